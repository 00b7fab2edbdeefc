"""The local cluster's node processes as the operating system sees them: find them,
stop them, and stop them when the server that started them dies.

Words: a *node* is one ``ray start --block`` and the process group it leads (its
raylet, agents and workers); the group's id is the pid in the cluster's
``state.json``. Every process of a cluster names the cluster's Ray temp dir on its
command line, so a group is *ours* only while its leader still does: a pid from an
old ``state.json`` may have been reused by anything since, and is never signalled
then.

The *watchdog* (``python -m raylane.orchestrator.tooling.nodeprocs DIR``) is a child
of ``raylane-server serve --local-cluster`` in a session of its own, so a signal to the
server's process group does not reach it. It notices its parent's death by being
re-parented (``getppid`` changes; a pid could be reused, a parent cannot come
back), then stops every node ``DIR/state.json`` lists. So nodes die with the server
however it dies: SIGTERM and a clean stop, SIGTERM then SIGKILL, or SIGKILL alone.
Nothing here imports Ray or the control plane: the watchdog stays small.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import sys
import time
from pathlib import Path

WATCH_INTERVAL_S = 0.5  # how soon after the server's death its nodes start to go
STOP_GRACE_S = 2  # SIGTERM, then SIGKILL: Ray nodes take >6 s to stop on SIGTERM here, and a torn-down cluster has nothing to save


def alive(pid: int) -> bool:
    try:
        # A node this process started and killed is a zombie until reaped, and a
        # zombie answers kill(0): reap it first, or a stop waits out its grace.
        if os.waitpid(pid, os.WNOHANG)[0] == pid:
            return False
    except ChildProcessError:
        pass  # not our child (another process started the cluster)
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:  # pragma: no cover
        return True


def proc_start(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (``/proc/PID/stat``
    field 22): a pid and its start time name one process for good."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def is_ours(pid: int, temp_dir: str) -> bool:
    """Whether ``pid`` still leads a node of the cluster whose temp dir this is."""
    try:
        return temp_dir.encode() in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def is_child(pid: int) -> bool:
    """Whether ``pid`` is this process's child: a node it started whose leader has
    exited (a zombie names nothing) may still have a raylet in its group."""
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1]) == os.getpid()
    except (OSError, ValueError, IndexError):
        return False


def naming(address: str) -> list[int]:
    """Pids of processes (not this one) whose command line names ``address``
    (``host:port``) as a whole: ``127.0.0.1:4321`` is not ``127.0.0.1:43210``, the
    GCS of another cluster on this machine. The raylets Ray's autoscaler started
    name their cluster's GCS so, and lead no process group of ours."""
    pattern = re.compile(re.escape(address.encode()) + rb"(?![0-9])")
    out = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if pattern.search(Path(f"/proc/{entry.name}/cmdline").read_bytes()):
                out.append(int(entry.name))
        except OSError:
            continue
    return out


def descendants(pids: list[int]) -> list[int]:
    """Every process started under ``pids`` (their children, theirs, and so on),
    in whatever session or process group it runs. Ray's job supervisor starts a
    job's driver in a session of its own, so a node's process group does not hold
    its drivers: killed with the group alone, a driver lived on, re-parented to
    init, running its job with no node under it (a real node's reclaim ends every
    process on it)."""
    children: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            ppid = int(Path(f"/proc/{entry.name}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue  # gone meanwhile
        children.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], list(pids)
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def _kill_each(pids: list[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def kill_tree(pid: int, sig: int = signal.SIGKILL) -> None:
    """Signal the process group ``pid`` leads and every process started under it
    (``descendants``): one node, the way a reclaimed machine goes."""
    under = descendants([pid])
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        pass
    _kill_each(under, sig)


def stop_groups(pids: list[int], grace_s: float = STOP_GRACE_S) -> None:
    """SIGTERM each process group, then SIGKILL those still there after the grace,
    and every process started under them in sessions of their own (``descendants``:
    the drivers of the jobs still running)."""
    under = descendants(pids)
    for pid in pids:
        try:
            os.killpg(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + grace_s
    for pid in pids:
        while alive(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        try:
            # Also when the leader is gone: a raylet's workers may outlive it in its group.
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    _kill_each(under, signal.SIGKILL)


def stop_pids(pids: list[int], grace_s: float = STOP_GRACE_S) -> None:
    """SIGTERM each process, then SIGKILL those still there after the grace (the
    raylets Ray's autoscaler started, which lead no process group of ours)."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + grace_s
    for pid in pids:
        while alive(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def stop_stale(dir: str | Path, *, owner: int | None = None) -> bool:
    """Stop what still runs of the cluster ``DIR/state.json`` describes (only the
    groups whose leader is still one of its nodes), delete its temp dir and the
    state file. With ``owner``, only a cluster of that owner (a state file a later
    server wrote is left alone). Returns whether a cluster was stopped."""
    path = Path(dir, "state.json")
    try:
        state = json.loads(path.read_text())
    except (OSError, ValueError):
        return False
    if owner is not None and state.get("owner_pid") != owner:
        return False
    temp_dir = state["temp_dir"]
    # Workers first, the head (the one with a dashboard port) last, so nodes do not
    # log a storm of lost-GCS errors.
    nodes = sorted(state.get("nodes", []), key=lambda n: "dashboard-port" in n["ports"])
    stop_groups([n["pid"] for n in nodes if is_ours(n["pid"], temp_dir)])
    if state.get("gcs_address"):
        # What the autoscaler of an autoscaling cluster started and its head left behind.
        stop_pids(naming(state["gcs_address"]))
    shutil.rmtree(temp_dir, ignore_errors=True)
    path.unlink(missing_ok=True)
    return True


def watch(dir: str | Path, owner: int) -> None:
    """Wait for ``owner`` (the parent) to die, then stop the cluster in ``dir``."""
    while os.getppid() == owner:
        time.sleep(WATCH_INTERVAL_S)
    # Only a cluster that is still the owner's: a clean stop removed the state
    # file, and a later server may have started a cluster of its own here.
    stop_stale(dir, owner=owner)


if __name__ == "__main__":
    watch(sys.argv[1], int(sys.argv[2]))
