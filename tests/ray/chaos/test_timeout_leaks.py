"""A job's timeout stops its Ray job and everything it started: no actor or
placement group of it is left behind (Ray's state API says so)."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from tests.helpers import wait_for
from tests.ray.conftest import wait_status

pytestmark = pytest.mark.ray
FUNCS = str(Path(__file__).resolve().parent.parent / "funcs")


def _state(cluster, what: str) -> list[dict]:
    r = httpx.get(cluster.state.dashboard_url + f"/api/v0/{what}?limit=10000&detail=1",
                  headers=cluster.auth_headers(), timeout=30)
    r.raise_for_status()
    return r.json()["data"]["result"]["result"]


def test_timeout_stops_the_job_and_leaks_no_actors_or_placement_groups(rapi, ray_cluster):
    # The timeout counts from RUNNING (the driver started); on a loaded 2-core machine
    # the gang's actors can take longer than a few seconds after that to come up, so
    # the timeout leaves them room, and the test asks Ray (which lists dead actors
    # too) that the gang existed rather than racing to see it alive.
    spec = {"name": "too-slow", "kind": "training", "entrypoint": "funcs:forever", "timeout_s": 30,
            "runtime_env": {"working_dir": FUNCS},
            "resources": {"num_workers": 2, "gpus_per_worker": 1, "cpus_per_worker": 1}}
    job = rapi.post("/v1/jobs", json=spec).json()
    wait_status(rapi, job["id"], {"RUNNING"}, timeout=120)
    rj_id = wait_for(lambda: httpx.get(ray_cluster.state.dashboard_url + f"/api/jobs/raylane-{job['id']}-1",
                                       headers=ray_cluster.auth_headers()).json().get("job_id"), timeout=60)

    def workers(alive_only: bool) -> list[dict]:
        return [a for a in _state(ray_cluster, "actors") if a.get("job_id") == rj_id and a["class_name"] == "Worker"
                and (a["state"] == "ALIVE" or not alive_only)]

    # Its gang comes up (two worker actors in one placement group), or the timeout
    # came first: either way the gang must have been made before it is checked below.
    wait_for(lambda: len(workers(alive_only=True)) == 2
             or rapi.get(f"/v1/jobs/{job['id']}").json()["status"] == "FAILED",
             timeout=120, what="workers alive")
    done = wait_status(rapi, job["id"], {"FAILED"}, timeout=120)
    assert done["failure_cause"] == "TIMEOUT" and "TIMEOUT" in done["status_reason"]
    atts = rapi.get(f"/v1/jobs/{job['id']}/attempts").json()
    assert len(atts) == 1 and atts[0]["cause"] == "TIMEOUT"  # a timeout is not retried

    assert len(workers(alive_only=False)) == 2, workers(alive_only=False)  # the gang was made

    def nothing_left():
        actors = [a for a in _state(ray_cluster, "actors") if a.get("job_id") == rj_id and a["state"] != "DEAD"]
        pgs = [p for p in _state(ray_cluster, "placement_groups")
               if p.get("creator_job_id") == rj_id and p["state"] != "REMOVED"]
        assert not actors and not pgs, (actors, pgs)
        return True

    wait_for(nothing_left, timeout=60, what="actors and placement groups cleaned up")
    # The GPUs are free again: a new GPU job is admitted.
    groups = {g["name"]: g for g in rapi.get("/v1/node-groups").json()}
    assert groups["gpu"]["used_by_raylane"].get("GPU", 0) == 0
