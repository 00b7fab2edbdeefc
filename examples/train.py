"""A small model trained data-parallel on every worker (numpy linear regression).

Each worker computes gradients on its shard; rank 0 writes checkpoints so a
restarted attempt resumes from the latest one instead of step 0.
"""

from __future__ import annotations

import json
import os
import time

import numpy as np


def main(ctx):
    steps = int(ctx.args.get("steps", 200))
    step_sleep = float(ctx.args.get("step_sleep", 0))  # stretch a step, to watch (or interrupt) a run
    checkpoint_every = int(ctx.args.get("checkpoint_every", 50))
    rng = np.random.default_rng(ctx.rank)
    true_w = np.array([2.0, -3.0, 0.5])
    x = rng.normal(size=(512, 3))
    y = x @ true_w + rng.normal(scale=0.01, size=512)
    w, start = np.zeros(3), 0
    latest = ctx.latest_checkpoint()
    if latest is not None:
        state = json.loads((latest / "state.json").read_text())
        w, start = np.array(state["w"]), state["step"]
    losses = []
    for step in range(start, steps):
        if step_sleep:
            time.sleep(step_sleep)
        pred = x @ w
        grad = 2 * x.T @ (pred - y) / len(y)
        w -= 0.05 * grad
        loss = float(np.mean((pred - y) ** 2))
        losses.append(loss)
        # Every `checkpoint_every` steps, and at once when Raylane asks (a node of
        # this job is draining: a spot preemption notice).
        if ctx.rank == 0 and ((step + 1) % checkpoint_every == 0 or ctx.checkpoint_requested()):
            d = ctx.checkpoint_dir / f"checkpoint_{step + 1:06d}"
            d.mkdir(parents=True, exist_ok=True)
            (d / "state.json").write_text(json.dumps({"w": w.tolist(), "step": step + 1}))
            ctx.report(step=step + 1, loss=loss)
    return {"first_loss": losses[0] if losses else None, "final_loss": losses[-1] if losses else None,
            "resumed_from": start, "steps_run": steps - start, "w": w.tolist(),
            "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")}
