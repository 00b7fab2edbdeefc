"""Trials that checkpoint every iteration and log where each (re)start began."""

import json
import os
import tempfile
import time

from ray import tune
from ray.tune import Checkpoint


def slow_trial(config):
    log = config["log"]
    start = 0
    ck = tune.get_checkpoint()
    if ck is not None:
        with ck.as_directory() as d:
            start = json.load(open(os.path.join(d, "state.json")))["iter"]
    import ray

    node = ray.get_runtime_context().get_node_id()
    with open(log, "a") as f:
        f.write(json.dumps({"x": config["x"], "start": start, "t": time.time(), "node": node,
                            "group": os.environ.get("RAY_NODE_TYPE_NAME")}) + "\n")
    for i in range(start, config["iters"]):
        time.sleep(config["sleep"])
        with tempfile.TemporaryDirectory() as d:
            json.dump({"iter": i + 1}, open(os.path.join(d, "state.json"), "w"))
            tune.report({"score": config["x"] * 10 + i, "iter": i + 1}, checkpoint=Checkpoint.from_directory(d))
    with open(log, "a") as f:
        f.write(json.dumps({"x": config["x"], "done": True, "t": time.time()}) + "\n")


def drain_trial(config):
    """Checkpoints only when Raylane asks (its node is draining), and logs where
    each (re)start began and each checkpoint it saved."""
    from jobs.base import checkpoint_requested

    log = config["log"]
    start = 0
    ck = tune.get_checkpoint()
    if ck is not None:
        with ck.as_directory() as d:
            start = json.load(open(os.path.join(d, "state.json")))["iter"]
    import ray

    node = ray.get_runtime_context().get_node_id()
    with open(log, "a") as f:
        f.write(json.dumps({"x": config["x"], "start": start, "t": time.time(), "node": node}) + "\n")
    for i in range(start, config["iters"]):
        time.sleep(config["sleep"])
        metrics = {"score": config["x"] * 10 + i, "iter": i + 1}
        if checkpoint_requested():
            with tempfile.TemporaryDirectory() as d:
                json.dump({"iter": i + 1}, open(os.path.join(d, "state.json"), "w"))
                tune.report(metrics, checkpoint=Checkpoint.from_directory(d))
            with open(log, "a") as f:
                f.write(json.dumps({"x": config["x"], "ckpt": i + 1, "node": node}) + "\n")
        else:
            tune.report(metrics)
    with open(log, "a") as f:
        f.write(json.dumps({"x": config["x"], "done": True, "t": time.time()}) + "\n")
