"""Placement across a fleet: (JobSpec, fleet, what each cluster has now, the
project's renting policy) -> the clusters that could run the job, in the order
to try them, each with its reason. A pure function; ``routing.route`` still
picks the node group within each cluster.

Words used here:

- *candidate*: one (cluster, node group) that can ever run the job (its largest
  node fits it, as ``routing.why_never_fits`` judges).
- *room now*: the group's live nodes have, beyond what Raylane's running
  attempts hold, the job's whole ``total`` (each of CPU and GPU); for a
  co-located gang, also one node that holds all its workers (for other GPU
  work, one worker), where Ray said what each node has free
  (``GroupNow.node_free``, ``routing.node_need``).
- *expected start*: when a job queued on a group now would start there
  (``expected_start``): its active jobs free what they hold as they are
  expected to end, the jobs already nominated there and admitted before it
  (*ahead*: higher priority, or the same and older) start in that order and
  hold their share for their expected run, then it starts when its own fits.
  Without the active jobs' ends (``GroupNow.holding``), all that is held is
  taken to free at ``next_free_s``.
- *wait budget*: how long a job may be expected to wait for owned capacity
  rather than rent: ``owned_soon_s``, or ``owned_wait_share`` of how long its
  kind runs on that group when that is longer (``wait_budget``). Renting saves
  the wait and costs the whole run, so the longer the run, the longer a wait is
  worth it; and the dearer renting is now, the longer too: for work of the
  default priority or below, the share is multiplied by how much dearer the
  cheapest rented candidate with room or a scale-up left is than the cheapest
  of all (``_dearer``: 1 while spot is open; on-demand / spot once spot is full).
- *soon*: the group has no room now, but the job's expected start there is
  within its wait budget.
- *nomination*: the first candidate not blocked by policy. A job is placed on
  one cluster at a time (DESIGN decision 10); moving on to the next candidate
  after a scale-up deadline is the dispatcher's, not this module's.

The order (issue 45, item 3), ranks in ``Rank``:

1. owned, with room now;
2. owned, without room but with a place that starts soon;
3. rented spot, for kinds that tolerate losing nodes (``spot_first`` or
   ``checkpoints`` in ``kinds.KINDS``), unless the job was preempted repeatedly
   (``avoid_spot``) or asked for a market;
4. rented on demand;
5. owned, without room and not soon: it still runs the job when nothing else
   may (renting forbidden or capped, or no rented cluster fits);
6. rented, its group at ``max_nodes`` with no room: a place in its queue.

Within a rank: cheaper first (a rented group's price for the job, an hour),
then the fleet file's order.

Pins: ``placement.cluster`` keeps one cluster, ``placement.tier`` one tier; a
pin the fleet cannot honour is refused (``Unroutable``, the field named). Policy:
a project that may not rent keeps owned candidates only (a job pinned to rented
is refused, ``Forbidden``); a rented candidate that would take the project's
rented spend past its cap an hour is *blocked* (kept, with the reason; the job
waits for owned capacity or for spend to fall).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from enum import IntEnum

from raylane.orchestrator.domain.errors import Conflict, Forbidden
from raylane.orchestrator.domain.fleet import Cluster, Fleet
from raylane.orchestrator.domain.kinds import traits
from raylane.orchestrator.domain.profile import NodeGroup
from raylane.orchestrator.domain.routing import ClusterView, GroupState, Unroutable, node_need, one_node, route
from raylane.orchestrator.domain.specs import JobSpec
from raylane.orchestrator.domain.views import Placement

RESOURCES = ("GPU", "CPU")  # what room is judged on, in the order reasons name them
_LAST_ID = "~"  # after every job id (ULIDs: digits and capitals): a job not stored yet queues last of its priority


class Rank(IntEnum):
    OWNED_ROOM = 1
    OWNED_SOON = 2
    RENTED_SPOT = 3
    RENTED_ON_DEMAND = 4
    OWNED_LATER = 5
    RENTED_FULL = 6  # a rented group at its max_nodes with no room: its queue, after every other


@dataclass(frozen=True)
class Holding:
    """One of Raylane's active jobs on a group: what it holds, and when it is expected
    to end (seconds from now; None: no end known)."""

    total: dict[str, float]
    end_s: float | None
    bound: bool = False  # end_s is its timeout_s (certain), not an estimate


@dataclass(frozen=True)
class Queued:
    """A queued job nominated to a group and not admitted yet: its place in the
    group's admission order (priority high first, then id, old first) and how long
    it is expected to run there (None: unknown)."""

    job_id: str
    priority: int
    total: dict[str, float]
    run_s: float | None
    # Its victims are being stopped for it (preemption, docs/sharing.md): it is ahead
    # of every other job of the group, and what they free is its (``_has_room``).
    reclaiming: bool = False


@dataclass
class GroupNow:
    """One node group of one cluster now, as the caller sees it (Ray's node list,
    Raylane's running attempts)."""

    alive_nodes: int = 0
    total: dict[str, float] = field(default_factory=dict)  # over alive, non-draining nodes
    held: dict[str, float] = field(default_factory=dict)  # by Raylane's running attempts
    next_free_s: float | None = None  # when held resources are expected to start freeing; None: unknown
    next_free_bound: bool = False  # next_free_s is an upper bound (a running job's timeout), not an estimate
    node_free: list[dict[str, float]] | None = None  # what each live node has free, as Ray said (None: unknown)
    # Each active job's end (None: only next_free_s is known, and all of ``held``
    # is taken to free then), the queue nominated here, and how long each kind is
    # expected to run here (kind -> seconds): what ``expected_start`` reads.
    holding: list[Holding] | None = None
    queued: list[Queued] = field(default_factory=list)
    runs: dict[str, float] = field(default_factory=dict)
    queue_read_to: tuple[int, str] | None = None  # the cluster's queue was read up to this (priority, id)

    def free(self, resource: str) -> float:
        return max(0.0, self.total.get(resource, 0.0) - self.held.get(resource, 0.0))

    def ahead_of(self, priority: int, job_id: str | None) -> list[Queued]:
        """The queued jobs admitted before a job of ``priority`` and ``job_id`` (None:
        one not stored yet, after every job of its priority), in admission order."""
        ahead = [q for q in self.queued if q.job_id != job_id and (q.reclaiming or q.priority > priority or (
                 q.priority == priority and (job_id is None or q.job_id < job_id)))]
        return sorted(ahead, key=lambda q: (not q.reclaiming, -q.priority, q.job_id))


def expected_start(need: dict[str, float], now: GroupNow, *, priority: int = 50,
                   job_id: str | None = None) -> float | None:
    """Seconds from now until a job needing ``need``, queued on this group now, is
    expected to start: the group's held resources free as its active jobs are
    expected to end, the jobs queued ahead of it (``ahead_of``) start in admission
    order as their resources free and hold them for their expected run, then it
    starts when its own fit. None: no start can be foreseen (an end or a run
    ahead of it is unknown). An estimate from past runs (the caller's), or a
    running job's timeout; strict order, no backfilling of a small job past a
    large one (the admission's skips are bounded, so a queue keeps its order in
    the long run)."""
    last = now.queue_read_to
    if last is not None and (-priority, job_id or _LAST_ID) > (-last[0], last[1]):
        return None  # behind more queued jobs than were read
    free = {r: now.free(r) for r in RESOURCES}
    if now.holding is None:  # only the first end is known: all that is held taken to free then
        events = [] if now.next_free_s is None else [(now.next_free_s, 0, dict(now.held))]
    else:
        events = [(h.end_s, i, h.total) for i, h in enumerate(now.holding) if h.end_s is not None]
    heapq.heapify(events)
    seq = len(events)
    t = 0.0
    for q in [*now.ahead_of(priority, job_id), None]:
        want = need if q is None else q.total
        while not all(free[r] >= want.get(r, 0.0) - 1e-9 for r in RESOURCES):
            if not events:
                return None
            end, _, res = heapq.heappop(events)
            t = max(t, end)
            for r in RESOURCES:
                free[r] = min(now.total.get(r, 0.0), free[r] + res.get(r, 0.0))
        if q is None:
            return t
        for r in RESOURCES:
            free[r] -= want.get(r, 0.0)
        if q.run_s is not None:  # a job ahead with no known run holds its share for good
            seq += 1
            heapq.heappush(events, (t + q.run_s, seq, want))
    return t  # pragma: no cover (the loop returns at its last item)


ClusterNow = dict[str, GroupNow]  # by node group
FleetNow = dict[str, ClusterNow]  # by cluster; a cluster missing: no view of it now


class NoCandidate(Conflict):
    """Every cluster that could run the job is skipped now (``place``'s ``skip``): a
    state of the fleet, not of the request (409 through the API)."""

    def __init__(self, message: str, skipped: list[str]):
        super().__init__(message, field="placement")
        self.skipped = skipped


@dataclass(frozen=True)
class RentPolicy:
    """What the job's project may rent: ``may_rent`` at all, and its rented spend an
    hour at most ``cap_per_hour`` (None: no cap), ``spend_per_hour`` being what its
    running attempts on rented clusters cost an hour now."""

    project: str = ""
    may_rent: bool = True
    cap_per_hour: float | None = None
    spend_per_hour: float = 0.0


@dataclass
class Candidate:
    cluster: str
    tier: str
    group: str
    market: str
    rank: Rank
    price_per_hour: float  # what the job costs an hour there (rented); 0 on owned: paid for anyway
    placement: Placement
    reason: str
    blocked: str | None = None  # why policy keeps the job off it now


@dataclass
class FleetPlacement:
    candidates: list[Candidate]  # in the order to try them
    excluded: list[str]  # clusters that can never run the job, or may not, and why

    @property
    def nominee(self) -> Candidate | None:
        return next((c for c in self.candidates if c.blocked is None), None)

    @property
    def reasons(self) -> list[str]:
        """What ``/v1/plan`` and the job's reasons say: the choice, then every
        candidate in order, then what was left out."""
        n = self.nominee
        head = (f"placed on {n.cluster} {n.group} ({n.tier})" if n else
                "waits: every cluster that could run it is blocked by policy")
        lines = [f"{c.reason}" + (f" (blocked: {c.blocked})" if c.blocked else "") for c in self.candidates]
        return [head, *lines, *self.excluded]

    def placement(self) -> Placement | None:
        """The nominee's routing decision, naming its cluster and tier, with the
        fleet's reasons after the router's; None when every candidate is blocked."""
        n = self.nominee
        if n is None:
            return None
        return n.placement.model_copy(update={"cluster": n.cluster, "tier": n.tier,
                                              "reasons": [*n.placement.reasons, *self.reasons]})


def _fmt(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


def _minutes(s: float) -> str:
    return f"~{max(1, round(s / 60))} min"


def _has_room(p: Placement, now: GroupNow | None, owed: list[Queued] = ()) -> bool:
    """Whether the group's free resources hold the job's ``total`` now, less what the
    jobs that preempted for them (``owed``: ``Queued.reclaiming``) are owed; a
    co-located gang needs one node that holds it too (a GPU worker, one node that
    holds one), where Ray said."""
    if now is None or now.alive_nodes == 0:
        return False
    if not all(now.free(r) - sum(q.total.get(r, 0.0) for q in owed) >= p.total.get(r, 0.0) for r in RESOURCES):
        return False
    need = node_need(p)
    return need is None or now.node_free is None or one_node(need, now.node_free) is not None


def _held_text(need: dict[str, float], now: GroupNow) -> str:
    """'2 of 2 GPUs held' for the first resource the job lacks."""
    for r in RESOURCES:
        if need.get(r, 0.0) > now.free(r):
            unit = f"{r}s" if now.total.get(r, 0.0) != 1 else r
            return f"{_fmt(now.held.get(r, 0.0))} of {_fmt(now.total.get(r, 0.0))} {unit} held"
    return "no room"


def job_price(placement: Placement, group: NodeGroup) -> float:
    """What the job costs an hour on a rented ``group``: its node share (the larger
    of its CPU and GPU share of one node, as ``costs.node_share``) x the node price."""
    cpu = placement.total.get("CPU", 0.0) / group.cpus if group.cpus else 0.0
    gpu = placement.total.get("GPU", 0.0) / group.gpus if group.gpus else 0.0
    return max(cpu, gpu) * group.price_per_hour


def _view(now: ClusterNow | None) -> ClusterView | None:
    if now is None:
        return None
    return {g: GroupState(alive_nodes=n.alive_nodes, total=dict(n.total)) for g, n in now.items()}


def _tolerates_spot(spec: JobSpec) -> bool:
    t = traits(spec.kind)
    return t.spot_first or t.checkpoints


def _routes(spec: JobSpec, cluster: Cluster, now: ClusterNow | None, avoid_spot: bool) -> list[Placement]:
    """The placements worth trying on ``cluster``: the router's own, and on a rented
    cluster its spot and on-demand choices when the job leaves the market open."""
    view = _view(now)
    if cluster.owned or spec.placement.market != "auto" or spec.placement.node_group != "auto":
        return [route(spec, cluster.profile, view, avoid_spot=avoid_spot)]
    markets = (["SPOT"] if _tolerates_spot(spec) and not avoid_spot else []) + ["ON_DEMAND"]
    out, seen = [], set()
    for market in markets:
        hinted = spec.model_copy(update={"placement": spec.placement.model_copy(update={"market": market})})
        try:
            p = route(hinted, cluster.profile, view, avoid_spot=avoid_spot)
        except Unroutable:
            continue
        # The market was the fleet's choice, not the user's: say so.
        asked = f"market {market} asked for explicitly"
        why = ("the job tolerates losing nodes: rented spot first" if market == "SPOT" else
               "rented on demand")
        p.reasons = [f"market {market}: {why}" if r == asked else r for r in p.reasons]
        if p.node_group not in seen:
            seen.add(p.node_group)
            out.append(p)
    if not out:  # say why in the router's words
        route(spec, cluster.profile, view, avoid_spot=avoid_spot)
    return out


def priority_wait_factor(priority: int) -> float:
    """How much of ``owned_wait_share`` a job of this priority waits: 1 at the
    default priority (50), less as priority rises (80: 0.4; 100: none, so
    ``owned_soon_s`` alone), more as it falls (20: 1.6). Urgent work rents
    rather than wait for GPUs already paid for; patient work waits for them."""
    return (100 - priority) / 50


DEFAULT_PRIORITY = 50  # a spec's, unless it says otherwise (specs.JobSpec.priority)


def price_weighs(spec: JobSpec) -> bool:
    """Whether renting's price lengthens the job's wait for owned (``dearer``): for
    work of the default priority or below; work above it is urgent, and rents."""
    return spec.priority <= DEFAULT_PRIORITY


def wait_budget(spec: JobSpec, g_now: GroupNow, owned_soon_s: float, owned_wait_share: float,
                dearer: float = 1.0) -> float:
    """How long the job may be expected to wait for an owned group before rented
    capacity comes first: ``owned_soon_s``, or ``owned_wait_share`` (scaled by
    the job's priority, ``priority_wait_factor``, and for patient work by how much
    dearer the rented capacity open now is than the cheapest, ``_dearer``) of how
    long its kind runs there when that is longer."""
    run = g_now.runs.get(spec.kind)
    if run is None:
        return owned_soon_s
    share = owned_wait_share * (dearer if price_weighs(spec) else 1.0)
    return max(owned_soon_s, share * priority_wait_factor(spec.priority) * run)


def _dearer(rented: list[Candidate]) -> float:
    """How much dearer the rented capacity the job would get now is than the
    cheapest that could ever run it: the cheapest candidate that is not full
    against the cheapest of all (1 with no rented candidate). When cheap spot is
    taken, what owned saves is on-demand's price, and a longer wait is worth it."""
    prices = [c.price_per_hour for c in rented if c.price_per_hour > 0]
    open_ = [c.price_per_hour for c in rented if c.price_per_hour > 0 and c.rank is not Rank.RENTED_FULL]
    if not prices or not open_:
        return 1.0
    return min(open_) / min(prices)


def _ahead_text(ahead: list[Queued]) -> str:
    """', 2 queued ahead (3 GPUs)' for the jobs queued before this one."""
    if not ahead:
        return ""
    gpus = sum(q.total.get("GPU", 0.0) for q in ahead)
    what = f"{_fmt(gpus)} GPU{'s' if gpus != 1 else ''}" if gpus else \
        f"{_fmt(sum(q.total.get('CPU', 0.0) for q in ahead))} CPUs"
    return f", {len(ahead)} queued ahead ({what})"


def _candidate(cluster: Cluster, p: Placement, now: ClusterNow | None, owned_soon_s: float, *,
               spec: JobSpec, job_id: str | None = None, owned_wait_share: float = 0.0,
               dearer: float = 1.0) -> Candidate:
    group = cluster.profile.group(p.node_group)
    g_now = now.get(group.name) if now is not None else None
    name = f"{cluster.name} {group.name}"
    if cluster.owned:
        if now is None:
            return Candidate(cluster.name, cluster.tier, group.name, group.market, Rank.OWNED_ROOM, 0.0, p,
                             f"{name}: owned, no live view of it now; owned first")
        ahead = g_now.ahead_of(spec.priority, job_id) if g_now is not None else []
        owed = [q for q in ahead if q.reclaiming]
        if _has_room(p, g_now, owed):
            free = ", ".join(f"{_fmt(g_now.free(r))} of {_fmt(g_now.total.get(r, 0))} {r}s free"
                             for r in RESOURCES if p.total.get(r))
            return Candidate(cluster.name, cluster.tier, group.name, group.market, Rank.OWNED_ROOM, 0.0, p,
                             f"{name}: room now ({free})")
        if g_now is None or g_now.alive_nodes == 0:
            return Candidate(cluster.name, cluster.tier, group.name, group.market, Rank.OWNED_LATER, 0.0, p,
                             f"{name}: no live node now")
        held = _held_text(p.total, g_now)
        scattered = held == "no room" and not owed and node_need(p) is not None  # free by the sum, on no one node
        if scattered:
            held = ("free by the sum, but no one node with room for " +
                    (f"its {p.num_workers} co-located workers" if p.colocate else "one of its workers"))
        if held == "no room" and owed:  # free, but the preemptor's
            held = f"what is free is owed to job {owed[0].job_id}, which preempted for it"
            ahead = [q for q in ahead if not q.reclaiming]
        held += _ahead_text(ahead)
        start = expected_start(p.total, g_now, priority=spec.priority, job_id=job_id)
        if scattered:  # the sum's estimate is too early: no sooner than a running job ends and may empty a node
            start = max(start, g_now.next_free_s) if start is not None and g_now.next_free_s is not None else None
        budget = wait_budget(spec, g_now, owned_soon_s, owned_wait_share, dearer)
        frees = "next frees within" if g_now.next_free_bound else "next frees in"
        by = " (a running job's timeout)" if g_now.next_free_bound else ""
        when = (f"{frees} {_minutes(g_now.next_free_s)}{by}" if g_now.next_free_s is not None
                else "no end expected")
        if start is not None and (ahead or start != g_now.next_free_s):  # its own start, not the first end
            when = f"starts in {_minutes(start)}" + (f" ({when})" if g_now.next_free_s is not None else "")
        if start is not None and start <= budget:
            worth = (f", worth a {_fmt(round(dearer, 1))}x longer wait: rented capacity that is open now is "
                     f"dearer than its cheapest" if dearer > 1.0 + 1e-9 and price_weighs(spec) else "")
            return Candidate(cluster.name, cluster.tier, group.name, group.market, Rank.OWNED_SOON, 0.0, p,
                             f"{name}: {held}, {when}{worth}")
        if start is None and g_now.next_free_s is not None:
            when += ", its start not foreseen"
        return Candidate(cluster.name, cluster.tier, group.name, group.market, Rank.OWNED_LATER, 0.0, p,
                         f"{name}: {held}, {when}: after rented capacity")
    price = job_price(p, group)
    rank = Rank.RENTED_SPOT if group.is_spot else Rank.RENTED_ON_DEMAND
    if now is None:
        state = "no live view of it now"
    elif _has_room(p, g_now):
        state = f"room now on {g_now.alive_nodes} node{'s' if g_now.alive_nodes != 1 else ''}"
    else:
        alive = g_now.alive_nodes if g_now else 0
        if alive < group.max_nodes:
            state = f"scale-up from {alive} node{'s' if alive != 1 else ''}"
        else:
            state = f"{alive} of {group.max_nodes} nodes busy (max_nodes): waits in its queue"
            rank = Rank.RENTED_FULL
    market = "spot" if group.is_spot else "on demand"
    return Candidate(cluster.name, cluster.tier, group.name, group.market, rank, price, p,
                     f"{name}: {state}, ${price:.2f}/h {market}")


def place(spec: JobSpec, fleet: Fleet, now: FleetNow | None = None, *, rent: RentPolicy = RentPolicy(),
          owned_soon_s: float = 600.0, owned_wait_share: float = 0.0, avoid_spot: bool = False,
          skip: dict[str, str] | None = None, job_id: str | None = None) -> FleetPlacement:
    """The candidates for ``spec`` across ``fleet`` in the order to try them (see the
    module's docstring). ``now``: each cluster's groups now (None: no live view, the
    order from the fleet alone). Raises ``Unroutable`` when no cluster can ever run
    the job or a pin names what the fleet lacks, ``Forbidden`` when the only
    clusters left are rented and the project may not rent. ``skip``: clusters
    left out now, each with why (lost; its scale-up for this job did not come):
    excluded with that reason, ``NoCandidate`` when they were all that was left."""
    pin_cluster, pin_tier = spec.placement.cluster, spec.placement.tier
    members = fleet.members
    if pin_cluster != "auto":
        member = fleet.cluster(pin_cluster)
        if member is None:
            raise Unroutable(f"no cluster {pin_cluster!r} in fleet {fleet.name}; its clusters: "
                             f"{', '.join(fleet.names)}", field="placement.cluster")
        if pin_tier != "auto" and member.tier != pin_tier:
            raise Unroutable(f"placement.cluster {pin_cluster} is {member.tier}, but placement.tier asks for "
                             f"{pin_tier}", field="placement.tier")
        members = [member]
    elif pin_tier != "auto":
        members = [c for c in members if c.tier == pin_tier]
        if not members:
            raise Unroutable(f"fleet {fleet.name} has no {pin_tier} cluster", field="placement.tier")
    if not rent.may_rent:
        if all(not c.owned for c in members):
            field_ = "placement.cluster" if pin_cluster != "auto" else "placement.tier"
            raise Forbidden(f"project {rent.project} may not run jobs on rented clusters "
                            f"(RAYLANE_FLEET_NO_RENT_PROJECTS), and this job's {field_} sends it to one", field=field_)

    candidates: list[Candidate] = []
    pending: list[tuple[Cluster, Placement, ClusterNow | None]] = []
    excluded: list[str] = []
    skipped: list[str] = []
    never: list[tuple[str, Unroutable]] = []
    for cluster in members:
        c_now = None if now is None else now.get(cluster.name)
        try:
            placements = _routes(spec, cluster, c_now, avoid_spot)
        except Unroutable as e:
            never.append((cluster.name, e))
            excluded.append(f"{cluster.name}: can never run it: {e.message}")
            continue
        if not cluster.owned and not rent.may_rent:
            excluded.append(f"{cluster.name}: project {rent.project} may not rent (RAYLANE_FLEET_NO_RENT_PROJECTS)")
            continue
        if skip and cluster.name in skip:
            excluded.append(f"{cluster.name}: {skip[cluster.name]}")
            skipped.append(cluster.name)
            continue
        for p in placements:
            pending.append((cluster, p, c_now))
    rented = [_candidate(c, p, c_now, owned_soon_s, spec=spec, job_id=job_id)
              for c, p, c_now in pending if not c.owned]
    dearer = _dearer(rented)
    for c, p, c_now in pending:
        if c.owned:
            candidates.append(_candidate(c, p, c_now, owned_soon_s, spec=spec, job_id=job_id,
                                         owned_wait_share=owned_wait_share, dearer=dearer))
    candidates += rented
    if not candidates:
        if never and len(never) == len(members):
            fields = {e.field for _, e in never}
            raise Unroutable("; ".join(f"{name}: {e.message}" for name, e in never),
                             field=fields.pop() if len(fields) == 1 else "resources")
        if skipped:
            raise NoCandidate("; ".join(excluded), skipped)
        raise Forbidden("; ".join(excluded), field="placement.tier")
    order = {c.name: i for i, c in enumerate(fleet.members)}
    candidates.sort(key=lambda c: (c.rank, c.price_per_hour, order[c.cluster]))
    if rent.cap_per_hour is not None:
        for c in candidates:
            if c.tier == "rented" and rent.spend_per_hour + c.price_per_hour > rent.cap_per_hour + 1e-9:
                c.blocked = (f"project {rent.project}'s rented spend would be "
                             f"${rent.spend_per_hour + c.price_per_hour:.2f}/h, over its cap of "
                             f"${rent.cap_per_hour:.2f}/h")
    return FleetPlacement(candidates, excluded)
