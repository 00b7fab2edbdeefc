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
