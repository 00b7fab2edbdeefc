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
