"""Each example runs end to end through the API on the local cluster, and the
test checks the real outcome."""

from __future__ import annotations

import glob
from pathlib import Path

import httpx
import pyarrow.parquet as pq
import pytest

from raylane.orchestrator.domain.specs import JobSpec
from tests.helpers import wait_for
from tests.ray.conftest import wait_status

pytestmark = pytest.mark.ray
EXAMPLES = Path(__file__).resolve().parent.parent.parent / "examples"
TERMINAL = {"SUCCEEDED", "FAILED", "CANCELLED"}


def submit_example(api, name: str, **overrides) -> dict:
    spec = JobSpec.from_file(EXAMPLES / name).model_dump(mode="json", exclude_none=True)
    spec.update(overrides)
    r = api.post("/v1/jobs", json=spec)
    assert r.status_code == 201, r.text
    return r.json()


def test_training_example_loss_goes_down_and_checkpoints(rapi):
    job = submit_example(rapi, "finetune.yaml", args={"steps": 200})
    done = wait_status(rapi, job["id"], TERMINAL, timeout=180)
    assert done["status"] == "SUCCEEDED", done["status_reason"]
    w0 = done["result"]["workers"][0]["return"]
    assert w0["final_loss"] < w0["first_loss"] / 100
    assert done["result"]["workers"][0]["node_group"] == "gpu"
    assert glob.glob(done["result"]["checkpoint_dir"] + "/checkpoint_*/state.json")


def test_sweep_example_finds_the_optimum_region(rapi):
    job = submit_example(rapi, "lr-sweep.yaml", sweep={
        "metric": "loss", "mode": "min", "num_samples": 20, "max_concurrent_trials": 4, "scheduler": "asha",
        "search_space": {"lr": {"loguniform": [1e-5, 1e-2]}, "batch_size": {"choice": [16, 32, 64]}}})
    done = wait_status(rapi, job["id"], TERMINAL, timeout=300)
    assert done["status"] == "SUCCEEDED", done["status_reason"]
    best = done["result"]["best"]
    assert done["result"]["num_trials"] == 20
    # The optimum is lr=1e-3, batch_size=32 (loss 0); 20 samples land within a decade of it.
    assert 1e-4 <= best["config"]["lr"] <= 1e-2 and best["metrics"]["loss"] < 1.0
    trials = rapi.get(f"/v1/jobs/{job['id']}/trials").json()
    assert len(trials) == 20 and trials[0]["metrics"]["loss"] == best["metrics"]["loss"]  # best first
    assert [t["metrics"]["loss"] for t in trials] == sorted(t["metrics"]["loss"] for t in trials)
    assert {t["node_group"] for t in trials} == {"spot-cpu"}


def test_batch_inference_example_one_output_row_per_input_row(rapi, tmp_path):
    from examples.make_data import make

    src = tmp_path / "in.parquet"
    make(str(src), n=1000)
    out = tmp_path / "out"
    job = submit_example(rapi, "batch-inference.yaml",
                         batch={"input_uri": str(src), "output_uri": str(out), "batch_size": 100})
    assert job["placement"]["node_group"] == "spot-cpu"
    done = wait_status(rapi, job["id"], TERMINAL, timeout=300)
    assert done["status"] == "SUCCEEDED", done["status_reason"]
    assert done["result"]["rows_in"] == done["result"]["rows_out"] == 1000
    table = pq.read_table(str(out)).to_pandas().sort_values("id")
    assert list(table["id"]) == list(range(1000))
    assert (abs(table["y"] - (3 * table["x"] + 1)) < 1e-9).all()


def test_batch_predictor_that_never_loads_fails_the_job_with_its_error(rapi, tmp_path):
    """Ray Data replaces a few predictor actors that die while starting (a spot
    node lost mid-start); a constructor that always fails still ends the job,
    once, as the code's fault, with its own error."""
    from examples.make_data import make

    src = tmp_path / "in.parquet"
    make(str(src), n=100)
    funcs = str(Path(__file__).resolve().parent / "funcs")
    job = rapi.post("/v1/jobs", json={
        "name": "broken-batch", "kind": "batch_inference", "entrypoint": "funcs:BrokenPredictor",
        "runtime_env": {"working_dir": funcs},
        "batch": {"input_uri": str(src), "output_uri": str(tmp_path / "out"), "batch_size": 50}}).json()
    done = wait_status(rapi, job["id"], TERMINAL, timeout=300)
    assert done["status"] == "FAILED" and done["attempts"] == 1
    (att,) = rapi.get(f"/v1/jobs/{job['id']}/attempts").json()
    assert att["cause"] == "APP_ERROR" and "model weights not found" in att["message"], att


def test_service_example_answers_and_cancel_tears_it_down(rapi, ray_cluster):
    job = submit_example(rapi, "service.yaml")
    assert job["placement"]["node_group"] == "spot-cpu"

    def routed():
        j = rapi.get(f"/v1/jobs/{job['id']}").json()
        assert j["status"] in ("DISPATCHING", "RUNNING"), j["status_reason"]
        return j["result"] and j["result"].get("url")

    url = wait_for(routed, timeout=240, what="service route")

    def answers():
        try:
            r = httpx.post(url, json={"x": 2}, timeout=5)
        except httpx.HTTPError:
            return False
        return r.status_code == 200 and r.json() == {"y": 7.0}

    wait_for(answers, timeout=120, what="service answers")
    rapi.post(f"/v1/jobs/{job['id']}/cancel")
    wait_status(rapi, job["id"], {"CANCELLED"}, timeout=120)

    def torn_down():
        r = httpx.get(ray_cluster.state.dashboard_url + "/api/serve/applications/",
                      headers=ray_cluster.auth_headers(), timeout=10)
        return r.status_code == 200 and f"raylane-{job['id']}" not in (r.json().get("applications") or {})

    wait_for(torn_down, timeout=60, what="serve app deleted")
