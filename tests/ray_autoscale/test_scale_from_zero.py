"""Groups that start at zero nodes get work on Ray's own autoscaler (v2, fake
multi-node provider: real local raylets per node type, labels included).

Each test reads what a user would: the job's status and reasons through the API,
and what Ray holds through its Jobs API and node list."""

from __future__ import annotations

import threading
from pathlib import Path

import httpx
import pytest

from raylane.orchestrator.domain.specs import JobSpec
from tests.helpers import wait_for
from tests.ray.conftest import wait_status
from tests.ray_autoscale.conftest import SCALE_AHEAD

pytestmark = [pytest.mark.ray, pytest.mark.slow]
EXAMPLES = Path(__file__).resolve().parent.parent.parent / "examples"
TERMINAL = {"SUCCEEDED", "FAILED", "CANCELLED"}
QUEUE_JOBS = 20  # see test_a_queue_for_a_group_capped_at_two_nodes...: the bound (4 at once, 2 ahead), not the length, is the point


def alive_nodes(cluster, group: str) -> int:
    return sum(1 for n in cluster.nodes()
               if n["raylet"]["state"] == "ALIVE" and n["raylet"].get("labels", {}).get("ray.io/node-group") == group)


def submit(api, spec: dict) -> dict:
    r = api.post("/v1/jobs", json=spec)
    assert r.status_code == 201, r.text
    return r.json()


def example(name: str, **overrides) -> dict:
    spec = JobSpec.from_file(EXAMPLES / name).model_dump(mode="json", exclude_none=True)
    spec.update(overrides)
    return spec


def reasons(api, job_id: str) -> list[str]:
    return [e["reason"] or "" for e in api.get(f"/v1/jobs/{job_id}/events").json()]


def test_training_job_on_a_gpu_group_at_zero_runs_after_ray_adds_a_node(aapi, autoscaling_cluster):
    assert alive_nodes(autoscaling_cluster, "gpu") == 0
    job = submit(aapi, example("finetune.yaml", args={"steps": 50}))
    # While it waits, its reason names the scale-up (as it is admitted and as Ray holds it).
    waiting = wait_for(lambda: aapi.get(f"/v1/jobs/{job['id']}").json(), timeout=30,
                       what="the job's first answer")
    assert waiting["status"] in {"PENDING", "DISPATCHING", "RUNNING"}, waiting["status_reason"]
    done = wait_status(aapi, job["id"], TERMINAL, timeout=240)
    assert done["status"] == "SUCCEEDED", done["status_reason"]
    assert any("waiting for the autoscaler: 0 of 1 gpu nodes up" in r for r in reasons(aapi, job["id"])), \
        reasons(aapi, job["id"])
    workers = done["result"]["workers"]
    assert {w["node_group"] for w in workers} == {"gpu"} and len(workers) == 2
    # Co-located on one node of the group, which had none before: the node the autoscaler
    # added. (Not counted after the job: its idle timeout, a minute, can remove it before
    # a loaded machine looks, and Ray's node summary may then no longer list it by its group.)
    assert len({w["node_id"] for w in workers}) == 1


def test_sweep_on_spot_cpu_at_zero_runs_its_trials_on_the_nodes_ray_adds(aapi, autoscaling_cluster):
    assert alive_nodes(autoscaling_cluster, "spot-cpu") == 0
    # Named explicitly: with room on its fallback (cpu) now, an auto-routed sweep would run there instead.
    job = submit(aapi, example("lr-sweep.yaml", placement={"node_group": "spot-cpu"}, sweep={
        "metric": "loss", "mode": "min", "num_samples": 4, "max_concurrent_trials": 2,
        "search_space": {"lr": {"loguniform": [1e-4, 1e-2]}, "batch_size": {"choice": [16, 32]}}}))
    done = wait_status(aapi, job["id"], TERMINAL, timeout=240)
    assert done["status"] == "SUCCEEDED", done["status_reason"]
    assert any("waiting for the autoscaler: 0 of 1 spot-cpu nodes up" in r for r in reasons(aapi, job["id"])), \
        reasons(aapi, job["id"])
    trials = aapi.get(f"/v1/jobs/{job['id']}/trials").json()
    assert len(trials) == 4 and {t["node_group"] for t in trials} == {"spot-cpu"}


def test_a_queue_for_a_group_capped_at_two_nodes_never_puts_more_than_the_bound_into_ray(aapi, autoscaling_cluster):
    """``burst``: 0..2 nodes of 2 CPUs. A queue of one-CPU jobs: while no node is up,
    Ray holds at most SCALE_AHEAD of them; never more than two nodes hold; all end."""
    assert alive_nodes(autoscaling_cluster, "burst") == 0
    st = autoscaling_cluster.state
    ray = httpx.Client(base_url=st.dashboard_url, headers=autoscaling_cluster.auth_headers(), timeout=10)
    seen: list[tuple[int, int, int]] = []  # (burst nodes alive, Ray's PENDING jobs, Ray's unfinished jobs) per look
    stop = threading.Event()

    def watch():
        while not stop.is_set():
            # Jobs first: a node seen absent after them was absent while they were read.
            jobs = [j for j in ray.get("/api/jobs/").json()
                    if (j.get("metadata") or {}).get("raylane_node_group") == "burst"]
            nodes = alive_nodes(autoscaling_cluster, "burst")
            seen.append((nodes, sum(j["status"] == "PENDING" for j in jobs),
                         sum(j["status"] in ("PENDING", "RUNNING") for j in jobs)))
            stop.wait(0.2)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        # Ray jobs (not the warm lane): the bound is on Ray jobs waiting for a scale-up.
        spec = {"name": "q", "kind": "command", "entrypoint": "python -c 'import time; time.sleep(0.5)'",
                "resources": {"cpus_per_worker": 1}, "placement": {"node_group": "burst"}, "lane": "isolated"}
        r = aapi.post("/v1/jobs/batch", json={"jobs": [{**spec, "name": f"q{i}"} for i in range(QUEUE_JOBS)]})
        assert r.status_code == 201, r.text
        ids = r.json()["ids"]

        def all_done():
            page = aapi.get("/v1/jobs", params={"limit": 500}).json()
            st = {j["id"]: j["status"] for j in page["items"] if j["id"] in ids}
            assert all(s in TERMINAL for s in st.values()), sorted(set(st.values()))
            return st

        final = wait_for(all_done, timeout=300, what=f"{QUEUE_JOBS} queued jobs to end", max_interval=2)
    finally:
        stop.set()
        watcher.join()
        ray.close()
    print(f"{QUEUE_JOBS} jobs, {len(seen)} looks: most unfinished in Ray {max(u for _, _, u in seen)}, most pending "
          f"{max(p for _, p, _ in seen)}, looks with no node {sum(n == 0 for n, _, _ in seen)}")
    assert set(final.values()) == {"SUCCEEDED"}
    assert len(final) == QUEUE_JOBS
    capacity = 2 * 2  # two nodes of 2 CPUs, one CPU a job
    assert max(u for _, _, u in seen) <= capacity, seen
    # Until the first node is listed, the ahead bound holds for the jobs *waiting* in
    # Ray (PENDING): those are the ones admitted ahead of the scale-up. Not for every
    # unfinished job: Ray's node summary (the dispatcher's view and this watcher's)
    # lists a new node only seconds after its raylet registers, and a job whose
    # driver already RUNS there no longer waits for the autoscaler, so the dispatcher
    # may admit another ahead (CI once saw 3 unfinished jobs in Ray before
    # the summary listed the node). The capacity bound above holds for all of them.
    first = next(i for i, (n, _, _) in enumerate(seen) if n > 0)
    assert max(p for _, p, _ in seen[:first]) <= SCALE_AHEAD, seen[:first]
    assert any(u > 0 for _, _, u in seen[:first]), "the watcher never saw Ray hold a job before a node came"
    assert max(n for n, _, _ in seen) <= 2


def test_a_scale_up_that_can_never_come_ends_the_job_with_the_reason(aapi, autoscaling_cluster):
    """``a100``: no node and max_nodes 0. A co-located gang is routed there (one node
    would hold it) and admission fails it; one worker that needs more nodes than
    max_nodes is refused at submit. Neither waits."""
    spec = example("finetune.yaml", resources={"num_workers": 2, "gpus_per_worker": 1, "cpus_per_worker": 1,
                                               "accelerator_type": "A100"})
    job = submit(aapi, spec)
    done = wait_status(aapi, job["id"], TERMINAL, timeout=30)
    assert done["status"] == "FAILED"
    assert "group a100 has no node and max_nodes 0: the autoscaler may add none" in done["status_reason"]
    r = aapi.post("/v1/jobs", json={"name": "one", "kind": "command", "entrypoint": "nvidia-smi",
                                    "resources": {"cpus_per_worker": 1, "gpus_per_worker": 1, "accelerator_type": "A100"}})
    assert r.status_code == 422 and "group a100 has 0 on 0 nodes at most" in r.text, r.text
    assert alive_nodes(autoscaling_cluster, "a100") == 0
