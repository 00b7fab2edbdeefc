"""A warm lane's host: ``python -m raylane.jobs.lane --group <g> --host <sid>``,
the driver of one long-lived Ray job per node group (``domain.lanes`` has the
words and the keys).

It polls Ray's KV store for the group's todo items, claims each (a put with
overwrite off: one host wins), and runs its command as a process of its own:
``/bin/sh -c`` in a new session, so a stop kills the whole process group, as
Ray's job supervisor does for a Ray job's entrypoint. A process, not a Ray
task: a command is a shell line that may start anything, and a task would hold
a Ray worker (and its runtime env) per command while the shell does the work.
The process gets SIGKILL if the host dies (``PR_SET_PDEATHSIG``), so a lost host
leaves no command running that a retry would run again beside it. It is set by
``setpriv --pdeathsig`` in front of the shell, not by a ``preexec_fn``: with
no ``preexec_fn`` Python starts the child with ``vfork``, which costs the same
whatever the host's size, where a ``fork`` of the ~170 MB host cost ~1.6 ms of
the host's CPU per command (docs/benchmarks.md, "the lane host alone").

A function job (``raylane.jobs.function``) is a call in a warm worker
(``raylane.jobs.lane_workers``): a process forked once, from a fork server the
host starts before its GCS client exists, that runs one call after another;
the interpreter, Raylane and the modules of earlier calls are loaded already.
The worker leads its own session (a stop kills it like a command, and it is
replaced), writes the result to a file, and the host leaves it in the store
under ``protocol.result_key``, where the reconciler reads any runner's result.

It writes each item's status and a bounded tail of its output back to the
store, honours stop requests, and exits after ``--idle-s`` without work; the
control plane starts another when work comes (``backends.lanes``). It lists
only the todo items of its protocol version (``lanes.PROTOCOL_VERSION``), and
an item that says another version is left, unclaimed, for a host of that
version, with one warning. After its last write for an item it reads the
item's claim: if the control plane has forgotten the attempt meanwhile (its
outcome is stored, or it was cancelled before it was recorded), the host
deletes what it wrote, so a late write cannot bring a forgotten attempt back.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from raylane.jobs import function  # noqa: F401 (loaded once here, so a worker forked later has it)
from raylane.jobs.lane_workers import WarmCall, Workers, WorkersLost
from raylane.orchestrator.domain import lanes, protocol
from raylane.orchestrator.domain.lanes import LaneStatus

log = logging.getLogger("raylane.lane")

POLL_BUSY_S = 0.01  # between looks at the store while work comes or runs
POLL_IDLE_S = 0.05  # ... and once nothing came for a second (one KV listing each: cheap for the GCS)
LOG_EVERY_S = 0.5  # a running item's output tail is refreshed at most this often
# An item's RUNNING status is written once it has run this long: one that ends
# sooner (most lane jobs: a call of a few ms) goes from PENDING, claimed by this
# host, straight to its end, one KV write fewer. The claim names the host
# meanwhile, so the control plane sees the item taken and its host's fate.
RUNNING_AFTER_S = 0.05
# A running item's record in Ray's dashboard is written again this often: Ray's job
# manager, restarted with its dashboard, marks every RUNNING record whose job has no
# supervisor FAILED ("failed to get job supervisor"), a lane attempt's included;
# the host puts it right within this time. One KV write per running item per period.
RECORD_REFRESH_S = 30.0
STOP_CHECK_S = 0.1  # how often stop requests are listed while items run (a cancel waits at most this)
SELF_CHECK_S = 1.0  # how often the host asks whether Ray still counts it alive
STOP_GRACE_S = 3.0  # SIGTERM, then SIGKILL after this long (Ray's job stop waits 3 s too)
KV_TIMEOUT_S = 10
PR_SET_PDEATHSIG = 1
FAILED_TAIL_CHARS = 4000  # of the output kept in a failed item's message
SETPRIV = shutil.which("setpriv")  # util-linux; without it, a command's child is a fork of the host


def _die_with_parent() -> None:  # runs in the child between fork and exec (no setpriv here)
    os.setsid()
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except OSError:
        pass  # not Linux: a lost host may leave its command running


class Store:
    """Ray's KV store, namespace ``protocol.KV_NAMESPACE``, through the driver's own GCS client."""

    def __init__(self, address: str):
        from ray._raylet import GcsClient

        self._c = GcsClient(address=address)
        self._ns = protocol.KV_NAMESPACE.encode()

    def get(self, key: str) -> bytes | None:
        return self._c.internal_kv_get(key.encode(), self._ns, timeout=KV_TIMEOUT_S) or None

    def put(self, key: str, value: bytes, *, overwrite: bool = True) -> bool:
        """True if the key was added (with overwrite off: this caller took it)."""
        return self._c.internal_kv_put(key.encode(), value, overwrite, self._ns, timeout=KV_TIMEOUT_S) == 1

    def delete(self, key: str) -> None:
        self._c.internal_kv_del(key.encode(), False, self._ns, timeout=KV_TIMEOUT_S)

    def keys(self, prefix: str) -> list[str]:
        return [k.decode() for k in self._c.internal_kv_keys(prefix.encode(), self._ns, timeout=KV_TIMEOUT_S)]

    def put_job_info(self, submission_id: str, value: bytes) -> None:
        """A lane attempt's record where Ray's job manager keeps its jobs' (``lanes.dashboard_record``)."""
        self._c.internal_kv_put(lanes.job_info_key(submission_id).encode(), value, True,
                                lanes.JOB_INFO_NAMESPACE.encode(), timeout=KV_TIMEOUT_S)

    def job_info(self, submission_id: str) -> dict | None:
        """Ray's record of a Ray job (the host's own: its node), or None."""
        value = self._c.internal_kv_get(lanes.job_info_key(submission_id).encode(), lanes.JOB_INFO_NAMESPACE.encode(),
                                        timeout=KV_TIMEOUT_S)
        return json.loads(value) if value else None

    def ray_job_status(self, submission_id: str) -> str | None:
        """Ray's status of a Ray job (its job manager's record in the same store)."""
        from ray._private import ray_constants
        from ray.dashboard.modules.job.common import JobInfoStorageClient

        value = self._c.internal_kv_get(JobInfoStorageClient.JOB_DATA_KEY.format(job_id=submission_id).encode(),
                                        ray_constants.KV_NAMESPACE_JOB, timeout=KV_TIMEOUT_S)
        return json.loads(value).get("status") if value else None


def still_wanted(store: Store, host_id: str) -> Callable[[], str | None]:
    """Why this host must stop now, or None. Ray's job supervisor kills its
    driver when it dies itself, but only from a watcher polling every second, and
    a node Ray declared dead may run on for a while (the local cluster's killed
    node, a partition): a host Ray no longer counts as running must take no more
    work, or the control plane would see its items lost twice."""
    parent = os.getppid()

    def check() -> str | None:
        if os.getppid() != parent:
            return "lost its Ray job supervisor"
        status = store.ray_job_status(host_id)
        if status not in (None, "PENDING", "RUNNING"):
            return f"is {status} in Ray"
        return None

    return check


@dataclass
class Running:
    sid: str
    proc: subprocess.Popen | WarmCall
    log_path: Path
    status: LaneStatus
    log_sent: int = -1  # bytes of output when the tail was last written
    log_at: float = 0.0
    stop_at: float | None = None  # when SIGTERM was sent
    killed: bool = False
    cpus: float = 0.0  # what admission counted it to hold
    item: dict = field(default_factory=dict)  # what it was queued with (its record in Ray's dashboard)
    started: float = field(default_factory=time.monotonic)
    announced: bool = False  # its RUNNING status is written (``RUNNING_AFTER_S``)
    recorded: float = 0.0  # when its RUNNING record in Ray's dashboard was last written (``RECORD_REFRESH_S``)


@dataclass
class Host:
    store: Store
    group: str
    host_id: str
    slots: int
    idle_s: float
    workdir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="raylane-lane-")))
    running: dict[str, Running] = field(default_factory=dict)
    wanted: Callable[[], str | None] | None = None  # still_wanted, where Ray runs the host
    workers: Workers | None = None  # function workers; started in main() before the GCS client, else here
    lost: str | None = None  # why this host can run no more functions (its fork server died)
    # Its node's CPUs (0: unknown, slots alone bound it): a host runs what fits them,
    # as admission counted each item, and leaves the rest to the group's other hosts.
    cpus: float = 0.0
    # The key that names this host (``lanes.host_key``): once it names another (or
    # none: its node drains, or the group's hosts moved to one per node), this host
    # takes no more items and exits when what it runs has ended.
    key: str | None = None
    retired: str | None = None  # why it takes no more items
    # Its lane env (``lanes.env_key``): it lists that env's items only, in the
    # runtime env Ray started it in; None: the node's own environment.
    env: str | None = None
    # Where its jobs run: a temporary directory of its own, or (a lane env with a
    # working_dir) the directory Ray unpacked it in, as a Ray job's entrypoint does.
    job_cwd: Path | None = None
    _cpus_of: dict[str, float] = field(default_factory=dict)  # todo key -> its item's CPUs (items never change)
    foreign: set[str] = field(default_factory=set)  # todo keys of another protocol version, left alone (logged once)
    _stops_at: float = 0.0  # when stop requests were last listed
    _node_id: str | None = None  # its node, as Ray's record of its own job says (read once)
    _records_failing: bool = False  # a dashboard record could not be written (logged once, until one is)

    def run(self) -> int:
        if self.workers is None:
            self.workers = Workers(self.slots)  # its fork server starts with the first function job
        try:
            return self._loop()
        finally:
            self.workers.close()

    def _loop(self) -> int:
        log.info("lane host %s for group %s%s: %d slots, exits after %.0f s idle", self.host_id, self.group,
                 f" (lane env {self.env}, jobs in {self.job_cwd or self.workdir})" if self.env else "",
                 self.slots, self.idle_s)
        last_work = checked = time.monotonic()
        while True:
            if self.wanted is not None and time.monotonic() - checked > SELF_CHECK_S:
                checked = time.monotonic()
                why = self.wanted()
                if why:
                    log.warning("this host %s: exiting, its items are lost with it", why)
                    self.abandon(why)
                    return 1
                if self.key is not None and self.retired is None and self.store.get(self.key) != self.host_id.encode():
                    self.retired = f"{self.key} no longer names it"
                    log.info("this host is retired (%s): it takes no more items", self.retired)
            if self.retired is not None and not self.running:
                log.info("retired and idle: exiting")
                return 0
            took = self._take() if self.retired is None and len(self.running) < self.slots and self._room() else 0
            if self.lost:
                self.abandon(self.lost)
                return 1
            self._watch()
            now = time.monotonic()
            if took or self.running:
                last_work = now
            elif now - last_work > self.idle_s:
                log.info("idle for %.0f s: exiting", self.idle_s)
                return 0
            time.sleep(POLL_BUSY_S if now - last_work < 1.0 else POLL_IDLE_S)

    def _room(self) -> bool:
        return not self.cpus or sum(r.cpus for r in self.running.values()) < self.cpus - 1e-9

    def _take(self) -> int:
        took = 0
        # In admission's order (a submission id starts with its job's time-ordered
        # id): an item that does not fit ends the pass, so the group's hosts drain
        # until one has room for it, instead of smaller items behind it keeping
        # every node short of it for as long as they come.
        prefix = lanes.todo_prefix(self.group, self.env)
        keys = sorted(self.store.keys(prefix))
        listed = set(keys)
        self.foreign &= listed  # bounded by what is listed
        self._cpus_of = {k: c for k, c in self._cpus_of.items() if k in listed}
        for key in keys:
            if len(self.running) >= self.slots:
                break
            if key in self.foreign:
                continue
            if key in self._cpus_of and not self._fits({"cpus": self._cpus_of[key]}):
                break  # known not to fit: no read of it again until room is made
            sid = key[len(prefix):]
            value = self.store.get(key)
            item = lanes.decode_item(value) if value is not None else None
            if item is not None and lanes.version_of(item) != lanes.PROTOCOL_VERSION:
                self.foreign.add(key)
                log.warning("%s: an item of lane protocol version %s; this host speaks version %d and leaves it "
                            "for a host that speaks its version", sid, lanes.version_of(item), lanes.PROTOCOL_VERSION)
                continue
            if item is not None and not self._fits(item):
                self._cpus_of[key] = lanes.item_cpus(item)
                break  # unclaimed: a host with room takes it (this one, once its items end)
            mine = item is not None and self.store.put(lanes.claim_key(sid), self.host_id.encode(), overwrite=False)
            self.store.delete(key)  # taken, by this host or an earlier one (a re-dispatched attempt)
            if mine:
                self._start(item)
                took += 1
        return took

    def _fits(self, item: dict) -> bool:
        """Whether the item fits this node's CPUs beside what runs (an item alone always does)."""
        if not self.cpus or not self.running:
            return True
        used = sum(r.cpus for r in self.running.values())
        return used + lanes.item_cpus(item) <= self.cpus + 1e-9

    def _start(self, item: dict) -> None:
        sid = item["sid"]
        log_path = self.workdir / f"{sid}.log"
        out = open(log_path, "wb")
        st = LaneStatus("RUNNING", group=self.group, host=self.host_id, start_time=int(time.time() * 1000),
                        env=self.env)
        cwd = self.job_cwd or self.workdir
        if "call" in item:
            out.close()
            try:
                proc = self.workers.call(entrypoint=item["command"], args=item["call"], env=item["env"],
                                         log_path=log_path, result_path=self._result_path(sid), cwd=cwd)
            except WorkersLost as e:  # a host that cannot run functions goes: the control plane starts another
                self.lost = f"lost its function workers ({e})"
                st.status, st.error_type, st.end_time = "FAILED", lanes.HOST_LOST, st.start_time
                st.message = f"lane host {self.host_id} {self.lost}"
                self._last_write(sid, st, item)
                return
            st.pid = proc.pid
            self.running[sid] = Running(sid, proc, log_path, st, cpus=lanes.item_cpus(item), item=item)
            return
        if SETPRIV:
            how = dict(args=[SETPRIV, "--pdeathsig", "KILL", "--", "/bin/sh", "-c", item["command"]],
                       start_new_session=True)
        else:
            how = dict(args=item["command"], shell=True, preexec_fn=_die_with_parent)
        try:
            proc = subprocess.Popen(**how, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    env={**os.environ, **item["env"]}, cwd=cwd)
        except OSError as e:
            out.close()
            st.status, st.exit_code, st.message, st.end_time = "FAILED", 127, f"could not start: {e}", st.start_time
            self._last_write(sid, st, item)
            return
        finally:
            out.close()  # the child holds its own copy
        st.pid = proc.pid
        self.running[sid] = Running(sid, proc, log_path, st, cpus=lanes.item_cpus(item), item=item)
        log.info("%s: started pid %d", sid, proc.pid)

    def _result_path(self, sid: str) -> Path:
        return self.workdir / f"{sid}.result"

    def _watch(self) -> None:
        if not self.running:
            return
        now = time.monotonic()
        stops: set[str] = set()
        if now - self._stops_at >= STOP_CHECK_S:
            self._stops_at = now
            stops = {k[len(lanes.STOP_PREFIX):] for k in self.store.keys(lanes.STOP_PREFIX)}
        for sid, r in list(self.running.items()):
            rc = r.proc.poll()
            if rc is not None:
                self._finish(r, rc)
                del self.running[sid]
                continue
            if not r.announced and now - r.started >= RUNNING_AFTER_S:
                r.announced = True
                r.recorded = now
                self._record(sid, r.status, r.item)  # before the status: whoever sees that sees this
                self.store.put(lanes.status_key(sid), r.status.encode())
            elif r.announced and now - r.recorded >= RECORD_REFRESH_S:
                r.recorded = now
                # Not for an attempt the control plane forgot (it counted this host lost
                # and ended or deleted the record): no record comes back from here.
                if self.store.get(lanes.claim_key(sid)) != lanes.FORGOTTEN:
                    self._record(sid, r.status, r.item)
            if sid in stops and r.stop_at is None:
                r.stop_at = now
                _signal(r.proc, signal.SIGTERM)
            elif r.stop_at is not None and now - r.stop_at > STOP_GRACE_S and not r.killed:
                r.killed = True
                _signal(r.proc, signal.SIGKILL)
            if now - r.log_at > LOG_EVERY_S:
                self._send_log(r)

    def _send_log(self, r: Running) -> str:
        r.log_at = time.monotonic()
        size = r.log_path.stat().st_size
        if size == r.log_sent:
            return ""
        with open(r.log_path, "rb") as f:
            f.seek(max(0, size - lanes.MAX_LOG_BYTES))
            tail = f.read(lanes.MAX_LOG_BYTES)
        self.store.put(lanes.logs_key(r.sid), tail)
        r.log_sent = size
        return tail.decode(errors="replace")

    def _finish(self, r: Running, rc: int) -> None:
        if not isinstance(r.proc, WarmCall):  # a worker cleans up after its own calls, and lives on
            _signal(r.proc, signal.SIGKILL)  # what the shell left behind in its group
        r.log_at = 0.0
        self._send_log(r)
        st = r.status
        st.end_time, st.exit_code = int(time.time() * 1000), rc
        if r.stop_at is not None:
            st.status, st.message = "STOPPED", "stopped on request"
        elif rc == 0:
            result = self._result_path(r.sid)
            # A function's, where the reconciler reads any runner's result. Only a call
            # has one: a command could write a file of that name in its directory.
            if isinstance(r.proc, WarmCall) and result.exists():
                self.store.put(protocol.result_key(r.sid), result.read_bytes())
            result.unlink(missing_ok=True)
            st.status = "SUCCEEDED"
        else:
            tail = r.log_path.read_bytes()[-FAILED_TAIL_CHARS:].decode(errors="replace")
            st.status = "FAILED"
            st.message = f"Job entrypoint command failed with exit code {rc}, last available logs:\n{tail}"
        self._last_write(r.sid, st, r.item)
        r.log_path.unlink(missing_ok=True)
        log.info("%s: %s (exit code %d)", r.sid, st.status, rc)

    def _record(self, sid: str, st: LaneStatus, item: dict) -> None:
        """The attempt's record in Ray's dashboard (``lanes.dashboard_record``): a
        view of it, so a failure to write it fails nothing (said once in the log)."""
        try:
            if self._node_id is None:
                own = self.store.job_info(self.host_id) or {}
                self._node_id = own.get("driver_node_id") or ""
            self.store.put_job_info(sid, lanes.dashboard_record(item, st, node_id=self._node_id or None))
        except Exception as e:
            if not self._records_failing:
                self._records_failing = True
                log.warning("could not write %s's record in Ray's dashboard (%s: %s); its status is unaffected, "
                            "and no more of these failures are logged until a write succeeds", sid,
                            type(e).__name__, e)
            return
        if self._records_failing:
            self._records_failing = False
            log.info("records in Ray's dashboard are written again (from %s)", sid)

    def _last_write(self, sid: str, st: LaneStatus, item: dict | None = None) -> None:
        """An item's end in Ray's dashboard, then its final status, then a look at
        its claim: the control plane marks it ``FORGOTTEN`` before it deletes the
        attempt's keys, so either this read sees the mark or this write came
        before that delete (``domain.lanes``). The record comes first: the
        control plane, once it has seen the status, finds the record ended (it
        ends a record still RUNNING as lost) and may delete it (past the
        dashboard's tail), which a record written after would undo."""
        self._record(sid, st, item or {})
        self.store.put(lanes.status_key(sid), st.encode())
        if self.store.get(lanes.claim_key(sid)) == lanes.FORGOTTEN:
            for key in (lanes.status_key(sid), lanes.logs_key(sid), lanes.stop_key(sid), protocol.result_key(sid)):
                self.store.delete(key)
            log.info("%s: %s, but the control plane had forgotten it meanwhile: its keys deleted", sid, st.status)

    def abandon(self, why: str) -> None:
        """The host is going away (its Ray job was stopped): its items end FAILED
        as lost with their host, so the control plane retries them."""
        for r in self.running.values():
            _signal(r.proc, signal.SIGKILL)
            st = r.status
            st.status, st.error_type, st.end_time = "FAILED", lanes.HOST_LOST, int(time.time() * 1000)
            st.message = f"lane host {self.host_id} {why}"
            try:
                self._last_write(r.sid, st, r.item)
            except Exception:  # the reconciler sees the host gone all the same
                log.exception("could not record %s as lost", r.sid)


def _signal(proc: subprocess.Popen | WarmCall, sig: int) -> None:
    if isinstance(proc, WarmCall):
        proc.signal(sig)  # and the worker is not reused
        return
    try:
        os.killpg(proc.pid, sig)  # the child leads its own session: its pid is its group's id
    except (ProcessLookupError, PermissionError):
        pass


def _probe(host: str) -> str | None:
    """Ray's status of a host's job as its self-check reads it (a function job for the tests)."""
    return Store(os.environ["RAY_ADDRESS"]).ray_job_status(host)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m raylane.jobs.lane")
    p.add_argument("--group", required=True)
    p.add_argument("--host", required=True, help="this host's Ray submission id")
    p.add_argument("--slots", type=int, default=8)
    p.add_argument("--idle-s", type=float, default=60.0)
    # A newer control plane may pass flags this host does not know (a node whose
    # package is older): it runs without them rather than fail at every start.
    # Options added since the first release come by environment (``lanes.HOST_ENV``),
    # which a host of that release ignores: its parser refused unknown flags.
    a, unknown = p.parse_known_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if unknown:
        log.warning("ignoring options this host does not know: %s", " ".join(unknown))
    cpus = float(os.environ.get(lanes.HOST_ENV_CPUS) or 0.0)
    key = os.environ.get(lanes.HOST_ENV_KEY) or None
    env = os.environ.get(lanes.HOST_ENV_ENV) or None
    job_cwd = Path.cwd() if os.environ.get(lanes.HOST_ENV_IN_WORKING_DIR) == "1" else None
    workers = Workers(a.slots)
    workers.start()  # before the GCS client: the fork server must not copy Ray's gRPC threads
    store = Store(os.environ["RAY_ADDRESS"])
    host = Host(store, a.group, a.host, a.slots, a.idle_s, wanted=still_wanted(store, a.host), workers=workers,
                cpus=cpus, key=key, env=env, job_cwd=job_cwd)

    def on_term(signum, _frame):
        host.abandon("was stopped")
        sys.exit(128 + signum)

    signal.signal(signal.SIGTERM, on_term)
    return host.run()


if __name__ == "__main__":
    sys.exit(main())
