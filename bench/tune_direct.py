"""The comparison side of bench/sweep_vs_tune.py: the same 200-trial sweep with
Tune used directly, as a Ray job driver. --mode default: Tune's defaults;
--mode expert: what a Ray expert would set for short trials."""

from __future__ import annotations

import argparse
import json
import time

import ray
from ray import tune
from ray.tune import PlacementGroupFactory

from examples.sweep import objective


def trainable(config):
    tune.report(objective(config))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", choices=["default", "expert"], required=True)
    ap.add_argument("--samples", type=int, default=200)
    ap.add_argument("--storage", required=True)
    args = ap.parse_args()
    ray.init()
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
    results = tuner.fit()
    best = results.get_best_result()
    print("BENCH " + json.dumps({"mode": args.mode, "fit_s": time.perf_counter() - t, "trials": len(results),
                                 "best_loss": best.metrics["loss"]}))


if __name__ == "__main__":
    main()
