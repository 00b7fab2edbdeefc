"""What every runner gets: the job's spec, placement and storage, and a way to
report its result. Imports ``raylane.orchestrator.domain.specs``/``resources`` only, never the store."""

from __future__ import annotations

import base64
import importlib
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from raylane.orchestrator.domain import ids
from raylane.orchestrator.domain.views import Placement
from raylane.orchestrator.domain.specs import JobSpec

RESULT_MARKER = "RAYLANE_RESULT "  # the reconciler reads the last such line of the driver log


@dataclass
class RunContext:
    job_id: str
    attempt: int
    project: str
    spec: JobSpec
    placement: Placement
    storage: Path  # survives attempts: checkpoints and experiment state live here

    @property
    def submission_id(self) -> str:
        return ids.submission_id(self.job_id, self.attempt)

    @classmethod
    def from_env(cls) -> "RunContext":
        if "RAYLANE_JOB_B64" in os.environ:
            # The dispatcher passes the runner's inputs on the driver's command line
            # (see raylane.orchestrator.loops.dispatcher.submit); make them plain env vars here.
            os.environ.update(json.loads(base64.b64decode(os.environ.pop("RAYLANE_JOB_B64"))))
        storage = Path(os.environ["RAYLANE_STORAGE"])
        storage.mkdir(parents=True, exist_ok=True)
        return cls(job_id=os.environ["RAYLANE_JOB_ID"], attempt=int(os.environ["RAYLANE_ATTEMPT"]),
                   project=os.environ.get("RAYLANE_PROJECT", "default"),
                   spec=JobSpec.model_validate_json(os.environ["RAYLANE_SPEC"]),
                   placement=Placement.model_validate_json(os.environ["RAYLANE_PLACEMENT"]), storage=storage)


class CheckpointSignal:
    """Raylane's request that an attempt checkpoint now, because a node it runs on
    is draining (a spot preemption notice). The control plane leaves it in Ray's
    key-value store (``raylane.orchestrator.backends.ray_gcs``); any process of the job
    can ask.

    ``requested()`` is True once per request (the message changes with each new
    draining node of the attempt); cheap to call every step (it reads the store
    at most once a second). Outside a Ray job it is always False."""

    CHECK_EVERY_S = 1.0

    def __init__(self, submission_id: str):
        self.submission_id = submission_id
        self._seen: bytes | None = None  # the last request acted on
        self._checked_at = 0.0

    def requested(self) -> bool:
        now = time.monotonic()
        if now - self._checked_at < self.CHECK_EVERY_S:
            return False
        self._checked_at = now
        try:
            from ray.experimental import internal_kv

            if not internal_kv._internal_kv_initialized():
                return False
            value = internal_kv._internal_kv_get(ids.checkpoint_key(self.submission_id), namespace=ids.KV_NAMESPACE)
        except Exception:  # never fail a step over a message
            return False
        if value and value != self._seen:
            self._seen = value
            print(f"raylane: checkpoint requested: {value.decode(errors='replace')}", flush=True)
            return True
        return False


_signal: CheckpointSignal | None = None  # this process's, set by the runner around the user's code


def watch_checkpoint_requests(submission_id: str) -> CheckpointSignal:
    """Runners call this before the user's code runs in a process (a training
    worker, a sweep trial), so ``checkpoint_requested()`` answers for that attempt."""
    global _signal
    _signal = CheckpointSignal(submission_id)
    return _signal


def checkpoint_requested() -> bool:
    """True, once per request, when Raylane asks this attempt to checkpoint now
    because a node it runs on is draining (a spot preemption notice). For a sweep's trial function
    (``from raylane.jobs.base import checkpoint_requested``; report a checkpoint to Tune
    when it is True) and anything else running inside a Raylane job; a training
    function has the same as ``ctx.checkpoint_requested()``. False outside a job."""
    return _signal.requested() if _signal is not None else False


def load_callable(path: str) -> Callable[..., Any]:
    module, _, attr = path.partition(":")
    try:
        cwd = os.getcwd()  # the runtime_env working_dir
    except FileNotFoundError:
        cwd = None
    if cwd and cwd not in sys.path:
        sys.path.insert(0, cwd)
    obj: Any = importlib.import_module(module)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def report_result(result: dict[str, Any]) -> None:
    print(RESULT_MARKER + json.dumps(result, default=str), flush=True)
