"""Cost and utilisation accounting: pure functions over attempts and the profile.

Words used here:

- *usage*: one attempt as accounting sees it (``AttemptUsage``): the node group
  and market it ran on, the resources it held (``attempts.resources``, the
  placement's ``total``), and when it held them.
- *held interval*: from ``started_at`` (the reconciler saw it running) to
  ``ended_at``, or to *now* while it runs. An attempt that Ray finished before
  the reconciler saw it running is charged from its dispatch (``created_at``),
  an upper bound; one that never reached Ray (refused at submit, cancelled
  while claimed, still queued in Ray) costs nothing.
- *node share*: the larger of the attempt's CPU share and GPU share of one node
  of its group (2 of a node's 4 CPUs and 1 of its 2 GPUs is a share of 0.5). A
  share above 1 means it spread over several nodes. Memory is not priced: the
  node groups are sized so CPUs or GPUs run out first.
- *cost*: held hours x node share x the group's ``price_per_hour`` (per node).
  Every attempt is charged once, whatever became of it: a preempted attempt
  and its retry are two charges, because both held nodes.
- *on-demand cost*: the same hours and resources priced on the group's
  *on-demand twin*: the ON_DEMAND group of the same shape (accelerator, GPUs,
  CPUs and memory per node), else the cheapest ON_DEMAND group with the same
  accelerator. An on-demand attempt's twin is its own group. *Spot savings* are
  on-demand cost minus cost.
- *utilisation* of a group over a window: resource-seconds held by attempts
  divided by resource-seconds available, where available = nodes x per-node
  resources x window. The node count is the profile's ``min_nodes`` (one when
  it is 0): the always-on fleet a team would own. Raylane does not record when
  nodes came and went, so Ray's live node count (a snapshot of now) would
  misstate any past window; ``min_nodes`` is the same for every window and is
  exactly the fleet the own-versus-rent decision is about. Above 100% means
  the group scaled past its ``min_nodes``.

Nothing here reads the database or the clock: callers pass attempts and *now*.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Iterable, Literal

from raylane.orchestrator.domain.kinds import KINDS
from raylane.orchestrator.domain.profile import NodeGroup, Profile
from raylane.orchestrator.domain.states import AttemptStatus

EPOCH_UTC = datetime(1970, 1, 1, tzinfo=timezone.utc)
GroupBy = Literal["project", "node_group", "kind"]
GROUP_BY: tuple[str, ...] = ("project", "node_group", "kind")

# Ray's terminal statuses for an attempt it ran: held resources even if the
# reconciler never saw it RUNNING.
RAN_STATUSES = frozenset({AttemptStatus.SUCCEEDED.value, AttemptStatus.FAILED.value, AttemptStatus.STOPPED.value})
SUBMIT_ERROR = "SUBMIT_ERROR"
# A command that asked for GPUs but whose entrypoint names none of these
# probably did not use them (the documented heuristic; see ``gpu_unused``).
GPU_HINTS = ("cuda", "gpu", "torch", "jax", "tensorflow", "keras", "nvidia", "vllm", "triton", "deepspeed",
             "accelerate", "cupy", "rapids", "train", "infer", "model")
# Result keys a job may report to say how much of its GPUs it used (0..1 or percent).
GPU_RESULT_KEYS = ("gpu_utilization", "gpu_utilisation", "gpu_util", "gpus_used")


@dataclass(frozen=True)
class AttemptUsage:
    job_id: str
    project: str
    kind: str
    name: str
    number: int
    node_group: str | None
    market: str | None
    resources: dict[str, float]
    status: str
    cause: str | None
    created_at: datetime
    started_at: datetime | None
    ended_at: datetime | None
    spec: dict[str, Any] = field(default_factory=dict)
    result: dict[str, Any] | None = None


@dataclass
class AttemptCost:
    usage: AttemptUsage
    hours: float  # held within the window
    share: float  # of one node of its group
    cost: float
    on_demand_cost: float
    cpu_seconds: float
    gpu_seconds: float
    priced: bool  # its group is in the profile
    n: int = 1  # attempts it stands for (a sum over attempts of one key: ``key_cost``)

    @property
    def savings(self) -> float:
        return self.on_demand_cost - self.cost


# Intervals -------------------------------------------------------------------


def held_span(*, status: str, cause: str | None, created_at: datetime, started_at: datetime | None,
              ended_at: datetime | None) -> tuple[datetime, datetime | None] | None:
    """When an attempt with these values held its resources: (start, end), end None while
    it runs; None if it held nothing (yet). The clock is not read: see ``held_interval``."""
    if cause == SUBMIT_ERROR:
        return None
    start = started_at
    if start is None:
        if ended_at is None or status not in RAN_STATUSES:
            return None
        start = created_at
    if ended_at is not None and ended_at <= start:
        return None
    return start, ended_at


def held_interval(u: AttemptUsage, now: datetime) -> tuple[datetime, datetime] | None:
    """When the attempt held its resources (see the module docstring), or None."""
    span = held_span(status=u.status, cause=u.cause, created_at=u.created_at, started_at=u.started_at,
                     ended_at=u.ended_at)
    if span is None:
        return None
    end = span[1] or now
    return (span[0], end) if end > span[0] else None


def _overlap_s(interval: tuple[datetime, datetime] | None, start: datetime, end: datetime) -> float:
    if interval is None:
        return 0.0
    a, b = max(interval[0], start), min(interval[1], end)
    return max(0.0, (b - a).total_seconds())


# Prices ----------------------------------------------------------------------


def node_share(resources: dict[str, float], group: NodeGroup) -> float:
    cpu = resources.get("CPU", 0.0) / group.cpus if group.cpus else 0.0
    gpu = resources.get("GPU", 0.0) / group.gpus if group.gpus else 0.0
    return max(cpu, gpu)


def _same_accelerator(a: NodeGroup, b: NodeGroup) -> bool:
    ta = a.accelerator.type if a.accelerator else None
    tb = b.accelerator.type if b.accelerator else None
    return ta == tb


def twin(group: NodeGroup, profile: Profile, market: str, resources: dict[str, float]) -> NodeGroup | None:
    """The ``market`` group of the same shape as ``group`` (itself if it is of that
    market); else the cheapest ``market`` group with the same accelerator for these
    resources; None if there is none."""
    if group.market == market:
        return group
    same = [g for g in profile.workers if g.market == market and _same_accelerator(g, group)]
    exact = [g for g in same if (g.gpus, g.cpus, g.memory_gb) == (group.gpus, group.cpus, group.memory_gb)]
    if exact:
        return exact[0]
    if not same:
        return None
    return min(same, key=lambda g: node_share(resources, g) * g.price_per_hour)


def price(resources: dict[str, float], group: NodeGroup, hours: float) -> float:
    return hours * node_share(resources, group) * group.price_per_hour


def attempt_cost(u: AttemptUsage, profile: Profile, *, start: datetime, end: datetime,
                 now: datetime) -> AttemptCost:
    """What one attempt cost within [start, end], and what it would have cost on demand."""
    return key_cost(u, _overlap_s(held_interval(u, now), start, end), profile)


def key_cost(u: AttemptUsage, seconds: float, profile: Profile, n: int = 1) -> AttemptCost:
    """What ``seconds`` held by attempts like ``u`` cost (its node group, market and
    resources; ``n`` of them): cost is linear in the seconds, so the sum of a key's
    attempts is priced once (``store.usage.sums``)."""
    hours = seconds / 3600.0
    res = u.resources or {}
    group = profile.group(u.node_group) if u.node_group else None
    if group is None:
        return AttemptCost(u, hours, 0.0, 0.0, 0.0, seconds * res.get("CPU", 0.0), seconds * res.get("GPU", 0.0),
                           priced=False, n=n)
    cost = price(res, group, hours)
    od = twin(group, profile, "ON_DEMAND", res)
    od_cost = price(res, od, hours) if od is not None else cost
    return AttemptCost(u, hours, node_share(res, group), cost, od_cost,
                       seconds * res.get("CPU", 0.0), seconds * res.get("GPU", 0.0), priced=True, n=n)


def costs(usages: Iterable[AttemptUsage], profile: Profile, *, start: datetime, end: datetime,
          now: datetime) -> list[AttemptCost]:
    out = []
    for u in usages:
        c = attempt_cost(u, profile, start=start, end=end, now=now)
        if c.hours > 0:
            out.append(c)
    return out


def _key(c: AttemptCost, group_by: str) -> str:
    u = c.usage
    return {"project": u.project, "node_group": u.node_group or "none", "kind": u.kind}[group_by]


def breakdown(items: list[AttemptCost], group_by: str, jobs_by_key: dict[str, int] | None = None,
              total_jobs: int | None = None) -> dict[str, Any]:
    """Cost, on-demand cost and spot savings per ``group_by`` key, most expensive first.

    ``items`` are attempts, or sums of attempts (``n``); sums do not know their
    jobs, so the caller counts them (``jobs_by_key``, ``total_jobs``)."""
    if group_by not in GROUP_BY:
        raise ValueError(f"group_by must be one of {', '.join(GROUP_BY)}")
    rows: dict[str, dict[str, Any]] = {}
    jobs: dict[str, set[str]] = defaultdict(set)
    for c in items:
        k = _key(c, group_by)
        r = rows.setdefault(k, {"key": k, "cost": 0.0, "on_demand_cost": 0.0, "spot_savings": 0.0, "attempts": 0,
                                "jobs": 0, "hours": 0.0, "cpu_hours": 0.0, "gpu_hours": 0.0})
        r["cost"] += c.cost
        r["on_demand_cost"] += c.on_demand_cost
        r["spot_savings"] += c.savings
        r["attempts"] += c.n
        r["hours"] += c.hours
        r["cpu_hours"] += c.cpu_seconds / 3600
        r["gpu_hours"] += c.gpu_seconds / 3600
        jobs[k].add(c.usage.job_id)
    for k, r in rows.items():
        r["jobs"] = len(jobs[k]) if jobs_by_key is None else jobs_by_key.get(k, 0)
    ordered = sorted(rows.values(), key=lambda r: (-r["cost"], r["key"]))
    total = {"cost": sum(c.cost for c in items), "on_demand_cost": sum(c.on_demand_cost for c in items),
             "spot_savings": sum(c.savings for c in items), "attempts": sum(c.n for c in items),
             "jobs": len({c.usage.job_id for c in items}) if total_jobs is None else total_jobs}
    return {"group_by": group_by, "rows": ordered, "total": total,
            "unpriced_attempts": sum(c.n for c in items if not c.priced)}


# Utilisation -----------------------------------------------------------------


def fleet_nodes(group: NodeGroup) -> int:
    return max(group.min_nodes, 1)


def utilisation(items: list[AttemptCost], profile: Profile, *, start: datetime, end: datetime) -> list[dict[str, Any]]:
    """Per worker group: CPU and GPU resource-hours held against the fleet's (see the module docstring)."""
    window_h = max((end - start).total_seconds(), 0.0) / 3600
    used: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for c in items:
        if c.usage.node_group:
            used[c.usage.node_group][0] += c.cpu_seconds / 3600
            used[c.usage.node_group][1] += c.gpu_seconds / 3600
    out = []
    for g in profile.workers:
        n = fleet_nodes(g)
        cpu_avail, gpu_avail = n * g.cpus * window_h, n * g.gpus * window_h
        cpu_used, gpu_used = used[g.name]
        out.append({
            "node_group": g.name, "market": g.market,
            "accelerator": g.accelerator.model_dump() if g.accelerator else None,
            "nodes": n, "basis": f"min_nodes={g.min_nodes}" + (" (counted as 1)" if g.min_nodes == 0 else ""),
            "window_hours": window_h,
            "cpu_hours_used": cpu_used, "cpu_hours_available": cpu_avail,
            "cpu_utilisation": cpu_used / cpu_avail if cpu_avail else None,
            "gpu_hours_used": gpu_used, "gpu_hours_available": gpu_avail,
            "gpu_utilisation": gpu_used / gpu_avail if gpu_avail else None,
        })
    return out


# Placements that could have been cheaper -------------------------------------


def gpu_unused(u: AttemptUsage) -> str | None:
    """Why this GPU attempt probably used no GPU, or None.

    The evidence, strongest first: the job's result reports zero GPU use under
    one of ``GPU_RESULT_KEYS``; else (the heuristic) a job of cost basis
    ``entrypoint`` (a command) that asked for GPUs whose entrypoint names no GPU
    framework or ML word (``GPU_HINTS``).
    """
    if u.resources.get("GPU", 0) <= 0:
        return None
    for k in GPU_RESULT_KEYS:
        v = (u.result or {}).get(k)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            return f"its result reports {k}={v:g}" if v == 0 else None
    if _cost_basis(u) == "entrypoint":
        entry = str(u.spec.get("entrypoint", "")).lower()
        if not any(h in entry for h in GPU_HINTS):
            return "a command that asked for GPUs names no GPU framework in its entrypoint (heuristic)"
    return None


# Why an attempt may appear in ``cheaper_placements``, decided when it is admitted
# (``review``), so the report reads these attempts only, not every one in its window.
REVIEW_GPU_COMMAND = "gpu_cmd"  # a GPU command naming no GPU framework: always looked at
REVIEW_GPU = "gpu"  # other GPU attempts: looked at when the job has a result (it may report 0 GPU use)
REVIEW_SPOT = "spot"  # spot-basis CPU work placed on an on-demand group


def review(kind: str, entrypoint: str, resources: dict[str, float], market: str | None) -> str | None:
    """Which of ``cheaper_placements``' findings an attempt could give, or None: none can.

    Every attempt ``cheaper_placements`` lists has one (a finding needs a GPU, or
    a spot-basis kind without GPUs on an on-demand group: the placement's market
    is its group's), so reading only these leaves the report's answer as it was."""
    u = AttemptUsage(job_id="", project="", kind=kind, name="", number=0, node_group=None, market=market,
                     resources=resources, status="", cause=None, created_at=EPOCH_UTC, started_at=None,
                     ended_at=None, spec={"entrypoint": entrypoint})
    if resources.get("GPU", 0) > 0:
        return REVIEW_GPU_COMMAND if gpu_unused(u) else REVIEW_GPU
    if _cost_basis(u) == "spot" and market != "SPOT":
        return REVIEW_SPOT
    return None


def _cost_basis(u: AttemptUsage) -> str:
    # A kind this version no longer has is charged for what it held, nothing guessed.
    row = KINDS.get(u.kind)
    return row.cost_basis if row else "held"


def _cheapest(profile: Profile, resources: dict[str, float], hours: float, *, market: str | None,
              gpu: bool) -> tuple[NodeGroup, float] | None:
    best = None
    for g in profile.workers:
        if (g.gpus > 0) != gpu or (market and g.market != market):
            continue
        if resources.get("CPU", 0) > g.cpus * max(1, g.max_nodes):
            continue
        c = price(resources, g, hours)
        if best is None or c < best[1]:
            best = (g, c)
    return best


def cheaper_placements(items: list[AttemptCost], profile: Profile) -> list[dict[str, Any]]:
    """Attempts whose placement could have been cheaper, with the estimated saving:

    - GPU attempts that used no GPU (``gpu_unused``): priced on the cheapest CPU
      group of the same market instead;
    - CPU attempts of cost basis ``spot`` (independent, interruptible work: sweeps,
      batch inference) that ran on on-demand nodes: priced on the spot twin of
      their group.
    """
    out = []
    for c in items:
        u = c.usage
        group = profile.group(u.node_group) if u.node_group else None
        if group is None or c.cost <= 0:
            continue
        why = gpu_unused(u)
        if why:
            cpu_only = {k: v for k, v in u.resources.items() if k != "GPU"}
            alt = _cheapest(profile, cpu_only, c.hours, market=group.market, gpu=False) \
                or _cheapest(profile, cpu_only, c.hours, market=None, gpu=False)
            if alt and alt[1] < c.cost:
                out.append(_suggestion(c, "gpu_unused", why, alt[0].name, alt[1],
                                       f"run it without GPUs on {alt[0].name}"))
            continue
        if _cost_basis(u) == "spot" and group.market == "ON_DEMAND" and u.resources.get("GPU", 0) == 0:
            spot = twin(group, profile, "SPOT", u.resources)
            if spot is not None:
                alt_cost = price(u.resources, spot, c.hours)
                if alt_cost < c.cost:
                    why = f"a {u.kind} of independent work ran on on-demand group {group.name}"
                    if u.cause == "PREEMPTED" or u.number > 1:
                        why += f" (attempt {u.number}; the spot fallback after preemption may explain it)"
                    out.append(_suggestion(c, "elastic_on_demand", why, spot.name, alt_cost,
                                           f"let it run on spot group {spot.name} (placement.market: auto)"))
    out.sort(key=lambda r: -r["saving"])
    return out


def _suggestion(c: AttemptCost, kind: str, why: str, group: str, alt_cost: float, advice: str) -> dict[str, Any]:
    u = c.usage
    return {"job_id": u.job_id, "name": u.name, "project": u.project, "kind": u.kind, "attempt": u.number,
            "node_group": u.node_group, "market": u.market, "finding": kind, "reason": why,
            "cost": c.cost, "cheaper_node_group": group, "cheaper_cost": alt_cost, "saving": c.cost - alt_cost,
            "suggestion": advice}


# The report ------------------------------------------------------------------


def gpu_decisions(util: list[dict[str, Any]], items: list[AttemptCost], *, break_even: float) -> list[dict[str, Any]]:
    """Per GPU group: its GPU utilisation against the own-versus-rent break-even."""
    cost_by_group: dict[str, float] = defaultdict(float)
    for c in items:
        cost_by_group[c.usage.node_group or ""] += c.cost
    out = []
    for g in util:
        if not g["accelerator"]:
            continue
        u = g["gpu_utilisation"] or 0.0
        own = u >= break_even
        acc = g["accelerator"]
        fleet = f"{g['nodes']} node{'s' if g['nodes'] != 1 else ''} x {acc['count']} {acc['type']}"
        advice = (f"{g['node_group']}: {fleet} busy {u:.1%} of the window, "
                  + (f"at or above the {break_even:.0%} break-even: owning (or reserving) them beats renting"
                     if own else f"below the {break_even:.0%} break-even: renting on demand beats owning"))
        out.append({"node_group": g["node_group"], "accelerator": acc, "nodes": g["nodes"], "basis": g["basis"],
                    "gpu_hours_used": g["gpu_hours_used"], "gpu_hours_available": g["gpu_hours_available"],
                    "utilisation": u, "break_even": break_even, "verdict": "own" if own else "rent",
                    "cost": cost_by_group.get(g["node_group"], 0.0), "advice": advice})
    return out


def report(usages: Iterable[AttemptUsage], profile: Profile, *, start: datetime, end: datetime, now: datetime,
           break_even: float) -> dict[str, Any]:
    items = costs(usages, profile, start=start, end=end, now=now)
    return report_of(items, items, profile, start=start, end=end, break_even=break_even)


def report_of(items: list[AttemptCost], reviewed: list[AttemptCost], profile: Profile, *, start: datetime,
              end: datetime, break_even: float, jobs_by_group: dict[str, int] | None = None,
              total_jobs: int | None = None) -> dict[str, Any]:
    """The report from ``items`` (attempts or sums of them, see ``breakdown``) and the
    attempts that may have had a cheaper placement (``reviewed``: at least those of
    ``items`` that did, in (job id, number) order)."""
    util = utilisation(items, profile, start=start, end=end)
    by_group = breakdown(items, "node_group", jobs_by_group, total_jobs)
    return {
        "window": {"start": start, "end": end, "hours": (end - start).total_seconds() / 3600},
        "break_even_utilisation": break_even,
        "total": by_group["total"],
        "by_node_group": by_group["rows"],
        "gpu_groups": gpu_decisions(util, items, break_even=break_even),
        "utilisation": util,
        "cheaper_placements": cheaper_placements(reviewed, profile),
        "notes": [
            "cost = held hours x node share (max of CPU and GPU share of one node) x the group's price_per_hour",
            "utilisation = resource-hours held / (min_nodes, at least 1, x per-node resources x window)",
            "GPU jobs that used no GPU: a reported gpu_utilization of 0, else a command asking for GPUs "
            "whose entrypoint names no GPU framework (heuristic)",
        ],
    }
