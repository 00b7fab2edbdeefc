"""How Raylane reads Ray's node list: a node seen draining stays known as
drained after it dies, its labels outlive it, and nothing is remembered of a
node once Ray stops listing it (a long-lived control plane must not grow). A
submission's Ray job id, wanted each pass while a node drains, is asked once
and kept, a bounded number of them."""

from __future__ import annotations

import httpx

from raylane.orchestrator.backends import ray_jobs
from raylane.orchestrator.backends.ray_jobs import RayJobsBackend
from raylane.orchestrator.testing import MemoryGcs


def _node(nid, state="ALIVE", labels=None):
    return {"raylet": {"nodeId": nid, "state": state, "labels": labels or {}, "resourcesTotal": {"CPU": 1}}}


def test_drained_and_labels_outlive_a_node_until_ray_forgets_it():
    listed = []
    gcs = MemoryGcs()
    backend = RayJobsBackend("http://ray.invalid", gcs=gcs)
    backend.draining_ttl_s = 0  # every listing asks the GCS afresh here
    backend.http = httpx.Client(base_url="http://ray.invalid", transport=httpx.MockTransport(
        lambda req: httpx.Response(200, json={"data": {"summary": list(listed)}})))
    spot = {"ray.io/node-group": "spot-cpu", "ray.io/market-type": "spot"}

    listed[:] = [_node("a", labels=spot), _node("b")]
    gcs.draining = {"a"}
    (a, b) = backend.nodes()
    assert a.draining and a.drained and not b.draining and a.group == "spot-cpu"

    # The drained node dies: Ray drops its labels, Raylane still knows what it was.
    listed[:] = [_node("a", state="DEAD"), _node("b")]
    gcs.draining = set()
    (a, _) = backend.nodes()
    assert a.state == "DEAD" and a.drained and not a.draining and a.market == "spot"

    # Ray no longer lists it: nothing of it is kept.
    listed[:] = [_node("b")]
    backend.nodes()
    assert "a" not in backend._drained and "a" not in backend._labels

    # A caller that just asked the GCS passes what it got: no second call.
    calls = gcs.calls["draining_nodes"]
    gcs.draining = {"b"}
    (b,) = backend.nodes(draining=backend.draining())
    assert b.draining and gcs.calls["draining_nodes"] == calls + 1


def test_one_gcs_answer_serves_every_caller_for_a_second_and_an_unreachable_gcs_is_left_alone(monkeypatch):
    now = [1000.0]
    monkeypatch.setattr(ray_jobs.time, "monotonic", lambda: now[0])
    gcs = MemoryGcs()
    backend = RayJobsBackend("http://ray.invalid", gcs=gcs)
    gcs.draining = {"a"}
    assert backend.draining() == {"a"} and backend.draining() == {"a"} and gcs.calls["draining_nodes"] == 1
    now[0] += ray_jobs.DRAINING_TTL_S
    gcs.draining = set()
    assert backend.draining() == set() and gcs.calls["draining_nodes"] == 2

    gcs.down = True  # the GCS cannot be reached: no drain known, and no call until the backoff ends
    now[0] += ray_jobs.DRAINING_TTL_S
    assert backend.draining() == set() and gcs.calls["draining_nodes"] == 3
    now[0] += ray_jobs.GCS_BACKOFF_S - 0.1
    assert backend.draining() == set() and gcs.calls["draining_nodes"] == 3
    now[0] += 0.1
    gcs.down, gcs.draining = False, {"b"}
    assert backend.draining() == {"b"} and gcs.calls["draining_nodes"] == 4


def test_ray_job_ids_are_asked_of_the_jobs_api_once_each_and_kept_bounded(monkeypatch):
    """While a node drains the reconciler needs each running attempt's Ray job id
    every pass; it never changes, so the Jobs API is asked once per submission."""
    asked: list[str] = []

    def jobs_api(req):
        sid = req.url.path.rsplit("/", 1)[-1]
        asked.append(sid)
        if sid == "not-started":  # its driver has not started: no Ray job id yet
            return httpx.Response(200, json={"submission_id": sid, "job_id": None, "status": "PENDING"})
        return httpx.Response(200, json={"submission_id": sid, "job_id": f"0{len(sid)}000000", "status": "RUNNING"})

    monkeypatch.setattr(ray_jobs, "RAY_JOB_IDS_KEPT", 2)
    backend = RayJobsBackend("http://ray.invalid")
    backend.http = httpx.Client(base_url="http://ray.invalid", transport=httpx.MockTransport(jobs_api))
    assert [backend.ray_job_id("a") for _ in range(3)] == ["01000000"] * 3
    assert asked == ["a"]
    assert backend.ray_job_id("not-started") is None and backend.ray_job_id("not-started") is None
    assert asked == ["a", "not-started", "not-started"]  # unknown yet: asked again next time
    backend.ray_job_id("bb")
    backend.ray_job_id("a")  # asked last: kept over bb
    backend.ray_job_id("ccc")  # one more than RAY_JOB_IDS_KEPT: the least recently asked (bb) goes
    assert list(backend._ray_job_ids) == ["a", "ccc"]
    asked.clear()
    backend.ray_job_id("a"), backend.ray_job_id("ccc"), backend.ray_job_id("bb")
    assert asked == ["bb"]


def test_a_pass_read_through_the_gcs_carries_the_ray_job_ids_already_known():
    class JobsGcs(MemoryGcs):
        def job_records(self, sids):
            return {sid: b'{"status": "RUNNING"}' for sid in sids}

    backend = RayJobsBackend("http://ray.invalid", gcs=JobsGcs())
    backend.http = httpx.Client(base_url="http://ray.invalid", transport=httpx.MockTransport(
        lambda req: httpx.Response(200, json={"submission_id": "a", "job_id": "02000000", "status": "RUNNING"})))
    assert backend.get_many(["a"])["a"].ray_job_id is None  # not known yet
    assert backend.ray_job_id("a") == "02000000"
    seen = backend.get_many(["a", "b"])
    assert seen["a"].ray_job_id == "02000000" and seen["b"].ray_job_id is None


def test_a_pass_decodes_only_the_job_records_that_changed_since_the_last(monkeypatch):
    """The reconciler reads every live attempt's record every 20 ms: one unchanged
    since the last read is not decoded again (the same RayJob), a changed one is,
    and what is kept is the last read's ids only."""
    from raylane.orchestrator.backends import ray_jobs

    records = {"a": b'{"status": "RUNNING"}', "b": b'{"status": "PENDING"}'}

    class JobsGcs(MemoryGcs):
        def job_records(self, sids):
            return {sid: records[sid] for sid in sids if sid in records}

    decoded = []
    real = ray_jobs.RayJob.from_json.__func__
    monkeypatch.setattr(ray_jobs.RayJob, "from_json", classmethod(lambda cls, d: decoded.append(d) or real(cls, d)))
    backend = RayJobsBackend("http://ray.invalid", gcs=JobsGcs())
    first = backend.get_many(["a", "b", "gone"])
    assert (first["a"].status, first["b"].status, first["gone"]) == ("RUNNING", "PENDING", None)
    assert len(decoded) == 2
    records["b"] = b'{"status": "SUCCEEDED", "driver_exit_code": 0}'
    second = backend.get_many(["a", "b"])
    assert second["a"] is first["a"] and second["b"].status == "SUCCEEDED" and second["b"].driver_exit_code == 0
    assert len(decoded) == 3  # b's new record only
    backend.get_many(["b"])
    assert set(backend._decoded) == {"b"}  # a ended: its record is no longer kept
    backend.get_many(["a"])
    assert len(decoded) == 4  # ... and is decoded again if asked again


def test_nodes_come_from_the_gcs_while_ray_is_reachable_and_from_the_dashboard_otherwise():
    """One GCS call a listing, drains in it; the dashboard without an answer from
    the GCS, and during an outage (a GCS that answers must not end an outage of the
    dashboard that submits go to, on every pass)."""
    http_calls = []
    gcs = MemoryGcs()
    backend = RayJobsBackend("http://ray.invalid", gcs=gcs)
    backend.draining_ttl_s = 3600  # no expiry between the calls below
    backend.http = httpx.Client(base_url="http://ray.invalid", transport=httpx.MockTransport(
        lambda req: http_calls.append(req.url.path) or httpx.Response(
            200, json={"data": {"summary": [_node("d")]}} if "nodes" in req.url.path else {})))
    gcs.node_table = [_node("g", labels={"ray.io/node-group": "spot-cpu"})["raylet"], _node("h")["raylet"]]
    gcs.draining = {"g"}

    assert [n.node_id for n in backend.nodes()] == ["d"]  # not known reachable yet: the dashboard
    assert http_calls == ["/nodes"] and gcs.calls["draining_nodes"] == 1  # and the GCS for its drains
    backend.cluster_view()  # a listing that worked: Ray is reachable
    http_calls.clear()
    g, h = backend.nodes()
    assert (g.node_id, g.draining, g.drained, g.group, h.draining) == ("g", True, True, "spot-cpu", False)
    # One GCS call: no dashboard, no call of its own for the drains, which it also caches.
    assert http_calls == [] and gcs.calls["all_nodes"] == 1 and gcs.calls["draining_nodes"] == 1
    assert backend.draining() == {"g"} and gcs.calls["draining_nodes"] == 1
    assert backend.cluster_view()["spot-cpu"].draining_nodes == 1 and http_calls == []
    # What each alive node has free, when the GCS said it, reaches the node and its group's view.
    gcs.node_table[1] = {**gcs.node_table[1], "labels": {"ray.io/node-group": "gpu"},
                         "resourcesTotal": {"CPU": 4.0, "GPU": 2.0}, "resourcesAvailable": {"CPU": 3.0}}
    assert backend.nodes()[1].resources_available == {"CPU": 3.0}
    assert backend.cluster_view()["gpu"].node_free == [{"CPU": 3.0, "GPU": 0.0}]
    assert backend.nodes()[0].resources_available is None  # (g: not said)

    gcs.down = True  # the GCS does not answer: the dashboard does
    assert [n.node_id for n in backend.nodes()] == ["d"] and http_calls == ["/nodes"]
    gcs.down = False
    backend.reachability.down("a submit failed")  # an outage: the dashboard is asked, and ends it
    http_calls.clear()
    assert [n.node_id for n in backend.nodes()] == ["d"] and http_calls == ["/nodes"]


def test_a_failing_gcs_listing_backs_off_and_a_dashboard_not_seen_lately_is_asked(monkeypatch, caplog):
    """A GCS that fails to list (unreachable, or an answer this Ray cannot read) is
    left alone for GCS_BACKOFF_S, said once; and nodes come from the GCS only while
    the dashboard was seen answering within DASHBOARD_CHECK_S: a dashboard that
    died while the GCS lives is noticed by the next listing."""
    import logging

    now = [1000.0]
    monkeypatch.setattr(ray_jobs.time, "monotonic", lambda: now[0])
    monkeypatch.setattr("raylane.orchestrator.backends.reachability.time.monotonic", lambda: now[0])

    class BrokenGcs(MemoryGcs):
        listings = 0
        fail = True

        def all_nodes(self):
            self.listings += 1
            if self.fail:
                raise ValueError("an enum value these protos do not know")
            return [{"nodeId": "g", "state": "ALIVE", "labels": {}, "resourcesTotal": {}}], set()

    http = []
    gcs = BrokenGcs()
    backend = RayJobsBackend("http://ray.invalid", gcs=gcs)
    backend.http = httpx.Client(base_url="http://ray.invalid", transport=httpx.MockTransport(
        lambda req: http.append(1) or httpx.Response(200, json={"data": {"summary": [_node("d")]}})))
    backend.cluster_view()  # the dashboard answered (and the GCS its drains)
    drain_calls = gcs.calls["draining_nodes"]
    with caplog.at_level(logging.WARNING, logger="raylane"):
        # The dashboard's list instead, and the GCS is not asked for the drains either.
        assert [n.node_id for n in backend.nodes()] == ["d"] and gcs.listings == 1 and gcs.calls["draining_nodes"] == drain_calls
        now[0] += 1
        backend.nodes()
        assert gcs.listings == 1  # backing off: not asked again
    assert len([r for r in caplog.records if "through its GCS failed" in r.getMessage()]) == 1
    now[0] += ray_jobs.GCS_BACKOFF_S
    gcs.fail = False
    backend.cluster_view()  # the backoff's end is past the dashboard check too: the dashboard first
    calls = len(http)
    assert [n.node_id for n in backend.nodes()] == ["g"] and len(http) == calls  # then the GCS
    now[0] += ray_jobs.DASHBOARD_CHECK_S  # the dashboard not seen since: asked again, and refreshed
    backend.cluster_view()
    assert len(http) == calls + 1
    backend.cluster_view()
    assert len(http) == calls + 1 and gcs.listings == 3


def test_the_gcs_node_table_reads_as_the_dashboard_list():
    """RayGcs.all_nodes on a reply as the GCS gives it: alive, draining, dead with
    its reason (named; one these protos do not know, as its number)."""
    from ray.core.generated import common_pb2, gcs_pb2, gcs_service_pb2

    from raylane.orchestrator.backends.ray_gcs import RayGcs

    alive, dead = gcs_pb2.GcsNodeInfo.GcsNodeState.ALIVE, gcs_pb2.GcsNodeInfo.GcsNodeState.DEAD
    reply = gcs_service_pb2.GetAllNodeInfoReply(node_info_list=[
        gcs_pb2.GcsNodeInfo(node_id=bytes.fromhex("aa" * 28), state=alive, is_head_node=True,
                            labels={"ray.io/node-group": "head"}, resources_total={"CPU": 0.0}),
        gcs_pb2.GcsNodeInfo(node_id=bytes.fromhex("bb" * 28), state=alive, resources_total={"CPU": 4.0},
                            state_snapshot=gcs_pb2.NodeSnapshot(state=gcs_pb2.NodeSnapshot.State.DRAINING)),
        gcs_pb2.GcsNodeInfo(node_id=bytes.fromhex("cc" * 28), state=dead, death_info=common_pb2.NodeDeathInfo(
            reason=common_pb2.NodeDeathInfo.Reason.AUTOSCALER_DRAIN_PREEMPTED, reason_message="preempted")),
        gcs_pb2.GcsNodeInfo(node_id=bytes.fromhex("dd" * 28), state=dead,
                            death_info=common_pb2.NodeDeathInfo(reason=99)),
    ])
    # What the GCS's resource manager says each alive node has free: a resource none of
    # which is free is left out (node bb's GPUs); the dead nodes are not in it.
    free = gcs_service_pb2.GetAllAvailableResourcesReply(resources_list=[
        gcs_pb2.AvailableResources(node_id=bytes.fromhex("aa" * 28), resources_available={"CPU": 0.0}),
        gcs_pb2.AvailableResources(node_id=bytes.fromhex("bb" * 28), resources_available={"CPU": 3.0}),
    ])
    gcs = RayGcs.__new__(RayGcs)
    gcs._available_after = 0.0
    gcs._call = lambda fn, request: free if isinstance(request, gcs_service_pb2.GetAllAvailableResourcesRequest) \
        else reply
    gcs._nodes = type("Stub", (), {"GetAllNodeInfo": None})()
    gcs._resources = type("Stub", (), {"GetAllAvailableResources": None})()
    nodes, draining = gcs.all_nodes()
    assert draining == {"bb" * 28}
    assert [n.get("resourcesAvailable") for n in nodes] == [{"CPU": 0.0}, {"CPU": 3.0}, None, None]
    assert [(n["nodeId"][:2], n["state"], n["isHeadNode"], n["deathInfo"].get("reason")) for n in nodes] == [
        ("aa", "ALIVE", True, None), ("bb", "ALIVE", False, None),
        ("cc", "DEAD", False, "AUTOSCALER_DRAIN_PREEMPTED"), ("dd", "DEAD", False, "99")]
    assert nodes[0]["labels"] == {"ray.io/node-group": "head"} and nodes[1]["resourcesTotal"] == {"CPU": 4.0}
    assert nodes[2]["deathInfo"]["reasonMessage"] == "preempted"


def test_a_groups_view_has_each_nodes_free_resources_only_when_ray_said_them_for_every_node():
    from raylane.orchestrator.domain.profile import default_profile
    from raylane.orchestrator.testing import FakeRay

    ray = FakeRay(default_profile())
    first = ray.node_ids("gpu")[0]
    second = ray.add_node("gpu")
    assert ray.cluster_view()["gpu"].node_free is None  # the fake's default: unknown
    ray.set_free(first, {"CPU": 3.0, "GPU": 1.0, "memory": 1.0})
    assert ray.cluster_view()["gpu"].node_free is None  # one node unknown: the group's is
    ray.set_free(second, {"CPU": 4.0})  # no GPU left out by Ray: none free
    assert ray.cluster_view()["gpu"].node_free == [{"CPU": 3.0, "GPU": 1.0, "memory": 1.0},
                                                   {"CPU": 4.0, "GPU": 0.0, "memory": 0.0}]
    ray.drain(second)  # a draining node adds no room
    assert ray.cluster_view()["gpu"].node_free == [{"CPU": 3.0, "GPU": 1.0, "memory": 1.0}]


def test_a_gcs_that_cannot_say_what_nodes_have_free_still_lists_them_and_is_not_asked_again_at_once(caplog):
    from ray.core.generated import gcs_pb2, gcs_service_pb2

    from raylane.orchestrator.backends.base import GcsUnavailable
    from raylane.orchestrator.backends.ray_gcs import RayGcs

    reply = gcs_service_pb2.GetAllNodeInfoReply(node_info_list=[gcs_pb2.GcsNodeInfo(
        node_id=bytes.fromhex("aa" * 28), state=gcs_pb2.GcsNodeInfo.GcsNodeState.ALIVE, resources_total={"GPU": 2.0})])
    asked = []

    def call(fn, request):
        if isinstance(request, gcs_service_pb2.GetAllAvailableResourcesRequest):
            asked.append(1)
            raise GcsUnavailable("Ray GCS at x: DEADLINE_EXCEEDED")
        return reply

    gcs = RayGcs.__new__(RayGcs)
    gcs._available_after = 0.0
    gcs._call = call
    gcs._nodes = type("Stub", (), {"GetAllNodeInfo": None})()
    gcs._resources = type("Stub", (), {"GetAllAvailableResources": None})()
    for _ in range(3):
        nodes, _ = gcs.all_nodes()
        assert [n["nodeId"][:2] for n in nodes] == ["aa"] and "resourcesAvailable" not in nodes[0]
    assert asked == [1]  # backed off: a pass does not wait out the timeout again
    assert "judged by their group's sum" in caplog.text
