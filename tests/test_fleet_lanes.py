"""Warm lanes on every cluster of a fleet (issue 45, docs/fleet.md): a small job
placed on the rented cluster runs in that cluster's own warm lane (its keys in
that cluster's Ray store, its host a Ray job there), its status and its log are
read from there, and each cluster's reconciler sweeps only its own attempts' keys.
On the two in-memory clusters of tests/test_fleet_dispatch.py; the lanes' own
behaviour is tests/test_lane_*.py's, on a live cluster tests/ray/test_fast_lane.py's."""

from __future__ import annotations

import pytest

from raylane.orchestrator.domain import lanes
from raylane.orchestrator.domain.ids import submission_id
from raylane.orchestrator.domain.lanes import LaneStatus
from tests.test_fleet_dispatch import fleet, job, run_until, submitted_to  # noqa: F401 (fleet: a fixture)


@pytest.fixture
def settings(settings, monkeypatch):
    monkeypatch.setattr("raylane.orchestrator.backends.lane_hosts.HOST_CHECK_S", 0.0)
    return settings.model_copy(update={"fast_lane": True, "fleet": "local-hybrid", "fleet_cluster_grace_s": 60.0})


def small(cluster: str) -> dict:
    return {"name": "hello", "kind": "command", "entrypoint": "echo hi", "placement": {"cluster": cluster}}


def keys(ray, sid: str) -> set[str]:
    return {k for k in ray.gcs.kv if sid in k}


def host_ids(ray) -> list[str]:
    return [s for s in submitted_to(ray) if s.startswith(lanes.HOST_ID_PREFIX)]


def test_a_small_job_on_the_rented_cluster_runs_in_its_own_lane_and_is_read_from_there(api, fleet):
    fd, rays = fleet
    j = api.post("/v1/jobs", json=small("cloud")).json()
    sid = submission_id(j["id"], 1)
    run_until(fd, lambda: keys(rays["cloud"], sid), "the job queued in cloud's lane")
    placed = job(api, j["id"])["placement"]
    assert placed["cluster"] == "cloud" and placed["lane"] == placed["node_group"], placed
    assert any("lane" in r for r in placed["reasons"]), placed["reasons"]
    # Its lane's keys and host are cloud's; onprem saw nothing of it, and no Ray job was made of it.
    assert lanes.todo_key(placed["lane"], sid, placed["lane_env"]) in rays["cloud"].gcs.kv
    assert not keys(rays["onprem"], sid) and host_ids(rays["cloud"]) and not host_ids(rays["onprem"])
    assert sid not in submitted_to(rays["cloud"]) + submitted_to(rays["onprem"])
    # A host of cloud's lane takes it, runs it, says so in cloud's store.
    host = host_ids(rays["cloud"])[0]
    gcs = rays["cloud"].gcs
    gcs.kv_put(lanes.claim_key(sid), host.encode())
    gcs.kv_del(lanes.todo_key(placed["lane"], sid, placed["lane_env"]))
    gcs.kv_put(lanes.status_key(sid), LaneStatus("RUNNING", group=placed["lane"], host=host, start_time=1).encode())
    gcs.kv_put(lanes.logs_key(sid), b"hi from cloud\n")
    run_until(fd, lambda: job(api, j["id"])["status"] == "RUNNING", "the lane attempt running")
    assert "hi from cloud" in api.get(f"/v1/jobs/{j['id']}/logs").text
    gcs.kv_put(lanes.status_key(sid), LaneStatus("SUCCEEDED", group=placed["lane"], host=host, exit_code=0,
                                                 start_time=1, end_time=2).encode())
    run_until(fd, lambda: job(api, j["id"])["status"] == "SUCCEEDED", "the lane attempt done")
    assert api.get(f"/v1/jobs/{j['id']}/attempts").json()[0]["cluster"] == "cloud"
    assert "hi from cloud" in api.get(f"/v1/jobs/{j['id']}/logs").text  # kept once cloud's store forgot it


def test_each_clusters_reconciler_sweeps_only_its_own_attempts(fleet, api, monkeypatch):
    """The tombstone sweep reads the ended attempts of its own cluster: onprem's
    sweep never asks for cloud's attempts (whose keys its store never held)."""
    fd, rays = fleet
    ids = {}
    for cluster in ("onprem", "cloud"):
        ids[cluster] = api.post("/v1/jobs", json=small(cluster)).json()["id"]
    run_until(fd, lambda: all(keys(rays[c], submission_id(i, 1)) for c, i in ids.items()), "both in their lanes")
    for cluster, jid in ids.items():
        assert api.post(f"/v1/jobs/{jid}/cancel").status_code in (200, 202)
    run_until(fd, lambda: all(job(api, i)["status"] == "CANCELLED" for i in ids.values()), "both cancelled")
    swept: dict[str, list[str]] = {}
    for name, m in fd.members.items():
        monkeypatch.setattr(m.lanes, "sweep", lambda rows, name=name: swept.setdefault(
            name, []).extend(r["submission_id"] for r in rows) or len(rows))
        monkeypatch.setattr(m.reconciler, "_swept_at", 0.0)
    for m in fd.members.values():
        m.reconciler.settings = m.reconciler.settings.model_copy(update={"lane_tombstone_keep_s": 0.0})
        m.reconciler._sweep_lanes()
    assert swept == {"onprem": [submission_id(ids["onprem"], 1)], "cloud": [submission_id(ids["cloud"], 1)]}
