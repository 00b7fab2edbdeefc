"""The fleet as the API sees it: which fleet the settings name, where a job would
be placed across it (``POST /v1/plan`` on a fleet of several clusters), and the
pins a submitted job may carry (``placement.cluster``, ``placement.tier``).

With every cluster's reach in the fleet file, jobs are dispatched across the
fleet (``services.fleetdispatch``: a placer, each cluster's own loops) and the
plan sees what the placer sees. Without it (a fleet file naming clusters
Raylane cannot reach) the control plane dispatches through one Ray backend, the
*attached* cluster (RAYLANE_DASHBOARD_URL; with ``serve --local-cluster`` and a
fleet, its first cluster, owned first), the others are placed by the fleet
file alone ("no live view of it now"), and a job pinned elsewhere is refused at
submit with the reason (``guard``), rather than accepted and run where it was
told not to be (docs/fleet.md).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from raylane.orchestrator.backends.fleet import FleetBackends
from raylane.orchestrator.domain import placement as fleet_placement
from raylane.orchestrator.domain.costs import node_share
from raylane.orchestrator.domain.errors import Invalid
from raylane.orchestrator.domain.fleet import Fleet, configured
from raylane.orchestrator.domain.placement import FleetPlacement, GroupNow, RentPolicy
from raylane.orchestrator.domain.profile import Profile
from raylane.orchestrator.domain.specs import JobSpec
from raylane.orchestrator.domain.views import Placement
from raylane.orchestrator.store import db, stats
from raylane.orchestrator.store import fleet as store_fleet
from raylane.orchestrator.store.transitions import utcnow

if TYPE_CHECKING:
    from raylane.orchestrator.services.controlplane import ControlPlane

log = logging.getLogger(__name__)
VIEW_CACHE_S = 2.0  # as the control plane's own view: a burst of plans makes one call per cluster


def fleet(cp: "ControlPlane") -> Fleet:
    """The fleet RAYLANE_FLEET names, else the attached (or configured) cluster as a fleet of one."""
    cached = getattr(cp, "_fleet", None)
    if cached is None:
        prof = cp.profile if cp.profile is not None else Profile.load(cp.settings.profile)
        cached = configured(cp.settings.fleet, prof, dashboard_url=cp.settings.dashboard_url,
                            gcs_address=cp.settings.ray_address)
        cp._fleet = cached
    return cached


def attached(cp: "ControlPlane") -> str:
    """The cluster the control plane's backend talks to: the fleet's cluster at
    RAYLANE_DASHBOARD_URL, else its first (owned first)."""
    f = fleet(cp)
    url = (cp.settings.dashboard_url or "").rstrip("/")
    match = next((c.name for c in f.members if c.spec.dashboard_url and c.spec.dashboard_url.rstrip("/") == url), None)
    return match or sorted(f.members, key=lambda c: not c.owned)[0].name


def rent_policy(cp: "ControlPlane", project: str | None, spend_per_hour: float = 0.0) -> RentPolicy:
    s = cp.settings
    if project is None:  # an admin planning for no project: no project's policy applies
        return RentPolicy(project="(none)")
    cap = s.fleet_rented_spend_cap.get(project, s.fleet_rented_spend_cap.get("*"))
    return RentPolicy(project=project, may_rent=project not in s.fleet_no_rent_projects, cap_per_hour=cap,
                      spend_per_hour=spend_per_hour)


def _backends(cp: "ControlPlane") -> FleetBackends | None:
    """A backend for each cluster of a fleet of several with its reach in the fleet
    file (None: one cluster, or a cluster Raylane cannot reach: the plan then sees
    the attached cluster alone). Built once; it only reads node lists here."""
    if hasattr(cp, "_fleet_backends"):
        return cp._fleet_backends
    f = fleet(cp)
    built = None
    if len(f.members) > 1:
        try:
            built = FleetBackends.build(f, attached(cp))
        except Invalid as e:
            log.warning("the fleet plan sees cluster %s alone: %s (%s)", attached(cp), e.message, e.field)
    cp._fleet_backends = built
    return built


def _other_view(cp: "ControlPlane", name: str):
    """Another cluster's node groups now (cached ``VIEW_CACHE_S``), None when unreachable."""
    from raylane.orchestrator.backends.ray_jobs import RayUnavailable

    cache = cp.__dict__.setdefault("_fleet_views", {})
    hit = cache.get(name)
    if hit is not None and time.monotonic() - hit[0] < VIEW_CACHE_S:
        return hit[1]
    try:
        view = _backends(cp).of(name).cluster_view()
    except RayUnavailable:
        view = None
    cache[name] = (time.monotonic(), view)
    return view


def _now(cp: "ControlPlane", f: Fleet) -> tuple[fleet_placement.FleetNow | None, float]:
    """Each cluster's groups now (the attached one's with what Raylane's active jobs
    hold; the others' by their node lists, nothing of Raylane's runs there yet), and
    what the active jobs on the attached cluster cost an hour when it is rented (the
    spend a cap is judged against)."""
    if cp.backend is None:
        return None, 0.0
    name = attached(cp)
    cluster = f.cluster(name)
    view = cp.cluster_view() or {}
    with db.read(cp.sessions) as s:
        used, _ = stats.used_by_active(s)
        ends = store_fleet.timeout_ends(s, now=utcnow())
    groups = {g.name: GroupNow(alive_nodes=st.alive_nodes, total=dict(st.total), held=used.get(g.name, {}),
                               next_free_s=ends.get(g.name), next_free_bound=g.name in ends, node_free=st.node_free)
              for g in cluster.profile.workers if (st := view.get(g.name)) is not None}
    now: fleet_placement.FleetNow = {name: groups}
    if _backends(cp) is not None:
        for other in f.members:
            if other.name == name:
                continue
            v = _other_view(cp, other.name)
            if v is not None:
                now[other.name] = {g: GroupNow(alive_nodes=st.alive_nodes, total=dict(st.total),
                                               node_free=st.node_free) for g, st in v.items()}
    spend = 0.0
    if not cluster.owned:
        for g in cluster.profile.workers:
            spend += node_share(used.get(g.name, {}), g) * g.price_per_hour
    return now, spend


def place(cp: "ControlPlane", spec: JobSpec, project: str | None) -> FleetPlacement:
    f = fleet(cp)
    fd = getattr(cp, "fleet_dispatch", None)
    if fd is not None:  # dispatching across the fleet: the placer's own view (what each cluster holds)
        with db.read(cp.sessions) as s:
            now, spends = fd.placer.fleet_now(s)
        return fleet_placement.place(spec, f, now, rent=rent_policy(cp, project, spends.get(project or "", 0.0)),
                                     owned_soon_s=cp.settings.fleet_owned_soon_s,
                                     owned_wait_share=cp.settings.fleet_owned_wait_share,
                                     skip={c: "lost" for c in fd.placer.lost})
    now, spend = _now(cp, f)
    return fleet_placement.place(spec, f, now, rent=rent_policy(cp, project, spend),
                                 owned_soon_s=cp.settings.fleet_owned_soon_s,
                                 owned_wait_share=cp.settings.fleet_owned_wait_share)


def plan(cp: "ControlPlane", spec: JobSpec, project: str | None) -> Placement:
    """``/v1/plan`` on a fleet of several clusters: the nominee's placement, its
    cluster and tier, and every candidate's reason; a job every candidate of which
    policy blocks gets the router's placement on its first candidate, marked waiting."""
    fp = place(cp, spec, project)
    p = fp.placement()
    if p is None:
        first = fp.candidates[0]
        p = first.placement.model_copy(update={"cluster": first.cluster, "tier": first.tier,
                                               "reasons": [*first.placement.reasons, *fp.reasons]})
    return p


def check_pins(cp: "ControlPlane", spec: JobSpec, project: str | None = None) -> None:
    """Refuse a submitted job's ``placement.cluster`` / ``placement.tier`` that the
    fleet cannot honour, or that names a cluster jobs are not dispatched to yet."""
    if spec.placement.cluster == "auto" and spec.placement.tier == "auto":
        return
    f = fleet(cp)
    fp = fleet_placement.place(spec, f, None, rent=rent_policy(cp, project))  # Unroutable / Forbidden name the field
    here = attached(cp)
    if not any(c.cluster == here for c in fp.candidates):
        where = spec.placement.cluster if spec.placement.cluster != "auto" else f"a {spec.placement.tier} cluster"
        raise Invalid(f"jobs are dispatched to cluster {here} only until dispatch across clusters is built "
                      f"(docs/fleet.md); this job is pinned to {where}",
                      field="placement.cluster" if spec.placement.cluster != "auto" else "placement.tier")


def guard(cp: "ControlPlane", route_one):
    """``route_one`` (the control plane's router) with the fleet's pins checked first;
    on a fleet of several clusters, the placement names the attached cluster (where
    the dispatcher sends it), so its attempts record their cluster."""
    f = fleet(cp)
    here = f.cluster(attached(cp))
    several = len(f.members) > 1

    def routed(spec: JobSpec) -> Placement:
        check_pins(cp, spec)
        p = route_one(spec)
        if several and p is not None:
            p = p.model_copy(update={"cluster": here.name, "tier": here.tier})
        return p

    return routed


def economics(cp: "ControlPlane", rows: list, *, start, end) -> dict:
    """``/v1/report``'s ``fleet`` section. Dispatching across a fleet: each attempt
    priced on the groups of the cluster it ran on (``attempts.cluster``; NULL: the
    attached one). Else from the window's usage sums (``store.usage.sums``), every
    attempt on the attached cluster, where the dispatcher sent it."""
    from raylane.orchestrator.domain import costs, fleetcosts

    f = fleet(cp)
    here = f.cluster(attached(cp))
    hours = (end - start).total_seconds() / 3600
    if getattr(cp, "fleet_dispatch", None) is not None:
        now = utcnow()
        by_cluster: dict[str, list] = {}
        with db.read(cp.sessions) as s:
            window = store_fleet.window_attempts(s, start=start, end=end)
        for cluster, u in window:
            member = f.cluster(cluster or here.name) or here
            c = costs.attempt_cost(u, member.profile, start=start, end=end, now=min(now, end))
            if c.hours > 0:
                by_cluster.setdefault(member.name, []).append(c)
        return fleetcosts.report(by_cluster, f, hours=hours, target=cp.settings.break_even_utilisation)
    items = [costs.key_cost(r.usage, r.seconds, here.profile, r.attempts) for r in rows]
    out = fleetcosts.report({here.name: items}, f, hours=(end - start).total_seconds() / 3600,
                            target=cp.settings.break_even_utilisation)
    if len(f.members) > 1:
        out["notes"].append(f"attempts do not record their cluster yet: all are counted on {here.name}, the "
                            "cluster jobs are dispatched to")
    return out


@dataclass
class Live:
    """What ``GET /v1/fleet`` shows of each cluster now."""

    dispatching: bool
    placing: int
    states: dict[str, str]
    active: dict[str, int]
    queued: dict[str, int]


def live(cp: "ControlPlane", here: str) -> Live:
    """Each cluster's state (its reachability; ``lost`` when the placer gave up on
    it) and the jobs on it, from the store (NULL: the attached cluster)."""
    from raylane.orchestrator.backends.reachability import REACHABLE, UNREACHABLE
    from raylane.orchestrator.domain.states import ACTIVE, QUEUED

    fd = getattr(cp, "fleet_dispatch", None)
    states: dict[str, str] = {}
    if fd is not None:
        for name, m in fd.members.items():
            seen = m.backend.reachability.now().state
            states[name] = "lost" if name in fd.placer.lost else \
                {REACHABLE: "reachable", UNREACHABLE: "unreachable"}.get(seen, "unknown")
    elif cp.backend is not None:
        seen = cp.backend.reachability.now().state
        states[here] = {REACHABLE: "reachable", UNREACHABLE: "unreachable"}.get(seen, "unknown")
    with db.read(cp.sessions) as s:
        counts = store_fleet.jobs_by_cluster(s, attached=here)
    active = {s.value for s in ACTIVE}
    queued = {s.value for s in QUEUED}
    out = Live(fd is not None, 0, states, {}, {})
    for (cluster, status), n in counts.items():
        if cluster == store_fleet.TO_PLACE:
            out.placing += n if status in queued else 0
        elif status in active:
            out.active[cluster] = out.active.get(cluster, 0) + n
        elif status in queued:
            out.queued[cluster] = out.queued.get(cluster, 0) + n
    return out
