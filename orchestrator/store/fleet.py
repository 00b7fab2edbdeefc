"""What the fleet plan reads of Raylane's own jobs (``services/fleetplan.py``).

``timeout_ends``: per node group, the soonest a running job there must end by
its own ``timeout_s``: an upper bound on when held resources start to free, the
only end Raylane knows for certain. Running jobs are few (bounded by the
cluster's capacity), so their specs are read whole.

``group_queues``: per node group, what the fleet's placer judges a job's
expected start on (``domain.placement.expected_start``): each active job with
its expected end (its timeout, or past runs of its kind there: ``past_runs``,
``run_left``), and the queued jobs nominated there with their expected runs."""

from __future__ import annotations

import bisect
from datetime import datetime

from dataclasses import dataclass

from sqlalchemy import and_, func, or_, select, true, update
from sqlalchemy.orm import Session

from raylane.orchestrator.domain.placement import Holding, Queued
from raylane.orchestrator.domain.states import ACTIVE, FailureCause, JobStatus
from raylane.orchestrator.store import tallies
from raylane.orchestrator.store.tables import attempts, jobs
from raylane.orchestrator.store.transitions import record_event, transition

# jobs.cluster of a queued job the fleet's placer has still to nominate a cluster for
# (submitted to a fleet, or given up with its lost cluster): no dispatcher takes it.
TO_PLACE = "(placing)"


@dataclass(frozen=True)
class Scope:
    """One cluster of a fleet as its loops see the store: the jobs nominated to
    it and the attempts placed on it; for the *attached* cluster also those with
    no cluster recorded (NULL: a deployment of one cluster, rows from before
    fleets). None in place of a Scope: every row (one cluster, no fleet)."""

    name: str
    attached: bool = False

    def on(self, column):
        return or_(column == self.name, column.is_(None)) if self.attached else column == self.name


def jobs_on(scope: Scope | None):
    """The SQL condition: a job nominated to ``scope``'s cluster (true without a scope)."""
    return true() if scope is None else scope.on(jobs.c.cluster)


def attempts_on(scope: Scope | None):
    """The SQL condition: an attempt placed on ``scope``'s cluster (true without a scope)."""
    return true() if scope is None else scope.on(attempts.c.cluster)


def timeout_ends(session: Session, *, now: datetime, scope: "Scope | None" = None) -> dict[str, float]:
    """Node group -> seconds from ``now`` until its first running job with a
    ``timeout_s`` reaches it (0 when already past); groups without one are absent.
    ``scope``: on one cluster of a fleet."""
    out: dict[str, float] = {}
    rows = session.execute(select(jobs.c.node_group, jobs.c.started_at, jobs.c.spec)
                           .where(jobs.c.status == JobStatus.RUNNING.value, jobs.c.started_at.is_not(None),
                                  jobs_on(scope)))
    for group, started, spec in rows:
        timeout = (spec or {}).get("timeout_s")
        if not group or not isinstance(timeout, (int, float)) or timeout <= 0:
            continue
        left = max(0.0, (started - now).total_seconds() + float(timeout))
        out[group] = min(left, out.get(group, left))
    return out


PAST_RUNS = 50  # the latest succeeded attempts of a kind on a group that an estimate reads


def past_runs(session: Session, group: str, kind: str, *, scope: "Scope | None" = None,
              cache: dict[tuple[str, str], list[float]] | None = None) -> list[float]:
    """How long the latest ``PAST_RUNS`` succeeded attempts of ``kind`` on ``group``
    ran, in seconds, shortest first. ``cache``: the caller's, read first and
    filled here (runs move slowly; the placer keeps them a minute)."""
    key = (group, kind)
    if cache is not None and key in cache:
        return cache[key]
    spans = sorted((e - b).total_seconds() for b, e in session.execute(
        select(attempts.c.started_at, attempts.c.ended_at).join(jobs, jobs.c.id == attempts.c.job_id)
        .where(attempts.c.node_group == group, jobs.c.kind == kind, attempts.c.status == "SUCCEEDED",
               attempts.c.started_at.is_not(None), attempts.c.ended_at.is_not(None), attempts_on(scope))
        .order_by(attempts.c.ended_at.desc()).limit(PAST_RUNS)))
    if cache is not None:
        cache[key] = spans
    return spans


def run_left(spans: list[float], ran_s: float) -> float | None:
    """How much longer a job that has run ``ran_s`` is expected to run: the median of
    the past runs (``spans``, shortest first) that lasted longer than that, less
    ``ran_s``. For a job just started, the median run; for one past its median,
    what the longer runs say rather than nothing. None: no past run lasted that long."""
    longer = spans[bisect.bisect_right(spans, ran_s):]
    return longer[len(longer) // 2] - ran_s if longer else None


QUEUE_READ = 200  # a cluster's queued jobs the placer reads a pass, in admission order; a job behind them waits long


def group_queues(session: Session, *, now: datetime, scope: "Scope",
                 cache: dict[tuple[str, str], list[float]] | None = None
                 ) -> tuple[dict[str, list[Holding]], dict[str, list[Queued]], tuple[int, str] | None]:
    """Per node group of ``scope``'s cluster: its active jobs, each with its expected
    end (the sooner of its ``timeout_s`` and the median run of its kind there,
    counted from its start; from now for one admitted and not started yet), and the
    queued jobs nominated to it, each with its expected run: what the placer reads
    to tell when a job nominated there now would start (``domain.placement``).
    Active jobs are bounded by the cluster's capacity; of the queue, the first
    ``QUEUE_READ`` in admission order are read, and when there are more, the last
    one read's (priority, id) is returned too (a job behind it: no start foreseen)."""
    cache = {} if cache is None else cache
    held: dict[str, list[Holding]] = {}
    for group, kind, started, spec, placement in session.execute(
            select(jobs.c.node_group, jobs.c.kind, jobs.c.started_at, jobs.c.spec, jobs.c.placement)
            .where(jobs.c.status.in_(_ACTIVE), jobs.c.node_group.is_not(None), jobs_on(scope))):
        since = 0.0 if started is None else (started - now).total_seconds()  # <= 0: how long it has run
        timeout = (spec or {}).get("timeout_s")
        bound = max(0.0, since + float(timeout)) if isinstance(timeout, (int, float)) and timeout > 0 else None
        left = run_left(past_runs(session, group, kind, scope=scope, cache=cache), -since)
        guess = None if left is None else left
        end = min((x for x in (bound, guess) if x is not None), default=None)
        held.setdefault(group, []).append(Holding((placement or {}).get("total") or {},
                                               None if end is None else max(0.0, end),
                                               end is not None and end == bound))
    rows = []
    for status in _QUEUED:  # one read per status, each in ix_jobs_status_priority_id's order (as admission)
        rows += session.execute(
            select(jobs.c.id, jobs.c.node_group, jobs.c.kind, jobs.c.priority, jobs.c.placement)
            .where(jobs.c.status == status, jobs.c.node_group.is_not(None), jobs_on(scope),
                   jobs.c.array_held.is_(False), jobs.c.deps_waiting == 0)
            .order_by(jobs.c.priority.desc(), jobs.c.id).limit(QUEUE_READ + 1)).all()
    rows.sort(key=lambda r: (-r.priority, r.id))
    last = (rows[QUEUE_READ - 1].priority, rows[QUEUE_READ - 1].id) if len(rows) > QUEUE_READ else None
    waiting: dict[str, list[Queued]] = {}
    for r in rows[:QUEUE_READ]:
        waiting.setdefault(r.node_group, []).append(Queued(
            r.id, r.priority, (r.placement or {}).get("total") or {},
            run_left(past_runs(session, r.node_group, r.kind, scope=scope, cache=cache), 0.0)))
    return held, waiting, last


# A fleet's placer (services/fleetdispatch.py) --------------------------------------------

_QUEUED = (JobStatus.PENDING.value, JobStatus.RETRYING.value)
PLACE_BATCH = 200  # jobs placed again per pass; the rest wait for the next


@dataclass(frozen=True)
class ToPlace:
    id: str
    project: str
    status: JobStatus
    spec: dict
    cluster: str | None
    status_reason: str | None
    node_group: str | None = None


_TO_PLACE_COLS = (jobs.c.id, jobs.c.project, jobs.c.status, jobs.c.spec, jobs.c.cluster, jobs.c.status_reason,
                  jobs.c.node_group)


def to_place(session: Session, *, lost: set[str], retry_before: datetime | None = None,
             limit: int = PLACE_BATCH) -> list[ToPlace]:
    """Queued jobs whose nomination must be made again: those marked ``TO_PLACE``
    (submitted, their cluster lost, their scale-up there did not come) and those
    nominated to a cluster in ``lost``, in admission order. A job tried before and
    left unplaced (``wait_unplaced``) comes back once its try is older than
    ``retry_before``: jobs no cluster can take now do not hold up those behind them."""
    fresh = jobs.c.cluster == TO_PLACE
    if retry_before is not None:
        fresh = and_(fresh, or_(jobs.c.nominated_at.is_(None), jobs.c.nominated_at < retry_before))
    where = fresh if not lost else or_(fresh, jobs.c.cluster.in_(lost))
    rows = session.execute(select(*_TO_PLACE_COLS).where(jobs.c.status.in_(_QUEUED), where)
                           .order_by(jobs.c.priority.desc(), jobs.c.id).limit(limit)).all()
    return [ToPlace(r.id, r.project, JobStatus(r.status), r.spec, r.cluster, r.status_reason, r.node_group)
            for r in rows]


def moved_from(session: Session, job_ids: list[str]) -> dict[str, set[str]]:
    """Per job, the clusters a scale-up of its did not come in time on: its nomination moved on from them."""
    out: dict[str, set[str]] = {}
    if not job_ids:
        return out
    for jid, cluster in session.execute(select(attempts.c.job_id, attempts.c.cluster).where(
            attempts.c.job_id.in_(job_ids), attempts.c.cause == FailureCause.SCALE_UP_TIMEOUT.value,
            attempts.c.cluster.is_not(None))):
        out.setdefault(jid, set()).add(cluster)
    return out


def nominate(session: Session, job: ToPlace, *, cluster: str, placement: dict, reason: str,
             now: datetime) -> bool:
    """The job's nomination is now ``cluster`` with ``placement`` (its reason and an
    event say why); a compare-and-set on its status and nomination: False when the
    job moved since it was read (a cancel, another replica's placer)."""
    group = placement.get("node_group")
    done = session.execute(update(jobs).where(jobs.c.id == job.id, jobs.c.status == job.status.value,
                                              _same(jobs.c.cluster, job.cluster))
                           .values(cluster=cluster, placement=placement, node_group=group,
                                   status_reason=reason, updated_at=now, nominated_at=now)).rowcount
    if done:
        record_event(session, job.id, status=job.status, reason=reason, actor="fleet", now=now)
        if group != job.node_group:  # the per-group counts (tallies) follow the job
            tallies.job_moved(session, src=job.status.value, src_group=job.node_group, to=job.status.value,
                              to_group=group)
    return bool(done)


def wait_unplaced(session: Session, job: ToPlace, *, reason: str, now: datetime) -> None:
    """The job stays to be placed (no candidate can take it now): its reason says why, once."""
    session.execute(update(jobs).where(jobs.c.id == job.id, jobs.c.status == job.status.value)
                    .values(cluster=TO_PLACE, status_reason=reason, nominated_at=now))  # tried: again later
    if job.status_reason != reason:
        record_event(session, job.id, status=job.status, reason=reason, actor="fleet", now=now)


def _same(column, value):
    return column.is_(None) if value is None else column == value


def fail_unplaced(session: Session, job: ToPlace, *, reason: str, now: datetime) -> None:
    """No cluster is left for the job: every candidate's scale-up failed it in turn."""
    transition(session, job.id, JobStatus.FAILED, reason=reason, actor="fleet", expected={job.status},
               values={"failure_cause": FailureCause.SCALE_UP_TIMEOUT.value, "finished_at": now})


_ACTIVE = [s.value for s in ACTIVE]


def active_on(session: Session, clusters: list[str]) -> list[tuple[str, str, str | None, dict]]:
    """(project, cluster, node group, resources held) of each active job on ``clusters``."""
    if not clusters:
        return []
    return [(project, cluster, group, (placement or {}).get("total") or {})
            for project, cluster, group, placement in session.execute(
                select(jobs.c.project, jobs.c.cluster, jobs.c.node_group, jobs.c.placement)
                .where(jobs.c.status.in_(_ACTIVE), jobs.c.cluster.in_(clusters)))]


def jobs_by_cluster(session: Session, *, attached: str) -> dict[tuple[str, str], int]:
    """(cluster, status) -> active and queued jobs nominated there (NULL: ``attached``)."""
    live = [*_ACTIVE, *_QUEUED]
    out: dict[tuple[str, str], int] = {}
    for cluster, status, n in session.execute(select(jobs.c.cluster, jobs.c.status, func.count())
                                              .where(jobs.c.status.in_(live))
                                              .group_by(jobs.c.cluster, jobs.c.status)):
        key = (cluster or attached, status)
        out[key] = out.get(key, 0) + n
    return out


def window_attempts(session: Session, *, start: datetime, end: datetime) -> list[tuple[str | None, "AttemptUsage"]]:
    """(cluster, usage) of every attempt that may have held resources within
    [start, end): created before its end, not ended before its start. The fleet
    report prices each on its own cluster's groups; a fleet's attempts in a window
    are a few thousand at most (the single-cluster report reads sums per key
    instead, ``store.usage.sums``)."""
    from raylane.orchestrator.domain.costs import AttemptUsage

    rows = session.execute(
        select(attempts.c.cluster, attempts.c.job_id, attempts.c.number, attempts.c.node_group, attempts.c.market,
               attempts.c.resources, attempts.c.status, attempts.c.cause, attempts.c.created_at,
               attempts.c.started_at, attempts.c.ended_at, jobs.c.project, jobs.c.kind, jobs.c.name)
        .join(jobs, jobs.c.id == attempts.c.job_id)
        .where(attempts.c.created_at < end, or_(attempts.c.ended_at.is_(None), attempts.c.ended_at >= start)))
    return [(r.cluster, AttemptUsage(job_id=r.job_id, project=r.project, kind=r.kind, name=r.name, number=r.number,
                                     node_group=r.node_group, market=r.market, resources=r.resources or {},
                                     status=r.status, cause=r.cause, created_at=r.created_at,
                                     started_at=r.started_at, ended_at=r.ended_at))
            for r in rows]


Nominated = ToPlace  # a queued job with its nomination, judged again (``nominated_before``)


def nominated_before(session: Session, *, before: datetime, limit: int = PLACE_BATCH) -> list[Nominated]:
    """Queued jobs nominated to a cluster before ``before`` and not admitted since,
    in admission order: the placer judges again whether another cluster would start
    them sooner (a rented group that filled up, owned capacity that freed)."""
    # Oldest judgement first (``ix_jobs_status_nominated_at``'s order): a big queue is
    # judged a batch a pass, round after round, without sorting all of it.
    rows = session.execute(select(*_TO_PLACE_COLS)
                           .where(jobs.c.status.in_(_QUEUED), jobs.c.nominated_at < before,
                                  jobs.c.cluster.is_not(None), jobs.c.cluster != TO_PLACE,
                                  jobs.c.array_held.is_(False), jobs.c.deps_waiting == 0)
                           .order_by(jobs.c.nominated_at).limit(limit)).all()
    return [ToPlace(r.id, r.project, JobStatus(r.status), r.spec, r.cluster, r.status_reason, r.node_group)
            for r in rows]


def still_best(session: Session, job_ids: list[str], *, now: datetime) -> None:
    """These jobs' nominations were judged again and kept."""
    if job_ids:
        session.execute(update(jobs).where(jobs.c.id.in_(job_ids)).values(nominated_at=now))
