"""``backends.lanes.LaneBackend`` against in-memory stand-ins for Ray's KV store
and Jobs API (what cannot run without a cluster here): hosts started and
replaced, attempts adopted, stopped before a host takes them, and lost with
their host. The real thing is tests/ray/test_fast_lane.py."""

from __future__ import annotations

import json

import pytest

from raylane.orchestrator.backends.lanes import LaneBackend
from raylane.orchestrator.backends.ray_jobs import AlreadySubmitted, RayJob
from raylane.orchestrator.domain import lanes
from raylane.orchestrator.domain.lanes import LaneStatus

HOST1 = lanes.host_submission_id("cpu", 1)


class Gcs:
    def __init__(self):
        self.d: dict[str, bytes] = {}
        self.multi_gets = 0

    def kv_get(self, key):
        return self.d.get(key)

    def kv_multi_get(self, keys):
        self.multi_gets += 1
        return {k: self.d[k] for k in keys if k in self.d}

    def kv_put(self, key, value, *, overwrite=True):
        if not overwrite and key in self.d:
            return False
        self.d[key] = value
        return True

    def kv_del(self, key, *, prefix=False):
        for k in [k for k in self.d if (k.startswith(key) if prefix else k == key)]:
            del self.d[k]


class Ray:
    """The Jobs API as LaneBackend uses it: submit once per id, get."""

    def __init__(self):
        self.gcs = Gcs()
        self.jobs: dict[str, RayJob] = {}

    def _find_gcs(self):
        return self.gcs

    def submit(self, *, submission_id, entrypoint, metadata, entrypoint_label_selector, **_):
        if submission_id in self.jobs:
            raise AlreadySubmitted(submission_id)
        assert f" python -m {lanes.HOST_MODULE} --group cpu --host {submission_id} " in entrypoint
        assert entrypoint_label_selector == {"ray.io/node-group": "cpu"} and metadata == {"raylane_lane": "cpu"}
        self.jobs[submission_id] = RayJob(submission_id, "RUNNING", None, None, 1, None, "node-1", None, metadata)

    def get(self, sid):
        return self.jobs.get(sid)

    def end(self, sid, status="FAILED", message="driver exited with -9"):
        self.jobs[sid].status, self.jobs[sid].message = status, message


@pytest.fixture
def ray():
    return Ray()


@pytest.fixture
def lb(ray, monkeypatch):
    monkeypatch.setattr("raylane.orchestrator.backends.lanes.HOST_CHECK_S", 0.0)  # always ask "Ray" afresh
    return LaneBackend(ray, idle_s=5, slots=2)


def test_submit_starts_one_host_and_a_second_dispatch_is_adopted(lb, ray):
    lb.submit(submission_id="a-1", group="cpu", command="true", env={})
    assert list(ray.jobs) == [HOST1]
    assert lb.get("a-1").status == "PENDING"
    with pytest.raises(AlreadySubmitted):
        lb.submit(submission_id="a-1", group="cpu", command="true", env={})
    lb.submit(submission_id="b-1", group="cpu", command="true", env={})
    assert list(ray.jobs) == [HOST1]  # the live host serves both


def test_a_dead_host_is_replaced_when_work_waits(lb, ray):
    lb.submit(submission_id="a-1", group="cpu", command="true", env={})
    ray.end(HOST1, "SUCCEEDED", "idle: exited")
    assert lb.get("a-1").status == "PENDING"  # unclaimed: it waits for the next host
    assert lanes.host_submission_id("cpu", 2) in ray.jobs


def test_stop_before_a_host_takes_it_means_no_host_ever_will(lb, ray):
    lb.submit(submission_id="a-1", group="cpu", command="true", env={})
    assert lb.stop("a-1")
    assert lb.get("a-1").status == "STOPPED"
    assert lanes.todo_key("cpu", "a-1") not in ray.gcs.d
    assert not ray.gcs.kv_put(lanes.claim_key("a-1"), HOST1.encode(), overwrite=False)  # a host's claim fails
    assert not lb.stop("a-1")  # ended: nothing to stop


def test_stop_of_a_running_item_asks_its_host(lb, ray):
    lb.submit(submission_id="a-1", group="cpu", command="sleep 9", env={})
    ray.gcs.kv_put(lanes.claim_key("a-1"), HOST1.encode(), overwrite=False)
    ray.gcs.kv_put(lanes.status_key("a-1"), LaneStatus("RUNNING", group="cpu", host=HOST1).encode())
    rj = lb.get("a-1")
    assert rj.status == "RUNNING" and rj.driver_node_id == "node-1"
    assert lb.stop("a-1") and lanes.stop_key("a-1") in ray.gcs.d


@pytest.mark.parametrize("status", ["RUNNING", "PENDING"])
def test_an_item_whose_host_ended_under_it_is_lost_with_it(lb, ray, status):
    lb.submit(submission_id="a-1", group="cpu", command="sleep 9", env={})
    ray.gcs.kv_put(lanes.claim_key("a-1"), HOST1.encode(), overwrite=False)
    if status == "RUNNING":  # claimed and started; PENDING: claimed, the host died before it wrote RUNNING
        ray.gcs.kv_put(lanes.status_key("a-1"), LaneStatus("RUNNING", group="cpu", host=HOST1).encode())
    ray.end(HOST1)
    rj = lb.get("a-1")
    assert rj.status == "FAILED" and rj.error_type == lanes.HOST_LOST and rj.driver_node_id == "node-1"
    assert f"{HOST1} ended (FAILED: driver exited with -9)" in rj.message


def test_logs_are_the_tail_or_empty_while_pending_or_none_when_unknown(lb, ray):
    assert lb.logs("nope") is None and lb.get("nope") is None
    lb.submit(submission_id="a-1", group="cpu", command="true", env={})
    assert lb.logs("a-1") == ""
    ray.gcs.kv_put(lanes.logs_key("a-1"), b"hello\n")
    assert lb.logs("a-1") == "hello\n"


def test_a_host_gone_with_its_node_says_so_in_rays_words(lb, ray):
    from raylane.orchestrator.loops.classify import classify
    from raylane.orchestrator.domain.states import FailureCause

    lb.submit(submission_id="a-1", group="cpu", command="sleep 9", env={})
    ray.gcs.kv_put(lanes.claim_key("a-1"), HOST1.encode(), overwrite=False)
    ray.gcs.kv_put(lanes.status_key("a-1"), LaneStatus("RUNNING", group="cpu", host=HOST1).encode())
    ray.end(HOST1, message="Job supervisor actor died")
    ray.jobs[HOST1].error_type = "JOB_SUPERVISOR_ACTOR_DIED"
    rj = lb.get("a-1")
    assert rj.error_type == "JOB_SUPERVISOR_ACTOR_DIED" and HOST1 in rj.message
    # The node is not declared dead yet: the group's market decides (spot: a preemption).
    assert classify(rj, {}, driver_market="SPOT")[0] is FailureCause.PREEMPTED
    assert classify(rj, {}, driver_market="ON_DEMAND")[0] is FailureCause.NODE_LOST


def test_items_a_host_gave_up_wait_for_rays_word_on_the_host(lb, ray):
    lb.submit(submission_id="a-1", group="cpu", command="sleep 9", env={})
    ray.gcs.kv_put(lanes.claim_key("a-1"), HOST1.encode(), overwrite=False)
    ray.gcs.kv_put(lanes.status_key("a-1"), LaneStatus(
        "FAILED", group="cpu", host=HOST1, error_type=lanes.HOST_LOST,
        message=f"lane host {HOST1} lost its Ray job supervisor").encode())
    assert lb.get("a-1").status == "RUNNING"  # Ray still counts the host running
    ray.end(HOST1)
    rj = lb.get("a-1")
    assert rj.status == "FAILED" and rj.error_type == lanes.HOST_LOST


def test_many_attempts_are_read_in_two_calls_whatever_their_number(lb, ray):
    for i in range(50):
        lb.submit(submission_id=f"a-{i}", group="cpu", command="true", env={})
    lb.ray.gcs.kv_put(lanes.claim_key("a-0"), HOST1.encode(), overwrite=False)
    lb.ray.gcs.kv_put(lanes.status_key("a-0"), LaneStatus("RUNNING", group="cpu", host=HOST1).encode())
    before = ray.gcs.multi_gets
    seen = lb.get_many([f"a-{i}" for i in range(50)] + ["never-submitted"])
    assert ray.gcs.multi_gets - before == 2  # the statuses, then the claims of the PENDING ones
    assert seen["never-submitted"] is None
    assert seen["a-0"].status == "RUNNING" and seen["a-0"].metadata["raylane_lane_host"] == HOST1
    assert {seen[f"a-{i}"].status for i in range(1, 50)} == {"PENDING"}
    assert all(seen[f"a-{i}"].__dict__ == lb.get(f"a-{i}").__dict__ for i in (0, 1, 49))


def test_an_ended_attempt_brings_its_log_tail_and_is_then_forgotten_but_its_claim(lb, ray):
    lb.submit(submission_id="a-1", group="cpu", command="echo hi", env={})
    lb.submit(submission_id="b-1", group="cpu", command="sleep 9", env={})
    gcs = ray.gcs
    gcs.kv_put(lanes.claim_key("a-1"), HOST1.encode())  # the host took it (and its todo item)
    gcs.kv_del(lanes.todo_key("cpu", "a-1"))
    gcs.kv_put(lanes.status_key("a-1"), LaneStatus("SUCCEEDED", group="cpu", host=HOST1,
                                                   exit_code=0).encode())
    gcs.kv_put(lanes.logs_key("a-1"), b"hi\n")
    seen = lb.get_many(["a-1", "b-1"])
    assert seen["a-1"].log_tail == "hi\n" and seen["b-1"].log_tail is None  # only an ended one's
    # A late redispatch (a replica that found the lease stale before the outcome was stored) put it back.
    gcs.kv_put(lanes.todo_key("cpu", "a-1"), b"again")
    lb.forget("a-1", group="cpu")
    # Status, log tail and the re-put item go; the claim stays, so no host could ever run it again.
    assert {k: v for k, v in gcs.d.items() if "a-1" in k} == {lanes.claim_key("a-1"): lanes.FORGOTTEN}
    assert lb.get("a-1") is None and lb.logs("a-1") is None
    assert lb.get("b-1").status == "PENDING"  # the other attempt's keys stay
    gcs.kv_put(lanes.stop_key("b-1"), b"1")
    lb.forget("b-1", group="cpu", stopped=True)
    # Never claimed: the tombstone alone is left, so no host can take it later either.
    assert {k: v for k, v in gcs.d.items() if "b-1" in k} == {lanes.claim_key("b-1"): lanes.FORGOTTEN}


def test_a_status_of_another_protocol_version_is_left_alone_and_said_once(lb, ray, caplog):
    # A control plane of a newer version dispatched it (a rolling upgrade): its words may mean other things.
    newer = {"v": lanes.PROTOCOL_VERSION + 1, "status": "SUCCEEDED", "group": "cpu", "host": "raylane-lane-v9-cpu-1"}
    ray.gcs.kv_put(lanes.status_key("n-1"), json.dumps(newer).encode())
    ray.gcs.kv_put(lanes.status_key("n-2"), json.dumps({**newer, "status": "RUNNING"}).encode())
    with caplog.at_level("WARNING", logger="raylane.orchestrator.backends.lanes"):
        seen = lb.get_many(["n-1", "n-2"])
        assert not lb.stop("n-2")
    assert {rj.status for rj in seen.values()} == {"PENDING"}  # not SUCCEEDED, not RUNNING: not read
    assert "protocol version" in seen["n-1"].message and seen["n-1"].log_tail is None
    assert lanes.stop_key("n-2") not in ray.gcs.d and lanes.claim_key("n-2") not in ray.gcs.d
    assert not ray.jobs  # no host looked for or started on its account
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1 and f"lane protocol version {lanes.PROTOCOL_VERSION + 1}" in said[0]


def test_a_status_written_before_statuses_carried_a_version_is_read_as_version_1(lb, ray):
    ray.gcs.kv_put(lanes.claim_key("o-1"), HOST1.encode())
    ray.jobs[HOST1] = RayJob(HOST1, "RUNNING", None, None, 1, None, "node-1", None, {})
    ray.gcs.kv_put(lanes.status_key("o-1"), json.dumps({"status": "RUNNING", "group": "cpu", "host": HOST1}).encode())
    rj = lb.get("o-1")
    assert rj.status == "RUNNING" and rj.driver_node_id == "node-1"


def test_discard_takes_an_unclaimed_attempt_and_leaves_only_its_tombstone(lb, ray):
    lb.submit(submission_id="a-1", group="cpu", command="true", env={})
    lb.discard("a-1", group="cpu")
    assert {k: v for k, v in ray.gcs.d.items() if "a-1" in k} == {lanes.claim_key("a-1"): lanes.FORGOTTEN}
    assert not ray.gcs.kv_put(lanes.claim_key("a-1"), HOST1.encode(), overwrite=False)  # no host can take it


@pytest.mark.parametrize("status", ["SUCCEEDED", "RUNNING"])
def test_discard_of_an_item_whose_host_is_done_with_it_or_gone_deletes_every_key(lb, ray, status):
    lb.submit(submission_id="a-1", group="cpu", command="true", env={})
    ray.gcs.kv_put(lanes.claim_key("a-1"), HOST1.encode(), overwrite=False)
    ray.gcs.kv_put(lanes.status_key("a-1"), LaneStatus(status, group="cpu", host=HOST1).encode())
    ray.gcs.kv_put(lanes.logs_key("a-1"), b"out\n")
    if status == "RUNNING":
        ray.end(HOST1)  # its host's Ray job ended under it: no host will write or delete again
    lb.discard("a-1")  # the group read from its status
    assert {k: v for k, v in ray.gcs.d.items() if "a-1" in k} == {lanes.claim_key("a-1"): lanes.FORGOTTEN}


class NodesRay(Ray):
    """A cluster whose dispatcher has listed the group's nodes (``cluster_view``)."""

    def __init__(self, nodes):
        super().__init__()
        self.nodes = nodes
        self.draining: list[str] = []
        self.selectors: dict[str, dict] = {}
        self.entrypoints: dict[str, str] = {}

    def group_nodes(self, group):
        return (list(self.nodes), list(self.draining)) if group == "cpu" else ([], [])

    def submit(self, *, submission_id, entrypoint, metadata, entrypoint_label_selector, **_):
        if submission_id in self.jobs:
            raise AlreadySubmitted(submission_id)
        self.selectors[submission_id], self.entrypoints[submission_id] = entrypoint_label_selector, entrypoint
        node = entrypoint_label_selector.get("ray.io/node-id")
        self.jobs[submission_id] = RayJob(submission_id, "RUNNING", None, None, 1, None, node, None, metadata)


def test_a_host_on_each_live_node_of_the_group_pinned_to_it_and_counting_its_cpus(monkeypatch):
    monkeypatch.setattr("raylane.orchestrator.backends.lanes.HOST_CHECK_S", 0.0)
    n1, n2 = "aa11" * 14, "bb22" * 14
    ray = NodesRay([(n1, 4.0), (n2, 2.0)])
    lb = LaneBackend(ray, idle_s=5, slots=8)
    lb.submit(submission_id="a-1", group="cpu", command="true", env={}, cpus=0.5)
    h1, h2 = lanes.host_submission_id("cpu", 1, n1), lanes.host_submission_id("cpu", 1, n2)
    assert sorted(ray.jobs) == sorted([h1, h2])
    assert ray.selectors[h1] == {"ray.io/node-group": "cpu", "ray.io/node-id": n1}
    # Options a host of the first release would refuse as flags come by environment.
    assert ray.entrypoints[h1].startswith(f"RAYLANE_LANE_HOST_KEY={lanes.host_key('cpu', n1)} RAYLANE_LANE_CPUS=4 ")
    assert "RAYLANE_LANE_CPUS=2 " in ray.entrypoints[h2] and "--cpus" not in ray.entrypoints[h2]
    assert lanes.decode_item(ray.gcs.d[lanes.todo_key("cpu", "a-1")])["cpus"] == 0.5
    lb.submit(submission_id="b-1", group="cpu", command="true", env={})
    assert len(ray.jobs) == 2  # live hosts serve the next submit
    # One node's host goes (its node, or it went idle): only that one is started again.
    ray.end(h2, "SUCCEEDED", "idle: exited")
    lb.ensure_host("cpu")
    assert sorted(ray.jobs) == sorted([h1, h2, lanes.host_submission_id("cpu", 2, n2)])
    # A new node joins the group: it gets a host of its own.
    n3 = "cc33" * 14
    ray.nodes.append((n3, 4.0))
    lb.ensure_host("cpu")
    assert lanes.host_submission_id("cpu", 1, n3) in ray.jobs
    assert len(lanes.host_submission_id("a" * 64, 99, n1)) <= 128  # a 64-character group fits attempts.ray_job


def test_the_whole_groups_host_and_a_draining_nodes_host_are_retired(monkeypatch):
    """Before the group's nodes are listed one host serves it; once they are, its
    key goes (the host retires), as does the key of a node that starts draining."""
    monkeypatch.setattr("raylane.orchestrator.backends.lanes.HOST_CHECK_S", 0.0)
    ray = NodesRay([])
    lb = LaneBackend(ray, idle_s=5, slots=8)
    lb.ensure_host("cpu")
    assert ray.gcs.d[lanes.host_key("cpu")] == HOST1.encode()  # no nodes known: one for the group
    n1, n2 = "aa11" * 14, "bb22" * 14
    ray.nodes = [(n1, 4.0), (n2, 4.0)]
    lb.ensure_host("cpu")
    assert lanes.host_key("cpu") not in ray.gcs.d  # the whole group's host retires
    assert {lanes.host_key("cpu", n1), lanes.host_key("cpu", n2)} <= set(ray.gcs.d)
    ray.nodes, ray.draining = [(n1, 4.0)], [n2]
    lb.ensure_host("cpu")
    assert lanes.host_key("cpu", n2) not in ray.gcs.d and lanes.host_key("cpu", n1) in ray.gcs.d


def test_a_node_whose_hosts_fail_at_start_gets_no_new_host_every_call(monkeypatch):
    monkeypatch.setattr("raylane.orchestrator.backends.lanes.HOST_CHECK_S", 0.0)
    n1 = "aa11" * 14
    ray = NodesRay([(n1, 4.0)])
    lb = LaneBackend(ray, idle_s=5, slots=8)
    lb.ensure_host("cpu")
    first = lanes.host_submission_id("cpu", 1, n1)
    ray.jobs[first].status, ray.jobs[first].start_time, ray.jobs[first].end_time = "FAILED", 1_000, 1_500
    with pytest.raises(Exception):
        lb.ensure_host("cpu")  # its only node's host failed at start: no new one yet
    for _ in range(20):
        with pytest.raises(Exception):
            lb.ensure_host("cpu")
    assert list(ray.jobs) == [first]  # one failed start, not one more per call
    lb._start_failures[("cpu", n1)] = (1, 0.0)  # the wait is over
    lb.ensure_host("cpu")
    assert lanes.host_submission_id("cpu", 2, n1) in ray.jobs
