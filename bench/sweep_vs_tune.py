"""A 200-trial sweep of short trials through Raylane against the same sweep with
Tune used directly, on the same local cluster, in the same run:
  - Tune's defaults (what a user writes first),
  - Tune as a Ray expert would set it for short trials (reuse_actors, a concurrency
    cap, trials placed on the spot group),
  - Raylane with the spec of examples/lr-sweep.yaml at 200 samples (no tuning knobs).
Each is submitted as a Ray job and timed from submit to SUCCEEDED. The expert and
Raylane run in alternated pairs (the machine's load moves; one pair proves little);
the median ratio and its spread are reported, with each driver's phases (Python's
start, imports, ray.init, set-up, Tune's fit, collecting results) from its log.

    python bench/sweep_vs_tune.py [--samples 200] [--pairs 3] [--with-defaults]
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

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import _server  # noqa: E402


def load() -> float:
    return os.getloadavg()[0]


def cpu_s(pid: int) -> float:
    """CPU seconds (user + system) a process has used so far, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def phases_of(logs: str, prefix: str) -> dict:
    line = [x for x in logs.splitlines() if prefix in x]
    return json.loads(line[-1].split(prefix, 1)[1]) if line else {}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--samples", type=int, default=200)
    ap.add_argument("--pairs", type=int, default=3, help="alternated (expert, Raylane) pairs")
    ap.add_argument("--with-defaults", action="store_true", help="also one run of Tune's defaults (slow)")
    ap.add_argument("--raylane-env", action="append", default=[], metavar="K=V",
                    help="an env var of Raylane's sweep job (its driver's: TUNE_GLOBAL_CHECKPOINT_S=auto, say)")
    args = ap.parse_args()
    from ray.job_submission import JobSubmissionClient

    from raylane.orchestrator.domain.ids import submission_id
    from raylane.orchestrator.domain.specs import JobSpec

    bench = _server.start_cluster_and_server({"RAYLANE_AUTH_ENABLED": "false"}, prefix="raylane-sweep-bench-")
    state, url, work = bench.state, bench.url, bench.work
    try:
        ray = JobSubmissionClient(state.dashboard_url, headers={"Authorization": f"Bearer {state.token}"})

        def direct(mode: str) -> dict:
            t = time.perf_counter()
            sid = ray.submit_job(
                entrypoint=f"python {ROOT}/bench/tune_direct.py --mode {mode} --samples {args.samples} "
                           f"--storage {work}/tune-{mode}-{uuid.uuid4().hex[:6]}",
                entrypoint_num_cpus=0.1, entrypoint_label_selector={"ray.io/node-group": "cpu"})
            while str(ray.get_job_status(sid)).split(".")[-1] not in ("SUCCEEDED", "FAILED", "STOPPED"):
                time.sleep(0.2)
            wall = time.perf_counter() - t
            logs = ray.get_job_logs(sid)
            line = [x for x in logs.splitlines() if x.startswith("BENCH ")]
            assert line, logs[-3000:]
            return {**json.loads(line[-1][6:]), "wall_s": wall}

        def raylane() -> dict:
            spec = JobSpec.from_file(ROOT / "examples" / "lr-sweep.yaml").model_dump(mode="json", exclude_none=True)
            spec["sweep"]["num_samples"] = args.samples
            spec["sweep"]["scheduler"] = "fifo"  # the same algorithm as the direct runs
            spec["sweep"].pop("max_concurrent_trials", None)  # no knobs: Raylane's defaults
            if args.raylane_env:
                spec.setdefault("runtime_env", {}).setdefault("env_vars", {}).update(
                    kv.split("=", 1) for kv in args.raylane_env)
            t, cpu0 = time.perf_counter(), cpu_s(bench.server.pid)
            job = httpx.post(url + "/v1/jobs", json=spec).json()
            while True:
                j = httpx.get(url + f"/v1/jobs/{job['id']}").json()
                if j["status"] in ("SUCCEEDED", "FAILED", "CANCELLED"):
                    break
                time.sleep(0.2)
            wall = time.perf_counter() - t
            # The control plane's own CPU over the sweep: on 2 cores it competes with the trials.
            server_cpu = cpu_s(bench.server.pid) - cpu0
            assert j["status"] == "SUCCEEDED", j["status_reason"]
            logs = httpx.get(url + f"/v1/jobs/{job['id']}/logs").text
            # Submit to the driver's start: Raylane's admission and Ray's job supervisor.
            ray_job = ray.get_job_info(submission_id(job["id"], 1))  # its Ray job: what Ray was given
            return {"wall_s": wall, "server_cpu_s": round(server_cpu, 2), "trials": j["result"]["num_trials"],
                    "concurrency": j["placement"]["num_workers"], "runtime_env": ray_job.runtime_env,
                    "best_loss": j["result"]["best"]["metrics"]["loss"],
                    "phases": {**phases_of(logs, "raylane: timing "), **phases_of(logs, "raylane: sweep timing ")}}

        pairs = []
        for i in range(args.pairs):
            before = load()
            # Alternate which runs first: a machine that gets busier or quieter favours neither.
            if i % 2 == 0:
                expert, ours = direct("expert"), raylane()
            else:
                ours, expert = raylane(), direct("expert")
            pairs.append({"pair": i + 1, "first": "expert" if i % 2 == 0 else "raylane", "load": [before, load()],
                          "expert_s": expert["wall_s"], "raylane_s": ours["wall_s"],
                          "ratio": ours["wall_s"] / expert["wall_s"], "expert": expert, "raylane": ours})
            print(f"pair {i + 1}: expert {expert['wall_s']:.1f} s, Raylane {ours['wall_s']:.1f} s, "
                  f"ratio {ours['wall_s'] / expert['wall_s']:.2f}, server CPU {ours['server_cpu_s']:.1f} s, load {before:.1f} -> {load():.1f}", flush=True)
        ratios = sorted(p["ratio"] for p in pairs)
        out = {"samples": args.samples, "raylane_env": args.raylane_env, "pairs": pairs, "median_ratio": statistics.median(ratios),
               "spread": [ratios[0], ratios[-1]]}
        if args.with_defaults:
            default = direct("default")
            out["tune_default_s"] = default["wall_s"]
            out["ratio_vs_default"] = statistics.median(p["raylane_s"] for p in pairs) / default["wall_s"]
        print(json.dumps(out, indent=2))
    finally:
        bench.stop()


if __name__ == "__main__":
    main()
