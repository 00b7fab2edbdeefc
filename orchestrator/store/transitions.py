"""The only writer of a job's status and of an attempt's.

``transition`` is a compare-and-set: it reads the current status, checks the
arrow against ``states.ALLOWED``, and updates ``WHERE id=:id AND status=:seen``.
If another writer got there first (rowcount 0), it re-reads and tries again a
bounded number of times, then raises ``InvalidTransition``. Every change writes
an event row in the same transaction.

``set_attempt`` does the same for an attempt (``states.ATTEMPT_ALLOWED``), keyed
by job id and attempt number; an attempt's change has no event of its own (the
job's transition written with it names the attempt).
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any, Iterable

from sqlalchemy import insert, select, update
from sqlalchemy.orm import Session

from raylane.orchestrator.domain.errors import InvalidTransition, NotFound
from raylane.orchestrator.domain.states import ALLOWED, ATTEMPT_ALLOWED, AttemptStatus, JobStatus
from raylane.orchestrator.store.tables import attempts, events, jobs
from raylane.orchestrator.store import arrays, dependencies, webhooks

# A status can change only a few times; more lost races than this means a bug
# (avoid an infinite loop if one happens).
MAX_CAS_RETRIES = 8


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


def transition(
    session: Session,
    job_id: str,
    to: JobStatus,
    *,
    reason: str | None,
    actor: str,
    expected: Iterable[JobStatus] | None = None,
    attempt: int | None = None,
    values: dict[str, Any] | None = None,
    now: datetime | None = None,
    cascade: bool = True,
) -> JobStatus:
    """Move ``job_id`` to ``to``; return the status it came from. ``cascade``: an end
    updates the job's dependents (``store.dependencies``, which passes False while it
    walks a chain itself).

    ``expected`` narrows the allowed sources further (e.g. the reconciler only
    moves RUNNING jobs to SUCCEEDED). ``values`` are other columns set in the
    same UPDATE. ``status_reason`` is set to ``reason`` unless ``values`` sets it.
    """
    now = now or utcnow()
    allowed = {s for s, dsts in ALLOWED.items() if to in dsts}
    if expected is not None:
        allowed &= set(expected)
    for _ in range(MAX_CAS_RETRIES):
        found = session.execute(select(jobs.c.status, jobs.c.array_id).where(jobs.c.id == job_id)).first()
        if found is None:
            raise NotFound(f"job {job_id} not found")
        seen, array_id = found
        src = JobStatus(seen)
        if src not in allowed:
            raise InvalidTransition(f"job {job_id} is {src.value}; it cannot become {to.value}")
        vals = {"status_reason": reason, **(values or {}), "status": to.value, "updated_at": now}
        res = session.execute(
            update(jobs).where(jobs.c.id == job_id, jobs.c.status == src.value).values(**vals)
        )
        if res.rowcount == 1:
            ev = session.execute(
                insert(events).values(
                    job_id=job_id, at=now, from_status=src.value, to_status=to.value,
                    reason=reason, actor=actor, attempt=attempt,
                )
            )
            # In this transaction: a committed status change always has its deliveries.
            webhooks.enqueue(session, job_id=job_id, event_id=ev.inserted_primary_key[0], to_status=to.value, now=now)
            if to.is_terminal():
                if array_id is not None:
                    arrays.release(session, array_id, now=now)  # the next held member may start
                if cascade:  # its children count it, or are cancelled (parent_ended walks the chain itself)
                    dependencies.parent_ended(session, job_id, to, now=now)
            return src
    raise InvalidTransition(f"job {job_id}: lost {MAX_CAS_RETRIES} races moving to {to.value}")


def record_event(
    session: Session, job_id: str, *, status: JobStatus, reason: str, actor: str,
    attempt: int | None = None, now: datetime | None = None,
) -> None:
    """An event that is not a status change (e.g. "waiting for 2 GPUs")."""
    session.execute(
        insert(events).values(
            job_id=job_id, at=now or utcnow(), from_status=status.value, to_status=status.value,
            reason=reason, actor=actor, attempt=attempt,
        )
    )


def set_attempt(
    session: Session,
    job_id: str,
    number: int,
    to: AttemptStatus,
    *,
    expected: Iterable[AttemptStatus] | None = None,
    values: dict[str, Any] | None = None,
) -> AttemptStatus:
    """Move attempt ``number`` of ``job_id`` to ``to``; return the status it came from.

    A compare-and-set like ``transition``: an arrow ``states.ATTEMPT_ALLOWED``
    lacks, or a status outside ``expected``, raises ``InvalidTransition``.
    """
    allowed = {s for s, dsts in ATTEMPT_ALLOWED.items() if to in dsts}
    if expected is not None:
        allowed &= set(expected)
    where = (attempts.c.job_id == job_id, attempts.c.number == number)
    for _ in range(MAX_CAS_RETRIES):
        seen = session.execute(select(attempts.c.status).where(*where)).scalar_one_or_none()
        if seen is None:
            raise NotFound(f"attempt {number} of job {job_id} not found")
        src = AttemptStatus(seen)
        if src not in allowed:
            raise InvalidTransition(f"attempt {number} of job {job_id} is {src.value}; it cannot become {to.value}")
        res = session.execute(update(attempts).where(*where, attempts.c.status == src.value)
                              .values(**(values or {}), status=to.value))
        if res.rowcount == 1:
            return src
    raise InvalidTransition(f"attempt {number} of job {job_id}: lost {MAX_CAS_RETRIES} races moving to {to.value}")
