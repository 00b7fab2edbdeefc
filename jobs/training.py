"""Training: N workers x G GPUs as Ray actors in one placement group (gang).

All workers start together or none do: the placement group reserves every
bundle atomically (STRICT_PACK when GPUs must be co-located), then one actor per
bundle calls the user's function with its rank, world size and a checkpoint
directory that survives attempts.
"""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path
from typing import Any

import ray
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from raylane.jobs.base import RunContext, load_callable, watch_checkpoint_requests

GANG_TIMEOUT_S = 600  # admission already checked capacity; this bounds a lost race


class TrainContext:
    """What the user's function receives."""

    def __init__(self, rank: int, world_size: int, checkpoint_dir: str, args: dict[str, Any],
                 submission_id: str = ""):
        self.rank = rank
        self.world_size = world_size
        self.checkpoint_dir = Path(checkpoint_dir)
        self.args = args
        self.metrics: list[dict[str, Any]] = []
        self._signal = watch_checkpoint_requests(submission_id)

    def checkpoint_requested(self) -> bool:
        """True (once) when Raylane asks for a checkpoint now: a node of this job is
        draining and will be gone soon. Check it every step; save when it is True."""
        return self._signal.requested()

    def report(self, **metrics: Any) -> None:
        self.metrics.append(metrics)
        if self.rank == 0:
            print(f"raylane-metrics {json.dumps(metrics, default=str)}", flush=True)

    def latest_checkpoint(self) -> Path | None:
        cks = sorted(self.checkpoint_dir.glob("checkpoint_*"))
        return cks[-1] if cks else None


@ray.remote
class Worker:
    def run(self, entrypoint: str, rank: int, world_size: int, checkpoint_dir: str, args: dict[str, Any],
            submission_id: str = ""):
        fn = load_callable(entrypoint)
        ctx = TrainContext(rank, world_size, checkpoint_dir, args, submission_id)
        out = fn(ctx)
        return {
            "rank": rank, "node_id": ray.get_runtime_context().get_node_id(), "host": socket.gethostname(),
            "node_group": os.environ.get("RAY_NODE_TYPE_NAME"),
            "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "gpu_ids": [str(g) for g in ray.get_gpu_ids()], "metrics": ctx.metrics[-1:] or [], "return": out,
        }


def run(ctx: RunContext) -> dict[str, Any]:
    pl = ctx.placement
    bundles = [dict(pl.worker_resources) for _ in range(pl.num_workers)]
    pg = placement_group(bundles, strategy=pl.strategy, bundle_label_selector=[pl.label_selector] * len(bundles))
    try:
        ray.get(pg.ready(), timeout=GANG_TIMEOUT_S)
        ckpt = ctx.storage / "checkpoints"
        ckpt.mkdir(parents=True, exist_ok=True)
        workers = [
            Worker.options(
                num_cpus=pl.worker_resources.get("CPU", 0), num_gpus=pl.worker_resources.get("GPU", 0),
                scheduling_strategy=PlacementGroupSchedulingStrategy(placement_group=pg, placement_group_bundle_index=i),
            ).remote()
            for i in range(pl.num_workers)
        ]
        outs = ray.get([w.run.remote(ctx.spec.entrypoint, i, pl.num_workers, str(ckpt), ctx.spec.args,
                                     ctx.submission_id)
                        for i, w in enumerate(workers)])
        return {"workers": outs, "checkpoint_dir": str(ckpt)}
    finally:
        remove_placement_group(pg)
