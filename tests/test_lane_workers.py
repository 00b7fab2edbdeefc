"""Function jobs in a lane host's warm workers (``raylane.jobs.lane_workers``),
against the in-memory store: results, logs, failures, stops, and what one job
must not leave to the next. Real processes; no Ray."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

from raylane.jobs.lane import Host
from raylane.orchestrator.domain import lanes, protocol
from tests.helpers import wait_for
from tests.test_lane_host import MemoryStore, enqueue, status

ROOT = Path(__file__).resolve().parent.parent


# A host takes items in admission order, that of their submission ids (time-ordered
# in production): where a test's order matters, its ids sort in that order.
def fn(store, sid, name, **args):
    enqueue(store, sid, f"tests.lane_funcs:{name}", env=args.pop("env", None), args=args)


def result(store, sid) -> dict:
    return protocol.decode_result(store.d[protocol.result_key(sid)])


def host(store, tmp_path, slots=1, idle_s=0.3) -> Host:
    return Host(store, "cpu", "raylane-lane-cpu-1", slots=slots, idle_s=idle_s, workdir=tmp_path)


def gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")  # a zombie runs no more
    except FileNotFoundError:
        return True


def test_results_logs_and_an_exception_with_its_traceback(tmp_path):
    store = MemoryStore()
    fn(store, "ok", "report", env={"SECRET": "s1"})
    fn(store, "boom", "boom")
    host(store, tmp_path).run()
    ok = result(store, "ok")
    assert status(store, "ok").status == "SUCCEEDED" and status(store, "ok").exit_code == 0
    assert ok["env"] == "s1" and ok["cwd"] == str(tmp_path)
    assert store.d[lanes.logs_key("ok")] == f"hello from {ok['pid']}\n".encode()
    boom = status(store, "boom")
    assert boom.status == "FAILED" and boom.exit_code == 1
    assert "Traceback (most recent call last)" in boom.message and "ValueError: boom in a lane" in boom.message
    assert protocol.result_key("boom") not in store.d


def test_a_worker_is_warm_and_one_job_leaves_no_env_or_cwd_to_the_next(tmp_path):
    store = MemoryStore()
    fn(store, "a", "leave_a_mess", env={"SECRET": "only-a"})
    fn(store, "b", "report")
    host(store, tmp_path).run()  # one slot: a, then b, in the same worker
    a, b = result(store, "a"), result(store, "b")
    assert a["env"] == "only-a"
    assert b["pid"] == a["pid"]  # the same process: warm
    assert b["env"] is None and b["leak"] is None and b["cwd"] == str(tmp_path)
    assert store.d[lanes.logs_key("b")] == f"hello from {b['pid']}\n".encode()  # its own log only


def test_a_stop_kills_a_hung_call_and_the_next_job_runs_in_a_fresh_worker(tmp_path):
    store, pidfile = MemoryStore(), tmp_path / "pid"
    fn(store, "1-warm", "report")
    fn(store, "2-hung", "hang", pidfile=str(pidfile))
    h = host(store, tmp_path, idle_s=1.0)
    t = threading.Thread(target=h.run)
    t.start()
    pid = wait_for(lambda: pidfile.exists() and pidfile.read_text() and int(pidfile.read_text()), timeout=10,
                   what="the hung call")
    assert pid == result(store, "1-warm")["pid"]  # the hung call runs in the warm worker
    store.put(lanes.stop_key("2-hung"), b"1")
    wait_for(lambda: lanes.status_key("2-hung") in store.d and status(store, "2-hung").status == "STOPPED",
             timeout=10, what="the stop")
    assert gone(pid)
    fn(store, "3-next", "report")
    t.join(30)
    assert status(store, "3-next").status == "SUCCEEDED"
    assert result(store, "3-next")["pid"] != pid


def test_a_call_that_ends_its_worker_fails_with_its_exit_code_and_the_next_job_runs(tmp_path):
    store = MemoryStore()
    fn(store, "1-exit3", "exit_hard", code=3)
    fn(store, "2-segv", "segfault")
    fn(store, "3-after", "report")
    host(store, tmp_path).run()
    exit3, segv = status(store, "1-exit3"), status(store, "2-segv")
    assert exit3.status == "FAILED" and exit3.exit_code == 3 and "going" in exit3.message
    assert segv.status == "FAILED" and segv.exit_code == -signal.SIGSEGV
    crash = store.d[lanes.logs_key("2-segv")].decode()  # faulthandler's, in the log of the call it ended
    assert "Segmentation fault" in crash and "lane_funcs.py" in crash
    assert status(store, "3-after").status == "SUCCEEDED"


def test_a_call_that_leaves_a_thread_retires_its_worker(tmp_path):
    store = MemoryStore()
    fn(store, "1-threads", "leave_a_thread")
    fn(store, "2-after", "report")
    host(store, tmp_path).run()
    assert status(store, "1-threads").status == "SUCCEEDED"
    assert result(store, "2-after")["pid"] != result(store, "1-threads")["pid"]


def test_a_worker_is_retired_after_max_calls(tmp_path, monkeypatch):
    from raylane.jobs import lane_workers

    monkeypatch.setattr(lane_workers, "MAX_CALLS", 2)  # read in the worker, a fork of this process
    store = MemoryStore()
    for sid in "abc":
        fn(store, sid, "report")
    host(store, tmp_path).run()
    a, b, c = (result(store, sid)["pid"] for sid in "abc")
    assert a == b != c


def test_workers_end_with_their_host(tmp_path):
    # A host that exits: its workers go with it.
    store = MemoryStore()
    for i in range(3):
        fn(store, f"j{i}", "report")
    h = host(store, tmp_path, slots=3)
    h.run()
    pids = {result(store, f"j{i}")["pid"] for i in range(3)}
    assert pids and os.getpid() not in pids  # the calls ran in workers, not in this process
    assert wait_for(lambda: all(gone(p) for p in pids), timeout=10, what="the workers to end")
    # A host killed without a word (SIGKILL): its worker dies too (PR_SET_PDEATHSIG, twice over).
    pidfile = tmp_path / "pid"
    proc = subprocess.Popen([sys.executable, "-c", "import sys; from tests.lane_funcs import host_main; "
                             f"host_main({str(tmp_path)!r}, {str(pidfile)!r})"], cwd=ROOT,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        pid = wait_for(lambda: pidfile.exists() and pidfile.read_text() and int(pidfile.read_text()), timeout=30,
                       what="the call in the killed host")
    finally:
        proc.kill()
        proc.wait()
    assert wait_for(lambda: gone(pid), timeout=10, what="the worker to die with its host")


def test_a_host_that_lost_its_fork_server_gives_up_its_item_as_lost_and_exits(tmp_path):
    store = MemoryStore()
    fn(store, "first", "report")
    h = host(store, tmp_path, idle_s=5.0)
    code = []
    t = threading.Thread(target=lambda: code.append(h.run()))
    t.start()
    wait_for(lambda: lanes.status_key("first") in store.d and status(store, "first").status == "SUCCEEDED",
             timeout=10, what="the first call")
    os.kill(h.workers._server, signal.SIGKILL)
    wait_for(lambda: gone(result(store, "first")["pid"]), timeout=10, what="its worker to go with it")
    fn(store, "second", "report")
    t.join(30)
    second = status(store, "second")
    assert code == [1]  # the control plane starts another host
    assert second.status == "FAILED" and second.error_type == lanes.HOST_LOST, second
