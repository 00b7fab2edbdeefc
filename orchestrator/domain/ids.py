"""Time-ordered job ids.

An id is a ULID (python-ulid) written in lower case: 48-bit milliseconds, then 80
random bits, 26 characters of Crockford base32. It sorts by creation time, so
"newest first" and cursor pagination are an index scan on the primary key, and
a page is stable under concurrent inserts. Ids minted in one process in the same
millisecond still sort in minting order (the library increments the random part).
"""

from __future__ import annotations

from ulid import ULID


def new_job_id(now_ms: int | None = None) -> str:
    # Lower case: ids were lower-case Crockford base32 before the library, and
    # stored ids, URLs and tests keep that spelling.
    return str(ULID() if now_ms is None else ULID.from_timestamp(int(now_ms))).lower()


def submission_id(job_id: str, attempt: int) -> str:
    """The Ray submission id of an attempt. Derived, never random: a dispatcher
    that crashed after submitting finds the same id in Ray instead of submitting twice."""
    return f"raylane-{job_id}-{attempt}"


