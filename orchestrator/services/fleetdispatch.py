"""Dispatch across a fleet of Ray clusters (docs/fleet.md; DESIGN decision 10):
one queue, one nomination per job at a time, the loops of each cluster on their own.

Words used here:

- *nomination*: the one cluster whose dispatcher may admit a queued job now
  (``jobs.cluster``). A job submitted to a fleet is stored *to be placed*
  (``store.fleet.TO_PLACE``); the ``FleetPlacer`` nominates it with the order of
  ``domain.placement`` (owned with room, owned soon, rented spot, rented on
  demand), the project's renting policy and each cluster's groups now, and its
  reason names the cluster, the group and why. "Owned soon" is judged on the
  group's queue (``store.fleet.group_queues``): each active job's expected end
  and the jobs already nominated there with their expected runs, so a burst
  does not pile onto an owned group that cannot start it within its wait
  budget. Only the nominee's dispatcher sees the job, so no job makes two
  clusters' autoscalers add nodes for it.
- *moving on*: an attempt admitted on a cluster ahead of a scale-up that did not
  come within ``scale_up_deadline_s`` is stopped there (the reconciler, as on one
  cluster), and on a fleet the job is placed again with that cluster left out
  (its attempts say where its scale-ups failed); with no cluster left it fails
  SCALE_UP_TIMEOUT.
- *lost*: a cluster whose every call failed for ``fleet_cluster_grace_s`` and
  that does not answer one more ping. Its live attempts end LOST with cause
  CLUSTER_LOST (retried at once, not counted against ``max_attempts``), their
  jobs are placed again without it, and while it stays lost nothing is nominated
  to it. One failed status call, or an outage shorter than the grace, restarts
  nothing.
- *fencing*: when a lost cluster answers again its dispatcher first stops every
  attempt given up with it (``Dispatcher.fence``), then submits anything new;
  those attempts are never read again, so a late result is ignored and a job's
  effects happen once.

Each cluster has its own backend, dispatcher and reconciler (threads of their
own): a head that hangs on one cluster delays no other's passes.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from raylane.orchestrator.backends.base import RayBackend, RayUnavailable
from raylane.orchestrator.backends.reachability import REACHABLE, UNREACHABLE
from raylane.orchestrator.domain import placement as fleet_placement
from raylane.orchestrator.domain.costs import node_share
from raylane.orchestrator.domain.errors import Forbidden
from raylane.orchestrator.domain.fleet import Fleet
from raylane.orchestrator.domain.placement import FleetNow, GroupNow, Holding, NoCandidate, Queued
from raylane.orchestrator.domain.profile import Profile
from raylane.orchestrator.domain.routing import Unroutable, with_lane
from raylane.orchestrator.domain.specs import JobSpec
from raylane.orchestrator.domain.views import Placement
from raylane.orchestrator.loops.base import LoopService
from raylane.orchestrator.services import fleetplan
from raylane.orchestrator.store import db, lifecycle, stats
from raylane.orchestrator.store import sharing as store_sharing
from raylane.orchestrator.store import fleet as store_fleet
from raylane.orchestrator.store.fleet import TO_PLACE, Scope
from raylane.orchestrator.store.transitions import utcnow

if TYPE_CHECKING:  # pragma: no cover
    from raylane.orchestrator.services.controlplane import ControlPlane

log = logging.getLogger(__name__)
VIEW_CACHE_S = 1.0  # a cluster's node list, read at most this often by the placer
UNPLACED_RETRY_S = 10.0  # a job no cluster can take now is tried again this long after
RUNS_KEPT_S = 60.0  # how long the placer keeps a kind's past runs on a group (store.fleet.past_runs)


@dataclass
class Member:
    """One cluster of the fleet as the control plane drives it."""

    name: str
    tier: str
    profile: Profile
    backend: RayBackend
    scope: Scope
    dispatcher: object
    reconciler: object
    lanes: object = None  # backends.lanes.LaneBackend: its warm lanes, in its own Ray's store


class FleetDispatch:
    """The fleet's clusters, each with its loops; the placer over all of them."""

    def __init__(self, fleet: Fleet, attached: str, members: dict[str, Member]):
        self.fleet = fleet
        self.attached = attached
        self.members = members
        self.placer: FleetPlacer | None = None

    def member_of(self, cluster: str | None) -> Member:
        """The member an attempt with this recorded cluster lives on (None: the attached one)."""
        return self.members.get(cluster or self.attached) or self.members[self.attached]

    def loops(self) -> list[LoopService]:
        out: list[LoopService] = []
        for m in self.members.values():
            out += [m.dispatcher, m.reconciler]
        return out + ([self.placer] if self.placer else [])


class _Wakes:
    """``ControlPlane.new_work`` on a fleet: new work wakes the placer (which places it
    and wakes the nominee's dispatcher) and every dispatcher (an ended attempt, a
    released array member: any cluster may admit now)."""

    def __init__(self, events: list[threading.Event]):
        self.events = events

    def set(self) -> None:
        for e in self.events:
            e.set()

    def is_set(self) -> bool:
        return any(e.is_set() for e in self.events)


def attach_fleet(plane: "ControlPlane", fleet: Fleet, backends: dict[str, RayBackend], attached: str) -> FleetDispatch:
    """Wire the plane to every cluster of ``fleet`` (``backends`` by cluster name):
    the attached cluster as ``assembly.attach_backend`` does (its warm lanes, the
    dashboard proxy, the node views), the others with warm lanes, a dispatcher and
    a reconciler each, and the placer; jobs submitted are stored to be placed."""
    from raylane.orchestrator.loops.dispatcher import Dispatcher
    from raylane.orchestrator.loops.reconciler import Reconciler
    from raylane.orchestrator.services import assembly

    here = fleet.cluster(attached)
    assembly.attach_backend(plane, backends[attached], here.profile, scope=Scope(attached, attached=True),
                            tier=here.tier, elsewhere=True)
    plane.dispatcher.scale_ahead = scale_ahead(plane.settings.autoscale_ahead_jobs, here.profile)
    members = {attached: Member(attached, here.tier, here.profile, backends[attached], Scope(attached, attached=True),
                                plane.dispatcher, plane.reconciler, plane.lanes)}
    wakes = [plane.new_work]
    settings = plane.settings
    for c in fleet.members:
        if c.name == attached:
            continue
        scope = Scope(c.name)
        lanes = assembly.lane_backend(backends[c.name], settings)  # its own, in its own Ray's store
        d = Dispatcher(settings, plane.sessions, backends[c.name], c.profile, wake=threading.Event(),
                       owner=f"{plane.dispatcher.owner}/{c.name}", scope=scope, tier=c.tier,
                       scale_ahead=scale_ahead(settings.autoscale_ahead_jobs, c.profile), lanes=lanes)
        r = Reconciler(settings, plane.sessions, backends[c.name], scope=scope, elsewhere=True, lanes=lanes)
        d.on_submitted = r.wake.set
        r.on_ended = plane.new_work.set
        members[c.name] = Member(c.name, c.tier, c.profile, backends[c.name], scope, d, r, lanes)
        wakes.append(d.wake)
    fd = FleetDispatch(fleet, attached, members)
    fd.placer = FleetPlacer(plane, fd)
    wakes.append(fd.placer.wake)
    plane.new_work = _Wakes(wakes)
    for m in members.values():  # an attempt ended anywhere: every cluster's queue may move
        m.reconciler.on_ended = plane.new_work.set
    plane.fleet_dispatch = fd
    plane.router = fleet_router(plane, fd)
    return fd


SCALE_AHEAD = 2  # a fleet cluster that scales: jobs submitted ahead of its scale-up per group, by default


def scale_ahead(setting: int, profile: Profile) -> int:
    """A fleet's cluster whose groups scale (max_nodes above min_nodes: a rented one
    scaling from zero) is sent jobs ahead of its scale-up, or nothing would ever
    make its autoscaler add a node: RAYLANE_AUTOSCALE_AHEAD_JOBS when set, else
    ``SCALE_AHEAD``. A static cluster: the setting (0: live nodes only)."""
    scales = any(g.max_nodes > g.min_nodes for g in profile.workers)
    return setting if setting or not scales else SCALE_AHEAD


def fleet_router(plane: "ControlPlane", fd: FleetDispatch):
    """The submit-time router on a fleet: refuses what no cluster can ever run (the
    field named), and stores the job to be placed; its placement until then is its
    first candidate's, as a preview."""
    def routed(spec: JobSpec) -> Placement:
        fp = fleet_placement.place(spec, fd.fleet, None)  # Unroutable / Forbidden name the field
        first = fp.candidates[0]
        return first.placement.model_copy(update={"cluster": TO_PLACE, "tier": None, "reasons": [
            f"to be placed across fleet {fd.fleet.name}", *first.placement.reasons]})

    return routed


class FleetPlacer(LoopService):
    """Each pass: declare lost the clusters unreachable past the grace, then nominate
    a cluster for every job to be placed, and wake the nominees' dispatchers."""

    name = "fleet-placer"

    def __init__(self, plane: "ControlPlane", fd: FleetDispatch):
        super().__init__(plane.settings.dispatch_interval_s)
        self.plane = plane
        self.fd = fd
        self.lost: dict[str, datetime] = {}  # cluster -> when the outage that lost it began
        self._views: dict[str, tuple[float, object]] = {}
        self._runs: dict[str, tuple[datetime, dict]] = {}  # cluster -> (when, (group, kind) -> past runs)
        self._lanes_ok: set[str] = set()  # the clusters whose lanes take jobs, this pass (``lanes_usable``)

    # Lost clusters --------------------------------------------------------------

    def check_lost(self) -> dict[str, datetime]:
        grace = self.plane.settings.fleet_cluster_grace_s
        now = utcnow()
        for name, m in self.fd.members.items():
            seen = m.backend.reachability.now()
            if seen.state == REACHABLE and name in self.lost:
                log.info("cluster %s answers again (lost since %s); its dispatcher stops what was given up there "
                         "before anything new", name, self.lost[name].isoformat())
                del self.lost[name]
            if seen.state != UNREACHABLE or name in self.lost or (now - seen.since).total_seconds() < grace:
                continue
            if m.backend.ping():  # one more ask before giving up on its jobs: a slow call is not a lost cluster
                continue
            self.lost[name] = seen.since
            message = (f"cluster {name} unreachable since {seen.since:%Y-%m-%d %H:%M:%S} UTC, past the "
                       f"{grace:.0f}s grace (RAYLANE_FLEET_CLUSTER_GRACE_S): {seen.error}")
            with db.transaction(self.plane.sessions) as s:
                ids = lifecycle.cluster_lost(s, m.scope, message)
            log.warning("%s; %d live attempt(s) there end CLUSTER_LOST and their jobs are placed again",
                        message, len(ids))
        return self.lost

    # Nominations ----------------------------------------------------------------

    def _view(self, m: Member):
        hit = self._views.get(m.name)
        if hit is not None and time.monotonic() - hit[0] < VIEW_CACHE_S:
            return hit[1]
        try:
            view = m.backend.cluster_view()
        except RayUnavailable:
            view = None
        self._views[m.name] = (time.monotonic(), view)
        return view

    def views(self) -> tuple[dict[str, object], dict[str, str]]:
        """Each cluster's node groups now, read from its Ray (outside any database
        transaction: a hung head must not hold the store's write lock), and the
        clusters that did not answer, with why they are left out of placement now."""
        views: dict[str, object] = {}
        down: dict[str, str] = {}
        for name, m in self.fd.members.items():
            if name in self.lost:
                continue
            view = self._view(m)
            if view is None:
                seen = m.backend.reachability.now()
                since = f" since {seen.since:%H:%M:%S} UTC" if seen.since else ""
                down[name] = f"unreachable{since}, not yet lost"
            else:
                views[name] = view
        return views, down

    def fleet_now(self, s, views: dict[str, object] | None = None) -> tuple[FleetNow, dict[str, float]]:
        """Each reachable cluster's groups now (``views``: their node groups, read by
        ``views()``; alive capacity, what Raylane's active jobs hold there and when
        each must end by its timeout or is expected to by past runs of its kind, the
        jobs nominated there and not admitted yet, how long each kind runs there),
        and each project's rented spend an hour."""
        if views is None:
            views, _ = self.views()
        now: FleetNow = {}
        for name, m in self.fd.members.items():
            view = views.get(name)
            if view is None:
                continue
            used, _ = stats.used_by_active(s, m.scope)
            at = utcnow()
            cached = self._runs.get(name)  # kept by the store's clock: past runs are about job time, not ours
            if cached is None or (at - cached[0]).total_seconds() > RUNS_KEPT_S:
                cached = self._runs[name] = (at, {})
            active, queued, read_to = store_fleet.group_queues(s, now=at, scope=m.scope, cache=cached[1])
            # A job whose victims are being stopped for it is first in its group's queue, and
            # what they free is its: a victim placed again must not be nominated back to it.
            for group, waiter in store_sharing.reclaiming(s, now=at, scope=m.scope).items():
                queued[group] = [replace(q, reclaiming=True) if q.job_id == waiter else q
                                 for q in queued.get(group, [])]
            runs: dict[str, dict[str, float]] = {}  # group -> kind -> median run there
            for (group, kind), spans in cached[1].items():
                if spans:
                    runs.setdefault(group, {})[kind] = spans[len(spans) // 2]
            now[name] = {}
            for g in m.profile.workers:
                st = view.get(g.name)
                if st is None:
                    continue
                holding = active.get(g.name, [])
                first = min((h for h in holding if h.end_s is not None), key=lambda h: h.end_s, default=None)
                now[name][g.name] = GroupNow(
                    alive_nodes=st.alive_nodes, total=dict(st.total), held=used.get(g.name, {}), node_free=st.node_free,
                    next_free_s=first.end_s if first else None, next_free_bound=bool(first and first.bound),
                    holding=holding, queued=queued.get(g.name, []), queue_read_to=read_to,
                    runs=runs.get(g.name, {}))
        spend: dict[str, float] = {}
        rented = {n: m for n, m in self.fd.members.items() if m.tier == "rented"}
        for project, cluster, group, total in store_fleet.active_on(s, list(rented)):
            g = rented[cluster].profile.group(group) if group else None
            if g is not None:
                spend[project] = spend.get(project, 0.0) + node_share(total, g) * g.price_per_hour
        return now, spend

    def lanes_usable(self) -> set[str]:
        """The clusters whose warm lanes may take jobs now: the fast lane on, and the
        cluster's Ray store known (finding it may ask its Ray: called outside the
        store's transaction)."""
        if not self.plane.settings.fast_lane:
            return set()
        return {name for name, m in self.fd.members.items()
                if name not in self.lost and m.lanes is not None and m.lanes.usable()}

    def _lane_placement(self, spec: JobSpec, n) -> Placement:
        """The nominee's placement, in its group's warm lane when the fast lane takes
        the job (``routing.with_lane``): every cluster of the fleet runs lanes, each
        in its own Ray's store."""
        p = n.placement.model_copy(deep=True, update={"cluster": n.cluster, "tier": n.tier})
        return with_lane(spec, p) if n.cluster in self._lanes_ok else p

    def run_once(self) -> None:
        lost = self.check_lost()
        settings = self.plane.settings
        at = utcnow()
        rejudge_before = at - timedelta(seconds=settings.fleet_renominate_s)
        retry_before = at - timedelta(seconds=UNPLACED_RETRY_S)
        with db.read(self.plane.sessions) as s:
            if not store_fleet.to_place(s, lost=set(lost), retry_before=retry_before, limit=1) and \
                    not store_fleet.nominated_before(s, before=rejudge_before, limit=1):
                return
        views, down = self.views()  # Ray first, then the store: no network call inside its transaction
        self._lanes_ok = self.lanes_usable()
        woken: set[str] = set()
        with db.transaction(self.plane.sessions) as s:
            now, spend = self.fleet_now(s, views)
            self._place(s, store_fleet.to_place(s, lost=set(lost), retry_before=retry_before), lost, down, now,
                        spend, woken)
            self._rejudge(s, store_fleet.nominated_before(s, before=rejudge_before), lost, down, now, spend, woken)
        for name in woken:
            self.fd.members[name].dispatcher.wake.set()

    def _rent(self, job, spend: dict[str, float]):
        """The job's project's renting policy, with what it rents now (``spend``, by project)."""
        return fleetplan.rent_policy(self.plane, job.project, spend.get(job.project, 0.0))

    def _skip(self, job_id: str, lost: dict[str, datetime], down: dict[str, str],
              moved: dict[str, set[str]]) -> dict[str, str]:
        """The clusters left out for this job now, each with why."""
        skip = {c: f"lost (unreachable since {t:%H:%M:%S} UTC)" for c, t in lost.items()}
        skip.update({c: why for c, why in down.items() if c not in skip})
        for c in moved.get(job_id, ()):
            skip.setdefault(c, "its scale-up for this job did not come in time")
        return skip

    def _nominate(self, s, job, spec: JobSpec, fp, now: FleetNow, spend: dict[str, float], woken: set[str],
                  reason: str) -> None:
        n = fp.nominee
        p = self._lane_placement(spec, n)
        p = p.model_copy(update={"reasons": [*fp.reasons, *p.reasons]})
        if store_fleet.nominate(s, job, cluster=n.cluster, placement=p.model_dump(mode="json"), reason=reason,
                                now=utcnow()):
            woken.add(n.cluster)
            if n.tier == "rented":  # the project's spend cap holds for the rest of this pass too
                spend[job.project] = spend.get(job.project, 0.0) + n.price_per_hour
            # What the next job of this pass sees: this one holds the group's room, or
            # waits in its queue (and no longer in the queue it moved from).
            for groups in now.values():
                for g_now in groups.values():
                    g_now.queued = [q for q in g_now.queued if q.job_id != job.id]
            g_now = now.get(n.cluster, {}).get(n.group)
            if g_now is not None:
                run = g_now.runs.get(spec.kind)
                if n.rank is fleet_placement.Rank.OWNED_ROOM or n.tier == "rented":
                    for k, v in p.total.items():
                        g_now.held[k] = g_now.held.get(k, 0.0) + v
                    if g_now.holding is not None:
                        g_now.holding.append(Holding(dict(p.total), run))
                else:
                    g_now.queued.append(Queued(job.id, spec.priority, dict(p.total), run))

    def _place(self, s, jobs: list, lost: dict[str, datetime], down: dict[str, str], now: FleetNow,
               spend: dict[str, float], woken: set[str]) -> None:
        """Nominate a cluster for each job to be placed; one that cannot be placed now
        says why and is tried again after ``UNPLACED_RETRY_S`` (the jobs behind it are
        not held up)."""
        moved = store_fleet.moved_from(s, [j.id for j in jobs])
        for job in jobs:
            try:
                with s.begin_nested():  # one job's failure is its own, not the pass's
                    self._place_one(s, job, lost, down, moved, now, spend, woken)
            except Exception as e:
                log.exception("placing job %s failed; it waits and is tried again", job.id)
                with s.begin_nested():
                    store_fleet.wait_unplaced(s, job, reason=f"placing it failed: {type(e).__name__}: {e}",
                                              now=utcnow())

    def _placed(self, spec: JobSpec, job, now: FleetNow, spend: dict[str, float], lost, down, moved):
        """``placement.place`` of ``job`` with the fleet's settings, its renting policy
        and the clusters it must skip (for a first placement and a re-judging alike)."""
        settings = self.plane.settings
        return fleet_placement.place(spec, self.fd.fleet, now, rent=self._rent(job, spend),
                                     owned_soon_s=settings.fleet_owned_soon_s,
                                     owned_wait_share=settings.fleet_owned_wait_share,
                                     skip=self._skip(job.id, lost, down, moved), job_id=job.id)

    def _place_one(self, s, job, lost, down, moved, now: FleetNow, spend: dict[str, float], woken: set[str]) -> None:
        at = utcnow()
        spec = JobSpec.from_stored(job.spec)
        try:
            fp = self._placed(spec, job, now, spend, lost, down, moved)
        except NoCandidate as e:
            if all(c in moved.get(job.id, ()) and c not in lost and c not in down for c in e.skipped):
                store_fleet.fail_unplaced(s, job, reason=f"no cluster of its candidates scaled up in "
                                          f"time: {e.message}", now=at)
            else:
                store_fleet.wait_unplaced(s, job, reason=f"waits for a cluster: {e.message}", now=at)
            return
        except (Unroutable, Forbidden) as e:  # the fleet or the policy changed since submit
            store_fleet.wait_unplaced(s, job, reason=f"no cluster may run it now: {e}", now=at)
            return
        if fp.nominee is None:
            store_fleet.wait_unplaced(s, job, reason="; ".join(fp.reasons), now=at)
            return
        self._nominate(s, job, spec, fp, now, spend, woken, f"{fp.reasons[0]}: {fp.nominee.reason}")

    def _rejudge(self, s, jobs: list, lost: dict[str, datetime], down: dict[str, str], now: FleetNow,
                 spend: dict[str, float], woken: set[str]) -> None:
        """Queued jobs nominated a while ago and not admitted: each moves when another
        (cluster, group) now ranks strictly better than where it waits (its rented
        group filled up, owned capacity freed, the owned wait is no longer soon), or
        where it waits is no candidate any more (a cluster gone from the fleet file,
        a project no longer allowed to rent, a spend cap reached); else its
        nomination is kept until the next judgement."""
        moved = store_fleet.moved_from(s, [j.id for j in jobs])
        kept = []
        for job in jobs:
            spec = JobSpec.from_stored(job.spec)
            try:
                fp = self._placed(spec, job, now, spend, lost, down, moved)
            except (NoCandidate, Unroutable, Forbidden):
                kept.append(job.id)
                continue
            except Exception:
                log.exception("judging job %s's nomination again failed; kept", job.id)
                kept.append(job.id)
                continue
            n = fp.nominee
            here = next((c for c in fp.candidates if c.cluster == job.cluster and c.group == job.node_group), None)
            gone = here is None or here.blocked is not None
            if n is None or n is here or (not gone and n.rank >= here.rank):
                kept.append(job.id)
                continue
            was = here.reason if here is not None else "no longer a candidate"
            if here is not None and here.blocked:
                was = f"blocked: {here.blocked}"
            self._nominate(s, job, spec, fp, now, spend, woken,
                           f"moved from {job.cluster} {job.node_group} ({was}): {fp.reasons[0]}: {n.reason}")
        store_fleet.still_best(s, kept, now=utcnow())


def _backend(url: str, token: str | None, gcs_address: str | None = None) -> RayBackend:
    """A cluster's backend: Ray's Jobs API at its dashboard, and its GCS when the
    fleet file gives the address (runner inputs off the command line, drains)."""
    from raylane.orchestrator.backends.ray_jobs import RayJobsBackend

    gcs = None
    if gcs_address:
        from raylane.orchestrator.backends.ray_gcs import RayGcs  # Ray's protobufs: only when used

        gcs = RayGcs(gcs_address, token)
    return RayJobsBackend(url, token, gcs=gcs)


def attach_configured_fleet(plane: "ControlPlane") -> tuple[FleetDispatch, dict[str, str | None]] | None:
    """The fleet RAYLANE_FLEET names, attached, when it has several clusters and
    each can be reached (its ``dashboard_url`` and token); with each cluster's
    token (the dashboard proxy's). None: one cluster, or a fleet file
    without every reach (then jobs run on the attached cluster alone, as before,
    and the log says why)."""
    from raylane.orchestrator.backends.fleet import FleetBackends
    from raylane.orchestrator.domain.errors import Invalid

    f = fleetplan.fleet(plane)
    if len(f.members) < 2:
        return None
    attached = fleetplan.attached(plane)
    try:
        built = FleetBackends.build(f, attached, make=_backend)
    except Invalid as e:
        log.warning("fleet %s: jobs run on cluster %s alone: %s (%s)", f.name, attached, e.message, e.field)
        return None
    fd = attach_fleet(plane, f, built.backends, attached)
    plane.dashboard_url = f.cluster(attached).spec.dashboard_url
    plane._fleet_backends = built  # the plan's views use the same backends
    return fd, {c.name: c.spec.read_token() for c in f.members}


def close(plane: "ControlPlane") -> None:
    """The other clusters' backends (the attached one is the plane's own)."""
    fd = getattr(plane, "fleet_dispatch", None)
    if fd is None:
        return
    for name, m in fd.members.items():
        if name != fd.attached:
            m.backend.close()


def keep_to_attached(plane: "ControlPlane") -> None:
    """A fleet of several clusters that cannot all be reached (a token unset, a
    reach missing): jobs run on the attached cluster alone, and its loops see only
    its jobs and attempts (and those that record no cluster). Attempts recorded on
    another cluster are left as they are, not asked of this cluster's Ray (which
    would call them lost and run them a second time), until the fleet is whole."""
    f = fleetplan.fleet(plane)
    if len(f.members) < 2 or getattr(plane, "dispatcher", None) is None:
        return
    here = fleetplan.attached(plane)
    scope = Scope(here, attached=True)
    plane.dispatcher.scope = scope
    plane.dispatcher.tier = f.cluster(here).tier
    plane.reconciler.scope = scope
    log.warning("fleet %s: jobs and attempts of clusters other than %s are left alone until every cluster can be "
                "reached", f.name, here)
