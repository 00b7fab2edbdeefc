"""Training: N workers x G GPUs as Ray actors in one placement group (gang).

All workers start together or none do: the placement group reserves every
bundle atomically (STRICT_PACK when GPUs must be co-located), then one actor per
bundle calls the user's function with its rank, world size and a checkpoint
directory that survives attempts.

Checkpoints live in the job's storage (``raylane.jobs.storage``). On a path every
node mounts, ``checkpoint_dir`` is that directory itself. On object storage it is
a node-local scratch directory holding the newest stored checkpoint at start;
a ``checkpoint_*`` directory written there is stored when the function next calls
``report()`` (as Ray Train's ``report(checkpoint=...)`` persists one) and when it
returns, so a resumed attempt on any node finds it.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
from pathlib import Path
from typing import Any

import ray
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from raylane.jobs.base import RunContext, load_callable, watch_checkpoint_requests
from raylane.jobs.storage import Storage, scratch_dir

GANG_TIMEOUT_S = 600  # admission already checked capacity; this bounds a lost race


class TrainContext:
    """What the user's function receives."""

    def __init__(self, rank: int, world_size: int, checkpoint_dir: str, args: dict[str, Any],
                 submission_id: str = "", store: Storage | None = None):
        self.rank = rank
        self.world_size = world_size
        self.checkpoint_dir = Path(checkpoint_dir)
        self.args = args
        self.metrics: list[dict[str, Any]] = []
        self._signal = watch_checkpoint_requests(submission_id)
        # Object storage: where checkpoint_dir's checkpoints are copied to, and the
        # names already there (the one fetched at start included).
        self._store = store
        self._stored: set[str] = set()
        if store is not None:
            latest = store.latest_checkpoint()
            if latest is not None:
                store.get_dir(latest, self.checkpoint_dir)
                self._stored.add(latest)

    def store_checkpoints(self) -> list[str]:
        """Copy the checkpoints written here since the last call to the job's storage
        (nothing to do on a shared path); returns their names."""
        if self._store is None:
            return []
        new = sorted(d.name for d in self.checkpoint_dir.glob("checkpoint_*")
                     if d.is_dir() and d.name not in self._stored)
        for name in new:
            self._store.put_dir(self.checkpoint_dir / name, name)
            self._stored.add(name)
        return new

    def checkpoint_requested(self) -> bool:
        """True (once) when Raylane asks for a checkpoint now: a node of this job is
        draining and will be gone soon. Check it every step; save when it is True."""
        return self._signal.requested()

    def report(self, **metrics: Any) -> None:
        """Record metrics, and store any checkpoint written since the last report;
        after a checkpoint request, a report that stored one (on a shared path: that
        finds a ``checkpoint_*`` written since) tells Raylane it is saved."""
        stored = self.store_checkpoints()
        asked = self._signal.requested_at
        if asked is not None and (stored or self._store is None and any(
                d.stat().st_mtime >= asked - 1.0 for d in self.checkpoint_dir.glob("checkpoint_*"))):
            self._signal.saved()
        self.metrics.append(metrics)
        if self.rank == 0:
            print(f"raylane-metrics {json.dumps(metrics, default=str)}", flush=True)

    def latest_checkpoint(self) -> Path | None:
        cks = sorted(self.checkpoint_dir.glob("checkpoint_*"))
        return cks[-1] if cks else None


@ray.remote
class Worker:
    def run(self, entrypoint: str, rank: int, world_size: int, checkpoints: Storage, args: dict[str, Any],
            submission_id: str = ""):
        fn = load_callable(entrypoint)
        shared = checkpoints.local_path
        local = shared if shared is not None else scratch_dir(f"{submission_id}-rank{rank}")
        try:
            ctx = TrainContext(rank, world_size, str(local), args, submission_id,
                               store=None if shared is not None else checkpoints)
            out = fn(ctx)
            ctx.store_checkpoints()
        finally:
            if shared is None:
                shutil.rmtree(local, ignore_errors=True)
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
        ckpt = ctx.storage.child("checkpoints")
        ckpt.ensure()
        workers = [
            Worker.options(
                num_cpus=pl.worker_resources.get("CPU", 0), num_gpus=pl.worker_resources.get("GPU", 0),
                scheduling_strategy=PlacementGroupSchedulingStrategy(placement_group=pg, placement_group_bundle_index=i),
            ).remote()
            for i in range(pl.num_workers)
        ]
        outs = ray.get([w.run.remote(ctx.spec.entrypoint, i, pl.num_workers, ckpt, ctx.spec.args,
                                     ctx.submission_id)
                        for i, w in enumerate(workers)])
        return {"workers": outs, "checkpoint_dir": ckpt.uri}
    finally:
        remove_placement_group(pg)
