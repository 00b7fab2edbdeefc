"""An attempt stopped mid-run (its driver's node lost) is re-dispatched and
resumes from the job's checkpoint: training from its latest checkpoint, a sweep
by restoring its Tune experiment (finished trials are not run again).

Training resumes from the default storage (a directory beside data_dir); the
sweep from storage on an S3 endpoint on loopback (moto, tests/s3.py), as a real
cluster's nodes, which share no disk, would use it, and then nothing at all is
written under data_dir (issue #13, point 3). The storage is a fixture parameter:
each test runs on one (each run costs 35-60 s of the cluster tier, the suite's
critical path); training resumes from S3 in tests/fleet/test_serve_fleet.py.
Run both with ``RAYLANE_TEST_BOTH_STORAGES=1``."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from raylane.jobs.sweep import snapshot_period_s
from tests.helpers import wait_for
from tests.s3 import CREDENTIALS, moto_s3
from tests.ray.chaos.test_spot_loss import lines, record
from tests.ray.conftest import wait_status

pytestmark = [pytest.mark.ray, pytest.mark.slow]
FUNCS = str(Path(__file__).resolve().parent.parent / "funcs")
TERMINAL = {"SUCCEEDED", "FAILED", "CANCELLED"}


@pytest.fixture(scope="module")
def s3():
    with moto_s3() as s:
        yield s


def storages(default: str) -> list[str]:
    return ["path", "s3"] if os.environ.get("RAYLANE_TEST_BOTH_STORAGES") else [default]


@pytest.fixture
def ray_settings(request, ray_settings, tmp_path):
    """The shared control plane's settings, with its job storage on a path or on S3
    (``request.param``: each test names its storages with ``storages()``).
    On S3, data_dir is a directory of its own, so the test can see that nothing lands there."""
    if request.param == "path":
        return ray_settings
    s3 = request.getfixturevalue("s3")
    return ray_settings.model_copy(update={
        "data_dir": tmp_path / "data", "storage_uri": f"s3://{s3.bucket}/{tmp_path.name}",
        "storage_endpoint_url": s3.endpoint, "storage_env": CREDENTIALS})


def stored_checkpoints(settings, s3_server, job_id) -> list[str]:
    """Names of the job's checkpoints in its storage (complete ones, on S3)."""
    if settings.storage_uri is None:
        return [p.name for p in (settings.storage_local_root / "default" / job_id / "checkpoints").glob("checkpoint_*")]
    prefix = settings.storage_uri.split("/", 3)[3] + f"/default/{job_id}/checkpoints/"
    return [k[len(prefix):].split("/")[0] for k in s3_server.keys(prefix) if k.endswith("/.raylane-committed")]


def assert_nothing_under_data_dir(settings):
    if settings.storage_uri is not None:
        data_dir = Path(settings.data_dir)
        assert not data_dir.exists() or not list(data_dir.rglob("*")), list(data_dir.rglob("*"))
        assert not settings.data_dir.with_name("data-storage").exists()  # nor in the default storage


def driver_node(rapi, ray_cluster, job_id):
    att = wait_for(lambda: rapi.get(f"/v1/jobs/{job_id}/attempts").json()[-1]["driver_node_id"] and
                   rapi.get(f"/v1/jobs/{job_id}/attempts").json()[-1], timeout=60)
    return next(n for n in ray_cluster.state.nodes if n.ports.get("node_id") == att["driver_node_id"])


@pytest.mark.parametrize("ray_settings", storages("path"), indirect=True)
def test_training_attempt_resumes_from_checkpoint(rapi, ray_cluster, ray_settings, request):
    spec = {"name": "resume-train", "kind": "training", "entrypoint": "examples.train:main",
            "resources": {"num_workers": 2, "gpus_per_worker": 1, "cpus_per_worker": 1},
            "args": {"steps": 400, "step_sleep": 0.05}, "retry": {"backoff_s": 0.5}}
    s3 = request.getfixturevalue("s3") if ray_settings.storage_uri else None
    job = rapi.post("/v1/jobs", json=spec).json()
    wait_status(rapi, job["id"], {"RUNNING"}, timeout=120)
    wait_for(lambda: len(stored_checkpoints(ray_settings, s3, job["id"])) >= 2, timeout=120, what="checkpoints")
    node = driver_node(rapi, ray_cluster, job["id"])
    assert node.group == "gpu"
    ray_cluster.kill_node(node.name)
    ray_cluster.add_node("gpu")
    done = wait_status(rapi, job["id"], TERMINAL, timeout=300)
    assert done["status"] == "SUCCEEDED", done["status_reason"]
    atts = rapi.get(f"/v1/jobs/{job['id']}/attempts").json()
    assert [a["cause"] for a in atts] == ["NODE_LOST", None]
    ret = done["result"]["workers"][0]["return"]
    assert ret["resumed_from"] >= 100 and ret["steps_run"] == 400 - ret["resumed_from"]
    assert done["result"]["checkpoint_dir"].startswith(ray_settings.storage_uri or str(ray_settings.storage_local_root))
    assert_nothing_under_data_dir(ray_settings)
    record(test="training_resume", resumed_from_step=ret["resumed_from"], steps_repeated_saved=ret["resumed_from"])


@pytest.mark.parametrize("ray_settings", storages("s3"), indirect=True)
def test_sweep_attempt_restores_its_experiment(rapi, ray_cluster, ray_settings, tmp_path, request):
    log = tmp_path / "trials.jsonl"
    spec = {"name": "resume-sweep", "kind": "sweep", "entrypoint": "chaos_funcs:slow_trial",
            "runtime_env": {"working_dir": FUNCS}, "retry": {"backoff_s": 0.5},
            "sweep": {"metric": "score", "mode": "max", "num_samples": 1, "max_concurrent_trials": 1,
                      "search_space": {"x": {"grid": list(range(16))}, "log": {"choice": [str(log)]},
                                       "iters": {"choice": [8]}, "sleep": {"choice": [0.25]}}}}
    job = rapi.post("/v1/jobs", json=spec).json()
    # The kill comes when some trials finished longer ago than the experiment's
    # snapshot period (and its upload) takes: those must be restored, not run again.
    # The driver sits on on-demand, which snapshots every 10 s: 16 trials of 2 s one
    # at a time, so the kill comes after about 10 of the 16 ran.
    settled = snapshot_period_s("ON_DEMAND") + 3.0
    wait_for(lambda: len([x for x in lines(log) if x.get("done") and time.time() - x["t"] > settled]) >= 3,
             timeout=300, what=f"three trials done more than {settled:g} s ago")
    node = driver_node(rapi, ray_cluster, job["id"])
    assert node.group == "cpu"  # the sweep's driver sits on on-demand
    killed_at = time.time()
    done_before = {x["x"] for x in lines(log) if x.get("done") and killed_at - x["t"] > settled}
    ray_cluster.kill_node(node.name)  # its driver with it, as a reclaimed machine's
    ray_cluster.add_node("cpu")
    done = wait_status(rapi, job["id"], TERMINAL, timeout=400)
    assert done["status"] == "SUCCEEDED", done["status_reason"]
    assert done["attempts"] == 2
    trials = rapi.get(f"/v1/jobs/{job['id']}/trials").json()
    assert len(trials) == 16 and all(t["status"] == "TERMINATED" for t in trials)
    finishes: dict[int, int] = {}
    for x in lines(log):
        if x.get("done"):
            finishes[x["x"]] = finishes.get(x["x"], 0) + 1
    # Trials that finished in attempt 1 before its last snapshot were restored, not run
    # again (one that finished in the seconds before the kill may run again: the
    # driver died with its node before the experiment said it was done).
    assert done_before and all(finishes[x] == 1 for x in done_before), (done_before, finishes)
    if ray_settings.storage_uri:  # the experiment lives in the bucket
        prefix = ray_settings.storage_uri.split("/", 3)[3] + f"/default/{job['id']}/tune/experiment/"
        assert any("experiment_state" in k
                   for k in request.getfixturevalue("s3").keys(prefix))
    assert_nothing_under_data_dir(ray_settings)
    starts = len([x for x in lines(log) if "start" in x])
    record(test="sweep_resume", trials_done_before_loss=len(done_before), trial_starts=starts, trials=16)
