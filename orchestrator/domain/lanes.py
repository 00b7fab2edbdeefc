"""Warm lanes (the fast lane, issue #16): which jobs take one, and what the
control plane and a lane host say to each other through Ray's KV store.

A Ray job per job costs a job supervisor actor (~85 MB) and 1-2 s before the
first line of user code. A *lane host* is one long-lived Ray job per node
group (``python -m raylane.jobs.lane``, submission id ``raylane-lane-v<N>-<group>-<n>``,
visible in Ray's dashboard) that runs small jobs as processes it starts itself.

Words:
- *lane*: the node group whose host runs a job (``Placement.lane``).
- *protocol version*: ``PROTOCOL_VERSION``, what a host and a control plane
  both speak. Hosts outlive a control plane's upgrade (they are Ray jobs), so
  every key a host lists or is known by carries it (todo prefix, host key, host
  id): a host sees only items of its version, a control plane adopts only hosts
  of its version. The per-attempt keys (claim, status, logs, stop) are shared by
  every version, so one claim still rules an attempt whoever dispatched it, and
  any control plane finds any attempt; what they hold says its version (``v``),
  and a reader of another version leaves it alone and says so in its log.
- *todo*: ``lane/v<N>/<group>/todo/<sid>``, written by the dispatcher: what to run.
- *claim*: ``lane/claim/<sid>``, written once with overwrite off by whoever
  takes the item: a host (to run it) or the control plane (to stop it before
  it runs). Ray's KV put with overwrite off is atomic, so an item is taken once.
  Once the attempt is forgotten the claim says ``FORGOTTEN`` (a tombstone).
- *status*: ``lane/a/<sid>/status``, a ``LaneStatus`` as JSON; PENDING written by
  the dispatcher (with overwrite off: a second dispatch of the same attempt
  adopts the first), the rest by the host that claimed it.
- *logs*: ``lane/a/<sid>/logs``, the last ``MAX_LOG_BYTES`` of the process's
  output, refreshed while it runs.
- *stop*: ``lane/stop/<sid>``: the control plane asks the host to stop it.
- *host key*: ``lane/v<N>/host/<group>[/env/<env>][/<node>]``: the submission id of
  the current host of the group (for a runtime env, on a node).
- *env*: a lane's runtime env, what its host's Ray job was started in (``env_of``:
  a spec's ``working_dir``, ``py_modules`` and ``pip``), named by ``env_key``, a
  hash of it. Jobs of the same env share hosts; items of an env are queued under
  ``lane/v<N>/<group>/env/<env>/todo/<sid>`` (a host lists its own env's only),
  and ``lane/v<N>/env/<env>`` holds the env itself, for a control plane that
  starts a host for items another one queued. No env: the node's own
  environment, the first release's keys.
- *forget*: the control plane is done with an attempt (its outcome is in the
  database, or it was cancelled before it was recorded): it marks the claim
  ``FORGOTTEN``, then deletes the attempt's keys.
- *sweep*: ``lane_tombstone_keep_s`` (a day) after an attempt ended, the
  control plane deletes its claim and whatever of its keys is left
  (``SWEEP_MARK_KEY`` says how far it got).

Invariants:
- One attempt runs at most once: its submission id is claimed once, and the
  claim stays (a tombstone) for ``lane_tombstone_keep_s`` after its end, far
  longer than any redispatch can come late. Once the outcome is in the database the
  attempt's status and log tail (``attempt_prefix``) and any todo item go, the
  tail kept in the database (``store.lane_logs``).
- A forgotten attempt's keys stay gone: after its last write for an item a host
  reads the claim, and if it says ``FORGOTTEN`` it deletes what it wrote. The
  control plane marks the claim before it deletes, so either the host's read
  sees the mark or its write came before the delete (Ray's KV store is one
  ordered server: a check and a put cannot be one step, this pair of orders is).
- A lane job holds what its placement says (admission counts it as for any
  job) but no Ray driver: a host reserves no Ray resources of its own.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from raylane.orchestrator.domain.specs import JobSpec

HOST_MODULE = "raylane.jobs.lane"
ENV_HOST_MODULE = "raylane.jobs.lane_env"  # a lane env's host: no node of an older package can start one
MAX_LANE_CPUS = 1.0  # more than one core is a job worth its own Ray job (and its own cgroup of resources)
MAX_LOG_BYTES = 64 * 1024  # of one job's output kept in Ray's KV store: a tail, not an archive
# Lane kinds: a shell command (a process of the host's) and a function (a call in a
# warm worker of the host: raylane.jobs.lane_workers). Other kinds place actors and trials: they need a Ray driver.
LANE_KINDS = frozenset({"command", "function"})
# What a lane's status says when its host's Ray job ended under a running item:
# ``loops.classify`` reads it as node loss (the node died) or LOST (the host did).
HOST_LOST = "RAYLANE_LANE_HOST_LOST"
# Bump when a key a host lists, or what an item or a status holds, changes meaning. Records
# written before the field existed (no ``v``) are version 1: the same format.
PROTOCOL_VERSION = 1
# What a claim says once the control plane is done with the attempt (``forget``).
FORGOTTEN = b"forgotten"


def decide(spec: JobSpec, *, enabled: bool) -> tuple[bool, str]:
    """Whether ``spec`` may run in a warm lane, and why (a reason either way)."""
    r = spec.resources
    kind = getattr(spec.kind, "value", spec.kind)
    if not enabled:
        return False, "Ray job: the fast lane is off (RAYLANE_FAST_LANE)"
    if spec.lane == "isolated":
        return False, "Ray job: the spec asks for lane: isolated"
    if kind not in LANE_KINDS:
        return False, f"Ray job: kind {kind} needs a driver of its own (the fast lane takes {', '.join(sorted(LANE_KINDS))})"
    if r.num_workers != 1:
        return False, f"Ray job: asks for {r.num_workers} workers (the fast lane takes one)"
    if r.gpus_per_worker > 0 or r.accelerator_type:
        return False, "Ray job: asks for GPUs (the fast lane takes CPU-only jobs)"
    if r.cpus_per_worker > MAX_LANE_CPUS:
        return False, f"Ray job: asks for {r.cpus_per_worker:g} CPUs (the fast lane takes ≤ {MAX_LANE_CPUS:g})"
    env = env_of(spec)
    local = [k for k in ("working_dir", "py_modules") if any(not _URI_RE.match(v) for v in _values(env, k))]
    if local:
        return False, (f"Ray job: its runtime_env.{local[0]} is a directory on the server, packed afresh for each "
                       f"job (a warm lane takes uploaded packages and URIs, which name their contents)")
    if env:
        return True, (f"fast lane: a {r.cpus_per_worker:g}-CPU {kind} runs in the group's warm lane for its runtime "
                      f"env ({', '.join(env)}; lane env {env_key(env)}), no Ray job of its own")
    return True, f"fast lane: a {r.cpus_per_worker:g}-CPU {kind} runs in the group's warm lane, no Ray job of its own"


_URI_RE = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")  # raylane://packages/..., s3://..., gcs://...
ENV_FIELDS = ("working_dir", "py_modules", "pip")  # what a lane's host runs in; env_vars go with each item
# Of the hash in keys: 128 bits, so no one can make another env with a job's key
# (at 48 bits, as before, a made-to-match env was within reach of a GPU farm, and
# its host would have run the other env's jobs, secrets and all).
ENV_KEY_CHARS = 32
HOST_ID_ENV_CHARS = 16  # ... and in a host's id, a name (``attempts.ray_job`` holds 128 characters)


def _values(env: dict[str, Any] | None, k: str) -> list[str]:
    v = (env or {}).get(k)
    return [] if not v else [v] if isinstance(v, str) else list(v)


def env_of(spec: JobSpec) -> dict[str, Any] | None:
    """The runtime env a lane host for ``spec`` must run in, as the spec says it
    (uploaded packages as ``raylane://`` URIs); None: the node's own environment."""
    env = spec.runtime_env
    out: dict[str, Any] = {}
    if env.working_dir:
        out["working_dir"] = env.working_dir
    if env.py_modules:
        out["py_modules"] = list(env.py_modules)
    if env.pip:
        out["pip"] = list(env.pip)
    return out or None


def env_key_of_stored(spec: dict[str, Any] | None) -> str | None:
    """``env_key(env_of(...))`` of a spec as stored: the lane env its attempts ran
    in, had they taken the lane (the spec parsed only if it has such an env)."""
    runtime_env = (spec or {}).get("runtime_env") or {}
    if not any(runtime_env.get(k) for k in ENV_FIELDS):
        return None
    from raylane.orchestrator.domain.specs import JobSpec

    return env_key(env_of(JobSpec.from_stored(spec)))


def env_key(env: dict[str, Any] | None) -> str | None:
    """The name of a lane env: a hash of what it holds (a package URI names its
    contents, so the same code is the same env). None for the node's own."""
    if not env:
        return None
    return hashlib.sha256(json.dumps(env, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:ENV_KEY_CHARS]


# Keys in Ray's KV store (namespace ``protocol.KV_NAMESPACE``) ---------------


def todo_prefix(group: str, env: str | None = None) -> str:
    where = group if env is None else f"{group}/env/{env}"
    return f"lane/v{PROTOCOL_VERSION}/{where}/todo/"


def todo_key(group: str, sid: str, env: str | None = None) -> str:
    return f"{todo_prefix(group, env)}{sid}"


def env_record_key(env: str) -> str:
    """Where a lane env is kept (its ``env_of``, JSON) for whoever starts its hosts."""
    return f"lane/v{PROTOCOL_VERSION}/env/{env}"


def attempt_prefix(sid: str) -> str:
    """An attempt's status and log tail: one delete by prefix clears them once its
    outcome (and the tail) is in the database."""
    return f"lane/a/{sid}/"


def claim_key(sid: str) -> str:
    """Outside ``attempt_prefix``: the claim stays after the outcome, a tombstone
    (~60 bytes) that keeps a todo item re-put by a late redispatch from ever running."""
    return f"lane/claim/{sid}"


def status_key(sid: str) -> str:
    return f"{attempt_prefix(sid)}status"


def logs_key(sid: str) -> str:
    return f"{attempt_prefix(sid)}logs"


def stop_key(sid: str) -> str:
    return f"lane/stop/{sid}"


STOP_PREFIX = "lane/stop/"

# The claim is a tombstone while a late redispatch could still put a todo item back,
# not for ever: ``lane_tombstone_keep_s`` after an attempt ended the control plane
# deletes its claim and any key of it left over (``LaneBackend.sweep``), so Ray's KV
# store holds what the last day's lane jobs left, not every lane job ever run. This
# key holds how far the sweep got, "<ended_at ISO>|<attempts row id>", shared by all
# control planes (one that sweeps again what another swept deletes nothing twice).
SWEEP_MARK_KEY = "lane/claims-swept-until"


# A host's options added after the first release, by environment: a host of that
# release refused flags it did not know, and ignores these.
HOST_ENV_CPUS = "RAYLANE_LANE_CPUS"  # its node's CPUs, which its items may hold
HOST_ENV_KEY = "RAYLANE_LANE_HOST_KEY"  # the key that names it; it retires when that names another
HOST_ENV_ENV = "RAYLANE_LANE_ENV"  # its lane env (``env_key``): it lists that env's todo items only
HOST_ENV_IN_WORKING_DIR = "RAYLANE_LANE_IN_WORKING_DIR"  # "1": its jobs run in its working_dir, as a Ray job's do

NODE_TAG_CHARS = 8  # of a node id in its host's key and id (Ray's submission ids stay short)


def host_key(group: str, node: str | None = None, env: str | None = None) -> str:
    """Where the group's current host is named: one per node of the group (``node``,
    a Ray node id), or one for the whole group when its nodes are not known; for
    each lane env (``env``) apart."""
    base = f"lane/v{PROTOCOL_VERSION}/host/{group}" + ("" if env is None else f"/env/{env}")
    return base if node is None else f"{base}/{node[:NODE_TAG_CHARS]}"


HOST_ID_PREFIX = "raylane-lane-"  # every version's host ids start so (a claim by a host)


def host_submission_id(group: str, n: int, node: str | None = None, env: str | None = None) -> str:
    """The ``n``-th host of the group (on ``node``, for lane env ``env``): ``raylane-lane-v1-cpu-3``,
    ``raylane-lane-v1-cpu-1a2b3c4d-3``, ``raylane-lane-v1-cpu-1a2b3c4d-e0123456789abcdef-3``."""
    where = group if node is None else f"{group}-{node[:NODE_TAG_CHARS]}"
    where += "" if env is None else f"-e{env[:HOST_ID_ENV_CHARS]}"
    return f"{HOST_ID_PREFIX}v{PROTOCOL_VERSION}-{where}-{n}"


# Records ----------------------------------------------------------------------


@dataclass
class LaneStatus:
    """One item's state; the status words are Ray's job statuses."""

    status: str  # PENDING RUNNING SUCCEEDED FAILED STOPPED
    group: str | None = None  # the lane
    host: str | None = None  # the host's submission id, once claimed
    pid: int | None = None  # the process (and process group) on the host's node
    exit_code: int | None = None
    message: str | None = None
    error_type: str | None = None  # HOST_LOST, or None
    start_time: int | None = None  # ms since the epoch, as Ray's job info
    end_time: int | None = None
    env: str | None = None  # its lane env (``env_key``), None for the node's own
    v: int = PROTOCOL_VERSION  # the writer's protocol version

    def encode(self) -> bytes:
        return json.dumps({k: v for k, v in asdict(self).items() if v is not None}).encode()

    @classmethod
    def decode(cls, value: bytes) -> "LaneStatus":
        """Any version's status; only one whose ``v`` is ``PROTOCOL_VERSION`` may be read further."""
        d = json.loads(value)
        return cls(**{k: d.get(k) for k in cls.__dataclass_fields__ if k != "v"}, v=d.get("v", 1))


def encode_item(sid: str, command: str, env: dict[str, str], *, args: dict[str, Any] | None = None,
                cpus: float = 0.0, metadata: dict[str, str] | None = None) -> bytes:
    """What a host needs to run an attempt: a shell command, or (``args`` given)
    a function's import path to call with ``args``; ``cpus``: what admission
    counted it to hold, which a host's CPUs must have room for (``item_cpus``);
    ``metadata``: the Ray job metadata the dispatcher gives any attempt (its job,
    project, kind...), which the host puts on the attempt's record in Ray's
    dashboard (``dashboard_record``). A host of an older release ignores it."""
    item: dict[str, Any] = {"v": PROTOCOL_VERSION, "sid": sid, "command": command, "env": env}
    if args is not None:
        item["call"] = args
    if cpus:
        item["cpus"] = cpus
    if metadata:
        item["meta"] = metadata
    return json.dumps(item).encode()


# An attempt's record in Ray's dashboard --------------------------------------
#
# A lane attempt is no Ray job, but its host writes a record for it where Ray's
# job manager keeps its own (``JobInfoStorageClient``: namespace ``job``, key
# ``_ray_internal_job_info_<sid>``), so Ray's dashboard, ``ray job list`` and
# ``ray job status <sid>`` show it as they show any job: status, entrypoint,
# times, the node it ran on, exit code and Raylane's metadata (its project, which
# ``api.rayscope`` scopes a member's view by; ``raylane_lane_host``, the Ray job
# that ran it). RUNNING once it has run ``jobs.lane.RUNNING_AFTER_S``, then its end; never
# a runtime env (its env vars carry the storage credentials). Its output stays
# Raylane's (``/v1/jobs/<id>/logs``): the record names no driver agent, so Ray's
# log pane is empty rather than wrong. Records are kept for live attempts and a
# short tail of ended ones only (``LaneBackend.sweep_records``): an ended attempt's
# record goes once it is not among the newest ``lane_dashboard_keep`` ended
# attempts, or ``RECORD_KEEP_S`` after its end, whichever comes first. Ray's
# dashboard lists every record it has on each read of its Jobs page (a GCS get
# each) and Raylane's ``/ray`` proxy takes 32 MiB of it at most: a day of lane
# jobs (about 950 bytes a record) would pass that at 0.4 jobs/s.
JOB_INFO_NAMESPACE = "job"  # ray_constants.KV_NAMESPACE_JOB
JOB_INFO_PREFIX = "_ray_internal_job_info_"  # JobInfoStorageClient.JOB_DATA_KEY_PREFIX
LANE_HOST_META = "raylane_lane_host"  # in a record's metadata: the host (a Ray job) that ran it
RECORD_KEEP_S = 3600.0  # an ended attempt's record stays at most this long (fewer under load: lane_dashboard_keep)
# How far the records sweep got, "<ended_at ISO>|<attempts row id>" as ``SWEEP_MARK_KEY``.
RECORDS_MARK_KEY = "lane/records-swept-until"


def job_info_key(sid: str) -> str:
    return f"{JOB_INFO_PREFIX}{sid}"


def dashboard_record(item: dict[str, Any], st: "LaneStatus", *, node_id: str | None) -> bytes:
    """Ray's ``JobInfo.to_json()`` of a lane attempt (the fields Ray's
    ``JobInfo.from_json`` takes, and no others: it refuses unknown ones)."""
    meta = {str(k): str(v) for k, v in (item.get("meta") or {}).items()}
    meta[LANE_HOST_META] = st.host or ""
    meta["raylane_lane"] = st.group or ""
    message = (st.message or {"RUNNING": "Running in a Raylane warm lane (no Ray job of its own).",
                              "SUCCEEDED": "Job finished successfully in a Raylane warm lane.",
                              "STOPPED": "Job was stopped in a Raylane warm lane."}.get(
        st.status, f"Job ended {st.status} in a Raylane warm lane.")).rstrip()
    message = message[:1].upper() + message[1:] + ("" if message.endswith(".") else ".")
    message += f" Host: Ray job {st.host}. Output: Raylane's /v1/jobs/{meta.get('raylane_job_id', '<id>')}/logs."
    return json.dumps({
        "status": st.status, "entrypoint": str(item.get("command", "")), "message": message,
        "error_type": None, "start_time": st.start_time, "end_time": st.end_time, "metadata": meta,
        "entrypoint_num_cpus": item_cpus(item) or None, "entrypoint_num_gpus": None, "entrypoint_memory": None,
        "entrypoint_resources": None, "driver_agent_http_address": None, "driver_node_id": node_id,
        "driver_exit_code": st.exit_code,
    }).encode()


def is_lane_record(value: bytes) -> bool:
    """Whether a record in Ray's job store is a lane attempt's (``dashboard_record``),
    not a Ray job's own, which the control plane never deletes."""
    try:
        meta = json.loads(value).get("metadata") or {}
    except (ValueError, AttributeError):
        return False
    return isinstance(meta, dict) and bool(meta.get(LANE_HOST_META))


def item_cpus(item: dict[str, Any]) -> float:
    """The CPUs an item holds while it runs (0 for an item written without them)."""
    return float(item.get("cpus") or 0.0)


def decode_item(value: bytes) -> dict[str, Any]:
    return json.loads(value)


def version_of(item: dict[str, Any]) -> int:
    """An item's protocol version (1 if written before items carried one)."""
    return item.get("v", 1)
