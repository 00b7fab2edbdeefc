"""Time-ordered job ids.

An id sorts by creation time (48-bit milliseconds, then 80 random bits, in
Crockford base32, like a ULID), so "newest first" and cursor pagination are an
index scan on the primary key, and a page is stable under concurrent inserts.
"""

from __future__ import annotations

import os
import re
import time

_ALPHABET = "0123456789abcdefghjkmnpqrstvwxyz"


def _b32(n: int, length: int) -> str:
    out = []
    for _ in range(length):
        out.append(_ALPHABET[n & 31])
        n >>= 5
    return "".join(reversed(out))


def new_job_id(now_ms: int | None = None) -> str:
    ms = int(time.time() * 1000) if now_ms is None else now_ms
    rand = int.from_bytes(os.urandom(10), "big")
    return _b32(ms, 10) + _b32(rand, 16)


def submission_id(job_id: str, attempt: int) -> str:
    """The Ray submission id of an attempt. Derived, never random: a dispatcher
    that crashed after submitting finds the same id in Ray instead of submitting twice."""
    return f"raylane-{job_id}-{attempt}"


# Raylane's messages to running jobs in Ray's internal key-value store: the control
# plane writes (``raylane.orchestrator.backends.ray_gcs``), the job's runner reads
# (``raylane.jobs.base.CheckpointSignal``).
KV_NAMESPACE = "raylane"


def checkpoint_key(submission_id: str) -> str:
    """Where the control plane asks an attempt to checkpoint now (its node is draining)."""
    return f"checkpoint/{submission_id}"


# Ray's words when an actor or task is lost with its node, naming the node.
RAY_NODE_DIED = re.compile(r"because its node has died\. Node Id: ([0-9a-f]{56})")
