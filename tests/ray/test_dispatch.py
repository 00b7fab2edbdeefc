"""Jobs really run on the local multi-node cluster, on the right node group.
Admission, priorities, cancel and the node-group views are Raylane's decisions
and run against the in-memory Ray: tests/test_loops_on_fake_ray.py."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from raylane.jobs.sweep import snapshot_period_s
from tests.ray.conftest import wait_status

pytestmark = pytest.mark.ray
FUNCS = str(Path(__file__).parent / "funcs")
TERMINAL = {"SUCCEEDED", "FAILED", "CANCELLED"}


def test_command_runs_on_cpu_group_with_logs_and_ray_metadata(rapi, ray_cluster):
    r = rapi.post("/v1/jobs", json={"name": "hello", "kind": "command", "entrypoint": "python -c 'print(42)'"})
    assert r.status_code == 201, r.text
    job = r.json()
    assert job["placement"]["node_group"] == "cpu" and job["placement"]["reasons"]
    # Followed from before it starts: the shared poller reads Ray's log and the stream ends with the job.
    with rapi.stream("GET", f"/v1/jobs/{job['id']}/logs", params={"follow": "true"},
                     headers={"Accept": "application/x-ndjson"}) as followed:
        assert followed.status_code == 200
        text = "".join(json.loads(line)["text"] for line in followed.iter_lines() if line.strip())
    assert "42" in text
    done = wait_status(rapi, job["id"], TERMINAL)
    assert done["status"] == "SUCCEEDED", done["status_reason"]
    assert "42" in rapi.get(f"/v1/jobs/{job['id']}/logs").text
    assert done["ray_submission_id"] == f"raylane-{job['id']}-1"
    assert done["dashboard_url"].endswith(f"#/jobs/raylane-{job['id']}-1")
    # The job is in Ray's own job list with Raylane's metadata, and its driver ran on a cpu node.
    ray_jobs = httpx.get(ray_cluster.state.dashboard_url + "/api/jobs/", headers=ray_cluster.auth_headers()).json()
    mine = [j for j in ray_jobs if j.get("metadata", {}).get("raylane_job_id") == job["id"]]
    assert len(mine) == 1
    md = mine[0]["metadata"]
    assert md["raylane_kind"] == "command" and md["raylane_node_group"] == "cpu" and md["raylane_project"] == "default"
    nodes = {n.node_id: n for n in __import__("raylane.orchestrator.backends.ray_jobs", fromlist=["x"]).RayJobsBackend(
        ray_cluster.state.dashboard_url, ray_cluster.state.token).nodes()}
    assert nodes[mine[0]["driver_node_id"]].group == "cpu"
    evs = [e["to_status"] for e in rapi.get(f"/v1/jobs/{job['id']}/events").json()]
    assert evs[0] == "PENDING" and evs[-3:] == ["DISPATCHING", "RUNNING", "SUCCEEDED"]


def test_gpu_training_actors_run_on_gpu_node_with_cuda_visible_devices(rapi, ray_cluster):
    spec = {"name": "gpu-where", "kind": "training", "entrypoint": "funcs:where",
            "runtime_env": {"working_dir": FUNCS},
            "resources": {"num_workers": 2, "gpus_per_worker": 1, "cpus_per_worker": 1}}
    job = rapi.post("/v1/jobs", json=spec).json()
    assert job["placement"]["strategy"] == "STRICT_PACK" and job["placement"]["node_group"] == "gpu"
    done = wait_status(rapi, job["id"], TERMINAL, timeout=180)
    assert done["status"] == "SUCCEEDED", done["status_reason"]
    workers = done["result"]["workers"]
    assert len(workers) == 2
    assert {w["node_group"] for w in workers} == {"gpu"}
    assert len({w["node_id"] for w in workers}) == 1  # co-located
    assert sorted(w["cuda_visible_devices"] for w in workers) == ["0", "1"] or \
        all(w["cuda_visible_devices"] for w in workers)
    # The result came through Ray's key-value store, which keeps no copy once it is stored.
    from raylane.orchestrator.backends.ray_gcs import RayGcs

    gcs = RayGcs(ray_cluster.state.gcs_address, ray_cluster.state.token)
    try:
        assert gcs.result(done["ray_submission_id"]) is None
        # The runner's inputs came the same way: the driver's command line (shown by
        # ``ps`` and in Ray's dashboard) names only their key, deleted once the attempt ended.
        from raylane.orchestrator.domain import protocol

        info = httpx.get(f"{ray_cluster.state.dashboard_url}/api/jobs/{done['ray_submission_id']}",
                         headers=ray_cluster.auth_headers()).json()
        assert info["entrypoint"].startswith(
            f"{protocol.INPUTS_KEY_ENV}={protocol.inputs_key(done['ray_submission_id'])} "), info["entrypoint"]
        # ... and the user's entrypoint, as a comment after the command, for Ray's dashboard (#48).
        command, _, shown = info["entrypoint"].partition("  # ")
        assert "funcs:where" not in command and protocol.PAYLOAD_ENV not in info["entrypoint"], info["entrypoint"]
        assert shown == "raylane training: funcs:where", info["entrypoint"]
        assert gcs.inputs(done["ray_submission_id"]) is None
    finally:
        gcs.close()


def test_a_runner_of_another_version_refuses_and_the_failure_is_runtime_env(rapi, monkeypatch):
    """The control plane stamps its version on the runner's inputs; the runner on
    the nodes (this checkout's) refuses another before running any user code, and
    the failure is the cluster's install (RUNTIME_ENV), not the job's code."""
    import raylane

    monkeypatch.setattr(raylane, "__version__", "0.0.0+elsewhere")  # this process is the control plane
    spec = {"name": "old-plane", "kind": "training", "entrypoint": "funcs:where",
            "runtime_env": {"working_dir": FUNCS}, "retry": {"max_attempts": 1},
            "resources": {"num_workers": 1, "cpus_per_worker": 0.5}}
    job = rapi.post("/v1/jobs", json=spec).json()
    done = wait_status(rapi, job["id"], {"FAILED"}, timeout=120)
    assert done["failure_cause"] == "RUNTIME_ENV", done["status_reason"]
    assert "runner version mismatch: the control plane runs raylane 0.0.0+elsewhere" in done["status_reason"]


def test_sweep_trials_run_on_spot_nodes(rapi):
    spec = {"name": "where-sweep", "kind": "sweep", "entrypoint": "funcs:trial_where",
            "runtime_env": {"working_dir": FUNCS},
            "sweep": {"metric": "score", "mode": "max", "num_samples": 1, "max_concurrent_trials": 4,
                      "search_space": {"x": {"grid": [1, 2, 3, 4]}}}}
    job = rapi.post("/v1/jobs", json=spec).json()
    assert job["placement"]["node_group"] == "spot-cpu" and job["placement"]["strategy"] == "SPREAD"
    done = wait_status(rapi, job["id"], TERMINAL, timeout=240)
    assert done["status"] == "SUCCEEDED", done["status_reason"]
    res = done["result"]
    assert res["num_trials"] == 4 and res["best"]["config"] == {"x": 4}
    trials = rapi.get(f"/v1/jobs/{job['id']}/trials").json()
    assert [t["config"]["x"] for t in trials] == [4, 3, 2, 1]  # mode max: best first
    assert {t["node_group"] for t in trials} == {"spot-cpu"}
    # Its driver sits on on-demand, so it snapshots the experiment at Tune's pace, not spot's.
    assert done["placement"]["driver_market"] == "ON_DEMAND"
    timing = next(x for x in rapi.get(f"/v1/jobs/{job['id']}/logs").text.splitlines() if "sweep timing" in x)
    assert json.loads(timing.split("sweep timing ", 1)[1])["snapshot_s"] == f"{snapshot_period_s('ON_DEMAND'):g}" == "10"


def test_a_sweep_of_short_trials_runs_them_one_at_a_time_once_it_knows_their_length(rapi):
    # 24 trials of microseconds, 4 allowed at once: once the first end, the sweep
    # runs one at a time on one actor (jobs/sweep.py, TrialSizedConcurrency), and
    # says so in its driver's log.
    spec = {"name": "short-sweep", "kind": "sweep", "entrypoint": "funcs:trial_where",
            "runtime_env": {"working_dir": FUNCS},
            "sweep": {"metric": "score", "mode": "max", "num_samples": 1, "max_concurrent_trials": 4,
                      "search_space": {"x": {"grid": list(range(24))}}}}
    job = rapi.post("/v1/jobs", json=spec).json()
    assert job["placement"]["num_workers"] == 4
    done = wait_status(rapi, job["id"], TERMINAL, timeout=240)
    assert done["status"] == "SUCCEEDED", done["status_reason"]
    assert done["result"]["num_trials"] == 24 and done["result"]["best"]["config"] == {"x": 23}
    logs = rapi.get(f"/v1/jobs/{job['id']}/logs").text
    assert "raylane: sweep concurrency 4 -> 1 of 4" in logs, logs[-3000:]
