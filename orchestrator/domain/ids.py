"""Time-ordered job ids.

An id is a ULID written in lower case: 48-bit milliseconds, then 80 random bits,
26 characters of Crockford base32. It sorts by creation time, so "newest first"
and cursor pagination are an index scan on the primary key, and a page is stable
under concurrent inserts. Ids minted in one process in the same millisecond sort
in minting order: the random part of the millisecond's first id is incremented,
as the ULID spec's monotonic generator does.

Minted here, not by python-ulid (used before, and still the tests' reference for
the format): its ``str`` encodes five bits a step in Python, and it mints one id
at a time under its lock and policy; a 1,000-job batch spent 6% of its server
CPU there (4.1 us an id against about 0.8 here).
"""

from __future__ import annotations

import os
import threading
import time

_DIGITS = "0123456789abcdefghjkmnpqrstvwxyz"  # Crockford's, in lower case
_PAIRS = [a + b for a in _DIGITS for b in _DIGITS]  # ten bits -> two digits
_RANDOM_BITS = 80
_RANDOM_MAX = (1 << _RANDOM_BITS) - 1

_lock = threading.Lock()
_last = [-1, 0]  # the millisecond of the last id minted, and its random part


def _forget_after_fork() -> None:
    # A forked child (a uvicorn worker) must not go on from its parent's last id:
    # both would mint the same next one within that millisecond.
    global _lock
    _lock = threading.Lock()
    _last[0], _last[1] = -1, 0


os.register_at_fork(after_in_child=_forget_after_fork)


def encode(value: int, _p: list[str] = _PAIRS) -> str:
    """A 128-bit ULID as its 26 digits: 130 bits (the first two zero), ten a step."""
    return "".join([_p[value >> 120], _p[(value >> 110) & 1023], _p[(value >> 100) & 1023],
                    _p[(value >> 90) & 1023], _p[(value >> 80) & 1023], _p[(value >> 70) & 1023],
                    _p[(value >> 60) & 1023], _p[(value >> 50) & 1023], _p[(value >> 40) & 1023],
                    _p[(value >> 30) & 1023], _p[(value >> 20) & 1023], _p[(value >> 10) & 1023], _p[value & 1023]])


def _reserve(n: int) -> int:
    """The first of ``n`` consecutive ULIDs (as an int), after every id this process
    minted before: a new millisecond starts at a random point, the same one goes on
    from its last id (a millisecond whose random part runs out takes the next one)."""
    with _lock:
        ms, last = _last
        now = max(time.time_ns() // 1_000_000, ms)
        if now == ms and last + n <= _RANDOM_MAX:
            start = last + 1
        else:
            if now == ms:
                now += 1  # ran out within the millisecond: borrow the next
            # Room for n after the start, so the run never wraps into the timestamp.
            start = int.from_bytes(os.urandom(_RANDOM_BITS // 8), "big") % (_RANDOM_MAX - n + 2)
        _last[0], _last[1] = now, start + n - 1
        return now << _RANDOM_BITS | start


def new_job_id(now_ms: int | None = None) -> str:
    """A new id; ``now_ms``: of that millisecond instead (random, not ordered: the bench's generator)."""
    if now_ms is not None:
        return encode(int(now_ms) << _RANDOM_BITS | int.from_bytes(os.urandom(_RANDOM_BITS // 8), "big"))
    return encode(_reserve(1))


def new_job_ids(n: int) -> list[str]:
    """``n`` ids in minting order (a batch's), reserved at once."""
    if n <= 0:
        return []
    return encode_run(_reserve(n), n)


def encode_run(base: int, n: int, _p: list[str] = _PAIRS) -> list[str]:
    """``[encode(base + i) for i in range(n)]``: consecutive ids share all but their
    last three digits (30 bits) until a carry reaches them, so those are encoded
    once a run of 2**30, not for every id."""
    out = []
    prefix_of = -1
    prefix = ""
    for v in range(base, base + n):
        hi = v >> 30
        if hi != prefix_of:
            prefix_of, prefix = hi, encode(v)[:-6]
        out.append(prefix + _p[(v >> 20) & 1023] + _p[(v >> 10) & 1023] + _p[v & 1023])
    return out


def submission_id(job_id: str, attempt: int) -> str:
    """The Ray submission id of an attempt. Derived, never random: a dispatcher
    that crashed after submitting finds the same id in Ray instead of submitting twice."""
    return f"raylane-{job_id}-{attempt}"


