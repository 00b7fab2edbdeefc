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
- *host key*: ``lane/v<N>/host/<group>``: the submission id of the group's current host.
- *forget*: the control plane is done with an attempt (its outcome is in the
  database, or it was cancelled before it was recorded): it marks the claim
  ``FORGOTTEN``, then deletes the attempt's keys.

Invariants:
- One attempt runs at most once: its submission id is claimed once, and the
  claim stays for good (a tombstone). Once the outcome is in the database the
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

import json
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from raylane.orchestrator.domain.specs import JobSpec

HOST_MODULE = "raylane.jobs.lane"
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
    env = spec.runtime_env
    if env.working_dir or env.pip or env.py_modules:
        what = ", ".join(k for k in ("working_dir", "pip", "py_modules") if getattr(env, k))
        return False, f"Ray job: its runtime_env needs {what} (a warm lane runs in the node's own environment)"
    return True, f"fast lane: a {r.cpus_per_worker:g}-CPU {kind} runs in the group's warm lane, no Ray job of its own"


# Keys in Ray's KV store (namespace ``protocol.KV_NAMESPACE``) ---------------


def todo_prefix(group: str) -> str:
    return f"lane/v{PROTOCOL_VERSION}/{group}/todo/"


def todo_key(group: str, sid: str) -> str:
    return f"{todo_prefix(group)}{sid}"


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


# A host's options added after the first release, by environment: a host of that
# release refused flags it did not know, and ignores these.
HOST_ENV_CPUS = "RAYLANE_LANE_CPUS"  # its node's CPUs, which its items may hold
HOST_ENV_KEY = "RAYLANE_LANE_HOST_KEY"  # the key that names it; it retires when that names another

NODE_TAG_CHARS = 8  # of a node id in its host's key and id (Ray's submission ids stay short)


def host_key(group: str, node: str | None = None) -> str:
    """Where the group's current host is named: one per node of the group (``node``,
    a Ray node id), or one for the whole group when its nodes are not known."""
    base = f"lane/v{PROTOCOL_VERSION}/host/{group}"
    return base if node is None else f"{base}/{node[:NODE_TAG_CHARS]}"


HOST_ID_PREFIX = "raylane-lane-"  # every version's host ids start so (a claim by a host)


def host_submission_id(group: str, n: int, node: str | None = None) -> str:
    """The ``n``-th host of the group (on ``node``): ``raylane-lane-v1-cpu-3``, ``raylane-lane-v1-cpu-1a2b3c4d-3``."""
    where = group if node is None else f"{group}-{node[:NODE_TAG_CHARS]}"
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
    v: int = PROTOCOL_VERSION  # the writer's protocol version

    def encode(self) -> bytes:
        return json.dumps({k: v for k, v in asdict(self).items() if v is not None}).encode()

    @classmethod
    def decode(cls, value: bytes) -> "LaneStatus":
        """Any version's status; only one whose ``v`` is ``PROTOCOL_VERSION`` may be read further."""
        d = json.loads(value)
        return cls(**{k: d.get(k) for k in cls.__dataclass_fields__ if k != "v"}, v=d.get("v", 1))


def encode_item(sid: str, command: str, env: dict[str, str], *, args: dict[str, Any] | None = None,
                cpus: float = 0.0) -> bytes:
    """What a host needs to run an attempt: a shell command, or (``args`` given)
    a function's import path to call with ``args``; ``cpus``: what admission
    counted it to hold, which a host's CPUs must have room for (``item_cpus``)."""
    item: dict[str, Any] = {"v": PROTOCOL_VERSION, "sid": sid, "command": command, "env": env}
    if args is not None:
        item["call"] = args
    if cpus:
        item["cpus"] = cpus
    return json.dumps(item).encode()


def item_cpus(item: dict[str, Any]) -> float:
    """The CPUs an item holds while it runs (0 for an item written without them)."""
    return float(item.get("cpus") or 0.0)


def decode_item(value: bytes) -> dict[str, Any]:
    return json.loads(value)


def version_of(item: dict[str, Any]) -> int:
    """An item's protocol version (1 if written before items carried one)."""
    return item.get("v", 1)
