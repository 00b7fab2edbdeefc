"""Preemption's statements (``domain.sharing``, docs/sharing.md). Functions take a
session and leave committing to the caller (the dispatcher's pass, the reconciler).

An attempt being preempted carries ``preempt_for`` (the waiting job) and
``preempt_deadline`` (its grace period's end); the reconciler asks it to
checkpoint, stops it once it has or at the deadline, and it ends
PREEMPTED_BY_PRIORITY. While any of a waiting job's victims is live, nothing more
is preempted for it.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy import or_, select, update
from sqlalchemy.orm import Session

from raylane.orchestrator.domain import sharing
from raylane.orchestrator.domain.kinds import traits
from raylane.orchestrator.domain.states import ATTEMPT_LIVE, AttemptStatus, FailureCause, JobStatus
from raylane.orchestrator.store.fleet import Scope, attempts_on
from raylane.orchestrator.store.tables import attempts, jobs
from raylane.orchestrator.store.transitions import record_event

_LIVE = [a.value for a in ATTEMPT_LIVE]
# After its last victim ended, a waiting job keeps what they freed this long: a
# dispatcher pass or two admits it; one that still does not fit by then lets others in.
RECLAIM_HOLD_S = 120.0


def _holder(r, *, grace_s: float) -> sharing.Holder:
    spec = r.spec or {}
    pre = spec.get("preemption") or {}
    preemptible = pre.get("preemptible")
    if preemptible is None:
        preemptible = traits(spec.get("kind", "command")).preemptible
    grace = pre.get("grace_s")
    return sharing.Holder(
        job_id=r.job_id, number=r.number, project=r.project, group=r.node_group,
        total=((r.placement or {}).get("total") or {}), priority=int(spec.get("priority", 50)),
        started_at=r.started_at, preemptible=bool(preemptible) and not (r.placement or {}).get("lane"),
        grace_s=float(grace_s if grace is None else grace), preempt_for=r.preempt_for,
        preempt_deadline=r.preempt_deadline, name=spec.get("name", ""))


def _running(scope: Scope | None):
    return (select(attempts.c.job_id, attempts.c.number, attempts.c.started_at, attempts.c.preempt_for,
                   attempts.c.preempt_deadline, jobs.c.project, jobs.c.node_group, jobs.c.spec, jobs.c.placement)
            .join(jobs, jobs.c.id == attempts.c.job_id)
            .where(attempts.c.status.in_(_LIVE), jobs.c.attempts == attempts.c.number,
                   jobs.c.status == JobStatus.RUNNING.value, attempts_on(scope)))


def holders(s: Session, *, grace_s: float, scope: Scope | None = None) -> list[sharing.Holder]:
    """Every running attempt (``scope``: on one cluster of a fleet), as preemption sees it."""
    return [_holder(r, grace_s=grace_s) for r in s.execute(
        _running(scope).where(attempts.c.status == AttemptStatus.RUNNING.value))]


def any_since(s: Session, *, since: datetime, scope: Scope | None = None) -> bool:
    """Whether any attempt is being preempted, or was since ``since``: most passes
    find none and read nothing more (``ix_attempts_preempt_for``)."""
    return s.execute(select(attempts.c.job_id).where(
        attempts.c.preempt_for.is_not(None), attempts_on(scope),
        or_(attempts.c.status.in_(_LIVE), attempts.c.ended_at >= since)).limit(1)).first() is not None


def preempting(s: Session, *, grace_s: float, scope: Scope | None = None) -> dict[str, list[sharing.Holder]]:
    """Waiting job -> its victims still live (asked to checkpoint, or stopping)."""
    out: dict[str, list[sharing.Holder]] = {}
    for r in s.execute(_running(scope).where(attempts.c.preempt_for.is_not(None))):
        out.setdefault(r.preempt_for, []).append(_holder(r, grace_s=grace_s))
    return out


def reclaiming(s: Session, *, now: datetime, hold_s: float = RECLAIM_HOLD_S,
               scope: Scope | None = None) -> dict[str, str]:
    """Group -> the waiting job its victims were stopped for: while any victim is
    live, and for ``hold_s`` after the last ended, what they free is the waiting
    job's (a victim queued again must not take it back first). Only for a job
    that still waits."""
    waiter = jobs.alias("waiter")
    rows = s.execute(select(attempts.c.node_group, attempts.c.preempt_for).join(
        waiter, waiter.c.id == attempts.c.preempt_for).where(
        attempts.c.preempt_for.is_not(None), attempts_on(scope),
        waiter.c.status.in_([JobStatus.PENDING.value, JobStatus.RETRYING.value]),
        or_(attempts.c.status.in_(_LIVE), attempts.c.ended_at >= now - timedelta(seconds=hold_s)))
        .order_by(attempts.c.preempt_deadline))
    out: dict[str, str] = {}
    for group, w in rows:
        out.setdefault(group, w)
    return out


def preempted_by(s: Session, *, since: datetime) -> dict[str, frozenset[str]]:
    """Job -> the jobs it was preempted for since ``since`` (the cycle window)."""
    out: dict[str, set[str]] = {}
    for jid, other in s.execute(select(attempts.c.job_id, attempts.c.preempt_for).where(
            attempts.c.preempt_for.is_not(None), attempts.c.cause == FailureCause.PREEMPTED_BY_PRIORITY.value,
            attempts.c.ended_at >= since)):
        out.setdefault(jid, set()).add(other)
    return {k: frozenset(v) for k, v in out.items()}


def request(s: Session, waiter_id: str, victims: list[sharing.Victim], *, now: datetime) -> None:
    """Mark each victim's attempt as preempted for ``waiter_id``, with its deadline,
    and say so in its events. Only an attempt still live and not already being
    preempted is marked (a race with its end or another replica's pass: skipped)."""
    for v in victims:
        h = v.holder
        deadline = now + timedelta(seconds=h.grace_s)
        done = s.execute(update(attempts).where(
            attempts.c.job_id == h.job_id, attempts.c.number == h.number, attempts.c.status.in_(_LIVE),
            attempts.c.preempt_for.is_(None)).values(preempt_for=waiter_id, preempt_deadline=deadline)).rowcount
        if done:
            record_event(s, h.job_id, status=JobStatus.RUNNING, actor="scheduler", attempt=h.number, now=now,
                         reason=f"preempted for job {waiter_id} ({v.why}): asked to checkpoint, stopped by "
                                f"{deadline.strftime('%H:%M:%S')} UTC at the latest "
                                f"(grace {h.grace_s:g} s); queued again after, not counted against max_attempts")


def withdraw(s: Session, waiter_ids: list[str], *, now: datetime) -> None:
    """The waiting jobs started (or went) without their victims: victims not yet
    being stopped keep running."""
    if not waiter_ids:
        return
    rows = s.execute(select(attempts.c.job_id, attempts.c.number, attempts.c.preempt_for).where(
        attempts.c.preempt_for.in_(waiter_ids), attempts.c.status.in_(_LIVE), attempts.c.cause.is_(None))).all()
    for jid, n, waiter in rows:
        s.execute(update(attempts).where(attempts.c.job_id == jid, attempts.c.number == n,
                                         attempts.c.cause.is_(None))
                  .values(preempt_for=None, preempt_deadline=None))
        record_event(s, jid, status=JobStatus.RUNNING, actor="scheduler", attempt=n, now=now,
                     reason=f"no longer preempted: job {waiter} started without it")


def waiting(s: Session, job_ids: list[str]) -> set[str]:
    """Of ``job_ids``, those still queued (a victim is stopped only for a job that waits)."""
    if not job_ids:
        return set()
    return set(s.execute(select(jobs.c.id).where(
        jobs.c.id.in_(job_ids), jobs.c.status.in_([JobStatus.PENDING.value, JobStatus.RETRYING.value]))).scalars())
