"""Webhooks and their deliveries (a transactional outbox). Functions take a
session and leave committing to the caller, like ``store.jobs``.

- ``enqueue_tick`` does the same for a schedule's handled tick, in the
  transaction that records it (``store.schedules.record``): a hook that asked for
  ``schedule.created`` or ``schedule.skipped`` hears of each tick once.
- ``enqueue`` runs inside the transaction that writes a job's status change
  (``store.transitions.transition``): one INSERT ... SELECT makes one delivery
  per hook of the job's project that wants the new status, so a committed
  status change always has its deliveries and a rolled-back one has none. With
  no hook it costs one indexed lookup that finds nothing.
- ``claim`` leases due deliveries to one notifier (a replica), so several
  replicas send each delivery once; a replica that dies mid-send leaves a lease
  that expires, and the delivery is sent again (at least once: receivers dedupe
  by the delivery id, which is the same on every try).
- ``sent`` records one try: DELIVERED on a 2xx, otherwise PENDING again after a
  backoff, or FAILED after the last try. Each try's outcome stays on the row
  (``GET /v1/webhooks/{id}/deliveries`` is the delivery log).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import and_, bindparam, delete, func, insert, literal, or_, select, update
from sqlalchemy.orm import Session

from raylane.orchestrator.store.tables import events, jobs, schedule_runs, schedules, webhook_deliveries, webhooks
from raylane.orchestrator.store import effects

PENDING, DELIVERED, FAILED = "PENDING", "DELIVERED", "FAILED"
# A schedule's handled tick, by its outcome: the event a hook may ask for.
SCHEDULE_EVENTS = {"created": "schedule.created", "skipped": "schedule.skipped"}


def statuses_column(statuses: list[str]) -> str:
    return "," + ",".join(statuses) + ","


def create(session: Session, *, hook_id: str, project: str, url: str, secret: str, statuses: list[str],
           events: list[str], description: str | None, actor: str, now: datetime) -> dict[str, Any]:
    row = {"id": hook_id, "project": project, "url": url, "secret": secret, "statuses": statuses_column(statuses),
           "events": statuses_column(events) if events else None, "description": description, "created_at": now,
           "created_by": actor}
    session.execute(insert(webhooks).values(**row))
    return row


def get(session: Session, hook_id: str, *, project: str | None) -> dict[str, Any] | None:
    """A hook, if it exists and ``project`` (None: any) may see it."""
    q = select(webhooks).where(webhooks.c.id == hook_id)
    if project is not None:
        q = q.where(webhooks.c.project == project)
    row = session.execute(q).mappings().first()
    return dict(row) if row else None


def list_(session: Session, *, project: str | None) -> list[dict[str, Any]]:
    q = select(webhooks).order_by(webhooks.c.created_at, webhooks.c.id)
    if project is not None:
        q = q.where(webhooks.c.project == project)
    return [dict(r) for r in session.execute(q).mappings()]


def delete_(session: Session, hook_id: str, *, project: str | None) -> bool:
    """Delete a hook and its deliveries (pending ones are not sent)."""
    if get(session, hook_id, project=project) is None:
        return False
    session.execute(delete(webhook_deliveries).where(webhook_deliveries.c.hook_id == hook_id))
    session.execute(delete(webhooks).where(webhooks.c.id == hook_id))
    return True


# Built once: it runs in every transition's transaction (the same statement, its values bound).
_ENQUEUE = insert(webhook_deliveries).from_select(
    ["hook_id", "event_id", "job_id", "status", "attempts", "next_at", "created_at"],
    select(webhooks.c.id, bindparam("event_id", type_=webhook_deliveries.c.event_id.type),
           bindparam("job_id", type_=webhook_deliveries.c.job_id.type), literal(PENDING), literal(0),
           bindparam("next_at", type_=webhook_deliveries.c.next_at.type),
           bindparam("created_at", type_=webhook_deliveries.c.created_at.type))
    .select_from(webhooks.join(jobs, jobs.c.project == webhooks.c.project))
    .where(jobs.c.id == bindparam("job_id"), webhooks.c.statuses.like(bindparam("wanted"))))


def enqueue(session: Session, *, job_id: str, event_id: int, to_status: str, now: datetime) -> None:
    """One delivery per hook of the job's project that wants ``to_status``."""
    session.execute(_ENQUEUE, {"event_id": event_id, "job_id": job_id, "next_at": now, "created_at": now,
                               "wanted": "%," + to_status + ",%"})


def any_wanted(session: Session, projects: set[str], to_status: str) -> bool:
    """Whether a hook of one of ``projects`` wants ``to_status`` (most clusters have none)."""
    return session.execute(select(webhooks.c.id).where(webhooks.c.project.in_(sorted(projects)),
                                                       webhooks.c.statuses.like("%," + to_status + ",%"))
                           .limit(1)).first() is not None


def enqueue_tick(session: Session, *, schedule_id: str, project: str, tick: datetime, outcome: str,
                 now: datetime) -> None:
    """One delivery per hook of the schedule's project that wants this tick's event
    (``SCHEDULE_EVENTS``), in the transaction that records the tick."""
    wanted = webhooks.c.events.like("%," + SCHEDULE_EVENTS[outcome] + ",%")
    chosen = (select(webhooks.c.id, literal(schedule_id), literal(tick, type_=webhook_deliveries.c.tick.type),
                     literal(PENDING), literal(0), literal(now, type_=webhook_deliveries.c.next_at.type),
                     literal(now, type_=webhook_deliveries.c.created_at.type))
              .where(webhooks.c.project == project, wanted))
    session.execute(insert(webhook_deliveries).from_select(
        ["hook_id", "schedule_id", "tick", "status", "attempts", "next_at", "created_at"], chosen))


def claim(session: Session, *, owner: str, now: datetime, lease_until: datetime, limit: int) -> list[dict[str, Any]]:
    """Lease up to ``limit`` due deliveries (PENDING, due, lease free or expired)
    to ``owner``; each with what its request needs: the hook, the event, the job."""
    free = or_(webhook_deliveries.c.lease_expires_at.is_(None), webhook_deliveries.c.lease_expires_at < now)
    due = and_(webhook_deliveries.c.status == PENDING, webhook_deliveries.c.next_at <= now, free)
    ids = session.execute(select(webhook_deliveries.c.id).where(due)
                          .order_by(webhook_deliveries.c.next_at, webhook_deliveries.c.id).limit(limit)).scalars().all()
    if not ids:
        return []
    # Compare-and-set: of two replicas that read the same ids, each row goes to one.
    mine = []
    for did in ids:
        r = session.execute(update(webhook_deliveries).where(webhook_deliveries.c.id == did, due)
                            .values(lease_owner=owner, lease_expires_at=lease_until))
        if r.rowcount == 1:
            mine.append(did)
    if not mine:
        return []
    d, h, e, r = webhook_deliveries, webhooks, events, schedule_runs
    rows = session.execute(
        select(d.c.id, d.c.attempts, d.c.job_id, h.c.id.label("hook_id"), h.c.url, h.c.secret, h.c.project,
               e.c.id.label("event_id"), e.c.at, e.c.from_status, e.c.to_status, e.c.reason, e.c.attempt,
               jobs.c.name, jobs.c.kind, jobs.c.failure_cause, d.c.schedule_id, d.c.tick,
               r.c.outcome.label("tick_outcome"), r.c.reason.label("tick_reason"), r.c.job_id.label("tick_job_id"),
               r.c.at.label("tick_at"), schedules.c.name.label("schedule_name"))
        .select_from(d.join(h, h.c.id == d.c.hook_id).outerjoin(e, e.c.id == d.c.event_id)
                     .outerjoin(jobs, jobs.c.id == d.c.job_id)
                     .outerjoin(r, and_(r.c.schedule_id == d.c.schedule_id, r.c.tick == d.c.tick))
                     .outerjoin(schedules, schedules.c.id == d.c.schedule_id))
        .where(d.c.id.in_(mine)).order_by(d.c.id)).mappings().all()
    return [dict(r) for r in rows]


def sent(session: Session, delivery_id: int, *, owner: str, now: datetime, status_code: int | None,
         error: str | None, retry_in: timedelta | None) -> bool:
    """Record one try of a delivery this owner holds. ``retry_in`` None after a
    failed try: give up (FAILED). False if the lease was lost meanwhile."""
    ok = status_code is not None and 200 <= status_code < 300
    values: dict[str, Any] = {"attempts": webhook_deliveries.c.attempts + 1, "last_status_code": status_code,
                              "last_error": (error or None) and error[:512], "lease_owner": None,
                              "lease_expires_at": None}
    if ok:
        values.update(status=DELIVERED, delivered_at=now)
    elif retry_in is None:
        values.update(status=FAILED)
    else:
        values.update(next_at=now + retry_in)
    r = session.execute(update(webhook_deliveries).where(webhook_deliveries.c.id == delivery_id,
                                                         webhook_deliveries.c.lease_owner == owner).values(**values))
    return r.rowcount == 1


def exists(session: Session, delivery_id: int) -> bool:
    return session.execute(select(webhook_deliveries.c.id).where(webhook_deliveries.c.id == delivery_id)
                           ).first() is not None


def deliveries(session: Session, hook_id: str, *, limit: int) -> list[dict[str, Any]]:
    d, e, r = webhook_deliveries, events, schedule_runs
    rows = session.execute(
        select(d.c.id, d.c.event_id, d.c.job_id, d.c.status, d.c.attempts, d.c.next_at, d.c.last_status_code,
               d.c.last_error, d.c.created_at, d.c.delivered_at, e.c.to_status, d.c.schedule_id, d.c.tick,
               r.c.outcome.label("tick_outcome"))
        .select_from(d.outerjoin(e, e.c.id == d.c.event_id)
                     .outerjoin(r, and_(r.c.schedule_id == d.c.schedule_id, r.c.tick == d.c.tick)))
        .where(d.c.hook_id == hook_id).order_by(d.c.id.desc()).limit(limit)).mappings().all()
    return [dict(r) for r in rows]


def pending_count(session: Session) -> int:
    return session.execute(select(func.count()).select_from(webhook_deliveries)
                           .where(webhook_deliveries.c.status == PENDING)).scalar_one()


def _outbox(m: effects.Moved) -> None:
    # In the change's transaction: a committed status change always has its deliveries.
    enqueue(m.session, job_id=m.job_id, event_id=m.event_id, to_status=m.to.value, now=m.now)


# Every change may be wanted by a hook; a batch of changes goes singly when one is (store.effects).
effects.register(effects.Effect("outbox", 20, _outbox,
                                wants_events=lambda session, projects, to: any_wanted(session, projects, to.value)))
