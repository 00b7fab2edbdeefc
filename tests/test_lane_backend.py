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
        self.records: dict[str, bytes] = {}  # Ray's job records (namespace "job"), by submission id
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

    def job_records(self, sids):
        return {sid: self.records[sid] for sid in sids if sid in self.records}

    def put_job_record(self, sid, value):
        self.records[sid] = value

    def delete_job_record(self, sid):
        self.records.pop(sid, None)


class Ray:
    """The Jobs API as LaneBackend uses it: submit once per id, get."""

    def __init__(self):
        self.gcs = Gcs()
        self.jobs: dict[str, RayJob] = {}

    def find_gcs(self):
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
    monkeypatch.setattr("raylane.orchestrator.backends.lane_hosts.HOST_CHECK_S", 0.0)  # always ask "Ray" afresh
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


def test_an_attempt_that_lost_its_host_mid_run_is_failed_in_rays_dashboard_when_forgotten(lb, ray):
    """A host killed with its node writes no end: its attempt's record in Ray's
    dashboard would say RUNNING for a day. Forgetting an attempt that did not
    succeed ends a live lane record; an ended one, a succeeded attempt's and a
    Ray job's own record are left as they are."""
    host_rec = lambda status, **kw: lanes.dashboard_record(  # noqa: E731
        {"command": "sleep 9", "meta": {"raylane_job_id": "j"}},
        LaneStatus(status, group="cpu", host=HOST1, start_time=1, **kw), node_id="node-1")
    gcs = ray.gcs
    gcs.records.update({"lost-1": host_rec("RUNNING"), "bad-1": host_rec("FAILED", end_time=2, exit_code=1),
                        "ok-1": host_rec("RUNNING"),  # its end not yet written, but it succeeded: the host writes it
                        "ray-1": json.dumps({"status": "RUNNING", "entrypoint": "python x.py",
                                             "metadata": {"raylane_job_id": "k"}}).encode()})
    before = dict(gcs.records)
    for sid in ("lost-1", "bad-1", "ray-1"):
        lb.forget(sid, group="cpu")
    lb.forget("ok-1", group="cpu", taken=True)
    lost = json.loads(gcs.records["lost-1"])
    assert lost["status"] == "FAILED" and lost["end_time"] >= lost["start_time"]
    assert HOST1 in lost["message"] and "was lost" in lost["message"]
    assert {k: v for k, v in gcs.records.items() if k != "lost-1"} == {k: v for k, v in before.items() if k != "lost-1"}


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
    monkeypatch.setattr("raylane.orchestrator.backends.lane_hosts.HOST_CHECK_S", 0.0)
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
    monkeypatch.setattr("raylane.orchestrator.backends.lane_hosts.HOST_CHECK_S", 0.0)
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
    monkeypatch.setattr("raylane.orchestrator.backends.lane_hosts.HOST_CHECK_S", 0.0)
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
    lb.hosts._start_failures[("cpu", n1, None)] = (1, 0.0)  # the wait is over
    lb.ensure_host("cpu")
    assert lanes.host_submission_id("cpu", 2, n1) in ray.jobs


# Lane envs: a job's working_dir, py_modules and pip make hosts of their own ------------


class EnvRay(NodesRay):
    """... that keeps each host's runtime env."""

    def __init__(self, nodes):
        super().__init__(nodes)
        self.runtime_envs: dict[str, dict | None] = {}

    def submit(self, *, submission_id, runtime_env=None, **kw):
        super().submit(submission_id=submission_id, **kw)
        self.runtime_envs[submission_id] = runtime_env


PKG_A = {"working_dir": "raylane://packages/" + "a1" * 32}
PKG_B = {"working_dir": "raylane://packages/" + "b2" * 32, "pip": ["emoji"]}


def to_ray(env):  # the dispatcher's: an uploaded package becomes Ray's URI of it
    return {**env, "working_dir": env["working_dir"].replace("raylane://packages/", "gcs://_ray_pkg_") + ".zip"}


def test_jobs_of_one_runtime_env_share_hosts_started_in_it_apart_from_other_envs(monkeypatch):
    monkeypatch.setattr("raylane.orchestrator.backends.lane_hosts.HOST_CHECK_S", 0.0)
    n1 = "aa11" * 14
    ray = EnvRay([(n1, 4.0)])
    lb = LaneBackend(ray, idle_s=5, slots=8, to_ray_env=to_ray)
    ka, kb = lanes.env_key(PKG_A), lanes.env_key(PKG_B)
    lb.submit(submission_id="a-1", group="cpu", command="true", env={}, lane_env=ka, runtime_env=PKG_A)
    lb.submit(submission_id="a2-1", group="cpu", command="true", env={}, lane_env=ka, runtime_env=PKG_A)
    lb.submit(submission_id="b-1", group="cpu", command="true", env={}, lane_env=kb, runtime_env=PKG_B)
    lb.submit(submission_id="c-1", group="cpu", command="true", env={})
    ha, hb, hc = (lanes.host_submission_id("cpu", 1, n1, ka), lanes.host_submission_id("cpu", 1, n1, kb),
                  lanes.host_submission_id("cpu", 1, n1))
    assert sorted(ray.jobs) == sorted([ha, hb, hc])  # one host per env on the node, the node's own env's apart
    assert ray.runtime_envs[ha] == {"working_dir": "gcs://_ray_pkg_" + "a1" * 32 + ".zip"}
    assert ray.runtime_envs[hb]["pip"] == ["emoji"] and ray.runtime_envs[hc] is None
    assert f"RAYLANE_LANE_ENV={ka} " in ray.entrypoints[ha] and "RAYLANE_LANE_IN_WORKING_DIR=1 " in ray.entrypoints[ha]
    assert "RAYLANE_LANE_ENV" not in ray.entrypoints[hc]
    # An env's host is a module a node of an older package has not got: there it fails at start, rather than
    # ignore the env and take the node's own environment's items in this env's code.
    assert f" python -m {lanes.ENV_HOST_MODULE} --group cpu " in ray.entrypoints[ha]
    assert f" python -m {lanes.HOST_MODULE} --group cpu " in ray.entrypoints[hc]
    assert ray.jobs[ha].metadata["raylane_lane_env"] == ka
    # Each env's items are queued where its hosts (and only they) look.
    assert lanes.todo_key("cpu", "a-1", ka) in ray.gcs.d and lanes.todo_key("cpu", "a-1") not in ray.gcs.d
    assert lanes.todo_key("cpu", "c-1") in ray.gcs.d
    assert ray.gcs.d[lanes.host_key("cpu", n1, ka)] == ha.encode()
    assert LaneStatus.decode(ray.gcs.d[lanes.status_key("b-1")]).env == kb
    # A stop before a host takes it removes the item from its env's queue.
    assert lb.stop("a2-1") and lanes.todo_key("cpu", "a2-1", ka) not in ray.gcs.d
    # ... and an outcome's forget, a late redispatch's re-put item with it.
    ray.gcs.kv_put(lanes.todo_key("cpu", "b-1", kb), b"{}")
    lb.forget("b-1", group="cpu", lane_env=kb)
    assert lanes.todo_key("cpu", "b-1", kb) not in ray.gcs.d


def test_a_restarted_control_plane_starts_an_envs_host_from_its_record(monkeypatch):
    monkeypatch.setattr("raylane.orchestrator.backends.lane_hosts.HOST_CHECK_S", 0.0)
    n1 = "aa11" * 14
    ray = EnvRay([(n1, 4.0)])
    ka = lanes.env_key(PKG_A)
    LaneBackend(ray, idle_s=5, slots=8, to_ray_env=to_ray).submit(
        submission_id="a-1", group="cpu", command="true", env={}, lane_env=ka, runtime_env=PKG_A)
    ha = lanes.host_submission_id("cpu", 1, n1, ka)
    ray.end(ha, "SUCCEEDED", "idle: exited")
    fresh = LaneBackend(ray, idle_s=5, slots=8, to_ray_env=to_ray)  # knows no env but what Ray's store holds
    assert fresh.get("a-1").status == "PENDING"
    h2 = lanes.host_submission_id("cpu", 2, n1, ka)
    assert ray.runtime_envs[h2] == ray.runtime_envs[ha] and ray.jobs[h2].status == "RUNNING"


def test_at_most_max_envs_of_a_group_keep_hosts_the_oldest_retires(monkeypatch):
    monkeypatch.setattr("raylane.orchestrator.backends.lane_hosts.HOST_CHECK_S", 0.0)
    monkeypatch.setattr("raylane.orchestrator.backends.lane_hosts.ENV_HOLD_S", 0.0)  # each env here is idle at once
    n1 = "aa11" * 14
    ray = EnvRay([(n1, 4.0)])
    lb = LaneBackend(ray, idle_s=60, slots=8, max_envs=2, to_ray_env=lambda e: e)
    envs = [{"working_dir": f"s3://b/code-{i}.zip"} for i in range(3)]
    keys = [lanes.env_key(e) for e in envs]
    for i, (e, k) in enumerate(zip(envs, keys)):
        lb.submit(submission_id=f"j{i}-1", group="cpu", command="true", env={}, lane_env=k, runtime_env=e)
    def named(k):
        return ray.gcs.d[lanes.host_key("cpu", n1, k)]

    # The third env's hosts made three: the first env's host is named no more (it retires, and exits when idle).
    h0 = lanes.host_submission_id("cpu", 1, n1, keys[0])
    assert named(keys[0]) == b"retired:" + h0.encode()
    assert [named(k) for k in keys[1:]] == [lanes.host_submission_id("cpu", 1, n1, k).encode() for k in keys[1:]]
    # Its waiting item is not lost: the env is wanted again, a new host starts for it (the retired one
    # takes nothing more), and the env wanted longest ago of the others gives way.
    lb.get_many(["j0-1"])
    assert named(keys[0]) == lanes.host_submission_id("cpu", 2, n1, keys[0]).encode()
    assert named(keys[1]).startswith(b"retired:") and not named(keys[2]).startswith(b"retired:")


def test_more_envs_with_work_than_max_envs_keep_their_hosts_instead_of_retiring_each_other(monkeypatch):
    """Three envs each with a job a second and room for two: retiring the one
    wanted longest ago at each look started a host (and set up its env) per job."""
    monkeypatch.setattr("raylane.orchestrator.backends.lane_hosts.HOST_CHECK_S", 0.0)
    n1 = "aa11" * 14
    ray = EnvRay([(n1, 4.0)])
    lb = LaneBackend(ray, idle_s=60, slots=8, max_envs=2, to_ray_env=lambda e: e)
    envs = [{"working_dir": f"s3://b/code-{i}.zip"} for i in range(3)]
    for n in range(4):  # rounds of one job per env
        for i, e in enumerate(envs):
            lb.submit(submission_id=f"j{i}-{n}", group="cpu", command="true", env={}, lane_env=lanes.env_key(e),
                      runtime_env=e)
    assert len(ray.jobs) == 3  # one host per env, started once
    assert not any(v.startswith(b"retired:") for k, v in ray.gcs.d.items() if "/host/" in k)


def test_an_env_ray_cannot_set_up_fails_its_waiting_jobs_as_a_ray_job_in_it_would(monkeypatch):
    from raylane.orchestrator.domain.states import FailureCause
    from raylane.orchestrator.loops.classify import classify

    monkeypatch.setattr("raylane.orchestrator.backends.lane_hosts.HOST_CHECK_S", 0.0)
    n1 = "aa11" * 14
    ray = EnvRay([(n1, 4.0)])
    lb = LaneBackend(ray, idle_s=5, slots=8, to_ray_env=lambda e: e)
    bad = {"pip": ["no-such-package-anywhere==9.9"]}
    kb = lanes.env_key(bad)
    lb.submit(submission_id="a-1", group="cpu", command="true", env={}, lane_env=kb, runtime_env=bad)
    hb = lanes.host_submission_id("cpu", 1, n1, kb)
    job = ray.jobs[hb]
    job.status, job.error_type, job.start_time, job.end_time = "FAILED", "RUNTIME_ENV_SETUP_FAILURE", 1_000, 3_000
    job.message = "Failed to set up runtime environment: pip install failed: No matching distribution"
    rj = lb.get("a-1")
    assert rj.status == "FAILED" and rj.error_type == "RUNTIME_ENV_SETUP_FAILURE"
    assert "No matching distribution" in rj.message and kb in rj.message
    cause, _ = classify(rj, {})
    assert cause == FailureCause.RUNTIME_ENV
    assert lanes.todo_key("cpu", "a-1", kb) not in ray.gcs.d  # taken: no host runs it later
    assert list(ray.jobs) == [hb]  # and no new host every pass meanwhile


def _setup_failed(job, *, took_ms=3_000):
    job.status, job.error_type, job.start_time, job.end_time = "FAILED", "RUNTIME_ENV_SETUP_FAILURE", 1_000, 1_000 + took_ms
    job.message = "Failed to set up runtime environment: pip install failed: No matching distribution"


def test_one_nodes_failed_env_setup_fails_nothing_while_another_nodes_host_of_the_env_runs(monkeypatch):
    """A pip index that timed out on one node is that node's trouble: the group's
    other host of the env runs the env's jobs, and none of them fails."""
    monkeypatch.setattr("raylane.orchestrator.backends.lane_hosts.HOST_CHECK_S", 0.0)
    n1, n2 = "aa11" * 14, "bb22" * 14
    ray = EnvRay([(n1, 4.0), (n2, 4.0)])
    lb = LaneBackend(ray, idle_s=5, slots=8, to_ray_env=lambda e: e)
    kb = lanes.env_key(PKG_B)
    lb.submit(submission_id="a-1", group="cpu", command="true", env={}, lane_env=kb, runtime_env=PKG_B)
    h1, h2 = lanes.host_submission_id("cpu", 1, n1, kb), lanes.host_submission_id("cpu", 1, n2, kb)
    assert {h1, h2} <= set(ray.jobs)
    _setup_failed(ray.jobs[h2])
    for _ in range(3):
        rj = lb.get("a-1")
        assert rj.status == "PENDING", rj.message  # n1's host takes it
    assert lanes.todo_key("cpu", "a-1", kb) in ray.gcs.d
    # Once no host of the env runs anywhere in the group, its waiting items fail.
    _setup_failed(ray.jobs[h1])
    assert lb.get("a-1").status == "FAILED"


def test_an_env_setup_that_fails_after_minutes_is_a_failed_start_too(monkeypatch):
    """A pip install that gives up after 95 s failed the host's start all the same:
    no new host (and install) at every look, and the env's waiting items fail."""
    monkeypatch.setattr("raylane.orchestrator.backends.lane_hosts.HOST_CHECK_S", 0.0)
    n1 = "aa11" * 14
    ray = EnvRay([(n1, 4.0)])
    lb = LaneBackend(ray, idle_s=5, slots=8, to_ray_env=lambda e: e)
    kb = lanes.env_key(PKG_B)
    lb.submit(submission_id="a-1", group="cpu", command="true", env={}, lane_env=kb, runtime_env=PKG_B)
    hb = lanes.host_submission_id("cpu", 1, n1, kb)
    _setup_failed(ray.jobs[hb], took_ms=95_000)
    for _ in range(5):
        lb.get_many(["a-1"])
    assert list(ray.jobs) == [hb]
    assert lb.get("a-1").error_type == "RUNTIME_ENV_SETUP_FAILURE"


def test_a_refused_lane_submit_leaves_nothing_a_host_could_run(monkeypatch):
    """The dispatcher records a refused submit FAILED (it may retry it as the next
    attempt): the refused attempt's item must not stay for a later host to run."""
    from raylane.orchestrator.backends.ray_jobs import PackageMissing

    monkeypatch.setattr("raylane.orchestrator.backends.lane_hosts.HOST_CHECK_S", 0.0)
    ray = EnvRay([("aa11" * 14, 4.0)])

    def gone(env):
        raise PackageMissing("package aaaa is no longer stored; upload it again and resubmit")

    lb = LaneBackend(ray, idle_s=5, slots=8, to_ray_env=gone)
    ka = lanes.env_key(PKG_A)
    with pytest.raises(PackageMissing):
        lb.submit(submission_id="a-1", group="cpu", command="true", env={"SECRET": "x"}, lane_env=ka,
                  runtime_env=PKG_A)
    assert lanes.todo_key("cpu", "a-1", ka) not in ray.gcs.d and lanes.status_key("a-1") not in ray.gcs.d
    assert not ray.gcs.kv_put(lanes.claim_key("a-1"), b"raylane-lane-v1-cpu-x-1", overwrite=False)
    assert not ray.jobs


def test_an_env_no_host_can_be_started_in_fails_its_items_and_the_pass_goes_on(monkeypatch):
    """A package gone from the store after its jobs were queued: the reconciler's
    read of every live attempt still answers (the other attempts are followed),
    and the env's waiting items fail as a Ray job in it would have been refused."""
    from raylane.orchestrator.backends.ray_jobs import PackageMissing

    monkeypatch.setattr("raylane.orchestrator.backends.lane_hosts.HOST_CHECK_S", 0.0)
    n1 = "aa11" * 14
    ray = EnvRay([(n1, 4.0)])
    stored = {"yes": True}

    def to_ray(env):
        if not stored["yes"]:
            raise PackageMissing("package a1a1 is no longer stored; upload it again and resubmit")
        return env

    lb = LaneBackend(ray, idle_s=5, slots=8, to_ray_env=to_ray)
    ka = lanes.env_key(PKG_A)
    lb.submit(submission_id="a-1", group="cpu", command="true", env={}, lane_env=ka, runtime_env=PKG_A)
    lb.submit(submission_id="c-1", group="cpu", command="true", env={})
    ray.end(lanes.host_submission_id("cpu", 1, n1, ka), "SUCCEEDED", "idle: exited")
    stored["yes"] = False
    got = lb.get_many(["a-1", "c-1"])
    assert got["c-1"].status == "PENDING"
    assert got["a-1"].status == "FAILED" and got["a-1"].error_type == "RUNTIME_ENV_SETUP_FAILURE"
    assert "no longer stored" in got["a-1"].message


def test_an_env_key_that_names_another_envs_record_is_refused(monkeypatch):
    monkeypatch.setattr("raylane.orchestrator.backends.lane_hosts.HOST_CHECK_S", 0.0)
    from raylane.orchestrator.backends.lane_hosts import LaneEnvConflict

    ray = EnvRay([("aa11" * 14, 4.0)])
    ka = lanes.env_key(PKG_A)
    assert len(ka) == 32  # 128 bits: no made-to-match env
    LaneBackend(ray, idle_s=5, slots=8, to_ray_env=lambda e: e).submit(
        submission_id="a-1", group="cpu", command="true", env={}, lane_env=ka, runtime_env=PKG_A)
    record = ray.gcs.d[lanes.env_record_key(ka)]
    # Another replica (or the same) asked to file other code under that key: refused, the record kept.
    for lb in (LaneBackend(ray, idle_s=5, slots=8, to_ray_env=lambda e: e),):
        with pytest.raises(LaneEnvConflict):
            lb.submit(submission_id="x-1", group="cpu", command="true", env={}, lane_env=ka, runtime_env=PKG_B)
        with pytest.raises(LaneEnvConflict):  # and again, once it knows the record
            lb.submit(submission_id="x-2", group="cpu", command="true", env={}, lane_env=ka, runtime_env=PKG_B)
    assert ray.gcs.d[lanes.env_record_key(ka)] == record
    assert lanes.todo_key("cpu", "x-1", ka) not in ray.gcs.d


def test_an_ended_attempts_result_is_read_with_its_log_tail_in_one_call(lb, ray):
    from raylane.orchestrator.domain import protocol

    for sid in ("fn-1", "none-1", "bad-1"):
        lb.submit(submission_id=sid, group="cpu", command="json:dumps", env={}, args={"obj": 1})
        ray.gcs.kv_put(lanes.claim_key(sid), HOST1.encode(), overwrite=False)
    ray.gcs.kv_put(lanes.status_key("fn-1"), LaneStatus("SUCCEEDED", group="cpu", host=HOST1, exit_code=0).encode())
    ray.gcs.kv_put(protocol.result_key("fn-1"), protocol.encode_result({"value": "1"}))
    ray.gcs.kv_put(lanes.logs_key("fn-1"), b"out\n")
    ray.gcs.kv_put(lanes.status_key("none-1"), LaneStatus("SUCCEEDED", group="cpu", host=HOST1, exit_code=0).encode())
    ray.gcs.kv_put(lanes.status_key("bad-1"), LaneStatus("FAILED", group="cpu", host=HOST1, exit_code=1).encode())
    before = ray.gcs.multi_gets
    got = lb.get_many(["fn-1", "none-1", "bad-1"])
    assert ray.gcs.multi_gets - before == 2  # the statuses, then the tails and results together
    assert got["fn-1"].result == (True, {"value": "1"}) and got["fn-1"].log_tail == "out\n"
    assert got["none-1"].result == (True, None)  # read, and there was none: not asked again
    assert got["bad-1"].result is None  # a failure reports no result
    # A result that is not JSON (no runner of ours wrote it) is no result, and stops no other attempt's pass.
    for sid in ("junk-1", "ok-1"):
        lb.submit(submission_id=sid, group="cpu", command="json:dumps", env={}, args={"obj": 1})
        ray.gcs.kv_put(lanes.claim_key(sid), HOST1.encode(), overwrite=False)
        ray.gcs.kv_put(lanes.status_key(sid), LaneStatus("SUCCEEDED", group="cpu", host=HOST1, exit_code=0).encode())
    ray.gcs.kv_put(protocol.result_key("junk-1"), b"{")
    ray.gcs.kv_put(protocol.result_key("ok-1"), protocol.encode_result({"value": "2"}))
    got = lb.get_many(["junk-1", "ok-1"])
    assert got["junk-1"].result == (True, None) and got["ok-1"].result == (True, {"value": "2"})


class Clock:
    """``time`` as backends.lanes reads it, with a monotonic clock the test moves."""

    def __init__(self):
        import time as _time

        self._time, self.t = _time, 1_000.0

    def monotonic(self):
        return self.t

    def time(self):
        return self._time.time()


def test_what_a_long_running_control_plane_remembers_stays_bounded_as_nodes_hosts_and_envs_come_and_go(
        monkeypatch):
    """Months of spot churn: every node lives a while and goes, some hosts fail at
    start, every job ships a new package. What the backend keeps in memory is what
    its current hosts, nodes and envs need, not an entry per host ever started."""
    from raylane.orchestrator.backends import lane_hosts, lanes as backend

    clock = Clock()
    monkeypatch.setattr(backend, "time", clock)
    monkeypatch.setattr(lane_hosts, "time", clock)
    monkeypatch.setattr(lane_hosts, "MEMO_MAX", 10)
    ray = EnvRay([])
    lb = LaneBackend(ray, idle_s=5, slots=8, to_ray_env=to_ray)
    for i in range(120):
        node = f"{i:04x}" * 14
        ray.nodes = [(node, 4.0)]
        env = {"working_dir": f"raylane://packages/{i:064x}"}
        lb.submit(submission_id=f"j{i}-1", group="cpu", command="true", env={}, lane_env=lanes.env_key(env),
                  runtime_env=env)
        lb.ensure_host("cpu")
        if i % 2:  # this node's host of the node's own env fails at start: counted, its next start waits
            first = ray.jobs[lanes.host_submission_id("cpu", 1, node)]
            first.status, first.start_time, first.end_time = "FAILED", 1_000, 1_500
            clock.t += 2.0  # past HOST_CHECK_S: Ray is asked again
            with pytest.raises(Exception):
                lb.ensure_host("cpu")
        clock.t += 120.0  # the node is reclaimed; the next one joins
    assert len(ray.jobs) >= 240  # a host per node and env was started and is remembered by Ray, not here
    pool = lb.hosts
    assert len(pool._hosts) <= 4 and len(pool._live_host) <= 4
    assert len(pool._start_failures) <= 2 and len(pool._env_broken) <= 2
    assert len(pool._counted_failures) <= 10 + 1 and len(pool._envs) <= 10 + 1


def test_a_database_error_starting_an_envs_host_fails_no_job_and_the_host_starts_later(monkeypatch):
    """Reading the env's package from the database failed (SQLite busy, PostgreSQL
    failing over): that is no fault of the env's, so no job of it is refused or
    failed; its items wait, and the next look starts the host. (The dispatcher's
    ``to_ray_env`` says so with ``StoreFailed``: the lanes import no store.)"""
    from raylane.orchestrator.domain.errors import StoreFailed

    monkeypatch.setattr("raylane.orchestrator.backends.lane_hosts.HOST_CHECK_S", 0.0)
    n1 = "aa11" * 14
    ray = EnvRay([(n1, 4.0)])
    db_up = {"yes": False}

    def to_ray(env):
        if not db_up["yes"]:
            raise StoreFailed("(sqlite3.OperationalError) database is locked")
        return env

    lb = LaneBackend(ray, idle_s=5, slots=8, to_ray_env=to_ray)
    ka = lanes.env_key(PKG_A)
    lb.submit(submission_id="a-1", group="cpu", command="true", env={}, lane_env=ka, runtime_env=PKG_A)  # no raise
    assert lanes.todo_key("cpu", "a-1", ka) in ray.gcs.d and lanes.claim_key("a-1") not in ray.gcs.d
    assert not ray.jobs
    assert lb.get_many(["a-1"])["a-1"].status == "PENDING"  # still down: it waits, nothing failed
    assert lanes.claim_key("a-1") not in ray.gcs.d
    db_up["yes"] = True
    assert lb.get_many(["a-1"])["a-1"].status == "PENDING"
    assert lanes.host_submission_id("cpu", 1, n1, ka) in ray.jobs
