"""Test functions shipped to Ray through runtime_env.working_dir."""

import os


def where(ctx):
    return {"group": os.environ.get("RAY_NODE_TYPE_NAME"), "cuda": os.environ.get("CUDA_VISIBLE_DEVICES")}


def trial_where(config):
    return {"score": config["x"], "group": os.environ.get("RAY_NODE_TYPE_NAME")}
