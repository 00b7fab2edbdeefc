"""Groups that scale from zero (issue #13): Raylane submits a job that fits only
after a scale-up so that Ray's autoscaler sees it, says so while it waits, and
ends a job whose scale-up never comes."""

from __future__ import annotations

import pytest

from tests.helpers import wait_for
from tests.ray.conftest import wait_status
from tests.ray_autoscale.conftest import FUNCS

pytestmark = [pytest.mark.ray, pytest.mark.slow]
TERMINAL = {"SUCCEEDED", "FAILED", "CANCELLED"}


def gpu_nodes(cluster, group: str) -> int:
    return sum(1 for n in cluster.nodes() if n["raylet"].get("state") == "ALIVE"
               and n["raylet"].get("labels", {}).get("ray.io/node-group") == group)


def test_a_2_gpu_training_job_at_zero_gpu_nodes_succeeds_after_ray_adds_one(autoscale_api, autoscaling_cluster):
    api = autoscale_api()
    assert gpu_nodes(autoscaling_cluster, "gpu") == 0
    spec = {"name": "from-zero", "kind": "training", "entrypoint": "funcs:where",
            "runtime_env": {"working_dir": FUNCS},
            "resources": {"num_workers": 2, "gpus_per_worker": 1, "cpus_per_worker": 1}}
    r = api.post("/v1/jobs", json=spec)
    assert r.status_code == 201, r.text
    jid = r.json()["id"]
    # While it waits, its reason names the scale-up (the first reason seen after admission).
    waiting = wait_for(lambda: [e for e in api.get(f"/v1/jobs/{jid}/events").json()
                                if "waiting for the autoscaler" in (e.get("reason") or "")],
                       timeout=60, what="an event naming the scale-up")
    assert "waiting for the autoscaler: 0 of 1 gpu nodes up" in waiting[0]["reason"]
    done = wait_status(api, jid, TERMINAL, timeout=300)
    assert done["status"] == "SUCCEEDED", done["status_reason"]
    assert {w["node_group"] for w in done["result"]["workers"]} == {"gpu"}
    assert gpu_nodes(autoscaling_cluster, "gpu") == 1


def test_a_scale_up_that_never_comes_ends_with_a_reason(autoscale_api):
    api = autoscale_api(scale_up_deadline_s=20)
    spec = {"name": "never", "kind": "command", "entrypoint": "true",
            "resources": {"gpus_per_worker": 1, "cpus_per_worker": 0.5, "accelerator_type": "A100"}}
    r = api.post("/v1/jobs", json=spec)
    assert r.status_code == 201, r.text
    assert r.json()["placement"]["node_group"] == "gpu-big"
    done = wait_status(api, r.json()["id"], TERMINAL, timeout=180)
    assert (done["status"], done["failure_cause"]) == ("FAILED", "SCALE_UP_TIMEOUT"), done["status_reason"]
    assert "scale-up of group gpu-big did not come within 20 s" in done["status_reason"]
