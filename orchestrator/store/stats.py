"""Aggregate reads: what active jobs hold (admission, GET /v1/node-groups) and the
counts the metrics collector turns into Prometheus families.

Every function is one read, or a few, of the tables as they are now; nothing is
kept between calls, so every control-plane replica answers the same. Jobs and
attempts not yet routed are counted under ``NONE``.

Words: *active* is ``states.ACTIVE`` (dispatching, running, cancelling),
*queued* is ``states.QUEUED`` (pending, retrying); a *histogram row* is
``(count, sum, [how many <= each bucket])`` per node group, summed in SQL.
"""

from __future__ import annotations

from datetime import datetime
from typing import Sequence

from sqlalchemy import case, func, select
from sqlalchemy.orm import Session

from raylane.orchestrator.domain.states import ACTIVE, QUEUED, AttemptStatus, FailureCause, JobStatus
from raylane.orchestrator.store.tables import attempts, jobs

assert QUEUED == {JobStatus.PENDING, JobStatus.RETRYING}, "queue_by_group below names both statuses"

NONE = "none"
HistogramRow = tuple[int, float, list[int]]

_ACTIVE = [s.value for s in ACTIVE]
_job_group = func.coalesce(jobs.c.node_group, NONE)
_attempt_group = func.coalesce(attempts.c.node_group, NONE)


def used_by_active(session: Session) -> tuple[dict[str, dict[str, float]], int]:
    """Resources Raylane's active jobs hold per node group, and how many drivers run."""
    used: dict[str, dict[str, float]] = {}
    n = 0
    for group, placement in session.execute(
        select(jobs.c.node_group, jobs.c.placement).where(jobs.c.status.in_(_ACTIVE))
    ):
        n += 1
        if not placement:
            continue
        g = used.setdefault(group, {})
        for k, v in (placement.get("total") or {}).items():
            g[k] = g.get(k, 0) + v
        drv = placement.get("driver_label_selector", {}).get("ray.io/node-group")
        if drv and drv != group:
            d = used.setdefault(drv, {})
            for k, v in (placement.get("driver_resources") or {}).items():
                d[k] = d.get(k, 0) + v
    return used, n


def ahead_by_group(session: Session) -> dict[str, int]:
    """Attempts admitted ahead of a scale-up whose driver has not started, per
    group: a live attempt carries a message only then (``queue.admit``)."""
    waiting = [AttemptStatus.CLAIMED.value, AttemptStatus.SUBMITTED.value, AttemptStatus.PENDING.value]
    return dict(session.execute(select(_attempt_group, func.count()).where(
        attempts.c.status.in_(waiting), attempts.c.message.is_not(None)).group_by(_attempt_group)).all())


def jobs_per_group(session: Session) -> tuple[dict[str, int], dict[str, int]]:
    """(active, queued) job counts per node group."""
    def count(statuses):
        return dict(session.execute(select(jobs.c.node_group, func.count()).where(
            jobs.c.status.in_([x.value for x in statuses])).group_by(jobs.c.node_group)).all())
    return count(ACTIVE), count(QUEUED)


def jobs_by_status(session: Session) -> list[tuple[str, str, int]]:
    """(status, node group, jobs) for every pair that has a job."""
    return [tuple(r) for r in session.execute(
        select(jobs.c.status, _job_group, func.count()).group_by(jobs.c.status, _job_group))]


def queue_by_group(session: Session) -> dict[str, tuple[int, datetime | None]]:
    """Node group -> (queued jobs, when the longest-waiting one started waiting):
    PENDING waits since submit, RETRYING since its last failure."""
    out: dict[str, tuple[int, datetime | None]] = {}
    for status, col in ((JobStatus.PENDING.value, jobs.c.created_at), (JobStatus.RETRYING.value, jobs.c.updated_at)):
        for group, n, first in session.execute(
                select(_job_group, func.count(), func.min(col)).where(jobs.c.status == status).group_by(_job_group)):
            count, oldest = out.get(group, (0, None))
            if first is not None and (oldest is None or first < oldest):
                oldest = first
            out[group] = (count + n, oldest)
    return out


def jobs_by_kind(session: Session) -> dict[str, int]:
    return dict(session.execute(select(jobs.c.kind, func.count()).group_by(jobs.c.kind)).all())


def attempts_by_market(session: Session) -> dict[tuple[str, str], int]:
    market = func.coalesce(attempts.c.market, NONE)
    return {(g, m): n for g, m, n in session.execute(
        select(_attempt_group, market, func.count()).group_by(_attempt_group, attempts.c.market))}


def failures_by_cause(session: Session) -> dict[tuple[str, str], int]:
    return {(g, cause): n for g, cause, n in session.execute(
        select(_attempt_group, attempts.c.cause, func.count()).where(attempts.c.cause.is_not(None))
        .group_by(_attempt_group, attempts.c.cause))}


def retries_by_group(session: Session) -> dict[str, int]:
    """Attempts after a job's first: each one is a retry."""
    return _attempts_per_group(session, attempts.c.number > 1)


def preemptions_by_group(session: Session) -> dict[str, int]:
    return _attempts_per_group(session, attempts.c.cause == FailureCause.PREEMPTED.value)


def _attempts_per_group(session: Session, cond) -> dict[str, int]:
    return dict(session.execute(select(_attempt_group, func.count()).where(cond).group_by(_attempt_group)).all())


def _seconds_between(session: Session, later, earlier):
    """``later - earlier`` in seconds, as SQL, on SQLite and PostgreSQL."""
    if session.bind.dialect.name == "postgresql":
        return func.extract("epoch", later - earlier)
    return (func.julianday(later) - func.julianday(earlier)) * 86400.0


def _histogram(session: Session, seconds, where, buckets: Sequence[float]) -> dict[str, HistogramRow]:
    sub = select(attempts.c.node_group.label("g"), seconds.label("d")).where(*where).subquery()
    cols = [func.count(), func.coalesce(func.sum(sub.c.d), 0.0)]
    cols += [func.sum(case((sub.c.d <= b, 1), else_=0)) for b in buckets]
    return {g or NONE: (count, total, le) for g, count, total, *le in
            session.execute(select(sub.c.g, *cols).group_by(sub.c.g))}


def admission_waits(session: Session, buckets: Sequence[float]) -> dict[str, HistogramRow]:
    """Seconds from submit to the first dispatch, per node group admitted to."""
    return _histogram(session, _seconds_between(session, attempts.c.created_at, jobs.c.created_at),
                      [attempts.c.job_id == jobs.c.id, attempts.c.number == 1], buckets)


def dispatch_latencies(session: Session, buckets: Sequence[float]) -> dict[str, HistogramRow]:
    """Seconds from dispatch to the attempt running on Ray, per attempt."""
    return _histogram(session, _seconds_between(session, attempts.c.started_at, attempts.c.created_at),
                      [attempts.c.started_at.is_not(None)], buckets)


def active_attempt_resources(session: Session) -> list[tuple[str | None, dict]]:
    """(node group, resources) of each active job's current, unended attempt."""
    return [(group, res or {}) for group, res in session.execute(
        select(attempts.c.node_group, attempts.c.resources).join(jobs, jobs.c.id == attempts.c.job_id)
        .where(jobs.c.status.in_(_ACTIVE), attempts.c.number == jobs.c.attempts, attempts.c.ended_at.is_(None)))]
