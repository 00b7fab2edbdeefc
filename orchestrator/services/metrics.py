"""Prometheus metrics computed from the database at scrape time.

Every number here is derived from the tables (jobs, attempts), never from
counters kept in a process, so every control-plane replica serves the same
values and a restart loses nothing. Counters are counts of immutable rows
(attempts are never deleted or moved to another group), so they only go up.
Histograms are built the same way: one aggregate query per histogram, the
bucket counts summed in SQL.

Metrics (labels in braces):

- ``raylane_jobs{status,node_group}``: jobs now in each status (gauge).
- ``raylane_queue_depth{node_group}``: jobs waiting for admission (PENDING, RETRYING).
- ``raylane_queue_oldest_age_seconds{node_group}``: how long the oldest of them has
  waited: since submit for PENDING, since its last failure for RETRYING.
- ``raylane_jobs_created_total{kind}``: jobs ever submitted.
- ``raylane_attempts_total{node_group,market}``: attempts dispatched.
- ``raylane_attempt_failures_total{node_group,cause}``: attempts that ended badly, by cause.
- ``raylane_retries_total{node_group}``: attempts after the first (each is a retry).
- ``raylane_preemptions_total{node_group}``: attempts lost to a spot reclaim.
- ``raylane_admission_wait_seconds{node_group}``: submit -> first dispatch (histogram).
- ``raylane_dispatch_latency_seconds{node_group}``: dispatch -> running on Ray, per attempt (histogram).
- ``raylane_resources_held{node_group,resource}``: CPU and GPU held by active jobs.
- ``raylane_cost_rate_dollars_per_hour{node_group}``: what active attempts cost per hour now.
- ``raylane_database_up``: 1 when the last scrape could read the database.

Jobs not yet routed have ``node_group="none"``.
"""

from __future__ import annotations

import logging
from typing import Callable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector
from sqlalchemy import case, func, select
from sqlalchemy.orm import Session

from raylane.orchestrator.domain.costs import node_share
from raylane.orchestrator.domain.profile import Profile
from raylane.orchestrator.domain.states import ACTIVE, QUEUED, FailureCause, JobStatus

assert QUEUED == {JobStatus.PENDING, JobStatus.RETRYING}, "queue metrics below name both statuses"
from raylane.orchestrator.store.tables import attempts, jobs
from raylane.orchestrator.store.transitions import utcnow

log = logging.getLogger(__name__)

NONE = "none"
# Seconds. Admission waits range from instant to hours on a busy GPU group.
ADMISSION_BUCKETS = (0.1, 0.5, 1, 2, 5, 10, 30, 60, 300, 900, 1800, 3600, 4 * 3600, 12 * 3600, 24 * 3600)
# Dispatch latency: Ray accepting the submission and starting the driver.
DISPATCH_BUCKETS = (0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 300, 900)

METRIC_NAMES = (
    "raylane_jobs", "raylane_queue_depth", "raylane_queue_oldest_age_seconds", "raylane_jobs_created_total",
    "raylane_attempts_total", "raylane_attempt_failures_total", "raylane_retries_total", "raylane_preemptions_total",
    "raylane_admission_wait_seconds", "raylane_dispatch_latency_seconds", "raylane_resources_held",
    "raylane_cost_rate_dollars_per_hour", "raylane_database_up",
)


def seconds_between(session: Session, later, earlier):
    """``later - earlier`` in seconds, as SQL, on SQLite and PostgreSQL."""
    if session.bind.dialect.name == "postgresql":
        return func.extract("epoch", later - earlier)
    return (func.julianday(later) - func.julianday(earlier)) * 86400.0


def _histogram(session: Session, name: str, doc: str, group_col, seconds, where, buckets,
               groups: list[str]) -> HistogramMetricFamily:
    sub = select(group_col.label("g"), seconds.label("d")).where(*where).subquery()
    cols = [func.count(), func.coalesce(func.sum(sub.c.d), 0.0)]
    cols += [func.sum(case((sub.c.d <= b, 1), else_=0)) for b in buckets]
    fam = HistogramMetricFamily(name, doc, labels=["node_group"])
    rows = {g or NONE: (count, total, le) for g, count, total, *le in
            session.execute(select(sub.c.g, *cols).group_by(sub.c.g))}
    for g in groups:
        rows.setdefault(g, (0, 0.0, [0] * len(buckets)))
    for g in sorted(rows):
        count, total, le = rows[g]
        fam.add_metric([g], buckets=[(str(float(b)), int(n or 0)) for b, n in zip(buckets, le)]
                       + [("+Inf", int(count))], sum_value=float(total or 0.0))
    return fam


def collect_from(session: Session, profile: Profile | None) -> Iterator:
    now = utcnow()
    g = func.coalesce(jobs.c.node_group, NONE)

    fam = GaugeMetricFamily("raylane_jobs", "Jobs now in each status, by node group.", labels=["status", "node_group"])
    seen = set()
    for status, group, n in session.execute(select(jobs.c.status, g, func.count()).group_by(jobs.c.status, g)):
        fam.add_metric([status, group], n)
        seen.add((status, group))
    for s in JobStatus:  # every status present, so a panel shows 0, not "no data"
        if not any(st == s.value for st, _ in seen):
            fam.add_metric([s.value, NONE], 0)
    yield fam

    depth = GaugeMetricFamily("raylane_queue_depth", "Jobs waiting for admission (PENDING or RETRYING).",
                              labels=["node_group"])
    age = GaugeMetricFamily("raylane_queue_oldest_age_seconds",
                            "Seconds the oldest waiting job has waited (PENDING: since submit; "
                            "RETRYING: since its last failure).", labels=["node_group"])
    oldest: dict[str, object] = {}
    counts: dict[str, int] = {}
    # The statuses of states.QUEUED, each with the time it started waiting.
    for status, col in ((JobStatus.PENDING.value, jobs.c.created_at), (JobStatus.RETRYING.value, jobs.c.updated_at)):
        for group, n, first in session.execute(
                select(g, func.count(), func.min(col)).where(jobs.c.status == status).group_by(g)):
            counts[group] = counts.get(group, 0) + n
            if first is not None and (group not in oldest or first < oldest[group]):
                oldest[group] = first
    for group in sorted(counts):
        depth.add_metric([group], counts[group])
        age.add_metric([group], max(0.0, (now - oldest[group]).total_seconds()) if group in oldest else 0.0)
    if not counts:
        depth.add_metric([NONE], 0)
        age.add_metric([NONE], 0)
    yield depth
    yield age

    fam = CounterMetricFamily("raylane_jobs_created", "Jobs ever submitted, by kind.", labels=["kind"])
    for kind, n in session.execute(select(jobs.c.kind, func.count()).group_by(jobs.c.kind)):
        fam.add_metric([kind], n)
    yield fam

    # Counters start at 0 for every worker group (and cause), so rate() and
    # increase() see the first attempt instead of a series appearing from nothing.
    workers = profile.workers if profile else []
    ag = func.coalesce(attempts.c.node_group, NONE)
    rows = {(grp, market): n for grp, market, n in session.execute(
        select(ag, func.coalesce(attempts.c.market, NONE), func.count()).group_by(ag, attempts.c.market))}
    for w in workers:
        rows.setdefault((w.name, w.market), 0)
    fam = CounterMetricFamily("raylane_attempts", "Attempts dispatched to Ray.", labels=["node_group", "market"])
    for key in sorted(rows):
        fam.add_metric(list(key), rows[key])
    yield fam

    rows = {(grp, cause): n for grp, cause, n in session.execute(
        select(ag, attempts.c.cause, func.count()).where(attempts.c.cause.is_not(None)).group_by(ag, attempts.c.cause))}
    for w in workers:
        for cause in FailureCause:
            rows.setdefault((w.name, cause.value), 0)
    fam = CounterMetricFamily("raylane_attempt_failures", "Attempts that ended badly, by failure cause.",
                              labels=["node_group", "cause"])
    for key in sorted(rows):
        fam.add_metric(list(key), rows[key])
    yield fam

    for name, doc, cond in (
        ("raylane_retries", "Attempts after a job's first: each one is a retry.", attempts.c.number > 1),
        ("raylane_preemptions", "Attempts lost to a spot reclaim or drain.",
         attempts.c.cause == FailureCause.PREEMPTED.value),
    ):
        counts = {w.name: 0 for w in workers}
        counts.update(dict(session.execute(select(ag, func.count()).where(cond).group_by(ag)).all()))
        fam = CounterMetricFamily(name, doc, labels=["node_group"])
        for grp in sorted(counts):
            fam.add_metric([grp], counts[grp])
        yield fam

    yield _histogram(session, "raylane_admission_wait_seconds",
                     "Seconds from submit to the first dispatch (admission), by the node group admitted to.",
                     attempts.c.node_group, seconds_between(session, attempts.c.created_at, jobs.c.created_at),
                     [attempts.c.job_id == jobs.c.id, attempts.c.number == 1], ADMISSION_BUCKETS,
                     [w.name for w in workers])
    yield _histogram(session, "raylane_dispatch_latency_seconds",
                     "Seconds from dispatch to the attempt running on Ray, per attempt.",
                     attempts.c.node_group, seconds_between(session, attempts.c.started_at, attempts.c.created_at),
                     [attempts.c.started_at.is_not(None)], DISPATCH_BUCKETS, [w.name for w in workers])

    held = GaugeMetricFamily("raylane_resources_held", "CPUs and GPUs held by active jobs (dispatching, running, "
                             "cancelling), by node group.", labels=["node_group", "resource"])
    rate = GaugeMetricFamily("raylane_cost_rate_dollars_per_hour",
                             "What the active attempts cost per hour now (node share x price_per_hour).",
                             labels=["node_group"])
    totals: dict[str, dict[str, float]] = {}
    dollars: dict[str, float] = {}
    for group, res in session.execute(
            select(attempts.c.node_group, attempts.c.resources).join(jobs, jobs.c.id == attempts.c.job_id)
            .where(jobs.c.status.in_([s.value for s in ACTIVE]), attempts.c.number == jobs.c.attempts,
                   attempts.c.ended_at.is_(None))):
        res = {k: float(v) for k, v in (res or {}).items() if isinstance(v, (int, float))}
        t = totals.setdefault(group or NONE, {"CPU": 0.0, "GPU": 0.0})
        t["CPU"] += res.get("CPU", 0.0)
        t["GPU"] += res.get("GPU", 0.0)
        ng = profile.group(group) if profile and group else None
        if ng is not None:
            dollars[group] = dollars.get(group, 0.0) + node_share(res, ng) * ng.price_per_hour
    groups = [x.name for x in profile.workers] if profile else []
    for group in sorted(set(groups) | set(totals)):
        for r in ("CPU", "GPU"):
            held.add_metric([group, r], totals.get(group, {}).get(r, 0.0))
        rate.add_metric([group], dollars.get(group, 0.0))
    yield held
    yield rate


class DatabaseCollector(Collector):
    """Reads the metrics above from the database on every scrape.

    ``sessions`` and ``profile`` are callables so the collector can be registered
    before the control plane exists (the app creates it at start-up)."""

    def __init__(self, sessions: Callable[[], object], profile: Callable[[], Profile | None]):
        self._sessions = sessions
        self._profile = profile

    def collect(self):
        up = GaugeMetricFamily("raylane_database_up", "1 when this scrape could read the database.")
        try:
            maker = self._sessions()
            with maker() as s:  # read-only: no commit
                families = list(collect_from(s, self._profile()))
        except Exception:
            log.exception("metrics: reading the database failed")
            up.add_metric([], 0)
            yield up
            return
        yield from families
        up.add_metric([], 1)
        yield up
