"""Time-ordered job ids.

An id sorts by creation time (48-bit milliseconds, then 80 random bits, in
Crockford base32, like a ULID), so "newest first" and cursor pagination are an
index scan on the primary key, and a page is stable under concurrent inserts.
"""

from __future__ import annotations

import os
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


def parse_submission_id(sid: str) -> tuple[str, int] | None:
    if not sid.startswith("raylane-"):
        return None
    body = sid[len("raylane-"):]
    job_id, _, n = body.rpartition("-")
    if not job_id or not n.isdigit():
        return None
    return job_id, int(n)
