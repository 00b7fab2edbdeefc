"""Spot workers vanish: a sweep and a batch job survive the loss of a spot node,
and repeated preemption moves a job to on-demand nodes."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import httpx
import pytest

from raylane.orchestrator.backends.ray_jobs import RayJobsBackend
from tests.helpers import wait_for
from tests.ray.conftest import wait_status

pytestmark = [pytest.mark.ray, pytest.mark.slow]
FUNCS = str(Path(__file__).resolve().parent.parent / "funcs")
TERMINAL = {"SUCCEEDED", "FAILED", "CANCELLED"}
FIGURES = Path(__file__).resolve().parents[3] / "test-artifacts" / "reliability.jsonl"


def record(**fig):
    FIGURES.parent.mkdir(exist_ok=True)
    with open(FIGURES, "a") as f:
        f.write(json.dumps(fig) + "\n")


def spot_nodes(cluster):
    return [n for n in cluster.state.nodes if n.group == "spot-cpu"]


def lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def trial_sweep(name: str, trial: str, log: Path, *, trials: int, iters: int, sleep: float) -> dict:
    """A sweep of ``chaos_funcs`` trials that log to ``log``, 4 at a time."""
    return {"name": name, "kind": "sweep", "entrypoint": f"chaos_funcs:{trial}", "runtime_env": {"working_dir": FUNCS},
            "sweep": {"metric": "score", "mode": "max", "num_samples": 1, "max_concurrent_trials": 4,
                      "search_space": {"x": {"grid": list(range(trials))}, "log": {"choice": [str(log)]},
                                       "iters": {"choice": [iters]}, "sleep": {"choice": [sleep]}}}}


def running_trial(log: Path, min_age_s: float) -> dict | None:
    """The start entry of a trial that has run for ``min_age_s`` and not ended."""
    ls = lines(log)
    done = {x["x"] for x in ls if x.get("done")}
    old = [x for x in ls if "start" in x and x["x"] not in done and time.time() - x["t"] > min_age_s]
    return old[0] if old else None


def test_sweep_survives_spot_node_loss_and_trials_resume_from_checkpoints(rapi, ray_cluster, tmp_path):
    log = tmp_path / "trials.jsonl"
    job = rapi.post("/v1/jobs", json=trial_sweep("chaos-sweep", "slow_trial", log, trials=8, iters=16,
                                                 sleep=0.5)).json()
    # Kill the node of a trial that is running and has checkpointed a few iterations.
    trial = wait_for(lambda: running_trial(log, 4.0), timeout=240, what="a trial with checkpoints")
    victim = next(n for n in ray_cluster.state.nodes if n.ports.get("node_id") == trial["node"])
    assert victim.group == "spot-cpu"
    killed_at = time.time()
    ray_cluster.kill_node(victim.name)
    done = wait_status(rapi, job["id"], TERMINAL, timeout=400)
    assert done["status"] == "SUCCEEDED", rapi.get(f"/v1/jobs/{job['id']}/logs").text[-5000:]
    assert done["attempts"] == 1  # the driver (on on-demand) survived: only trials were retried
    trials = rapi.get(f"/v1/jobs/{job['id']}/trials").json()
    assert len(trials) == 8 and all(t["status"] == "TERMINATED" for t in trials)
    assert all(t["metrics"]["iter"] == 16 for t in trials)
    restarts = [x for x in lines(log) if x.get("start", 0) > 0]
    assert restarts, f"no trial resumed from a checkpoint: killed {trial}; log: {lines(log)}"
    first_resume = min(x["t"] for x in restarts)
    record(test="sweep_spot_loss", recovery_s=round(first_resume - killed_at, 1),
           resumed_trials=len(restarts), min_resume_iter=min(x["start"] for x in restarts))


def test_batch_inference_survives_spot_node_loss(rapi, ray_cluster, tmp_path):
    from examples.make_data import make

    src, out = tmp_path / "in.parquet", tmp_path / "out"
    make(str(src), n=20000)
    # examples.predict.Linear, slower per batch: its map work lasts long enough to be
    # killed in the middle of (the plain one can end in the seconds between two looks).
    spec = {"name": "chaos-batch", "kind": "batch_inference", "entrypoint": "chaos_funcs:SlowLinear",
            "runtime_env": {"working_dir": FUNCS},
            "resources": {"num_workers": 2, "cpus_per_worker": 1},
            "batch": {"input_uri": str(src), "output_uri": str(out), "batch_size": 50}}
    job = rapi.post("/v1/jobs", json=spec).json()
    wait_status(rapi, job["id"], {"RUNNING"}, timeout=120)
    sid = rapi.get(f"/v1/jobs/{job['id']}/attempts").json()[-1]["submission_id"]
    # Kill a spot node once the job's map actors live on it: one state-API query for
    # the job's alive actors (not one per node), their nodes matched to the cluster's
    # spot nodes by id, and Ray's node list read again if a replaced node's id is new.
    ray = RayJobsBackend(ray_cluster.state.dashboard_url, ray_cluster.state.token)
    seen: dict[str, set[str]] = {}
    try:
        def node_with_actors():
            rj = ray.get(sid)
            ended = str(getattr(rj.status, "value", rj.status)) if rj is not None else None
            assert ended not in ("SUCCEEDED", "FAILED", "STOPPED"), f"the job ended ({ended}) before a kill; {seen}"
            if rj is None or not rj.ray_job_id:
                return None
            r = httpx.get(ray_cluster.state.dashboard_url + "/api/v0/actors", headers=ray_cluster.auth_headers(),
                          params=[("filter_keys", "job_id"), ("filter_predicates", "="),
                                  ("filter_values", rj.ray_job_id), ("filter_keys", "state"),
                                  ("filter_predicates", "="), ("filter_values", "ALIVE"), ("detail", "false")],
                          timeout=30)
            if r.status_code != 200:
                return None
            nodes = {a["node_id"] for a in r.json()["data"]["result"]["result"] if a.get("node_id")}
            seen["actor_nodes"] = nodes
            seen["spot_nodes"] = {n.ports.get("node_id") for n in spot_nodes(ray_cluster)}
            spot = spot_nodes(ray_cluster)
            found = next((n for n in spot if n.ports.get("node_id") in nodes), None)
            if found is None:  # an id recorded for a replaced node may be stale: match by its raylet's port
                ports = {int(x["raylet"].get("nodeManagerPort") or 0) for x in ray_cluster.nodes()
                         if x["raylet"].get("nodeId") in nodes}
                found = next((n for n in spot if int(n.ports.get("node-manager-port") or -1) in ports), None)
            return found

        try:
            victim = wait_for(node_with_actors, timeout=120, what="the job's map actors on a spot node")
        except TimeoutError as e:
            raise AssertionError(f"{e}: actors on {seen.get('actor_nodes')}, spot nodes {seen.get('spot_nodes')}")
    finally:
        ray.close()
    killed_at = time.time()
    ray_cluster.kill_node(victim.name)
    done = wait_status(rapi, job["id"], TERMINAL, timeout=400)
    assert done["status"] == "SUCCEEDED", done["status_reason"]
    assert done["result"]["rows_in"] == done["result"]["rows_out"] == 20000
    atts = rapi.get(f"/v1/jobs/{job['id']}/attempts").json()
    # Ray Data replaces lost actors and recomputes lost blocks, and where it
    # cannot, the runner runs the dataset again: the attempt itself survives.
    assert done["attempts"] == 1, [(a["cause"], a["message"]) for a in atts]
    import pyarrow.parquet as pq

    table = pq.read_table(str(out)).to_pandas()
    assert sorted(table["id"]) == list(range(20000))
    record(test="batch_spot_loss", job_done_after_kill_s=round(time.time() - killed_at, 1),
           attempts=done["attempts"], dataset_runs=done["result"]["runs"])


def test_repeated_preemption_moves_job_to_on_demand(rapi, ray_cluster, tmp_path):
    release = tmp_path / "release"
    spec = {"name": "preempted", "kind": "command", "entrypoint": f"{sys.executable} {FUNCS}/gate.py {release}",
            "resources": {"cpus_per_worker": 0.5}, "placement": {"market": "SPOT"},
            "retry": {"backoff_s": 0.5, "spot_fallback_after": 2}}
    job = rapi.post("/v1/jobs", json=spec).json()
    assert job["placement"]["node_group"] == "spot-cpu"
    try:
        detect = []
        for n in (1, 2):
            j = wait_status(rapi, job["id"], {"RUNNING"}, timeout=180)
            assert j["attempts"] == n
            att = rapi.get(f"/v1/jobs/{job['id']}/attempts").json()[-1]
            wait_for(lambda: rapi.get(f"/v1/jobs/{job['id']}/attempts").json()[-1]["driver_node_id"], timeout=30)
            att = rapi.get(f"/v1/jobs/{job['id']}/attempts").json()[-1]
            node = next(x for x in ray_cluster.state.nodes if x.ports.get("node_id") == att["driver_node_id"])
            assert node.group == "spot-cpu"
            t = time.time()
            ray_cluster.kill_node(node.name)
            wait_for(lambda: rapi.get(f"/v1/jobs/{job['id']}").json()["attempts"] == n + 1 or
                     rapi.get(f"/v1/jobs/{job['id']}").json()["status"] == "RETRYING", timeout=180)
            detect.append(time.time() - t)  # (the other spot node takes the second attempt)
        try:
            j = wait_status(rapi, job["id"], {"RUNNING"}, timeout=180)
        except AssertionError as e:
            raise AssertionError(f"{e}; attempts: {rapi.get(f'/v1/jobs/{job[chr(105)+chr(100)]}/attempts').json()}")
        atts = rapi.get(f"/v1/jobs/{job['id']}/attempts").json()
        assert [a["cause"] for a in atts[:2]] == ["PREEMPTED", "PREEMPTED"]
        assert j["preemptions"] == 2 and j["placement"]["node_group"] == "cpu"
        assert any("spot to on-demand" in r for r in j["placement"]["reasons"])
        wait_for(lambda: rapi.get(f"/v1/jobs/{job['id']}/attempts").json()[-1]["driver_node_id"], timeout=30)
        last = rapi.get(f"/v1/jobs/{job['id']}/attempts").json()[-1]
        node = next(x for x in ray_cluster.state.nodes if x.ports.get("node_id") == last["driver_node_id"])
        assert node.group == "cpu" and last["node_group"] == "cpu"
        release.touch()
        assert wait_status(rapi, job["id"], TERMINAL)["status"] == "SUCCEEDED"
        record(test="repeated_preemption", detection_s=[round(d, 1) for d in detect])
    finally:
        release.touch()
