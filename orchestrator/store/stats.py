"""Aggregate reads: what active jobs hold (admission, GET /v1/node-groups) and the
counts the metrics collector turns into Prometheus families.

Every function is one read, or a few, of the tables as they are now, bounded by
the jobs that are active or queued (never by every job stored: the counts of
those live in ``store.tallies``); nothing is kept between calls, so every
control-plane replica answers the same. Jobs and attempts not yet routed are
counted under ``NONE``.

Words: *active* is ``states.ACTIVE`` (dispatching, running, cancelling),
*queued* is ``states.QUEUED`` (pending, retrying).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from raylane.orchestrator.domain.states import ACTIVE, QUEUED, AttemptStatus, JobStatus
from raylane.orchestrator.store.fleet import Scope, attempts_on, jobs_on
from raylane.orchestrator.store.tables import attempts, jobs
from raylane.orchestrator.store.tallies import NONE

assert QUEUED == {JobStatus.PENDING, JobStatus.RETRYING}, "queue_oldest below names both statuses"


_ACTIVE = [s.value for s in ACTIVE]
_attempt_group = func.coalesce(attempts.c.node_group, NONE)


def used_by_active(session: Session, scope: Scope | None = None) -> tuple[dict[str, dict[str, float]], int]:
    """Resources Raylane's active jobs hold per node group, and how many drivers
    run (a job in a warm lane has none: ``domain.lanes``); ``scope``: on one
    cluster of a fleet (its groups' names may be another cluster's too)."""
    used: dict[str, dict[str, float]] = {}
    n = 0
    for group, placement in session.execute(
        select(jobs.c.node_group, jobs.c.placement).where(jobs.c.status.in_(_ACTIVE), jobs_on(scope))
    ):
        n += 0 if (placement or {}).get("lane") else 1
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


def waiting_by_group(session: Session, scope: Scope | None = None) -> tuple[dict[tuple[str, bool], int], dict[str, float]]:
    """Per node group: ``(group, False)``, Ray jobs admitted and not yet running
    (DISPATCHING: waiting in Ray's queue); ``(group, True)``, active jobs in a
    warm lane (they hold CPUs that Ray does not see: admission's queue-ahead
    keeps out of such a group). And per group the most CPUs one of those Ray
    jobs waits for (a smaller job queued behind it could take its place)."""
    out: dict[tuple[str, bool], int] = {}
    need: dict[str, float] = {}
    for group, status, placement in session.execute(
        select(jobs.c.node_group, jobs.c.status, jobs.c.placement).where(jobs.c.status.in_(_ACTIVE), jobs_on(scope))
    ):
        lane = bool((placement or {}).get("lane"))
        if lane or status == JobStatus.DISPATCHING.value:
            out[(group, lane)] = out.get((group, lane), 0) + 1
        if not lane and status == JobStatus.DISPATCHING.value:
            need[group] = max(need.get(group, 0.0), float(((placement or {}).get("total") or {}).get("CPU", 0)))
    return out, need


# A running attempt's workers may still be asking Ray for their placement group
# (the runner imports, builds its gang): GPUs of an attempt running for less than
# this are counted as not placed yet.
PLACING_S = 120.0


def unplaced_gpus(session: Session, now: datetime, scope: Scope | None = None) -> dict[str, float]:
    """Per node group, the GPUs of live attempts that Ray may not have placed on a
    node yet: not running (claimed, submitted, pending in Ray), or running for less
    than ``PLACING_S``. What admission may take per node on their behalf
    (``admission._Pass``); bounded so, GPUs that Ray never places on the group's
    nodes (a job on a draining node, a sweep below its concurrency) are not."""
    placing = [AttemptStatus.CLAIMED.value, AttemptStatus.SUBMITTED.value, AttemptStatus.PENDING.value]
    since = now - timedelta(seconds=PLACING_S)
    out: dict[str, float] = {}
    for group, resources in session.execute(select(_attempt_group, attempts.c.resources).where(
            (attempts.c.status.in_(placing)) |
            ((attempts.c.status == AttemptStatus.RUNNING.value) & (attempts.c.started_at > since)),
            attempts_on(scope))):
        gpus = float((resources or {}).get("GPU", 0.0))
        if gpus:
            out[group] = out.get(group, 0.0) + gpus
    return out


def ahead_by_group(session: Session, scope: Scope | None = None) -> dict[str, int]:
    """Attempts admitted ahead of a scale-up whose driver has not started, per
    group: a live attempt carries a message only then (``queue.admit``)."""
    waiting = [AttemptStatus.CLAIMED.value, AttemptStatus.SUBMITTED.value, AttemptStatus.PENDING.value]
    return dict(session.execute(select(_attempt_group, func.count()).where(
        attempts.c.status.in_(waiting), attempts.c.message.is_not(None), attempts_on(scope))
        .group_by(_attempt_group)).all())


def jobs_per_group(session: Session, scope: Scope | None = None) -> tuple[dict[str, int], dict[str, int]]:
    """(active, queued) job counts per node group (``scope``: on one cluster of a fleet)."""
    def count(statuses):
        return dict(session.execute(select(jobs.c.node_group, func.count()).where(
            jobs.c.status.in_([x.value for x in statuses]), jobs_on(scope)).group_by(jobs.c.node_group)).all())
    return count(ACTIVE), count(QUEUED)


def queue_oldest(session: Session, counts: dict[tuple[str, str], float]) -> dict[str, tuple[int, datetime | None]]:
    """Node group -> (queued jobs, when the longest-waiting one started waiting):
    PENDING waits since submit, RETRYING since its last failure. ``counts`` is
    ``(status, group) -> jobs`` (``tallies``); the oldest is one index step per
    group for PENDING (``ix_jobs_node_group_status_created_at``), and a read of
    the group's RETRYING jobs (those wait out a backoff: few at a time)."""
    out: dict[str, tuple[int, datetime | None]] = {}
    for (status, group), n in sorted(counts.items()):
        if status not in (JobStatus.PENDING.value, JobStatus.RETRYING.value) or n <= 0:
            continue
        col = jobs.c.created_at if status == JobStatus.PENDING.value else jobs.c.updated_at
        in_group = jobs.c.node_group.is_(None) if group == NONE else jobs.c.node_group == group
        first = session.execute(select(col).where(in_group, jobs.c.status == status)
                                .order_by(col).limit(1)).scalar_one_or_none()
        count, oldest = out.get(group, (0, None))
        if first is not None and (oldest is None or first < oldest):
            oldest = first
        out[group] = (count + int(n), oldest)
    return out


def active_attempt_resources(session: Session) -> list[tuple[str | None, dict]]:
    """(node group, resources) of each active job's current, unended attempt."""
    return [(group, res or {}) for group, res in session.execute(
        select(attempts.c.node_group, attempts.c.resources).join(jobs, jobs.c.id == attempts.c.job_id)
        .where(jobs.c.status.in_(_ACTIVE), attempts.c.number == jobs.c.attempts, attempts.c.ended_at.is_(None)))]


def borrowed_by_group(session: Session) -> dict[str, int]:
    """Node group -> active jobs admitted on borrowed capacity (``Placement.borrowed``,
    docs/sharing.md)."""
    out: dict[str, int] = {}
    for group, placement in session.execute(
            select(jobs.c.node_group, jobs.c.placement).where(jobs.c.status.in_(_ACTIVE))):
        if (placement or {}).get("borrowed"):
            out[group] = out.get(group, 0) + 1
    return out
