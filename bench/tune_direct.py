"""The comparison side of bench/sweep_vs_tune.py: the same 200-trial sweep with
Tune used directly, as a Ray job driver. --mode default: Tune's defaults;
--mode expert: what a Ray expert would set for short trials."""

from __future__ import annotations

import time

_T0 = time.time()

import argparse  # noqa: E402
import json  # noqa: E402

import ray  # noqa: E402
from ray import tune
from ray.tune import PlacementGroupFactory

from examples.sweep import objective  # noqa: E402
from raylane.jobs.run import process_started_at  # noqa: E402


def trainable(config):
    tune.report(objective(config))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", choices=["default", "expert"], required=True)
    ap.add_argument("--samples", type=int, default=200)
    ap.add_argument("--storage", required=True)
    args = ap.parse_args()
    imported = time.time()
    ray.init()
    inited = time.time()
    space = {"lr": tune.loguniform(1e-5, 1e-2), "batch_size": tune.choice([16, 32, 64])}
    t = time.perf_counter()
    if args.mode == "default":
        tuner = tune.Tuner(trainable, param_space=space,
                           tune_config=tune.TuneConfig(metric="loss", mode="min", num_samples=args.samples),
                           run_config=tune.RunConfig(storage_path=args.storage, verbose=0))
    else:
        res = PlacementGroupFactory([{"CPU": 1}], bundle_label_selector=[{"ray.io/node-group": "spot-cpu"}])
        tuner = tune.Tuner(tune.with_resources(trainable, res), param_space=space,
                           tune_config=tune.TuneConfig(metric="loss", mode="min", num_samples=args.samples,
                                                       max_concurrent_trials=8, reuse_actors=True),
                           run_config=tune.RunConfig(storage_path=args.storage, verbose=0))
    set_up = time.perf_counter()
    results = tuner.fit()
    fit = time.perf_counter()
    best = results.get_best_result()
    # The same phases as Raylane's driver prints ("raylane: timing"), for the comparison.
    start = process_started_at() or _T0
    phases = {"python": _T0 - start, "imports": imported - _T0, "ray_init": inited - imported,
              "setup": set_up - t, "fit": fit - set_up, "collect": time.perf_counter() - fit}
    print("BENCH " + json.dumps({"mode": args.mode, "fit_s": fit - set_up, "trials": len(results),
                                 "best_loss": best.metrics["loss"], "phases": {k: round(v, 3) for k, v in phases.items()}}))


if __name__ == "__main__":
    main()
