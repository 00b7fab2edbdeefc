"""The lane host (``raylane.jobs.lane``) against an in-memory store with the
same interface as Ray's KV store: what it runs, what it writes, once. Real
processes and forks; no Ray."""

from __future__ import annotations

import json
import threading

import pytest

from raylane.jobs.lane import Host
from raylane.orchestrator.domain import lanes, protocol
from raylane.orchestrator.domain.lanes import LaneStatus
from tests.helpers import wait_for


class MemoryStore:
    """Ray's KV store as the host uses it: a put with overwrite off adds or refuses, atomically."""

    def __init__(self):
        self.d: dict[str, bytes] = {}
        self.infos: dict[str, bytes] = {}  # Ray's job records (namespace "job"), apart from the lane keys
        self.lock = threading.Lock()

    def get(self, key):
        return self.d.get(key)

    def put(self, key, value, *, overwrite=True):
        with self.lock:
            if not overwrite and key in self.d:
                return False
            self.d[key] = value
            return True

    def delete(self, key):
        self.d.pop(key, None)

    def keys(self, prefix):
        return [k for k in list(self.d) if k.startswith(prefix)]

    def put_job_info(self, sid, value):
        self.infos[sid] = value

    def job_info(self, sid):
        value = self.infos.get(sid)
        return json.loads(value) if value else None


def status(store, sid) -> LaneStatus:
    return LaneStatus.decode(store.d[lanes.status_key(sid)])


def enqueue(store, sid, command, env=None, args=None):
    store.put(lanes.todo_key("cpu", sid), lanes.encode_item(sid, command, env or {}, args=args))


def test_commands_and_functions_run_with_status_logs_and_results(tmp_path):
    store = MemoryStore()
    enqueue(store, "cmd", "echo hi-$X", {"X": "lane"})
    enqueue(store, "bad", "echo oops; exit 3")
    enqueue(store, "fn", "json:dumps", args={"obj": [1, 2]})
    enqueue(store, "boom", "json:loads", args={"s": "not json"})
    Host(store, "cpu", "raylane-lane-cpu-1", slots=4, idle_s=0.2, workdir=tmp_path).run()
    assert status(store, "cmd").status == "SUCCEEDED" and store.d[lanes.logs_key("cmd")] == b"hi-lane\n"
    bad = status(store, "bad")
    assert bad.status == "FAILED" and bad.exit_code == 3 and "oops" in bad.message
    assert status(store, "fn").status == "SUCCEEDED"
    assert protocol.decode_result(store.d[protocol.result_key("fn")]) == {"value": "[1, 2]"}
    boom = status(store, "boom")
    assert boom.status == "FAILED" and "JSONDecodeError" in boom.message
    assert protocol.result_key("boom") not in store.d
    assert not store.keys(lanes.todo_prefix("cpu"))  # every item taken
    assert all(status(store, s).host == "raylane-lane-cpu-1" for s in ("cmd", "bad", "fn", "boom"))


def test_an_item_is_run_once_whatever_the_number_of_hosts(tmp_path):
    store, out = MemoryStore(), tmp_path / "runs"
    for i in range(10):
        enqueue(store, f"j{i}", f"echo {i} >> {out}")
    hosts = [Host(store, "cpu", f"raylane-lane-cpu-{n}", slots=3, idle_s=0.3, workdir=tmp_path / str(n))
             for n in range(3)]
    for h in hosts:
        h.workdir.mkdir()
    threads = [threading.Thread(target=h.run) for h in hosts]
    for t in threads:
        t.start()
    # A re-dispatched attempt: the same item again after it ran is taken by no one.
    wait_for(lambda: status(store, "j0").status == "SUCCEEDED" if lanes.status_key("j0") in store.d else False,
             timeout=10, what="j0 ran")
    enqueue(store, "j0", f"echo again >> {out}")
    for t in threads:
        t.join(30)
    assert sorted(out.read_text().split()) == sorted(str(i) for i in range(10))


def test_a_stop_request_kills_the_process_group(tmp_path):
    store = MemoryStore()
    pidfile = tmp_path / "pid"
    enqueue(store, "long", f"sleep 300 & echo $! > {pidfile}; wait")
    host = Host(store, "cpu", "raylane-lane-cpu-1", slots=1, idle_s=0.2, workdir=tmp_path)
    t = threading.Thread(target=host.run)
    t.start()
    pid = wait_for(lambda: pidfile.exists() and pidfile.read_text().strip() and int(pidfile.read_text()),
                   timeout=10, what="the command's child")
    store.put(lanes.stop_key("long"), b"1")
    t.join(30)
    st = status(store, "long")
    assert st.status == "STOPPED" and st.exit_code is not None
    # The shell's child (same process group) went with it.
    with open(f"/proc/{pid}/stat") if _exists(pid) else open("/dev/null") as f:
        assert f.read().rsplit(")", 1)[-1].split()[:1] in ([], ["Z"])
    assert json.loads(store.d[lanes.status_key("long")])["status"] == "STOPPED"


def _exists(pid: int) -> bool:
    import os

    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False


@pytest.mark.parametrize("setpriv", [True, False], ids=["setpriv", "preexec_fn"])
def test_a_command_leads_a_session_of_its_own_with_or_without_setpriv(tmp_path, monkeypatch, setpriv):
    from raylane.jobs import lane

    if not setpriv:
        monkeypatch.setattr(lane, "SETPRIV", None)  # a node without util-linux's setpriv: a fork, as before
    store = MemoryStore()
    enqueue(store, "cmd", "ps -o pid=,pgid= -p $$")
    Host(store, "cpu", "raylane-lane-cpu-1", slots=1, idle_s=0.2, workdir=tmp_path).run()
    assert status(store, "cmd").status == "SUCCEEDED"
    pid, pgid = store.d[lanes.logs_key("cmd")].split()
    assert pid == pgid  # its own process group: what a stop kills


def test_an_item_of_another_protocol_version_is_left_unclaimed_for_a_host_of_its_version(tmp_path, caplog):
    store = MemoryStore()
    enqueue(store, "ours", "true")
    newer = json.dumps({"v": lanes.PROTOCOL_VERSION + 1, "sid": "newer", "run": ["what", "v1 cannot read"]})
    store.put(lanes.todo_key("cpu", "newer"), newer.encode())
    with caplog.at_level("WARNING", logger="raylane.lane"):
        Host(store, "cpu", "raylane-lane-cpu-1", slots=2, idle_s=0.2, workdir=tmp_path).run()
    assert status(store, "ours").status == "SUCCEEDED"
    assert store.d[lanes.todo_key("cpu", "newer")] == newer.encode()  # still there, for a host that reads it
    assert lanes.claim_key("newer") not in store.d and lanes.status_key("newer") not in store.d
    said = [r.getMessage() for r in caplog.records if "newer" in r.getMessage()]
    assert len(said) == 1 and f"lane protocol version {lanes.PROTOCOL_VERSION + 1}" in said[0]  # once, not per poll


class ControlPlaneView:
    """The same store through the calls ``backends.lanes.LaneBackend`` makes (Ray's
    GCS client), and a Jobs API that counts the host running: both sides on one store."""

    def __init__(self, store: MemoryStore):
        self.store = store

    def find_gcs(self):
        return self

    def kv_get(self, key):
        return self.store.get(key)

    def kv_put(self, key, value, *, overwrite=True):
        return self.store.put(key, value, overwrite=overwrite)

    def kv_del(self, key, *, prefix=False):
        for k in self.store.keys(key) if prefix else [key]:
            self.store.delete(k)

    def job_records(self, sids):
        return {s: self.store.infos[s] for s in sids if s in self.store.infos}

    def put_job_record(self, sid, value):
        self.store.infos[sid] = value

    def delete_job_record(self, sid):
        self.store.infos.pop(sid, None)

    def get(self, sid):
        from raylane.orchestrator.backends.ray_jobs import RayJob

        return RayJob(sid, "RUNNING", None, None, 1, None, "node-1", None, {})


def keys_of(store, sid) -> dict[str, bytes]:
    return {k: v for k, v in store.d.items() if sid in k.split("/")}


def _run_host(store, tmp_path):
    host = Host(store, "cpu", lanes.host_submission_id("cpu", 1), slots=1, idle_s=0.2, workdir=tmp_path)
    t = threading.Thread(target=host.run)
    t.start()
    wait_for(lambda: lanes.status_key("x") in store.d and status(store, "x").status == "RUNNING", timeout=10,
             what="the item running")
    return t


def test_a_host_that_writes_after_the_control_plane_forgot_the_attempt_brings_none_of_it_back(tmp_path):
    """Its outcome is stored and its keys deleted while its host (one Ray counted lost) ran on."""
    from raylane.orchestrator.backends.lanes import LaneBackend

    store, gate = MemoryStore(), tmp_path / "gate"
    enqueue(store, "x", f"while [ ! -e {gate} ]; do sleep 0.01; done; echo late")
    t = _run_host(store, tmp_path)
    LaneBackend(ControlPlaneView(store)).forget("x", group="cpu")
    gate.touch()
    t.join(30)
    assert keys_of(store, "x") == {lanes.claim_key("x"): lanes.FORGOTTEN}


def test_a_running_item_cancelled_before_it_was_recorded_is_stopped_and_leaves_only_its_claim(tmp_path):
    from raylane.orchestrator.backends.lanes import LaneBackend

    store = MemoryStore()
    enqueue(store, "x", "sleep 300")
    t = _run_host(store, tmp_path)
    LaneBackend(ControlPlaneView(store)).discard("x", group="cpu")  # the dispatcher's cancel-before-record
    t.join(30)
    assert not t.is_alive()  # stopped: the host went idle and exited
    assert keys_of(store, "x") == {lanes.claim_key("x"): lanes.FORGOTTEN}


def test_a_host_runs_what_its_nodes_cpus_hold_and_leaves_the_rest_to_the_groups_other_hosts(tmp_path):
    """Admission counts the group's CPUs, so a host on one node of a two-node
    group must not take all of it: with ``cpus`` it takes what fits its node
    beside what runs, and another host takes the rest."""
    store = MemoryStore()
    gate = tmp_path / "go"
    for i in range(6):  # six 1-CPU commands for two 3-CPU nodes
        store.put(lanes.todo_key("cpu", f"j{i}"),
                  lanes.encode_item(f"j{i}", f"while [ ! -e {gate} ]; do sleep 0.02; done", {}, cpus=1))
    hosts = [Host(store, "cpu", f"raylane-lane-cpu-n{n}-1", slots=8, idle_s=0.3, workdir=tmp_path / str(n), cpus=3)
             for n in range(2)]
    for h in hosts:
        h.workdir.mkdir()
    first = threading.Thread(target=hosts[0].run)
    first.start()
    # Alone, the first host takes its node's 3 CPUs' worth, not all six (its 8 slots would).
    wait_for(lambda: len(hosts[0].running) == 3, timeout=10, what="the first host full")
    assert len(store.keys(lanes.todo_prefix("cpu"))) == 3
    second = threading.Thread(target=hosts[1].run)
    second.start()
    wait_for(lambda: len(hosts[1].running) == 3, timeout=10, what="the second host takes the rest")
    assert not store.keys(lanes.todo_prefix("cpu")) and len(hosts[0].running) == 3
    gate.touch()
    first.join(30)
    second.join(30)
    by_host = {h.host_id: [i for i in range(6) if status(store, f"j{i}").host == h.host_id] for h in hosts}
    assert all(status(store, f"j{i}").status == "SUCCEEDED" for i in range(6))
    assert sorted(len(v) for v in by_host.values()) == [3, 3]


def test_an_item_bigger_than_the_node_still_runs_alone(tmp_path):
    store = MemoryStore()
    store.put(lanes.todo_key("cpu", "big"), lanes.encode_item("big", "true", {}, cpus=4))
    Host(store, "cpu", "raylane-lane-cpu-1", slots=2, idle_s=0.2, workdir=tmp_path, cpus=2).run()
    assert status(store, "big").status == "SUCCEEDED"


def test_items_are_taken_in_admission_order_and_one_that_does_not_fit_waits_for_room(tmp_path):
    """A 3-CPU item behind running 1-CPU ones is not overtaken by the small items
    after it: the host drains until it fits, then runs it."""
    store = MemoryStore()
    gate, order = tmp_path / "go", tmp_path / "order"
    store.put(lanes.todo_key("cpu", "a1"), lanes.encode_item("a1", f"while [ ! -e {gate} ]; do sleep 0.02; done; "
                                                             f"echo a1 >> {order}", {}, cpus=1))
    store.put(lanes.todo_key("cpu", "b2"), lanes.encode_item("b2", f"echo b2 >> {order}", {}, cpus=3))
    store.put(lanes.todo_key("cpu", "c3"), lanes.encode_item("c3", f"echo c3 >> {order}", {}, cpus=1))
    host = Host(store, "cpu", "raylane-lane-cpu-1", slots=8, idle_s=0.3, workdir=tmp_path, cpus=3)
    t = threading.Thread(target=host.run)
    t.start()
    wait_for(lambda: "a1" in host.running, timeout=10, what="a1 running")
    # b2 does not fit beside a1, and c3 (which would) is not taken past it.
    assert set(host.running) == {"a1"} and lanes.todo_key("cpu", "c3") in store.d
    gate.touch()
    t.join(30)
    assert order.read_text().split() == ["a1", "b2", "c3"]


def test_a_host_whose_key_names_another_takes_no_more_and_exits_when_its_items_end(tmp_path, monkeypatch):
    from raylane.jobs import lane

    monkeypatch.setattr(lane, "SELF_CHECK_S", 0.0)
    store = MemoryStore()
    gate = tmp_path / "go"
    key = lanes.host_key("cpu")
    store.put(key, b"raylane-lane-cpu-1")
    enqueue(store, "first", f"while [ ! -e {gate} ]; do sleep 0.02; done")
    host = Host(store, "cpu", "raylane-lane-cpu-1", slots=4, idle_s=60, workdir=tmp_path, key=key,
                wanted=lambda: None)
    t = threading.Thread(target=host.run)
    t.start()
    wait_for(lambda: "first" in host.running, timeout=10, what="first running")
    store.delete(key)  # the control plane retired it (its node drains, or hosts went per node)
    wait_for(lambda: host.retired, timeout=10, what="the host retired")
    enqueue(store, "second", "true")
    gate.touch()
    t.join(30)
    assert not t.is_alive()  # exited once "first" ended, long before its 60 s idle
    assert status(store, "first").status == "SUCCEEDED"
    assert lanes.todo_key("cpu", "second") in store.d  # left for the group's other hosts


def test_a_host_of_a_lane_env_runs_that_envs_items_only_in_its_working_dir(tmp_path):
    store = MemoryStore()
    env = lanes.env_key({"working_dir": "raylane://packages/" + "a1" * 32})
    code = tmp_path / "unpacked"  # where Ray unpacked the env's working_dir (the host's cwd)
    code.mkdir()
    (code / "lane_env_mod.py").write_text("def where(**kw):\n    import os\n    return os.getcwd()\n")
    (code / "marker.txt").write_text("from-the-package\n")
    store.put(lanes.todo_key("cpu", "cmd", env), lanes.encode_item("cmd", "cat marker.txt", {}))
    store.put(lanes.todo_key("cpu", "fn", env), lanes.encode_item("fn", "lane_env_mod:where", {}, args={}))
    enqueue(store, "own", "pwd")  # the node's own environment's item: another host's
    import sys
    sys.path.insert(0, str(code))  # as ``python -m`` in Ray's working_dir puts its cwd first
    try:
        (tmp_path / "w").mkdir()
        Host(store, "cpu", "raylane-lane-v1-cpu-e" + env + "-1", slots=2, idle_s=0.3, workdir=tmp_path / "w",
             env=env, job_cwd=code).run()
    finally:
        sys.path.remove(str(code))
    assert status(store, "cmd").status == "SUCCEEDED" and store.d[lanes.logs_key("cmd")] == b"from-the-package\n"
    assert status(store, "cmd").env == env
    assert status(store, "fn").status == "SUCCEEDED"
    assert protocol.decode_result(store.d[protocol.result_key("fn")]) == {"value": str(code)}
    assert lanes.todo_key("cpu", "own") in store.d and lanes.status_key("own") not in store.d  # left alone


def test_a_short_item_writes_only_its_end_and_a_longer_one_says_running_first(tmp_path, monkeypatch):
    monkeypatch.setattr("raylane.jobs.lane.RUNNING_AFTER_S", 1.0)  # wide: a loaded machine's `true` stays short
    class Counting(MemoryStore):
        def __init__(self):
            super().__init__()
            self.statuses: dict[str, list[str]] = {}

        def put(self, key, value, *, overwrite=True):
            if key.startswith("lane/a/") and key.endswith("/status"):
                self.statuses.setdefault(key, []).append(LaneStatus.decode(value).status)
            return super().put(key, value, overwrite=overwrite)

    store = Counting()
    enqueue(store, "quick", "true")
    enqueue(store, "slow", "sleep 1.5")
    Host(store, "cpu", "raylane-lane-cpu-1", slots=2, idle_s=0.2, workdir=tmp_path).run()
    assert store.statuses[lanes.status_key("quick")] == ["SUCCEEDED"]  # one write: the claim said who ran it
    assert store.statuses[lanes.status_key("slow")] == ["RUNNING", "SUCCEEDED"]


def test_a_command_that_writes_a_result_file_publishes_no_result(tmp_path):
    """Only a function call has a result: a command that writes a file with the
    result's name in its directory (by mistake, or to poison the control plane's
    read) leaves nothing in Ray's store under the result key."""
    store = MemoryStore()
    enqueue(store, "cmd", "printf '{' > cmd.result")
    Host(store, "cpu", "raylane-lane-cpu-1", slots=1, idle_s=0.2, workdir=tmp_path).run()
    assert status(store, "cmd").status == "SUCCEEDED"
    assert protocol.result_key("cmd") not in store.d


def test_each_item_has_a_record_where_ray_keeps_its_jobs_that_rays_own_code_reads(tmp_path, monkeypatch):
    """Ray's dashboard, ``ray job list`` and ``ray job status`` read a job from its
    job manager's records: the host writes one per item (RUNNING once it has run
    ``RUNNING_AFTER_S``, then its end), with the dispatcher's metadata, the
    host's node (from Ray's record of the host's own job) and no runtime env."""
    from ray.dashboard.modules.job.common import JobInfo, JobStatus

    monkeypatch.setattr("raylane.jobs.lane.RUNNING_AFTER_S", 1.0)
    writes: list[tuple[str, str]] = []

    class Recording(MemoryStore):
        def put_job_info(self, sid, value):
            writes.append((sid, json.loads(value)["status"]))
            super().put_job_info(sid, value)

    store = Recording()
    host = "raylane-lane-v1-cpu-1"
    store.put_job_info(host, json.dumps({"status": "RUNNING", "entrypoint": "x", "driver_node_id": "n0de"}).encode())
    writes.clear()
    meta = {"raylane_job_id": "j1", "raylane_project": "research", "raylane_kind": "command"}
    store.put(lanes.todo_key("cpu", "quick"), lanes.encode_item("quick", "echo $SECRET", {"SECRET": "s3"},
                                                                metadata=meta, cpus=0.5))
    store.put(lanes.todo_key("cpu", "slow"), lanes.encode_item("slow", "sleep 1.5; exit 4", {}, metadata=meta))
    Host(store, "cpu", host, slots=2, idle_s=0.2, workdir=tmp_path).run()
    assert sorted(writes) == [("quick", "SUCCEEDED"), ("slow", "FAILED"), ("slow", "RUNNING")]
    quick = JobInfo.from_json(store.job_info("quick"))  # Ray's own parser takes it
    assert quick.status is JobStatus.SUCCEEDED and quick.entrypoint == "echo $SECRET"
    assert quick.metadata == {**meta, "raylane_lane_host": host, "raylane_lane": "cpu"}
    assert quick.driver_node_id == "n0de" and quick.driver_exit_code == 0 and quick.entrypoint_num_cpus == 0.5
    assert quick.start_time <= quick.end_time and quick.runtime_env is None
    assert "s3" not in store.infos["quick"].decode()  # env vars (storage credentials) are not in Ray's job list
    assert "/v1/jobs/j1/logs" in quick.message
    slow = JobInfo.from_json(store.job_info("slow"))
    assert slow.status is JobStatus.FAILED and slow.driver_exit_code == 4


def test_a_record_that_cannot_be_written_fails_no_item(tmp_path, caplog):
    class NoRecords(MemoryStore):
        def put_job_info(self, sid, value):
            raise TimeoutError("GCS busy")

    store = NoRecords()
    enqueue(store, "a", "true")
    enqueue(store, "b", "true")
    Host(store, "cpu", "raylane-lane-v1-cpu-1", slots=2, idle_s=0.2, workdir=tmp_path).run()
    assert status(store, "a").status == status(store, "b").status == "SUCCEEDED"
    assert sum("record in Ray's dashboard" in r.message for r in caplog.records) == 1  # said once


def test_a_failure_to_write_records_is_said_again_after_they_were_written_again(tmp_path, caplog):
    """One warning per outage of the record writes, not one per item, nor one for
    the host's whole life: a write that succeeds ends the outage."""
    calls = []

    class Flaky(MemoryStore):
        def put_job_info(self, sid, value):
            calls.append(sid)
            if len(calls) in (1, 3):  # fails, works, fails, then works
                raise TimeoutError("GCS busy")
            super().put_job_info(sid, value)

    caplog.set_level("INFO", logger="raylane.lane")
    store = Flaky()
    for sid in "abcd":
        enqueue(store, sid, "true")
    Host(store, "cpu", "raylane-lane-v1-cpu-1", slots=1, idle_s=0.2, workdir=tmp_path).run()
    assert len(calls) >= 4 and all(status(store, s).status == "SUCCEEDED" for s in "abcd")
    assert sum("could not write" in r.message for r in caplog.records) == 2
    assert sum("written again" in r.message for r in caplog.records) == 2


def test_a_running_record_that_rays_restarted_job_manager_marked_failed_is_put_right(tmp_path, monkeypatch):
    """Ray's job manager, restarted with its dashboard, marks a RUNNING record whose
    job has no supervisor FAILED: a lane item's is one. Its host writes the record
    again every ``RECORD_REFRESH_S`` while the item runs, and its end after."""
    monkeypatch.setattr("raylane.jobs.lane.RECORD_REFRESH_S", 0.2)
    store = MemoryStore()
    marker = tmp_path / "go"
    enqueue(store, "long", f"while [ ! -e {marker} ]; do sleep 0.05; done")
    host = threading.Thread(target=Host(store, "cpu", "raylane-lane-v1-cpu-1", slots=1, idle_s=0.2,
                                        workdir=tmp_path).run, daemon=True)
    host.start()
    wait_for(lambda: store.job_info("long") and store.job_info("long")["status"] == "RUNNING", timeout=30,
             what="the item's RUNNING record")
    failed = {**store.job_info("long"), "status": "FAILED", "message": "Unexpected error occurred: failed to get "
              "job supervisor.", "error_type": "JOB_SUPERVISOR_ACTOR_START_FAILURE"}
    store.put_job_info("long", json.dumps(failed).encode())  # what Ray's JobManager._monitor_job does
    wait_for(lambda: store.job_info("long")["status"] == "RUNNING", timeout=30, what="the record put right")
    marker.touch()
    host.join(60)
    assert not host.is_alive() and store.job_info("long")["status"] == "SUCCEEDED"
