"""Warm function workers for a lane host (``raylane.jobs.lane``): a function
job is a call in a long-lived worker process, not a fork of the host per job.

Words:
- *fork server*: a child the host forks once, before it creates its GCS client
  (``Workers.start`` in ``lane.main``), and whose only work is to fork workers
  on request and report how each one ended. Forking the host itself per job
  copied a ~170 MB process holding Ray's gRPC threads (several ms of CPU and
  page faults each, and a Ray client used in such a fork hangs); the fork
  server holds no thread, lock or socket of Ray's, so neither does a worker.
  Not ``multiprocessing``'s 'forkserver': that starts a fresh interpreter
  (seconds of imports before the first call) and leaves sessions,
  ``PR_SET_PDEATHSIG`` and exit codes of killed workers to its own machinery.
- *worker*: a fork of the fork server, leader of its own session (a stop kills
  its process group), that runs one call at a time: a request in, ``ok`` or
  not out, over a socket of its own (handed to the fork server by
  ``SCM_RIGHTS``).

Invariants:
- A worker dies with its host: the fork server and each worker have
  ``PR_SET_PDEATHSIG`` (SIGKILL) on their parent, checked against a parent that
  died before the ``prctl``; a host that closes the pool has the fork server
  kill every worker's group.
- A call sees the host's environment plus its job's, the host's workdir as
  cwd, and fds 1 and 2 on its job's log; environment, cwd, ``sys.path`` and fds
  are restored after it, so no job's env or cwd reaches the next one. Imported
  modules stay: that is what makes a worker warm (a second call of the same
  module imports nothing).
- A worker is retired (and another forked when one is needed) after
  ``MAX_CALLS`` calls, or after a call that left a thread or a child process
  behind (the children are killed): what one call leaks, few others see.
- A call that ends its worker (``os._exit``, a signal, a stop) fails with the
  worker's exit code, as a fork of the host did; that worker is not reused.
"""

from __future__ import annotations

import ctypes
import json
import os
import select
import signal
import socket
import struct
import sys
import time
from pathlib import Path
from typing import Any

PR_SET_PDEATHSIG = 1
MAX_CALLS = 1000  # calls per worker before it is retired (as Ray's max_calls), a bound on slow leaks
SPAWN_TIMEOUT_S = 10.0  # for the fork server's answer to a fork request
_HEADER = struct.Struct("!I")


def die_with_parent(parent: int) -> None:
    """SIGKILL when ``parent`` dies; exit now if it already has (the race before the prctl)."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except OSError:
        pass  # not Linux: a lost host may leave its workers running
    if os.getppid() != parent:
        os._exit(1)


def _send(sock: socket.socket, msg: dict) -> None:
    data = json.dumps(msg).encode()
    sock.sendall(_HEADER.pack(len(data)) + data)


def _recv_exact(sock: socket.socket, n: int) -> bytes | None:
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return buf


def _recv(sock: socket.socket) -> Any:
    """The next message, or None at end of stream."""
    head = _recv_exact(sock, _HEADER.size)
    body = head and _recv_exact(sock, _HEADER.unpack(head)[0])
    return None if body is None else json.loads(body)


# The worker (a fork of the fork server) -----------------------------------------


def _worker(sock: socket.socket) -> None:
    """Serve calls until the host closes the socket or the worker retires. Never returns."""
    from raylane.jobs.function import call  # already loaded: the fork server's copy
    from raylane.orchestrator.domain import protocol

    import faulthandler

    null = os.open(os.devnull, os.O_RDONLY)  # as a command's stdin: a call has no terminal to read
    os.dup2(null, 0)
    os.close(null)
    faulthandler.enable(file=2)  # a crash's Python traceback goes to the log of the call it ended
    calls = 0
    while True:
        req = _recv(sock)
        if req is None:
            os._exit(0)
        ok = _serve(req, call, protocol.encode_result)
        calls += 1
        retire = _leftovers() or calls >= MAX_CALLS
        _send(sock, {"ok": ok, "retire": retire})
        if retire:
            os._exit(0)


def _serve(req: dict, call, encode_result) -> bool:
    env0, cwd0, path0 = dict(os.environ), os.getcwd(), list(sys.path)
    saved = os.dup(1), os.dup(2)
    streams = sys.stdout, sys.stderr
    fd = os.open(req["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    # print() and tracebacks go to the job's log, whatever sys.stdout was in the host
    mine = open(1, "w", buffering=1, closefd=False), open(2, "w", buffering=1, closefd=False)
    sys.stdout, sys.stderr = mine
    try:
        os.environ.update(req["env"])
        os.chdir(req["cwd"])
        Path(req["result"]).write_bytes(encode_result(call(req["entrypoint"], req["args"])))
        return True
    except BaseException:  # SystemExit too: the fork reported it as a failure (exit code 1)
        import traceback

        traceback.print_exc()
        return False
    finally:
        for s in {*mine, sys.stdout, sys.stderr}:  # the call may have replaced them
            try:
                s.flush()
            except (OSError, ValueError):
                pass
        sys.stdout, sys.stderr = streams
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        os.close(saved[0])
        os.close(saved[1])
        os.environ.clear()
        os.environ.update(env0)
        os.chdir(cwd0)
        sys.path[:] = path0


def _leftovers() -> bool:
    """Whether the call left a thread or a child process (killed here) behind."""
    import threading

    left = threading.active_count() > 1
    for task in Path("/proc/self/task").iterdir():
        try:
            children = (task / "children").read_text().split()
        except OSError:
            continue
        for pid in map(int, children):
            left = True
            try:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
            except (ProcessLookupError, ChildProcessError):
                pass
    return left


# The fork server ---------------------------------------------------------------


def _fork_server(ctl: socket.socket, host: int) -> None:
    """Fork a worker per request (its socket comes with it); report each worker's
    exit code; at end of stream (the host closed the pool), kill them all. Never returns."""
    die_with_parent(host)
    _close_fds_but(ctl.fileno())
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, signal.SIG_IGN)  # it goes with its host (end of stream, or PR_SET_PDEATHSIG)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # wakes select() through wake_r
    me, workers = os.getpid(), set()
    while True:
        ready, _, _ = select.select([ctl, wake_r], [], [], 1.0)
        if wake_r in ready:
            os.read(wake_r, 4096)
        while workers:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if not pid:
                break
            workers.discard(pid)
            _send(ctl, {"exit": pid, "code": os.waitstatus_to_exitcode(status)})
        if ctl not in ready:
            continue
        msg, fds, _, _ = socket.recv_fds(ctl, 16, 1)
        if not msg:
            for pid in workers:
                _killpg(pid, signal.SIGKILL)
            os._exit(0)
        pid = os.fork()
        if pid == 0:
            try:
                ctl.close()
                os.close(wake_r)
                os.close(wake_w)
                signal.set_wakeup_fd(-1)
                for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGINT):
                    signal.signal(sig, signal.SIG_DFL)
                os.setsid()
                die_with_parent(me)
                _worker(socket.socket(fileno=fds[0]))
            finally:
                os._exit(1)
        os.close(fds[0])
        workers.add(pid)
        _send(ctl, {"pid": pid})


def _close_fds_but(keep: int) -> None:
    """Close what the fork copied from the host but the fork server's own socket
    and stdio: a copy of another end (the host's end of its own socket, another
    pool's) held here would keep it from ever seeing end of stream."""
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd > 2 and fd != keep:
            try:
                os.close(fd)
            except OSError:
                pass  # the listing's own fd, closed already


def _killpg(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)  # a worker leads its own session: its pid is its group's id
    except (ProcessLookupError, PermissionError):
        pass


# The host's side -----------------------------------------------------------------


class WorkersLost(RuntimeError):
    """The fork server is gone: no worker can be started in this host any more."""


class Worker:
    def __init__(self, pid: int, sock: socket.socket):
        self.pid, self.sock = pid, sock
        self.exit_code: int | None = None  # once the fork server saw it end


class Workers:
    """The host's pool: at most ``size`` workers, forked on demand by the fork
    server and kept while work comes."""

    def __init__(self, size: int):
        self.size = size
        self._ctl: socket.socket | None = None
        self._server: int | None = None
        self._all: dict[int, Worker] = {}
        self._idle: list[Worker] = []
        self.gone = False  # the fork server ended (end of stream on its socket)

    def start(self) -> None:
        """Fork the fork server (once). Call it before the process has threads
        of its own (before the GCS client) where that can be chosen."""
        if self._ctl is not None:
            return
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        host = os.getpid()
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            try:
                mine.close()
                _fork_server(theirs, host)
            finally:
                os._exit(1)
        theirs.close()
        self._ctl, self._server = mine, pid

    def call(self, *, entrypoint: str, args: dict, env: dict[str, str], log_path: Path, result_path: Path,
             cwd: Path) -> "WarmCall":
        """Hand a call to an idle worker, or to a new one. Raises ``WorkersLost``."""
        self.start()
        self._pump()
        if self.gone:
            raise WorkersLost("the fork server is gone")
        while self._idle:
            w = self._idle.pop()
            if w.exit_code is None and self._give(w, entrypoint, args, env, log_path, result_path, cwd):
                return WarmCall(self, w)
            self._drop(w)  # died while idle (killed from outside)
        w = self._spawn()
        if not self._give(w, entrypoint, args, env, log_path, result_path, cwd):
            self._drop(w)
            raise WorkersLost(f"a new worker (pid {w.pid}) took no call")
        return WarmCall(self, w)

    def pids(self) -> list[int]:
        return list(self._all)

    def close(self) -> None:
        """Kill every worker (the fork server does, at end of stream) and reap the fork server."""
        if self._ctl is None:
            return
        for w in self._all.values():
            w.sock.close()
        self._all.clear()
        self._idle.clear()
        self._ctl.close()
        self._ctl = None
        try:
            os.waitpid(self._server, 0)
        except ChildProcessError:
            pass

    def _give(self, w: Worker, entrypoint, args, env, log_path, result_path, cwd) -> bool:
        try:
            _send(w.sock, {"entrypoint": entrypoint, "args": args, "env": env, "log": str(log_path),
                           "result": str(result_path), "cwd": str(cwd)})
            return True
        except OSError:
            return False

    def _spawn(self) -> Worker:
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            socket.send_fds(self._ctl, [b"w"], [theirs.fileno()])
            deadline = time.monotonic() + SPAWN_TIMEOUT_S
            while True:  # exit reports may come first
                if not select.select([self._ctl], [], [], max(0.0, deadline - time.monotonic()))[0]:
                    raise WorkersLost("the fork server did not answer")
                msg = _recv(self._ctl)
                if msg is None:
                    self.gone = True
                    raise WorkersLost("the fork server is gone")
                if "pid" in msg:
                    break
                self._exited(msg)
        except OSError as e:
            mine.close()
            raise WorkersLost(f"the fork server is gone: {e}") from e
        finally:
            theirs.close()
        w = self._all[msg["pid"]] = Worker(msg["pid"], mine)
        return w

    def _pump(self) -> None:
        """Read the fork server's exit reports that arrived."""
        while self._ctl is not None and not self.gone and select.select([self._ctl], [], [], 0)[0]:
            msg = _recv(self._ctl)
            if msg is None:
                self.gone = True
                return
            self._exited(msg)

    def _exited(self, msg: dict) -> None:
        w = self._all.get(msg["exit"])
        if w is not None:
            w.exit_code = msg["code"]

    def _done(self, w: Worker, *, reuse: bool) -> None:
        if reuse and len(self._idle) < self.size:
            self._idle.append(w)
        else:
            self._drop(w)

    def _drop(self, w: Worker) -> None:
        if w.exit_code is None:
            _killpg(w.pid, signal.SIGKILL)
        w.sock.close()
        self._all.pop(w.pid, None)


class WarmCall:
    """One call in a worker. Quacks like ``Popen`` where the host needs it:
    ``pid`` (the worker's process group, for a stop) and ``poll()`` (0, 1 for an
    exception, or the worker's own exit code if the call ended it)."""

    def __init__(self, pool: Workers, worker: Worker):
        self._pool, self._w = pool, worker
        self.pid = worker.pid
        self.returncode: int | None = None
        self._signalled = False

    def poll(self) -> int | None:
        if self.returncode is not None:
            return self.returncode
        w = self._w
        if select.select([w.sock], [], [], 0)[0]:
            try:
                reply = _recv(w.sock)
            except OSError:
                reply = None
            if reply is not None:
                # a worker that was signalled may be dying now: never reuse it
                self._pool._done(w, reuse=not reply["retire"] and not self._signalled)
                self.returncode = 0 if reply["ok"] else 1
                return self.returncode
        else:
            return None
        # End of stream: the call ended its worker. Its exit code comes from the fork server.
        deadline = time.monotonic() + SPAWN_TIMEOUT_S
        while w.exit_code is None and not self._pool.gone and time.monotonic() < deadline:
            self._pool._pump()
            if w.exit_code is None and self._pool._ctl is not None:
                select.select([self._pool._ctl], [], [], 0.05)
        self.returncode = w.exit_code if w.exit_code is not None else -signal.SIGKILL
        self._pool._drop(w)
        return self.returncode

    def signal(self, sig: int) -> None:
        self._signalled = True
        _killpg(self.pid, sig)
