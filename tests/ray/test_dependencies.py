"""A pipeline on the local cluster (issue #18, point 1): a training job, then a
command job that reads the training job's result from ``RAYLANE_PARENTS``; and a
failing step whose dependent is cancelled with the reason, never run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.ray.conftest import wait_status

pytestmark = pytest.mark.ray

FUNCS = str(Path(__file__).parent / "funcs")
TERMINAL = {"SUCCEEDED", "FAILED", "CANCELLED"}


def test_a_pipeline_passes_results_along_and_a_failure_cancels_what_follows(rapi):
    r = rapi.post("/v1/jobs/batch", json={"jobs": [
        {"name": "train", "kind": "training", "entrypoint": "funcs:where", "runtime_env": {"working_dir": FUNCS},
         "resources": {"num_workers": 1, "cpus_per_worker": 0.5}},
        {"name": "report", "kind": "command", "depends_on": ["train"],
         "entrypoint": "python -c 'import os; print(\"PARENTS=\" + os.environ[\"RAYLANE_PARENTS\"])'"},
        {"name": "broken", "kind": "command", "entrypoint": "exit 3", "retry": {"max_attempts": 1}},
        {"name": "after-broken", "kind": "command", "entrypoint": "echo never", "depends_on": ["broken"]},
    ]})
    assert r.status_code == 201, r.text
    train, report, broken, after = r.json()["ids"]
    assert rapi.get(f"/v1/jobs/{report}").json()["status_reason"] == f"waiting for parents: {train} to succeed"

    done = wait_status(rapi, report, TERMINAL, timeout=240)
    assert done["status"] == "SUCCEEDED", done["status_reason"]
    trained = rapi.get(f"/v1/jobs/{train}").json()
    assert trained["status"] == "SUCCEEDED"
    # The child started after its parent ended, and was told the parent's result and storage.
    assert done["started_at"] >= trained["finished_at"]
    line = next(x for x in rapi.get(f"/v1/jobs/{report}/logs").text.splitlines() if x.startswith("PARENTS="))
    parents = json.loads(line[len("PARENTS="):])
    assert parents[train]["status"] == "SUCCEEDED" and parents[train]["result"] == trained["result"]
    assert parents[train]["storage"].endswith(f"/default/{train}")

    assert wait_status(rapi, broken, {"FAILED"}, timeout=120)["failure_cause"]
    skipped = wait_status(rapi, after, {"CANCELLED"}, timeout=30)
    assert skipped["status_reason"] == f"parent {broken} ended FAILED; this job needed it to succeed"
    assert skipped["attempts"] == 0  # never reached Ray
