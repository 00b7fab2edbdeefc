"""Code packages: zipped working dirs named by their sha256
(``raylane.orchestrator.domain.packages``). Functions take a session and leave
committing to the caller, like ``store.jobs``.

A package is written once (insert-or-nothing: two uploads of one tree store one
row) and read whole only when it is handed to Ray. ``last_used_at`` moves on
upload, submit and dispatch; the sweep deletes what is unused since a cutoff
and named by no live job's spec.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import String, cast, delete, exists, insert, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from raylane.orchestrator.domain.packages import package_uri
from raylane.orchestrator.domain.states import TERMINAL
from raylane.orchestrator.store.tables import jobs, packages

# One sweep deletes at most this many packages: an upload pays for a bounded
# sweep; what is left goes with the next one.
SWEEP_BATCH = 50


def exists_(session: Session, sha256: str) -> bool:
    return session.execute(select(packages.c.sha256).where(packages.c.sha256 == sha256)).first() is not None


def put(session: Session, sha256: str, data: bytes, *, project: str | None, actor: str, now: datetime) -> bool:
    """Store a package; True if this call stored it, False if it was there (then it is touched)."""
    try:
        with session.begin_nested():
            session.execute(insert(packages).values(sha256=sha256, size_bytes=len(data), data=data, project=project,
                                                    created_by=actor, created_at=now, last_used_at=now))
        return True
    except IntegrityError:
        touch(session, sha256, now=now)
        return False


def touch(session: Session, sha256: str, *, now: datetime) -> bool:
    """Mark a package used now; False if there is no such package."""
    r = session.execute(update(packages).where(packages.c.sha256 == sha256).values(last_used_at=now))
    return r.rowcount == 1


def read(session: Session, sha256: str) -> bytes | None:
    row = session.execute(select(packages.c.data).where(packages.c.sha256 == sha256)).first()
    return None if row is None else bytes(row[0])


def sweep(session: Session, *, unused_before: datetime) -> list[str]:
    """Delete packages unused since ``unused_before`` that no live job's spec names;
    returns their sha256s (at most ``SWEEP_BATCH``)."""
    stale = session.execute(select(packages.c.sha256).where(packages.c.last_used_at < unused_before)
                            .order_by(packages.c.last_used_at).limit(SWEEP_BATCH)).scalars().all()
    gone = []
    for sha in stale:
        # The spec is JSON; its text holds the URI as written (one live-job scan
        # per stale package, on the status index, bounded by SWEEP_BATCH).
        in_use = session.execute(select(exists().where(
            jobs.c.status.not_in([s.value for s in TERMINAL]),
            cast(jobs.c.spec, String).contains(package_uri(sha))))).scalar()
        if not in_use:
            session.execute(delete(packages).where(packages.c.sha256 == sha,
                                                   packages.c.last_used_at < unused_before))
            gone.append(sha)
    return gone
