"""Sweeps: Ray Tune over the spec's search space, trials on the router's group.

Expert defaults, so a user gets them without being an expert: ``reuse_actors``
for short trials, trials placed by label selector on the (spot) group with SPREAD,
``FailureConfig`` so trials lost with a node are retried from their checkpoints,
and the experiment stored in the job's storage (a bucket or a shared path) so a
new attempt, on any node, restores it.
A trial function can save a checkpoint when its node is about to be drained:
``raylane.jobs.base.checkpoint_requested()`` turns True once per trial after the request.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from collections import deque
from typing import Any

from ray import tune
from ray.tune import PlacementGroupFactory
from ray.tune.search.basic_variant import BasicVariantGenerator

from raylane.jobs.base import RunContext, load_callable, watch_checkpoint_requests
from raylane.jobs.metrics import flush_live_trials, trial_callback


def _domain(d) -> Any:
    k = d.kind
    v = getattr(d, k)
    return {"uniform": lambda: tune.uniform(*v), "loguniform": lambda: tune.loguniform(*v),
            "randint": lambda: tune.randint(*v), "choice": lambda: tune.choice(v),
            "grid": lambda: tune.grid_search(v)}[k]()


# How often Tune snapshots the experiment (trial statuses, the searcher) to the
# job's storage, unless the job's env sets TUNE_GLOBAL_CHECKPOINT_S. A driver lost
# with its node without notice loses the trials finished since the last snapshot:
# the next attempt restores the experiment and runs them again. Each snapshot
# encodes every trial on the driver's loop, which starts no trial meanwhile (about
# 0.1-0.2 s at 200 trials on two busy cores), so the period is a trade between
# that loss and the sweep's speed, made by the market of the driver's group: a
# driver on spot, which can be reclaimed at any time, snapshots every 2 s; one on
# on-demand (the router's choice when the profile has such a group), every 10 s,
# as Tune's own default ("auto", at least 10 s) does. docs/reliability.md.
SNAPSHOT_PERIOD_S = {"SPOT": 2.0, "ON_DEMAND": 10.0}


def snapshot_period_s(driver_market: str | None) -> float:
    """Seconds between experiment snapshots for a driver on ``driver_market``; an
    unknown market is taken as spot (the shorter loss)."""
    return SNAPSHOT_PERIOD_S.get(driver_market or "SPOT", SNAPSHOT_PERIOD_S["SPOT"])


# How many trials run at once, by how long they take. With reuse_actors, Tune starts
# an actor for each trial it stages, and hands a finished trial's actor to the next
# staged trial, removing the actor it had started for that one. So an actor started
# for a staged trial lives only if no running trial ends before it is ready: with
# ``c`` trials live, each ``L`` seconds long, that needs (c - 1) * L longer than an
# actor's start. Below that, every trial runs on one actor while Tune starts, and
# throws away, an actor for each trial it stages. Measured here (a trial actor's
# start, a process importing Tune, takes 1.3 CPU-seconds), 100 trials of
# microseconds at 8 at once started 16-21 actors, ran every trial on one, and took
# 12.4-17 s; at 1 at once, one actor, 2.9 s; at 3 at once, 10.6-12.2 s
# (docs/benchmarks.md, "Trials sized to their length"). So the cap on live trials
# follows the trials: the router's cap (``placement.num_workers``) until trials end,
# as Tune alone would start; then, by the median length of the last ones, one at a
# time if (cap - 1) * median < ``ACTOR_START_S``, else the router's cap; plus one for
# each trial live over ``LONG_AFTER_S``, so a straggler holds short trials up for
# at most that long. (Starting with one trial, to learn their length first, made
# 2 s trials 45% slower: the other actors then start while the first one frees up
# every 2 s and takes their trials.)
ACTOR_START_S = 1.0
LONG_AFTER_S = 3.0
LENGTHS_KEPT = 32  # the last trials whose median decides


def concurrency_for(cap: int, median_trial_s: float) -> int:
    """How many trials to run at once, under ``cap``, for trials of ``median_trial_s``:
    one where an actor started for a second trial would not be ready before the
    running ones end (it would be thrown away), else all ``cap``."""
    return 1 if (cap - 1) * median_trial_s < ACTOR_START_S else cap


class TrialSizedConcurrency(BasicVariantGenerator):
    """Tune's own search (random and grid) whose cap on live trials follows the
    trials' lengths (see above), checked each time Tune asks for a trial. What it
    learned (the last lengths) is saved with the experiment, so a restored sweep
    keeps it."""

    def __init__(self, *, max_concurrent: int, clock=time.monotonic, **kwargs):
        super().__init__(max_concurrent=max_concurrent, **kwargs)
        self.cap = max_concurrent
        self.lengths: deque[float] = deque(maxlen=LENGTHS_KEPT)
        self._clock = clock
        self._born: dict[str, float] = {}  # live trials: when each was handed to Tune (or restored)
        self._said = max_concurrent

    def _target(self, median: float | None) -> int:
        if median is None:
            return self.cap
        now = self._clock()
        long_lived = sum(1 for t in self._born.values() if now - t > LONG_AFTER_S)
        return min(self.cap, long_lived + concurrency_for(self.cap, median))

    def _resize(self) -> None:
        """Set the cap for the next trial (Tune asks at each step of its loop)."""
        median = statistics.median(self.lengths) if self.lengths else None
        self.max_concurrent = self._target(median)
        # Said in the driver's log when the trials' lengths move it (not at each straggler).
        said = self.cap if median is None else concurrency_for(self.cap, median)
        if said != self._said:
            why = "end before" if said == 1 else "outlast"
            print(f"raylane: sweep concurrency {self._said} -> {said} of {self.cap}: its trials take "
                  f"{median:.3g} s (median of the last {len(self.lengths)}), so {self.cap - 1} of them {why} a trial "
                  f"actor's start (about {ACTOR_START_S:g} s); plus one for each trial live over {LONG_AFTER_S:g} s",
                  flush=True)
            self._said = said

    def next_trial(self):
        self._resize()
        trial = super().next_trial()
        if trial is not None:
            self._born[trial.trial_id] = self._clock()
        return trial

    def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False):
        super().on_trial_complete(trial_id, result=result, error=error)
        self._born.pop(trial_id, None)
        length = (result or {}).get("time_total_s")
        if not error and isinstance(length, (int, float)):
            self.lengths.append(float(length))

    def _restored(self) -> None:
        # This process's clock: the live trials restored with the experiment count
        # their age from now (the old process's readings mean nothing here).
        self._clock = time.monotonic
        self._born = {tid: self._clock() for tid in self._live_trials}

    def set_state(self, state):  # the experiment's snapshot of its search
        super().set_state(state)
        self._restored()

    def __setstate__(self, state):  # unpickled with a restored Tuner
        self.__dict__.update(state)
        self._restored()


def run(ctx: RunContext) -> dict[str, Any]:
    t0 = time.time()
    sw = ctx.spec.sweep
    pl = ctx.placement
    os.environ.setdefault("TUNE_GLOBAL_CHECKPOINT_S", f"{snapshot_period_s(pl.driver_market or pl.market):g}")
    fn = load_callable(ctx.spec.entrypoint)
    submission_id = ctx.submission_id

    def trainable(config):
        import inspect

        import ray

        # Each trial sees a drain's checkpoint request once (raylane.jobs.base.checkpoint_requested).
        watch_checkpoint_requests(submission_id)
        where = {"node_group": os.environ.get("RAY_NODE_TYPE_NAME"), "node_id": ray.get_runtime_context().get_node_id()}
        # Three shapes of objective: return one dict (one result); yield dicts (one
        # per iteration, which lets ASHA stop bad trials early); or report to Tune
        # itself (tune.report with checkpoints) and return None.
        if inspect.isgeneratorfunction(fn):
            for out in fn(config):
                tune.report({**out, **where})
            return
        out = fn(config)
        if isinstance(out, dict):
            tune.report({**out, **where})

    resources = PlacementGroupFactory([dict(pl.worker_resources)], strategy="PACK",
                                      bundle_label_selector=[pl.label_selector])
    scheduler = None
    if sw.scheduler == "asha":
        scheduler = tune.schedulers.ASHAScheduler(max_t=sw.max_t, grace_period=sw.grace_period)
    # Tune reads and writes the experiment through this filesystem, from the driver
    # and from every trial (it travels with the run config), endpoint included.
    fs, path = ctx.storage.child("tune").filesystem()
    name = "experiment"
    exp_dir = f"{path}/{name}"
    trainable_r = tune.with_resources(trainable, resources)
    if tune.Tuner.can_restore(exp_dir, storage_filesystem=fs):
        tuner = tune.Tuner.restore(exp_dir, trainable=trainable_r, resume_errored=True, storage_filesystem=fs)
    else:
        tuner = tune.Tuner(
            trainable_r,
            param_space={k: _domain(d) for k, d in sw.search_space.items()},
            tune_config=tune.TuneConfig(metric=sw.metric, mode=sw.mode, num_samples=sw.num_samples,
                                        search_alg=TrialSizedConcurrency(max_concurrent=pl.num_workers),
                                        scheduler=scheduler, reuse_actors=True),
            run_config=tune.RunConfig(storage_path=path, storage_filesystem=fs, name=name, verbose=0,
                                      callbacks=[trial_callback()],
                                      failure_config=tune.FailureConfig(max_failures=sw.max_trial_failures)),
        )
    t1 = time.time()
    results = tuner.fit()
    flush_live_trials()
    t2 = time.time()
    best = results.get_best_result(metric=sw.metric, mode=sw.mode)
    trials = []
    for r in results:
        m = r.metrics or {}
        trials.append({"trial_id": str(m.get("trial_id") or r.path.rsplit("/", 1)[-1])[:64], "config": r.config,
                       "status": "ERROR" if r.error else "TERMINATED",
                       "node_id": m.get("node_id"), "node_group": m.get("node_group"),
                       "metrics": {k: v for k, v in m.items() if isinstance(v, (int, float, str))},
                       "error": str(r.error)[:500] if r.error else None})
    # Where the sweep's seconds went: set-up (the experiment's storage, a restore
    # check), Tune's fit, and collecting the trials into the result; and the
    # experiment's snapshot period it ran with.
    print("raylane: sweep timing " + json.dumps({"setup": round(t1 - t0, 3), "fit": round(t2 - t1, 3),
                                                  "collect": round(time.time() - t2, 3),
                                                  "snapshot_s": os.environ["TUNE_GLOBAL_CHECKPOINT_S"]}), flush=True)
    return {"best": {"config": best.config, "metrics": {k: v for k, v in (best.metrics or {}).items()
                                                         if isinstance(v, (int, float, str))}},
            "num_trials": len(trials), "trials": trials}
