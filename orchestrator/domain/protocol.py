"""The runner protocol: everything the control plane and a job's runner inside
Ray say to each other, in the one module both sides import (as Ray's
``dashboard/modules/job/common.py`` is for its job manager and job supervisor).
Pure: no Ray, no SQLAlchemy; the two ends that touch Ray are
``raylane.jobs.base`` (the runner) and ``raylane.orchestrator.backends.ray_gcs``
(the control plane).

Words:
- *runner*: ``python -m raylane.jobs.run``, the driver of every job but a
  command; it runs the Raylane code installed on the cluster's nodes, not the
  control plane's.
- *inputs*: job id, attempt, project, spec, placement, the job's storage URI
  (and the S3 endpoint that reaches it) and where Serve binds, plus the
  control plane's Raylane version and ``PROTOCOL_VERSION``, as ``RAYLANE_*``
  environment variables (``Env``). A command job gets them in its runtime_env;
  a runner's driver gets them from Ray's KV store (``inputs_key``), and its
  command line carries only that key and the versions (``driver_command``):
  env vars in runtime_env would give every worker of the job a runtime env of
  its own, so Ray could not hand trials its prestarted workers (a 200-trial
  sweep of short trials paid seconds for it), and a spec on the command line
  (its env values included) shows in ``ps`` on the node and in the entrypoint
  column of Ray's dashboard. Where the control plane cannot reach the GCS
  the inputs ride on the command line, base64-encoded (``driver_command``
  without a key), as before protocol 3.
- *KV*: Ray's internal key-value store, namespace ``KV_NAMESPACE``. The control
  plane leaves an attempt's inputs (``inputs_key``) and checkpoint requests
  (``checkpoint_key``) there; the runner leaves the attempt's result there
  (``result_key``).
- *result*: a JSON object of at most ``MAX_RESULT_BYTES`` once encoded.

Invariants:
- A runner runs only inputs of its own Raylane version and protocol version;
  otherwise it exits with ``EXIT_VERSION_MISMATCH`` and a message that starts
  with ``VERSION_MISMATCH_MARKER`` before touching the cluster, and the
  reconciler classifies that as RUNTIME_ENV (the cluster's install is wrong,
  not the user's code).
- A result past the bound is refused by the runner (``ResultTooLargeError``,
  which fails the attempt with the limit and the size), never truncated.
- A result key lives until the attempt's outcome is stored in the database:
  the reconciler deletes it then (a running service's route: once stored),
  and the attempt's inputs key with it.
- Inputs are written before the Ray job is submitted, under a key named by the
  submission id: a re-submitted attempt (same id) writes the same value.
"""

from __future__ import annotations

import base64
import json
import re
from typing import Any, Mapping

import raylane

PROTOCOL_VERSION = 3  # bump when a name, an encoding or a key below changes meaning (2: storage is a URI, 3: inputs in KV)

RUNNER_MODULE = "raylane.jobs.run"
PAYLOAD_ENV = "RAYLANE_JOB_B64"  # the runner's inputs on its command line (no GCS reachable)
INPUTS_KEY_ENV = "RAYLANE_INPUTS_KEY"  # where in Ray's KV store the runner finds its inputs


class Env:
    """The names of the runner's inputs (and of a command job's env vars)."""

    JOB_ID = "RAYLANE_JOB_ID"
    ATTEMPT = "RAYLANE_ATTEMPT"
    PROJECT = "RAYLANE_PROJECT"
    SPEC = "RAYLANE_SPEC"  # JobSpec as JSON
    PLACEMENT = "RAYLANE_PLACEMENT"  # Placement as JSON
    # Survives attempts and nodes: checkpoints, experiment state, batch outputs. A URI
    # (s3://, gs://, ...) or an absolute path every node mounts; never the control plane's data_dir.
    STORAGE = "RAYLANE_STORAGE"
    STORAGE_ENDPOINT = "RAYLANE_STORAGE_ENDPOINT_URL"  # S3 endpoint of s3:// URIs (not AWS); absent: AWS's
    SERVE = "RAYLANE_SERVE"  # a service's ingress, as JSON: {"host", "port", "public_url"}
    ARRAY_ID = "RAYLANE_ARRAY_ID"  # a member of an array: the array
    ARRAY_INDEX = "RAYLANE_ARRAY_INDEX"  # ... and its index, 0 .. size-1
    PARENTS = "RAYLANE_PARENTS"  # a job with depends_on: {parent id: {name, status, storage, result}} as JSON
    VERSION = "RAYLANE_VERSION"  # the control plane's raylane.__version__
    PROTOCOL = "RAYLANE_PROTOCOL"  # the control plane's PROTOCOL_VERSION
    # Set on a node by the local cluster, not by the control plane: the address
    # the runner's driver attaches to (several nodes share one host there).
    NODE_IP = "RAYLANE_NODE_IP"


# The inputs a runner job's user code may read in any of its processes (a trial,
# a training worker, a predictor actor), not in its driver alone: they go into the
# job's runtime_env too. Only jobs in an array or with parents have them, so every
# other job keeps one runtime env for all its workers (the prestarted ones above).
WORKER_ENV = (Env.ARRAY_ID, Env.ARRAY_INDEX, Env.PARENTS)


def worker_env(env: dict[str, str]) -> dict[str, str]:
    """Of a runner's inputs, those every process of the job sees (``WORKER_ENV``)."""
    return {k: env[k] for k in WORKER_ENV if env.get(k)}


def runner_env(*, job_id: str, attempt: int, project: str, spec_json: str, placement_json: str,
               storage: str, storage_endpoint: str | None = None, serve_json: str | None = None,
               array: tuple[str, str] | None = None, parents_json: str | None = None) -> dict[str, str]:
    """The inputs of one attempt, stamped with this side's versions. ``array``:
    (array id, index) of an array's member."""
    optional = {Env.STORAGE_ENDPOINT: storage_endpoint, Env.SERVE: serve_json,
                Env.ARRAY_ID: array and array[0], Env.ARRAY_INDEX: array and array[1], Env.PARENTS: parents_json}
    return {
        **{k: v for k, v in optional.items() if v},
        Env.JOB_ID: job_id,
        Env.ATTEMPT: str(attempt),
        Env.PROJECT: project,
        Env.SPEC: spec_json,
        Env.PLACEMENT: placement_json,
        Env.STORAGE: storage,
        Env.VERSION: raylane.__version__,
        Env.PROTOCOL: str(PROTOCOL_VERSION),
    }


def encode_payload(env: Mapping[str, str]) -> str:
    return base64.b64encode(json.dumps(dict(env)).encode()).decode()


def decode_payload(blob: str) -> dict[str, str]:
    return json.loads(base64.b64decode(blob))


# What of the user's entrypoint a driver's command line shows, after a shell
# comment mark: characters of import paths and plain words only, so nothing in
# it can end the comment (a newline) or mean anything to a shell.
_SHOWN_UNSAFE = re.compile(r"[^A-Za-z0-9_.:/=, -]")
SHOWN_MAX_CHARS = 200


def shown_entrypoint(kind: str, entrypoint: str) -> str:
    """`` # <kind> <entrypoint>``: appended to a runner's command line so that Ray's
    dashboard shows the user's entrypoint in its entrypoint column, not only the
    wrapper's (a comment: the shell runs the same command)."""
    return f"  # raylane {kind}: {_SHOWN_UNSAFE.sub('?', entrypoint)[:SHOWN_MAX_CHARS]}"


def driver_command(env: Mapping[str, str], *, inputs_key: str | None = None, shown: str = "") -> str:
    """The entrypoint of a runner's Ray job. With ``inputs_key`` the inputs wait in
    Ray's KV store and the command line names the key and the versions (checked
    before the runner touches the cluster); without, they ride on it in base64
    (which needs no shell quoting). ``shown``: ``shown_entrypoint``'s comment."""
    if inputs_key is None:
        return f"{PAYLOAD_ENV}={encode_payload(env)} python -m {RUNNER_MODULE}{shown}"
    # Names and versions are [A-Za-z0-9_./-]: nothing to quote.
    return (f"{INPUTS_KEY_ENV}={inputs_key} {Env.VERSION}={env[Env.VERSION]} {Env.PROTOCOL}={env[Env.PROTOCOL]} "
            f"python -m {RUNNER_MODULE}{shown}")


def encode_inputs(env: Mapping[str, str]) -> bytes:
    return json.dumps(dict(env)).encode()


def decode_inputs(value: bytes) -> dict[str, str]:
    return json.loads(value)


# Versions --------------------------------------------------------------------

EXIT_VERSION_MISMATCH = 78  # sysexits' EX_CONFIG: the cluster's configuration, not the job, is wrong
VERSION_MISMATCH_MARKER = "raylane: runner version mismatch:"


class VersionMismatchError(RuntimeError):
    """The runner on the cluster is not the control plane's version."""


def check_versions(env: Mapping[str, str]) -> None:
    """Raise ``VersionMismatchError`` unless the inputs come from a control plane
    of this Raylane version and protocol version."""
    theirs, ours = env.get(Env.VERSION), raylane.__version__
    their_protocol = env.get(Env.PROTOCOL)
    if theirs == ours and their_protocol == str(PROTOCOL_VERSION):
        return
    raise VersionMismatchError(
        f"{VERSION_MISMATCH_MARKER} the control plane runs raylane {theirs or 'unknown'} (protocol "
        f"{their_protocol or 'unknown'}), this node has raylane {ours} (protocol {PROTOCOL_VERSION}); "
        f"install the control plane's version on the cluster's nodes (or in the job's runtime_env)")


# Ray's key-value store -------------------------------------------------------

KV_NAMESPACE = "raylane"


def checkpoint_key(submission_id: str) -> str:
    """Where the control plane asks an attempt to checkpoint now (its node is draining)."""
    return f"checkpoint/{submission_id}"


def inputs_key(submission_id: str) -> str:
    """Where the control plane leaves an attempt's inputs for its runner."""
    return f"inputs/{submission_id}"


def trials_key(submission_id: str) -> str:
    """Where a sweep's runner leaves its finished trials while it runs (the reconciler
    stores them, so a sweep's trials show as they finish, not at its end)."""
    return f"trials/{submission_id}"


def checkpointed_key(submission_id: str) -> str:
    """Where an attempt's runner says it saved a checkpoint after a request (the
    request's message as the value): a preempted attempt is then stopped at once,
    not at its grace period's end (docs/sharing.md)."""
    return f"checkpointed/{submission_id}"


def result_key(submission_id: str) -> str:
    """Where an attempt's runner leaves its result for the reconciler."""
    return f"result/{submission_id}"


# A result rides in the GCS's memory (and its Redis, with fault tolerance) until
# the reconciler stores it; a summary fits easily, bulk output belongs in storage.
MAX_RESULT_BYTES = 1024 * 1024


class ResultTooLargeError(ValueError):
    """A result past ``MAX_RESULT_BYTES``: the attempt fails with this message."""


def encode_result(result: Mapping[str, Any]) -> bytes:
    value = json.dumps(dict(result), default=str).encode()
    if len(value) > MAX_RESULT_BYTES:
        raise ResultTooLargeError(
            f"the job's result is {len(value)} bytes as JSON; the limit is {MAX_RESULT_BYTES} bytes "
            f"({MAX_RESULT_BYTES // 1024} KiB): return a summary and write bulk output to storage")
    return value


def decode_result(value: bytes) -> dict[str, Any]:
    result = json.loads(value)
    return result if isinstance(result, dict) else {"value": result}


# Ray's words -----------------------------------------------------------------

# Ray's words when an actor or task is lost with its node, naming the node.
RAY_NODE_DIED = re.compile(r"because its node has died\. Node Id: ([0-9a-f]{56})")
