"""A pipeline on the local cluster (issue #18, point 1): train -> sweep over the
trained value -> batch inference with the best trial, each step reading its
parent from its own workers (trials, predictor actors), which only real
processes show. Results passed along and a failure cancelling what follows are
Raylane's own decisions: tests/test_loops_on_fake_ray.py."""

from __future__ import annotations

import math
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tests.ray.conftest import wait_status

pytestmark = pytest.mark.ray

FUNCS = str(Path(__file__).parent / "funcs")
TERMINAL = {"SUCCEEDED", "FAILED", "CANCELLED"}


def test_train_then_sweep_over_its_result_then_batch_inference_with_the_best_trial(rapi, tmp_path):
    from examples.make_data import make

    src, out = tmp_path / "in.parquet", tmp_path / "out"
    make(str(src), n=200)
    env = {"working_dir": FUNCS}
    grid = [1e-4, 10 ** -2.5, 1e-1]  # the training step "learns" log10(lr) = -2.5: the middle one wins
    r = rapi.post("/v1/jobs/batch", json={"jobs": [
        {"name": "train", "kind": "training", "entrypoint": "funcs:pipeline_train", "runtime_env": env,
         "resources": {"num_workers": 1, "cpus_per_worker": 0.5}},
        {"name": "sweep", "kind": "sweep", "entrypoint": "funcs:pipeline_objective", "runtime_env": env,
         "depends_on": ["train"], "resources": {"cpus_per_worker": 0.5},
         "sweep": {"metric": "loss", "mode": "min", "num_samples": 1, "search_space": {"lr": {"grid": grid}}}},
        {"name": "score", "kind": "batch_inference", "entrypoint": "funcs:PipelinePredictor", "runtime_env": env,
         "depends_on": ["sweep"], "resources": {"num_workers": 1, "cpus_per_worker": 0.5},
         "batch": {"input_uri": str(src), "output_uri": str(out), "batch_size": 50}},
    ]})
    assert r.status_code == 201, r.text
    train, sweep, score = r.json()["ids"]
    assert rapi.get(f"/v1/jobs/{score}").json()["status_reason"] == f"waiting for parents: {sweep} to succeed"

    scored = wait_status(rapi, score, TERMINAL, timeout=400)
    assert scored["status"] == "SUCCEEDED", scored["status_reason"]
    trained, swept = rapi.get(f"/v1/jobs/{train}").json(), rapi.get(f"/v1/jobs/{sweep}").json()
    assert trained["status"] == swept["status"] == "SUCCEEDED"
    # In order: each step started after its parent ended.
    assert swept["started_at"] >= trained["finished_at"] and scored["started_at"] >= swept["finished_at"]
    # Every trial read the trained value in its own process: the losses are the distances to it.
    trials = {round(t["config"]["lr"], 12): t["metrics"]["loss"] for t in rapi.get(f"/v1/jobs/{sweep}/trials").json()}
    assert trials == pytest.approx({round(lr, 12): (math.log10(lr) + 2.5) ** 2 for lr in grid})
    best = swept["result"]["best"]["config"]["lr"]
    assert best == pytest.approx(10 ** -2.5)
    # Every predictor actor scored with the best trial's learning rate.
    table = pq.read_table(str(out)).to_pandas().sort_values("id")
    assert list(table["id"]) == list(range(200))
    assert (table["lr"] == best).all()
    x = pq.read_table(str(src)).to_pandas().sort_values("id")["x"].to_numpy()
    assert (abs(table["y"].to_numpy() - x * best) < 1e-12).all()
