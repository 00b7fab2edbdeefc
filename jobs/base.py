"""What every runner gets: the job's spec, placement and storage, and a way to
report its result. The words, names and keys between this side and the control
plane are ``raylane.orchestrator.domain.protocol``'s; this module is their Ray
end inside the job. Imports the domain only, never the store."""

from __future__ import annotations

import importlib
import os
import sys
import time
from dataclasses import dataclass
from typing import Any, Callable

from raylane.jobs.storage import Storage
from raylane.orchestrator.domain import ids, protocol
from raylane.orchestrator.domain.protocol import Env
from raylane.orchestrator.domain.views import Placement
from raylane.orchestrator.domain.specs import JobSpec


@dataclass
class RunContext:
    job_id: str
    attempt: int
    project: str
    spec: JobSpec
    placement: Placement
    storage: Storage  # survives attempts and nodes: checkpoints, experiment state, outputs

    @property
    def submission_id(self) -> str:
        return ids.submission_id(self.job_id, self.attempt)

    @property
    def parents(self) -> dict[str, dict]:
        """``parents()``, for a runner's driver and a training function."""
        return parents()

    @property
    def array_index(self) -> int | None:
        """``array_index()``."""
        return array_index()

    @classmethod
    def from_env(cls) -> "RunContext":
        """The runner's inputs, after checking they come from a control plane of
        this version (``protocol.VersionMismatchError`` otherwise)."""
        if protocol.PAYLOAD_ENV in os.environ:
            # The dispatcher passed the runner's inputs on the driver's command line
            # (``protocol.driver_command``); make them plain env vars here, for the user's code too.
            os.environ.update(protocol.decode_payload(os.environ.pop(protocol.PAYLOAD_ENV)))
        protocol.check_versions(os.environ)  # the command line carries the versions, whichever way
        key = os.environ.pop(protocol.INPUTS_KEY_ENV, None)
        if key is not None:
            os.environ.update(read_inputs(key))
        storage = Storage.from_env()
        storage.ensure()
        return cls(job_id=os.environ[Env.JOB_ID], attempt=int(os.environ[Env.ATTEMPT]),
                   project=os.environ.get(Env.PROJECT, "default"),
                   spec=JobSpec.model_validate_json(os.environ[Env.SPEC]),
                   placement=Placement.model_validate_json(os.environ[Env.PLACEMENT]), storage=storage)


def parents() -> dict[str, dict]:
    """This job's parents (``depends_on``) by id: name, status, storage (their
    checkpoints and outputs, to read) and result (``RAYLANE_PARENTS``); {} without.
    Any process of the job may ask: a sweep's trial function, a training worker, a
    batch predictor's constructor (``from raylane.jobs.base import parents``)."""
    import json

    value = os.environ.get(Env.PARENTS)
    return json.loads(value) if value else {}


def array_index() -> int | None:
    """This job's index in its array (``RAYLANE_ARRAY_INDEX``); None outside an
    array. Any process of the job may ask."""
    value = os.environ.get(Env.ARRAY_INDEX)
    return int(value) if value else None


def read_inputs(key: str) -> dict[str, str]:
    """The inputs the dispatcher left in Ray's KV store, read before ``ray.init``
    (the runner imports the user's code first) with a GCS client of its own: a
    Ray job's driver has the GCS address in ``RAY_ADDRESS`` and Ray's token."""
    from ray._raylet import GcsClient

    value = GcsClient(address=os.environ["RAY_ADDRESS"]).internal_kv_get(
        key.encode(), protocol.KV_NAMESPACE.encode(), timeout=30)
    if not value:
        raise RuntimeError(f"raylane: this attempt's inputs are not in Ray's store ({key}); "
                           f"the control plane deletes them once the attempt has ended")
    return protocol.decode_inputs(value)


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
        self._unsaid: bytes | None = None  # a request seen whose checkpoint is not said saved yet
        self.requested_at: float | None = None  # wall time the last request was seen
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
            value = internal_kv._internal_kv_get(protocol.checkpoint_key(self.submission_id),
                                                 namespace=protocol.KV_NAMESPACE)
        except Exception:  # never fail a step over a message
            return False
        if value and value != self._seen:
            self._seen = value
            self._unsaid = value
            self.requested_at = time.time()
            print(f"raylane: checkpoint requested: {value.decode(errors='replace')}", flush=True)
            return True
        return False

    def saved(self) -> None:
        """Tell the control plane the checkpoint it asked for is saved (a preempted
        attempt is then stopped at once instead of at its grace period's end).
        Does nothing when no request is unanswered; never fails the job."""
        value, self._unsaid = self._unsaid, None
        if value is None:
            return
        try:
            from ray.experimental import internal_kv

            if internal_kv._internal_kv_initialized():
                internal_kv._internal_kv_put(protocol.checkpointed_key(self.submission_id), value, overwrite=True,
                                             namespace=protocol.KV_NAMESPACE)
                print("raylane: checkpoint saved after the request", flush=True)
        except Exception:
            pass


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


def checkpoint_saved() -> None:
    """Say that the checkpoint asked for (``checkpoint_requested()`` was True) is
    saved: a job being preempted is then stopped at once rather than at the end of
    its grace period (docs/sharing.md). A training function's ``ctx.report()`` says
    it for you once a checkpoint is stored; a command or a trial calls this."""
    if _signal is not None:
        _signal.saved()


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


def report_result(submission_id: str, result: dict[str, Any]) -> None:
    """Leave the attempt's result in Ray's key-value store for the reconciler
    (``protocol.result_key``); a later report of the same attempt replaces it.
    Raises ``protocol.ResultTooLargeError`` past ``protocol.MAX_RESULT_BYTES``,
    which fails the attempt with the limit and the size. Needs a connected Ray driver."""
    value = protocol.encode_result(result)
    from ray.experimental import internal_kv

    if not internal_kv._internal_kv_initialized():
        raise RuntimeError("raylane: a result is reported from a connected Ray driver (call ray.init() first)")
    internal_kv._internal_kv_put(protocol.result_key(submission_id), value, overwrite=True,
                                 namespace=protocol.KV_NAMESPACE)
    print(f"raylane: result reported ({len(value)} bytes)", flush=True)
