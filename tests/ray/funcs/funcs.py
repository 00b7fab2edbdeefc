"""Test functions shipped to Ray through runtime_env.working_dir."""

import os


def where(ctx):
    return {"group": os.environ.get("RAY_NODE_TYPE_NAME"), "cuda": os.environ.get("CUDA_VISIBLE_DEVICES")}


def trial_where(config):
    return {"score": config["x"], "group": os.environ.get("RAY_NODE_TYPE_NAME")}


def forever(ctx):
    """Hold the workers (and their GPUs) until stopped."""
    import time

    while True:
        time.sleep(0.2)


class BrokenPredictor:
    """A batch predictor whose model never loads."""

    def __init__(self):
        raise RuntimeError("model weights not found at /models/missing")

    def __call__(self, batch):  # pragma: no cover - never constructed
        return batch


def slow_trial(config):
    """A trial that takes a moment, so a sweep is seen half done."""
    import time

    time.sleep(1.5)
    return {"score": config["x"]}


# A three-step pipeline (tests/ray/test_dependencies.py): train -> sweep over the
# trained value -> batch inference with the best trial's config. Each step reads
# its parent through raylane.jobs.base.parents(), in whichever process it runs.

def pipeline_train(ctx):
    """'Learns' the log10 of the best learning rate: the sweep searches around it."""
    return {"log10_lr": -2.5, "trained_on": os.environ.get("RAY_NODE_TYPE_NAME")}


def _only_parent() -> dict:
    from raylane.jobs.base import parents

    (parent,) = parents().values()
    return parent


def pipeline_objective(config):
    """A trial: loss is the distance to what the training parent learned."""
    import math

    trained = _only_parent()["result"]["workers"][0]["return"]
    return {"loss": (math.log10(config["lr"]) - trained["log10_lr"]) ** 2}


class PipelinePredictor:
    """Scores each row with the sweep parent's best learning rate, read once per actor."""

    def __init__(self):
        self.lr = _only_parent()["result"]["best"]["config"]["lr"]

    def __call__(self, batch):
        return {"id": batch["id"], "y": batch["x"] * self.lr, "lr": batch["x"] * 0 + self.lr}
