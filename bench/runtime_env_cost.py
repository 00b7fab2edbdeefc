"""Does what Raylane adds to a command job's Ray job (its inputs as runtime_env
env_vars, a new job id each time, and its metadata) make Ray start it slower?

Straight to Ray's Jobs API on the local multi-node cluster (no Raylane in the
path), a trivial job (`true`, 0.25 CPU, the `cpu` group) in alternated
variants: ``plain`` (what ``bench/dispatch_latency.py``'s direct path sends),
``same_env`` (a few RAYLANE_* variables, the same values every job),
``new_env`` (the same with a new job id each job), ``raylane_like`` (the
variables and metadata the dispatcher sends for a command job, the spec and
placement JSON included). Each time is submit to SUCCEEDED seen by a 20 ms
poll; the quantiles of each variant are printed, the raw times written as JSON.

    python bench/runtime_env_cost.py [--n 40] [--variants plain raylane_like] [--out times.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import _server  # noqa: E402

SPEC = {"name": "lat", "kind": "command", "entrypoint": "true", "resources": {"cpus_per_worker": 0.25},
        "placement": {"node_group": "cpu"}, "lane": "isolated"}


def runtime_env_of(variant: str) -> dict:
    from raylane.orchestrator.domain import protocol
    from raylane.orchestrator.domain.specs import JobSpec

    if variant == "plain":
        return {}
    job_id = "x" * 26 if variant == "same_env" else uuid.uuid4().hex[:26]
    if variant in ("same_env", "new_env"):
        return {"runtime_env": {"env_vars": {"RAYLANE_JOB_ID": job_id, "RAYLANE_ATTEMPT": "1"}}}
    spec = JobSpec.model_validate(SPEC)
    placement = ('{"node_group":"cpu","market":"ON_DEMAND","strategy":"PACK","colocate":false,"num_workers":1,'
                 '"worker_resources":{"CPU":0.25},"label_selector":{"ray.io/node-group":"cpu"},'
                 '"reasons":["a command job: one process, packed","the spec names node group cpu"]}')
    env = protocol.runner_env(job_id=job_id, attempt=1, project="default",
                              spec_json=spec.model_dump_json(exclude_none=True), placement_json=placement,
                              storage=f"/tmp/raylane-storage/default/{job_id}")
    return {"runtime_env": {"env_vars": env},
            "metadata": {"raylane_job_id": job_id, "raylane_project": "default", "raylane_kind": "command",
                         "raylane_node_group": "cpu", "raylane_attempt": "1", "raylane_name": "lat"}}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=40, help="jobs of each variant")
    ap.add_argument("--variants", nargs="+", default=["plain", "raylane_like"],
                    choices=("plain", "same_env", "new_env", "raylane_like"))
    ap.add_argument("--out", help="write the raw times (ms) here as JSON")
    args = ap.parse_args()
    from ray.job_submission import JobStatus, JobSubmissionClient

    b = _server.start_cluster_and_server({"RAYLANE_LOOPS_ENABLED": "false"}, prefix="raylane-bench-envcost-")
    times: dict[str, list[float]] = {v: [] for v in args.variants}
    try:
        ray = JobSubmissionClient(b.state.dashboard_url, headers={"Authorization": f"Bearer {b.state.token}"})

        def one(variant: str) -> float:
            t = time.perf_counter()
            sid = ray.submit_job(entrypoint="true", submission_id=f"envcost-{uuid.uuid4().hex}",
                                 entrypoint_num_cpus=0.25, entrypoint_label_selector={"ray.io/node-group": "cpu"},
                                 **runtime_env_of(variant))
            while ray.get_job_status(sid) not in (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.STOPPED):
                time.sleep(0.02)
            return (time.perf_counter() - t) * 1000

        for v in args.variants:  # warm-up, not counted
            one(v)
        for i in range(args.n):
            for v in (args.variants if i % 2 == 0 else args.variants[::-1]):
                times[v].append(one(v))
            if i % 10 == 9:
                print(f"{i + 1} of each, load {os.getloadavg()[0]:.1f}: p50 so far "
                      + ", ".join(f"{v} {statistics.median(x):.0f} ms" for v, x in times.items()), flush=True)
    finally:
        b.stop()
    if args.out:
        Path(args.out).write_text(json.dumps(times))
    print("| variant | n | q10 | q25 | p50 | q75 | q90 | mean |\n|---|---:|---:|---:|---:|---:|---:|---:|")
    for v, x in times.items():
        x = sorted(x)
        q = [x[int(p * (len(x) - 1))] for p in (0.1, 0.25, 0.5, 0.75, 0.9)]
        print(f"| {v} | {len(x)} | " + " | ".join(f"{t:.0f}" for t in q) + f" | {statistics.mean(x):.0f} |")


if __name__ == "__main__":
    main()
