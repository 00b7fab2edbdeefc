"""The router: (JobSpec, profile, live cluster) -> Placement, with reasons.

A pure function. The one idea it encodes: tightly coupled GPU work needs
co-located accelerators (one node, STRICT_PACK, gang-scheduled); independent
work (trials, inference batches) needs cheap interruptible workers (spot,
SPREAD) and tolerance of their loss.

Rules, in order:
1. An explicit ``placement.node_group`` wins when the job can ever fit there, and
   is refused with the reason when it cannot.
2. A job that asks for GPUs only goes to groups with accelerators (of the asked
   type); it never lands on a CPU group.
3. Without GPUs: spot-first kinds (sweeps, batch inference, services) default to
   spot, with the on-demand CPU group as soft fallback; the others (training,
   commands) default to on-demand. ``placement.market`` overrides the default.
4. ``avoid_spot`` (after repeated preemptions) routes to an on-demand group of the
   same shape.
5. A multi-worker GPU job of a STRICT_PACK kind (training) co-locates unless
   ``colocate: false``; otherwise its workers take their kind's strategy.

What a kind implies is its row in ``kinds.KINDS``; nothing here tests a kind's name.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from raylane.orchestrator.domain import lanes
from raylane.orchestrator.domain.errors import Invalid
from raylane.orchestrator.domain.kinds import traits
from raylane.orchestrator.domain.profile import NODE_GROUP_LABEL, NodeGroup, Profile
from raylane.orchestrator.domain.views import Placement
from raylane.orchestrator.domain.specs import JobSpec

GiB = 1024**3


@dataclass
class GroupState:
    """What the cluster has now in one node group (from Ray's node list)."""

    alive_nodes: int = 0
    draining_nodes: int = 0
    total: dict[str, float] = field(default_factory=dict)  # over alive, non-draining nodes
    # What each of those nodes has free now as Ray counts it (CPU, GPU, memory), when
    # Ray said so for every one of them (its GCS does; the dashboard's list does not);
    # None: unknown. A co-located gang must fit one node (``node_need``, ``one_node``).
    node_free: list[dict[str, float]] | None = None


ClusterView = dict[str, GroupState]


def node_need(placement: Placement) -> dict[str, float] | None:
    """What one node must hold for the job to start: a co-located gang's workers
    together (STRICT_PACK), or one worker that asks for GPUs (no node splits a
    worker). None: CPU work, which the group's sum judges (Ray's own queue and the
    warm lanes' hosts hold CPUs that Raylane counts its own way)."""
    worker = {k: v for k, v in placement.worker_resources.items() if k in ("CPU", "GPU", "memory")}
    if placement.colocate:
        return {k: v * placement.num_workers for k, v in worker.items()}
    return worker if worker.get("GPU", 0.0) > 1e-9 else None


def one_node(need: dict[str, float], nodes: list[dict[str, float]]) -> int | None:
    """A node (an index of ``nodes``, what each has free) that holds all of
    ``need``, or None when none does. Of those that do, the one with the most room:
    where Ray may put it is not known, and taking room from the largest is what
    leaves a later gang least (admission subtracts it there)."""
    fits = [i for i, n in enumerate(nodes) if all(n.get(k, 0.0) >= v - 1e-9 for k, v in need.items())]
    return max(fits, key=lambda i: (nodes[i].get("GPU", 0.0), nodes[i].get("CPU", 0.0)), default=None)


class Unroutable(Invalid):
    """A job that can never fit the profile: refused at submit, with the reason."""


def _fmt(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


def _per_worker(spec: JobSpec) -> dict[str, float]:
    r = spec.resources
    out = {"CPU": r.cpus_per_worker}
    if r.gpus_per_worker:
        out["GPU"] = r.gpus_per_worker
    if r.memory_gb_per_worker:
        out["memory"] = r.memory_gb_per_worker * GiB
    return out


def why_never_fits(spec: JobSpec, group: NodeGroup, colocate: bool) -> str | None:
    """None if the job can fit the group at its largest; else the reason it never will."""
    r = spec.resources
    if group.role == "head":
        return f"group {group.name} is the head group and runs no jobs"
    if r.gpus_per_worker > 0 and group.gpus == 0:
        return f"job needs {_fmt(r.gpus_per_worker)} GPU per worker; group {group.name} has no GPUs"
    if r.accelerator_type and (not group.accelerator or group.accelerator.type != r.accelerator_type):
        have = group.accelerator.type if group.accelerator else "none"
        return f"job needs accelerator {r.accelerator_type}; group {group.name} has {have}"
    if r.gpus_per_worker > group.gpus:
        return f"one worker needs {_fmt(r.gpus_per_worker)} GPUs; a node of group {group.name} has {group.gpus}"
    if r.cpus_per_worker > group.cpus:
        return f"one worker needs {_fmt(r.cpus_per_worker)} CPUs; a node of group {group.name} has {_fmt(group.cpus)}"
    if r.memory_gb_per_worker and r.memory_gb_per_worker > group.memory_gb:
        return (f"one worker needs {_fmt(r.memory_gb_per_worker)} GB; a node of group {group.name} has "
                f"{_fmt(group.memory_gb)} GB")
    nodes = 1 if colocate else group.max_nodes
    if r.total_gpus > group.gpus * nodes:
        where = "one node" if colocate else f"{group.max_nodes} nodes at most"
        return (f"job needs {_fmt(r.total_gpus)} GPUs co-located; group {group.name} has {group.gpus * nodes} "
                f"on {where}")
    if r.total_cpus + r.driver_cpus > group.cpus * nodes:
        where = "one node" if colocate else f"{group.max_nodes} nodes at most"
        return f"job needs {_fmt(r.total_cpus + r.driver_cpus)} CPUs; group {group.name} has {_fmt(group.cpus * nodes)} on {where}"
    return None


def said_once(refusals: list[tuple[NodeGroup, str]]) -> str:
    """The groups' refusals joined, each sentence once: "a node of group spot-cpu
    or cpu has 8", not the same sentence once per group."""
    names: dict[str, list[str]] = {}
    for g, why in refusals:
        names.setdefault(why.replace(f"group {g.name}", "group {}"), []).append(g.name)
    return "; ".join(t.replace("group {}", "group " + " or ".join(ns)) if "group {}" in t else t
                     for t, ns in names.items())


def route(spec: JobSpec, profile: Profile, cluster: ClusterView | None = None, *,
          avoid_spot: bool = False, fast_lane: bool = False) -> Placement:
    """Decide where ``spec`` runs. Raises ``Unroutable`` if it can never run.
    ``fast_lane``: small jobs may take the group's warm lane (``lanes.decide``)."""
    r = spec.resources
    wants_gpu = r.gpus_per_worker > 0
    colocate = spec.placement.colocate
    if colocate is None:
        colocate = wants_gpu and r.num_workers > 1 and traits(spec.kind).strategy == "STRICT_PACK"
    reasons: list[str] = []

    if spec.placement.node_group != "auto":
        group = profile.group(spec.placement.node_group)
        if group is None:
            names = ", ".join(g.name for g in profile.workers)
            raise Unroutable(f"no node group {spec.placement.node_group!r}; groups are: {names}",
                             field="placement.node_group")
        why = why_never_fits(spec, group, colocate)
        if why:
            raise Unroutable(f"placement.node_group {group.name} can never run this job: {why}",
                             field="placement.node_group")
        if avoid_spot and group.is_spot:
            reasons.append(f"asked for {group.name}, but it was preempted repeatedly; still honouring the explicit hint")
        reasons.append(f"node group {group.name} asked for explicitly")
        chosen, fallbacks = group, []
    else:
        chosen, fallbacks = _choose(spec, profile, colocate, avoid_spot, reasons)

    placement = _placement(spec, profile, chosen, fallbacks, colocate, reasons, cluster)
    if not fast_lane:
        return placement  # every job is a Ray job; nothing to say per job
    return with_lane(spec, placement)


def with_lane(spec: JobSpec, placement: Placement) -> Placement:
    """``placement`` (changed in place) in its group's warm lane when the job is
    small enough for one (``lanes.decide``), and why or why not among its reasons.
    ``route`` with ``fast_lane``; a fleet's placer on the group it nominated."""
    take, why = lanes.decide(spec, enabled=True)
    if take:
        # A lane runs where its host runs: no fallback group, no driver of its own.
        placement.lane = placement.node_group
        placement.lane_env = lanes.env_key(lanes.env_of(spec))
        placement.fallback_node_groups = []
        placement.total = dict(placement.worker_resources)  # one worker, no driver besides
        placement.reasons = [r for r in placement.reasons if not r.startswith("falls back to ")]
    placement.reasons.append(why)
    return placement


# What of a spec the router reads (``route``, ``lanes.decide``): specs alike in
# these route alike. tests/test_routing.py records every attribute ``route``
# reads and fails on one not covered here.
ROUTE_READS = ("kind", "lane", "resources", "placement", "sweep.num_trials", "sweep.max_concurrent_trials",
               "runtime_env.working_dir", "runtime_env.py_modules", "runtime_env.pip")


def route_key(spec: JobSpec) -> tuple:
    """What ``route`` decides from (``ROUTE_READS``), hashable. Written out, not
    walked from the paths: 0.8 us a spec against 6.5 for a generic walk, which ate
    most of what the memo saves. ``Resources`` and ``PlacementHint`` hold scalars
    only (a list field would make this unhashable, and every batch fail loudly)."""
    sweep, env = spec.sweep, spec.runtime_env
    return (spec.kind, spec.lane, tuple(spec.resources.__dict__.values()), tuple(spec.placement.__dict__.values()),
            None if sweep is None else (sweep.num_trials, sweep.max_concurrent_trials),
            env.working_dir, tuple(env.py_modules), tuple(env.pip))


def route_many(specs: Sequence[JobSpec], route_one: Callable[[JobSpec], Placement]) -> list[Placement]:
    """``route_one`` (``route`` with the profile, cluster view and lane setting bound)
    of each spec, each shape routed once: a batch of 1,000 alike jobs spent ~17 us
    a job routing (0.8 now), a fifth of its server CPU. Specs alike share one
    ``Placement``: read it, do not change it. Raises ``Unroutable`` for the first
    spec that can never run, its field as ``jobs.<index>.<field>``."""
    seen: dict[tuple, Placement] = {}
    out = []
    for i, spec in enumerate(specs):
        key = route_key(spec)
        placement = seen.get(key)
        if placement is None:
            try:
                placement = seen[key] = route_one(spec)
            except Unroutable as e:
                raise in_batch(e, i) from None
        out.append(placement)
    return out


def in_batch(e: Unroutable, index: int) -> Unroutable:
    """``e`` as refused for the batch's job ``index``: its field ``jobs.<index>.<field>``."""
    return Unroutable(f"jobs[{index}]: {e.message}", field=f"jobs.{index}.{e.field}" if e.field else f"jobs.{index}")


def _choose(spec: JobSpec, profile: Profile, colocate: bool, avoid_spot: bool, reasons: list[str]):
    r = spec.resources
    wants_gpu = r.gpus_per_worker > 0
    candidates = [g for g in profile.workers if (g.gpus > 0) == wants_gpu]
    if wants_gpu:
        desc = f"{r.num_workers} worker{'s' if r.num_workers > 1 else ''} x {_fmt(r.gpus_per_worker)} GPU"
        if colocate:
            reasons.append(f"{desc}, tightly coupled: co-locate on one node")
        else:
            reasons.append(f"{desc}: GPU group, not co-located")
    if avoid_spot:
        # Wins over an explicit market: repeated reclaims mean spot cannot finish this job.
        market = "ON_DEMAND"
        reasons.append("preempted repeatedly: falling back from spot to on-demand")
    elif spec.placement.market != "auto":
        market = spec.placement.market
        reasons.append(f"market {market} asked for explicitly")
    elif not wants_gpu and traits(spec.kind).spot_first:
        market = "SPOT"
    else:
        market = "ON_DEMAND"

    fitting: list[NodeGroup] = []
    refusals: list[tuple[NodeGroup, str]] = []
    for g in candidates:
        why = why_never_fits(spec, g, colocate)
        if why:
            refusals.append((g, why))
        else:
            fitting.append(g)
    if not fitting:
        if not candidates:
            kind = "GPU" if wants_gpu else "CPU-only"
            raise Unroutable(f"the profile has no {kind} node group for this job", field="resources")
        raise Unroutable(said_once(refusals), field="resources")
    preferred = [g for g in fitting if g.market == market]
    others = [g for g in fitting if g.market != market and not (avoid_spot and g.is_spot)]
    if not preferred:
        if not others:
            raise Unroutable(f"no {market} group can run this job after spot fallback", field="placement.market")
        reasons.append(f"no {market} group fits; using {others[0].market}")
        preferred, others = others, []
    # Smallest fitting node first: leave big nodes for big jobs. A group whose
    # max_nodes is 0 can never get a node: last, whatever its price.
    preferred.sort(key=lambda g: (g.max_nodes == 0, g.gpus, g.cpus, g.price_per_hour))
    chosen = preferred[0]
    fallbacks = [g for g in preferred[1:] + others]
    kind = traits(spec.kind)
    if not wants_gpu:
        if spec.sweep is not None:
            reasons.append(f"sweep of {spec.sweep.num_trials} independent trials: {chosen.name}, {kind.strategy}")
        elif kind.spot_first:
            reasons.append(f"{kind.name} tolerates lost workers: {chosen.name} ({chosen.market})")
        else:
            reasons.append(f"{kind.name} without GPUs: {chosen.name} ({chosen.market})")
    else:
        reasons.append(f"GPU group {chosen.name} ({chosen.gpus} x {chosen.accelerator.type} per node)")
    if fallbacks and not wants_gpu:
        reasons.append(f"falls back to {', '.join(g.name for g in fallbacks)} if {chosen.name} has no room")
    return chosen, [g for g in fallbacks if not wants_gpu]


def _placement(spec: JobSpec, profile: Profile, group: NodeGroup, fallbacks: list[NodeGroup], colocate: bool,
               reasons: list[str], cluster: ClusterView | None) -> Placement:
    r = spec.resources
    kind = traits(spec.kind)
    if colocate:
        strategy = "STRICT_PACK"
    else:
        # SPREAD for independent work: losing one spot node loses few trials.
        # A STRICT_PACK kind that does not co-locate (one worker, no GPUs) packs.
        strategy = "PACK" if kind.strategy == "STRICT_PACK" else kind.strategy
    per_worker = _per_worker(spec)
    workers = r.num_workers
    if spec.sweep is not None:
        if spec.sweep.max_concurrent_trials:
            workers = min(spec.sweep.max_concurrent_trials, spec.sweep.num_trials)
        else:
            # No cap given: as many trials at once as the group can hold now (or at
            # its largest), so Tune does not queue hundreds of trial actors.
            live = cluster.get(group.name) if cluster else None
            cpus = live.total.get("CPU", 0) if live and live.alive_nodes else group.cpus * group.max_nodes
            slots = int(cpus // r.cpus_per_worker) if r.cpus_per_worker else spec.sweep.num_trials
            workers = max(1, min(spec.sweep.num_trials, slots))
            reasons.append(f"{workers} trials at a time: what group {group.name} holds")
        if workers > 1:
            # jobs/sweep.py, TrialSizedConcurrency: Tune would start an actor per trial only to discard it.
            reasons.append(f"one trial at a time instead of {workers} if {workers - 1} of its trials prove to end "
                           "before a trial actor starts (it would be thrown away)")
    total = {k: v * workers for k, v in per_worker.items()}
    driver_group = group
    if group.is_spot and kind.runner is not None:
        # The driver holds the job together (Tune's controller, Ray Data's
        # coordinator): keep it off spot, so a reclaim loses workers, not the job.
        on_demand = [g for g in profile.workers if not g.is_spot and g.gpus == 0 and g.cpus >= r.driver_cpus]
        if on_demand:
            driver_group = on_demand[0]
            reasons.append(f"driver on on-demand group {driver_group.name}, so a spot reclaim loses workers, not the job")
    driver_resources = {"CPU": r.driver_cpus}
    if kind.runner is None:
        # A command is its own driver: the entrypoint holds the worker's resources.
        driver_resources = dict(per_worker)
    elif driver_group is group:
        total["CPU"] = total.get("CPU", 0) + r.driver_cpus
    if cluster is not None:
        st = cluster.get(group.name)
        if st is None or st.alive_nodes == 0:
            reasons.append(f"group {group.name} has no live node now; the job waits for one")
    return Placement(
        node_group=group.name,
        market=group.market,
        strategy=strategy,
        colocate=colocate,
        num_workers=workers,
        worker_resources=per_worker,
        label_selector={NODE_GROUP_LABEL: group.name},
        fallback_node_groups=[g.name for g in fallbacks],
        driver_resources=driver_resources,
        driver_label_selector={NODE_GROUP_LABEL: driver_group.name},
        driver_market=driver_group.market,
        total=total,
        reasons=reasons,
    )
