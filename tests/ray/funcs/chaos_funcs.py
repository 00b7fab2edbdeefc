"""Trials that log where each (re)start began, each checkpoint and their end."""

import json
import os
import tempfile
import time

from ray import tune
from ray.tune import Checkpoint


def _write(log, **entry):
    with open(log, "a") as f:
        f.write(json.dumps(entry) + "\n")


def _run(config, checkpoint_now):
    """Resume from the trial's checkpoint if Tune has one, log where it began,
    then iterate, reporting a checkpoint when ``checkpoint_now()`` says so."""
    import ray

    log = config["log"]
    start = 0
    ck = tune.get_checkpoint()
    if ck is not None:
        with ck.as_directory() as d:
            start = json.load(open(os.path.join(d, "state.json")))["iter"]
    node = ray.get_runtime_context().get_node_id()
    _write(log, x=config["x"], start=start, t=time.time(), node=node, group=os.environ.get("RAY_NODE_TYPE_NAME"))
    for i in range(start, config["iters"]):
        time.sleep(config["sleep"])
        metrics = {"score": config["x"] * 10 + i, "iter": i + 1}
        if checkpoint_now():
            with tempfile.TemporaryDirectory() as d:
                json.dump({"iter": i + 1}, open(os.path.join(d, "state.json"), "w"))
                tune.report(metrics, checkpoint=Checkpoint.from_directory(d))
            _write(log, x=config["x"], ckpt=i + 1, node=node)
        else:
            tune.report(metrics)
    _write(log, x=config["x"], done=True, t=time.time())


def slow_trial(config):
    """Checkpoints every iteration."""
    _run(config, lambda: True)


def drain_trial(config):
    """Checkpoints only when Raylane asks (its node is draining)."""
    from raylane.jobs.base import checkpoint_requested

    _run(config, checkpoint_requested)


class SlowLinear:
    """``examples.predict.Linear`` that takes ``delay_s`` a batch: the spot-loss
    test's map actors stay alive long enough (400 batches: ~12 s a pass) for the
    test to find their node and kill it while they work, however fast the machine
    and however long their node took to be counted dead before they started."""

    def __init__(self, delay_s: float = 0.03):
        self.delay_s = delay_s

    def __call__(self, batch):
        time.sleep(self.delay_s)
        return {"id": batch["id"], "x": batch["x"], "y": 3.0 * batch["x"] + 1.0}
