"""Schedules and their handled ticks. Functions take a session and leave
committing to the caller, like ``store.jobs``.

A pass over a due schedule (``loops.scheduler``): ``claim`` leases it to one
replica (compare-and-set), the replica makes the jobs of its due ticks (each
keyed by its tick, so a redo makes none twice), ``record`` writes each tick's
outcome (insert-or-nothing), and ``advance`` moves ``next_at`` on and releases
the lease, only if the lease is still this replica's.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import and_, delete, insert, or_, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from raylane.orchestrator.store.tables import jobs, schedule_runs, schedules, webhook_deliveries
from raylane.orchestrator.store import webhooks


def create(session: Session, row: dict[str, Any]) -> None:
    session.execute(insert(schedules).values(**row))


def get(session: Session, schedule_id: str, *, project: str | None) -> dict[str, Any] | None:
    q = select(schedules).where(schedules.c.id == schedule_id)
    if project is not None:
        q = q.where(schedules.c.project == project)
    row = session.execute(q).mappings().first()
    return dict(row) if row else None


def list_(session: Session, *, project: str | None) -> list[dict[str, Any]]:
    q = select(schedules).order_by(schedules.c.project, schedules.c.name)
    if project is not None:
        q = q.where(schedules.c.project == project)
    return [dict(r) for r in session.execute(q).mappings()]


def delete_(session: Session, schedule_id: str) -> None:
    """The schedule, its handled ticks and their webhook deliveries (pending ones are not sent)."""
    session.execute(delete(webhook_deliveries).where(webhook_deliveries.c.schedule_id == schedule_id))
    session.execute(delete(schedule_runs).where(schedule_runs.c.schedule_id == schedule_id))
    session.execute(delete(schedules).where(schedules.c.id == schedule_id))


def set_paused(session: Session, schedule_id: str, paused: bool, *, next_at: datetime | None, now: datetime) -> None:
    values: dict[str, Any] = {"paused": paused, "updated_at": now}
    if next_at is not None:
        values["next_at"] = next_at
    session.execute(update(schedules).where(schedules.c.id == schedule_id).values(**values))


def due_ids(session: Session, *, now: datetime, limit: int) -> list[str]:
    free = or_(schedules.c.lease_expires_at.is_(None), schedules.c.lease_expires_at < now)
    return list(session.execute(select(schedules.c.id).where(schedules.c.paused.is_(False), schedules.c.next_at <= now,
                                                             free).order_by(schedules.c.next_at).limit(limit)).scalars())


def claim(session: Session, schedule_id: str, *, owner: str, now: datetime, lease_until: datetime) -> dict | None:
    """Lease a due schedule to ``owner``; its row, or None if another replica has it."""
    free = or_(schedules.c.lease_expires_at.is_(None), schedules.c.lease_expires_at < now)
    r = session.execute(update(schedules).where(schedules.c.id == schedule_id, schedules.c.paused.is_(False),
                                                schedules.c.next_at <= now, free)
                        .values(lease_owner=owner, lease_expires_at=lease_until))
    if r.rowcount != 1:
        return None
    return dict(session.execute(select(schedules).where(schedules.c.id == schedule_id)).mappings().one())


def job_status(session: Session, job_id: str | None) -> str | None:
    if job_id is None:
        return None
    return session.execute(select(jobs.c.status).where(jobs.c.id == job_id)).scalar_one_or_none()


def record(session: Session, schedule_id: str, tick: datetime, *, job_id: str | None, outcome: str,
           reason: str | None, now: datetime, project: str) -> None:
    """A tick's outcome, and its webhook deliveries; a tick already recorded (a
    redo) keeps its first, and is not announced twice."""
    try:
        with session.begin_nested():
            session.execute(insert(schedule_runs).values(schedule_id=schedule_id, tick=tick, job_id=job_id,
                                                         outcome=outcome, reason=reason and reason[:256], at=now))
            webhooks.enqueue_tick(session, schedule_id=schedule_id, project=project, tick=tick, outcome=outcome,
                                  now=now)
    except IntegrityError:
        pass


def advance(session: Session, schedule_id: str, *, owner: str, next_at: datetime, last_job_id: str | None,
            now: datetime) -> bool:
    values: dict[str, Any] = {"next_at": next_at, "lease_owner": None, "lease_expires_at": None, "updated_at": now}
    if last_job_id is not None:
        values["last_job_id"] = last_job_id
    r = session.execute(update(schedules).where(schedules.c.id == schedule_id, schedules.c.lease_owner == owner)
                        .values(**values))
    return r.rowcount == 1


def runs(session: Session, schedule_id: str, *, limit: int) -> list[dict[str, Any]]:
    rows = session.execute(select(schedule_runs).where(schedule_runs.c.schedule_id == schedule_id)
                           .order_by(schedule_runs.c.tick.desc()).limit(limit)).mappings().all()
    return [dict(r) for r in rows]


def release(session: Session, schedule_id: str, *, owner: str) -> None:
    session.execute(update(schedules).where(and_(schedules.c.id == schedule_id, schedules.c.lease_owner == owner))
                    .values(lease_owner=None, lease_expires_at=None))
