"""Rate-limit windows in the database, shared by every replica that uses it.

Words: a *window* is a fixed span of ``window_s`` seconds, starting at a multiple
of ``window_s`` since the epoch; its row counts the *hits* taken in it. A key's
limit is a *sliding window counter*: the hits of the current window plus the
previous window's hits weighted by how much of that window still lies inside
the last ``window_s`` seconds, rounded up (an estimate that errs towards
refusing: it assumes the previous window's hits were spread evenly).

Invariants:

- A hit is taken by one statement, ``INSERT .. ON CONFLICT DO UPDATE SET n = n + 1
  WHERE n < :room RETURNING n``: two replicas cannot both take the last unit, and
  a refused hit changes no row.
- The previous window is read, not locked: it has closed, so only a hit that
  started before its end can still land there.
- Rows older than the previous window count for nothing; ``prune`` deletes them.
"""

from __future__ import annotations

import math

from sqlalchemy import delete, select
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.orm import Session

from raylane.orchestrator.store.tables import rate_windows

MIN_WAIT_S = 0.001  # a refusal always asks the caller to wait a little


def _upsert(session: Session):
    return (pg_insert if session.bind.dialect.name == "postgresql" else sqlite_insert)(rate_windows)


def _count(session: Session, key: str, start: int) -> int:
    return session.execute(select(rate_windows.c.n).where(
        rate_windows.c.key == key, rate_windows.c.window_start == start)).scalar() or 0


def take(session: Session, key: str, *, limit: int, window_s: int, now: float) -> float:
    """Take one hit of ``key``; return 0 when allowed, else the seconds until one is."""
    start = int(now // window_s) * window_s
    frac = (now - start) / window_s
    prev = _count(session, key, start - window_s)
    room = limit - math.ceil(prev * (1 - frac))
    if room > 0:
        stmt = _upsert(session).values(key=key, window_start=start, n=1)
        stmt = stmt.on_conflict_do_update(index_elements=[rate_windows.c.key, rate_windows.c.window_start],
                                          set_={"n": rate_windows.c.n + 1},
                                          where=rate_windows.c.n < room).returning(rate_windows.c.n)
        if session.execute(stmt).first() is not None:
            return 0.0
    cur = _count(session, key, start)
    return max(_wait(limit, window_s, start, now, prev, cur), MIN_WAIT_S)


def _wait(limit: int, window_s: int, start: int, now: float, prev: int, cur: int) -> float:
    """Seconds until ceil(prev' * (1 - f)) + cur' < limit again (f: the share of the window gone)."""
    if cur < limit and prev > 0:  # this window has room once the previous one weighs less
        f = 1 - (limit - cur - 1) / prev
        return start + window_s * f - now
    # The next window, where this one is the previous: wait for it to weigh below limit - 1.
    f = max(0.0, 1 - (limit - 1) / cur) if cur else 0.0
    return start + window_s * (1 + f) - now


def prune(session: Session, *, now: float, keep_s: int) -> int:
    """Delete the windows that started more than ``keep_s`` ago; return how many."""
    return session.execute(delete(rate_windows).where(rate_windows.c.window_start < now - keep_s)).rowcount
