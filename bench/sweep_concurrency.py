"""Where a sweep of short trials spends its time: Tune's trial actors.

One driver, one local Ray node of 8 CPUs, alternated rounds of the same sweep:
  - ``tune``: Tune as an expert sets it for short trials (reuse_actors, at most
    8 trials at once), as in bench/tune_direct.py;
  - ``raylane``: Raylane's sweep runner (jobs/sweep.py) called as a library, whose
    cap on live trials follows the trials' length (``TrialSizedConcurrency``).
Each run counts the trial actors Ray started (its GCS's actor table) and the ones
that ran a trial (the distinct ``pid`` of the results), the driver's CPU seconds
and the whole machine's (from /proc/stat: on a shared machine that includes
others' work). ``--trial-s`` sets each trial's length (0: the microseconds of
examples/sweep.py's objective).

    python bench/sweep_concurrency.py [--trials 100] [--rounds 3] [--trial-s 0]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def objective(config):
    """examples/sweep.py's objective, after sleeping the trial's length."""
    from examples.sweep import objective as loss

    if config.get("sleep"):
        time.sleep(config["sleep"])
    return loss(config)


def busy_s() -> float:
    v = list(map(int, open("/proc/stat").readline().split()[1:]))
    return (sum(v) - v[3] - v[4]) / os.sysconf("SC_CLK_TCK")


def trial_actors() -> int:
    import ray

    return sum(1 for a in ray._private.state.actors().values() if "ImplicitFunc" in str(a.get("ActorClassName")))


def space(trial_s: float) -> dict:
    from ray import tune

    return {"lr": tune.loguniform(1e-5, 1e-2), "batch_size": tune.choice([16, 32, 64]), "sleep": tune.choice([trial_s])}


def run_tune(n: int, trial_s: float, storage: str) -> list[int]:
    from ray import tune

    def trainable(config):
        tune.report(objective(config))

    res = tune.PlacementGroupFactory([{"CPU": 1}])
    results = tune.Tuner(tune.with_resources(trainable, res), param_space=space(trial_s),
                         tune_config=tune.TuneConfig(metric="loss", mode="min", num_samples=n,
                                                     max_concurrent_trials=8, reuse_actors=True),
                         run_config=tune.RunConfig(storage_path=storage, verbose=0)).fit()
    return [r.metrics.get("pid") for r in results]


def run_raylane(n: int, trial_s: float, storage: str) -> list[int]:
    from raylane.jobs import sweep
    from raylane.jobs.base import RunContext
    from raylane.jobs.storage import Storage
    from raylane.orchestrator.domain import protocol
    from raylane.orchestrator.domain.specs import JobSpec
    from raylane.orchestrator.domain.views import Placement

    spec = {"name": "bench", "kind": "sweep", "entrypoint": "bench.sweep_concurrency:objective",
            "sweep": {"metric": "loss", "mode": "min", "num_samples": n, "scheduler": "fifo",
                      "search_space": {"lr": {"loguniform": [1e-5, 1e-2]}, "batch_size": {"choice": [16, 32, 64]},
                                       "sleep": {"choice": [trial_s]}}}}
    job_id = "bench" + uuid.uuid4().hex[:8]
    # What the runner's driver has in a real job: the live list of finished trials goes to Ray's store.
    os.environ.update({protocol.Env.JOB_ID: job_id, protocol.Env.ATTEMPT: "1"})
    ctx = RunContext(job_id=job_id, attempt=1, project="bench",
                     spec=JobSpec.model_validate(spec),
                     placement=Placement(node_group="local", market="SPOT", strategy="PACK", colocate=False,
                                         num_workers=8, worker_resources={"CPU": 1}, label_selector={},
                                         driver_market="ON_DEMAND", reasons=[]),
                     storage=Storage(storage))
    return [t["metrics"].get("pid") for t in sweep.run(ctx)["trials"]]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trials", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=3, help="alternated (tune, raylane) rounds")
    ap.add_argument("--trial-s", type=float, default=0.0, help="each trial's length, seconds")
    args = ap.parse_args()
    import ray

    os.environ["TUNE_GLOBAL_CHECKPOINT_S"] = "10"  # both: Tune's own period (an on-demand driver's)
    work = tempfile.mkdtemp(prefix="raylane-sweep-conc-")
    ray.init(num_cpus=8, include_dashboard=False, _temp_dir=f"{work}/ray", configure_logging=False)
    variants = {"tune": run_tune, "raylane": run_raylane}
    run_tune(16, 0.0, tempfile.mkdtemp(dir=work))  # warm: Ray's worker pool, Tune's imports
    rows: dict[str, list[dict]] = {k: [] for k in variants}
    for i in range(args.rounds):
        for name in (["tune", "raylane"] if i % 2 == 0 else ["raylane", "tune"]):
            before, cpu0, busy0, t0 = trial_actors(), time.process_time(), busy_s(), time.perf_counter()
            pids = variants[name](args.trials, args.trial_s, tempfile.mkdtemp(dir=work))
            row = {"wall_s": time.perf_counter() - t0, "driver_cpu_s": time.process_time() - cpu0,
                   "machine_cpu_s": busy_s() - busy0, "actors_started": trial_actors() - before,
                   "actors_used": len(set(pids)), "trials": len(pids), "load": os.getloadavg()[0]}
            rows[name].append(row)
            print(f"round {i + 1} {name:8s} wall {row['wall_s']:6.2f} s  actors started {row['actors_started']:3d}, "
                  f"used {row['actors_used']:2d}  driver CPU {row['driver_cpu_s']:5.2f} s  machine CPU "
                  f"{row['machine_cpu_s']:6.2f} s  load {row['load']:.1f}", flush=True)
    ratios = [r["wall_s"] / t["wall_s"] for r, t in zip(rows["raylane"], rows["tune"])]
    for name, rs in rows.items():
        print(f"{name:8s} median wall {statistics.median(r['wall_s'] for r in rs):.2f} s, actors started "
              f"{statistics.median(r['actors_started'] for r in rs):g}, used {statistics.median(r['actors_used'] for r in rs):g}")
    print(f"raylane / tune: median {statistics.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f}) over "
          f"{len(ratios)} rounds, {args.trials} trials of {args.trial_s:g} s")
    ray.shutdown()


if __name__ == "__main__":
    main()
