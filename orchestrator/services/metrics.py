"""Prometheus metrics computed from the database at scrape time.

Every number here comes from the database, never from counters kept in a
process, so every control-plane replica serves the same values and a restart
loses nothing. Counts of jobs and attempts, and the histograms, are
``store.tallies``: rows moved in the same transaction as what they count, so a
scrape costs the same at 1,000,000 stored jobs as at 1,000. What active and
queued jobs hold or how long they waited is read from those jobs only
(``store.stats``). Counters count immutable facts (a job submitted, an attempt
dispatched), so they only go up. This module names the families and fills in
the zeros: one function per family, listed in ``FAMILIES``.

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
- ``raylane_borrowed_jobs{node_group}``: active jobs on borrowed capacity (docs/sharing.md).
- ``raylane_database_up``: 1 when the last scrape could read the database.

Jobs not yet routed have ``node_group="none"``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Callable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

from raylane.orchestrator.domain.costs import node_share
from raylane.orchestrator.domain.profile import Profile
from raylane.orchestrator.domain.states import FailureCause, JobStatus
from raylane.orchestrator.store import stats, tallies
from raylane.orchestrator.store.tallies import ADMISSION_BUCKETS, DISPATCH_BUCKETS, NONE
from raylane.orchestrator.store.transitions import utcnow

if TYPE_CHECKING:  # the store alone imports SQLAlchemy
    from raylane.orchestrator.store.db import Session

log = logging.getLogger(__name__)

def _histogram(name: str, doc: str, rows: dict[str, tuple[int, float, list[int]]], buckets,
               groups: list[str]) -> HistogramMetricFamily:
    fam = HistogramMetricFamily(name, doc, labels=["node_group"])
    for g in groups:
        rows.setdefault(g, (0, 0.0, [0] * len(buckets)))
    for g in sorted(rows):
        count, total, le = rows[g]
        fam.add_metric([g], buckets=[(str(float(b)), int(n or 0)) for b, n in zip(buckets, le)]
                       + [("+Inf", int(count))], sum_value=float(total or 0.0))
    return fam


@dataclass
class _Scrape:
    """What every family of one scrape reads: the database's tallies, once."""

    session: Session
    profile: Profile | None
    now: datetime
    kept: dict
    workers: list

    def tally(self, name: str) -> dict[tuple[str, str], int]:
        return {(a, b): int(v) for (n, a, b), v in self.kept.items() if n == name}


def _jobs(x: _Scrape) -> Iterator:
    fam = GaugeMetricFamily("raylane_jobs", "Jobs now in each status, by node group.", labels=["status", "node_group"])
    seen = set()
    for (status, group), n in sorted(x.tally("jobs").items()):
        fam.add_metric([status, group], n)
        seen.add((status, group))
    for s in JobStatus:  # every status present, so a panel shows 0, not "no data"
        if not any(st == s.value for st, _ in seen):
            fam.add_metric([s.value, NONE], 0)
    yield fam


def _queue(x: _Scrape) -> Iterator:
    depth = GaugeMetricFamily("raylane_queue_depth", "Jobs waiting for admission (PENDING or RETRYING).",
                              labels=["node_group"])
    age = GaugeMetricFamily("raylane_queue_oldest_age_seconds",
                            "Seconds the oldest waiting job has waited (PENDING: since submit; "
                            "RETRYING: since its last failure).", labels=["node_group"])
    queue = stats.queue_oldest(x.session, x.tally("jobs"))
    for group in sorted(queue):
        n, oldest = queue[group]
        depth.add_metric([group], n)
        age.add_metric([group], max(0.0, (x.now - oldest).total_seconds()) if oldest is not None else 0.0)
    if not queue:
        depth.add_metric([NONE], 0)
        age.add_metric([NONE], 0)
    yield depth
    yield age


def _created(x: _Scrape) -> Iterator:
    fam = CounterMetricFamily("raylane_jobs_created", "Jobs ever submitted, by kind.", labels=["kind"])
    for (kind, _), n in sorted(x.tally("jobs_created").items()):
        fam.add_metric([kind], n)
    yield fam


# Counters start at 0 for every worker group (and cause), so rate() and
# increase() see the first attempt instead of a series appearing from nothing.


def _attempts(x: _Scrape) -> Iterator:
    rows = x.tally("attempts")
    for w in x.workers:
        rows.setdefault((w.name, w.market), 0)
    fam = CounterMetricFamily("raylane_attempts", "Attempts dispatched to Ray.", labels=["node_group", "market"])
    for key in sorted(rows):
        fam.add_metric(list(key), rows[key])
    yield fam


def _failures(x: _Scrape) -> Iterator:
    rows = x.tally("failures")
    for w in x.workers:
        for cause in FailureCause:
            rows.setdefault((w.name, cause.value), 0)
    fam = CounterMetricFamily("raylane_attempt_failures", "Attempts that ended badly, by failure cause.",
                              labels=["node_group", "cause"])
    for key in sorted(rows):
        fam.add_metric(list(key), rows[key])
    yield fam


def _retries_and_preemptions(x: _Scrape) -> Iterator:
    retries = {g: n for (g, _), n in x.tally("retries").items()}
    preemptions = {g: n for (g, cause), n in x.tally("failures").items() if cause == FailureCause.PREEMPTED.value}
    for name, doc, read in (
        ("raylane_retries", "Attempts after a job's first: each one is a retry.", retries),
        ("raylane_preemptions", "Attempts lost to a spot reclaim or drain.", preemptions),
    ):
        counts = {w.name: 0 for w in x.workers}
        counts.update(read)
        fam = CounterMetricFamily(name, doc, labels=["node_group"])
        for grp in sorted(counts):
            fam.add_metric([grp], counts[grp])
        yield fam


def _histograms(x: _Scrape) -> Iterator:
    groups = [w.name for w in x.workers]
    yield _histogram("raylane_admission_wait_seconds",
                     "Seconds from submit to the first dispatch (admission), by the node group admitted to.",
                     tallies.histogram(x.kept, "admission_wait"), ADMISSION_BUCKETS, groups)
    yield _histogram("raylane_dispatch_latency_seconds",
                     "Seconds from dispatch to the attempt running on Ray, per attempt.",
                     tallies.histogram(x.kept, "dispatch_latency"), DISPATCH_BUCKETS, groups)


def _held_and_cost(x: _Scrape) -> Iterator:
    profile = x.profile
    held = GaugeMetricFamily("raylane_resources_held", "CPUs and GPUs held by active jobs (dispatching, running, "
                             "cancelling), by node group.", labels=["node_group", "resource"])
    rate = GaugeMetricFamily("raylane_cost_rate_dollars_per_hour",
                             "What the active attempts cost per hour now (node share x price_per_hour).",
                             labels=["node_group"])
    totals: dict[str, dict[str, float]] = {}
    dollars: dict[str, float] = {}
    for group, res in stats.active_attempt_resources(x.session):
        res = {k: float(v) for k, v in res.items() if isinstance(v, (int, float))}
        t = totals.setdefault(group or NONE, {"CPU": 0.0, "GPU": 0.0})
        t["CPU"] += res.get("CPU", 0.0)
        t["GPU"] += res.get("GPU", 0.0)
        ng = profile.group(group) if profile and group else None
        if ng is not None:
            dollars[group] = dollars.get(group, 0.0) + node_share(res, ng) * ng.price_per_hour
    groups = [w.name for w in profile.workers] if profile else []
    for group in sorted(set(groups) | set(totals)):
        for r in ("CPU", "GPU"):
            held.add_metric([group, r], totals.get(group, {}).get(r, 0.0))
        rate.add_metric([group], dollars.get(group, 0.0))
    yield held
    yield rate


def _borrowed(x: _Scrape) -> Iterator:
    fam = GaugeMetricFamily("raylane_borrowed_jobs", "Active jobs admitted on borrowed capacity: beyond their "
                            "project's guaranteed share of the group (docs/sharing.md).", labels=["node_group"])
    got = stats.borrowed_by_group(x.session)
    for group in sorted(set(w.name for w in x.workers) | set(got)):
        fam.add_metric([group or NONE], float(got.get(group, 0)))
    yield fam


# The families, in the order a scrape lists them; a new one is a function here.
FAMILIES: tuple[Callable[[_Scrape], Iterator], ...] = (
    _jobs, _queue, _created, _attempts, _failures, _retries_and_preemptions, _histograms, _held_and_cost,
    _borrowed,
)


def collect_from(session: Session, profile: Profile | None) -> Iterator:
    scrape = _Scrape(session, profile, utcnow(), tallies.read(session), profile.workers if profile else [])
    for family in FAMILIES:
        yield from family(scrape)


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


class FleetCollector(Collector):
    """A fleet's clusters (``services.fleetdispatch``), each on its own:
    ``raylane_cluster_up`` (1 when its last call worked), ``raylane_cluster_lost``
    (1 while the placer holds it lost) and ``raylane_cluster_jobs`` (active and
    queued jobs nominated to it, by status). Nothing without a fleet."""

    def __init__(self, plane: Callable[[], object]):
        self._plane = plane

    def collect(self):
        from raylane.orchestrator.backends.reachability import REACHABLE
        from raylane.orchestrator.store import fleet as store_fleet

        plane = self._plane()
        fd = getattr(plane, "fleet_dispatch", None)
        if fd is None:
            return
        up = GaugeMetricFamily("raylane_cluster_up", "1 when the fleet cluster's last call worked.",
                               labels=["cluster", "tier"])
        lost = GaugeMetricFamily("raylane_cluster_lost", "1 while the fleet cluster is lost (unreachable past the "
                                 "grace; its attempts ended CLUSTER_LOST).", labels=["cluster"])
        for name, m in fd.members.items():
            up.add_metric([name, m.tier], 1 if m.backend.reachability.now().state == REACHABLE else 0)
            lost.add_metric([name], 1 if name in fd.placer.lost else 0)
        jobs_fam = GaugeMetricFamily("raylane_cluster_jobs", "Active and queued jobs by the fleet cluster they are "
                                     "nominated to ((placing): not yet placed).", labels=["cluster", "status"])
        try:
            with plane.sessions() as s:
                counts = store_fleet.jobs_by_cluster(s, attached=fd.attached)
        except Exception:
            log.exception("metrics: reading jobs by cluster failed")
            counts = {}
        for (cluster, status), n in sorted(counts.items()):
            jobs_fam.add_metric([cluster, status], n)
        yield up
        yield lost
        yield jobs_fam
