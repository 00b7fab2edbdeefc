"""How Raylane reads Ray's node list: a node seen draining stays known as
drained after it dies, its labels outlive it, and nothing is remembered of a
node once Ray stops listing it (a long-lived control plane must not grow)."""

from __future__ import annotations

import httpx

from raylane.orchestrator.backends import ray_jobs
from raylane.orchestrator.backends.ray_jobs import RayJobsBackend


def _node(nid, state="ALIVE", labels=None):
    return {"raylet": {"nodeId": nid, "state": state, "labels": labels or {}, "resourcesTotal": {"CPU": 1}}}


class FakeGcs:
    def __init__(self):
        self.draining = set()
        self.calls = 0

    def draining_nodes(self):
        self.calls += 1
        if self.draining is None:
            from raylane.orchestrator.backends.ray_gcs import GcsUnavailable

            raise GcsUnavailable("Ray GCS at 127.0.0.1:1: UNAVAILABLE: connection refused")
        return {n: None for n in self.draining}

    def close(self):
        pass


def test_drained_and_labels_outlive_a_node_until_ray_forgets_it():
    listed = []
    gcs = FakeGcs()
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
    calls = gcs.calls
    gcs.draining = {"b"}
    (b,) = backend.nodes(draining=backend.draining())
    assert b.draining and gcs.calls == calls + 1


def test_one_gcs_answer_serves_every_caller_for_a_second_and_an_unreachable_gcs_is_left_alone(monkeypatch):
    now = [1000.0]
    monkeypatch.setattr(ray_jobs.time, "monotonic", lambda: now[0])
    gcs = FakeGcs()
    backend = RayJobsBackend("http://ray.invalid", gcs=gcs)
    gcs.draining = {"a"}
    assert backend.draining() == {"a"} and backend.draining() == {"a"} and gcs.calls == 1
    now[0] += ray_jobs.DRAINING_TTL_S
    gcs.draining = set()
    assert backend.draining() == set() and gcs.calls == 2

    gcs.draining = None  # the GCS cannot be reached: no drain known, and no call until the backoff ends
    now[0] += ray_jobs.DRAINING_TTL_S
    assert backend.draining() == set() and gcs.calls == 3
    now[0] += ray_jobs.GCS_BACKOFF_S - 0.1
    assert backend.draining() == set() and gcs.calls == 3
    now[0] += 0.1
    gcs.draining = {"b"}
    assert backend.draining() == {"b"} and gcs.calls == 4
