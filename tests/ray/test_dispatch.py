"""Jobs really run on the local multi-node cluster, on the right node group."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import httpx
import pytest

from raylane.jobs.sweep import snapshot_period_s
from tests.helpers import wait_for
from tests.ray.conftest import wait_status

pytestmark = pytest.mark.ray
FUNCS = str(Path(__file__).parent / "funcs")
TERMINAL = {"SUCCEEDED", "FAILED", "CANCELLED"}


def gate(path: Path, gpus: int, name: str, priority: int = 50) -> dict:
    """A command job holding `gpus` GPUs until `path` exists."""
    return {"name": name, "kind": "command", "entrypoint": f"{sys.executable} {FUNCS}/gate.py {path}",
            "resources": {"gpus_per_worker": gpus, "cpus_per_worker": 0.5}, "priority": priority}


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
        assert "funcs:where" not in info["entrypoint"] and protocol.PAYLOAD_ENV not in info["entrypoint"]
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


def test_never_fits_is_refused_at_submit_with_reason(rapi):
    spec = {"name": "huge", "kind": "training", "entrypoint": "m:f",
            "resources": {"num_workers": 4, "gpus_per_worker": 1}}
    r = rapi.post("/v1/jobs", json=spec)
    assert r.status_code == 422
    assert "4 GPUs co-located; group gpu has 2 on one node" in r.json()["detail"][0]["msg"]
    r = rapi.post("/v1/jobs", json={**spec, "resources": {"gpus_per_worker": 1}, "placement": {"node_group": "cpu"}})
    assert r.status_code == 422 and "has no GPUs" in r.text
    assert rapi.get("/v1/jobs", params={"name_prefix": "huge"}).json()["items"] == []
    plan = rapi.post("/v1/plan", json={**spec, "resources": {"num_workers": 2, "gpus_per_worker": 1}}).json()
    assert plan["node_group"] == "gpu" and any("co-locate" in r for r in plan["reasons"])


def test_waits_with_reason_then_priority_order_when_capacity_frees(rapi, tmp_path):
    release_a = tmp_path / "release-a"
    a = rapi.post("/v1/jobs", json=gate(release_a, 2, "gate-a")).json()
    wait_status(rapi, a["id"], {"RUNNING"})
    # The GPU group is full: a low-priority job, then a high-priority one.
    low = rapi.post("/v1/jobs", json=gate(tmp_path / "never", 1, "low", priority=10)).json()
    high = rapi.post("/v1/jobs", json=gate(tmp_path / "release-h", 2, "high", priority=90)).json()
    # Its first reason is the submit's own ("waiting for admission"); an admission
    # pass replaces it with what the group lacks.
    j = wait_for(lambda: (lambda j: j if j["status_reason"] != "waiting for admission" else None)(
        rapi.get(f"/v1/jobs/{low['id']}").json()), timeout=30, what="admission's reason")
    assert j["status"] == "PENDING"
    assert j["status_reason"] == "waiting for 1 GPUs in group gpu: 0 free"
    release_a.touch()
    wait_status(rapi, a["id"], {"SUCCEEDED"})
    wait_status(rapi, high["id"], {"DISPATCHING", "RUNNING"})
    # The high-priority job took the whole group; the low one still waits.
    assert rapi.get(f"/v1/jobs/{low['id']}").json()["status"] == "PENDING"
    rapi.post(f"/v1/jobs/{low['id']}/cancel")
    rapi.post(f"/v1/jobs/{high['id']}/cancel")
    wait_status(rapi, high["id"], {"CANCELLED"})


def test_node_groups_and_cluster(rapi):
    groups = {g["name"]: g for g in rapi.get("/v1/node-groups").json()}
    assert set(groups) == {"head", "gpu", "spot-cpu", "cpu"}
    assert groups["gpu"]["capacity"]["GPU"] == 2 and groups["spot-cpu"]["alive_nodes"] >= 1
    assert groups["spot-cpu"]["market"] == "SPOT"
    nodes = rapi.get("/v1/cluster").json()["nodes"]
    assert {n["node_group"] for n in nodes if n["state"] == "ALIVE"} >= {"head", "gpu", "spot-cpu", "cpu"}


def test_cancel_running_job_stops_ray_job(rapi, tmp_path, ray_cluster):
    j = rapi.post("/v1/jobs", json=gate(tmp_path / "never", 0, "to-cancel")).json()
    wait_status(rapi, j["id"], {"RUNNING"})
    r = rapi.post(f"/v1/jobs/{j['id']}/cancel").json()
    assert r["job"]["status"] == "CANCELLING"
    wait_status(rapi, j["id"], {"CANCELLED"})
    rj = httpx.get(ray_cluster.state.dashboard_url + f"/api/jobs/raylane-{j['id']}-1",
                   headers=ray_cluster.auth_headers()).json()
    assert rj["status"] == "STOPPED"
