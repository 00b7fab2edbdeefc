"""The fleet's economics: pure functions over priced attempts (``costs.AttemptCost``)
and the fleet (``fleet.Fleet``), for ``/v1/report``'s ``fleet`` section and
``raylane report``.

Words used here (``costs`` defines held hours, node share and cost):

- *owned cost*: an owned cluster's ``cost.per_hour`` x the window's hours,
  whatever ran; each owned group's part of it is its nodes x its amortised
  node-hour (``Cluster.amortised_node_hour``).
- *utilisation* of an owned group: resource-hours its attempts held over its
  nodes' resource-hours in the window (GPUs for a GPU group, CPUs otherwise);
  an owned group's nodes are its ``max_nodes`` (fixed: ``min_nodes`` equals it).
- *target*: the utilisation above which owning beats renting
  (RAYLANE_BREAK_EVEN_UTILISATION, 0.7): below it the machines cost more than
  renting their work would; well above it work waits or spills to rented.
- *verdict* of an owned group: ``grow`` (at or above the target and work of the
  same shape was rented), ``keep`` (at or above the target), ``shrink`` (below).
- *rented spend*: what attempts on rented clusters cost, by cluster and market.
- *as all-rented*: every attempt priced on a rented group of its shape (its
  *rented twin*: the same accelerator and GPUs per node, else the same
  accelerator, else CPU-only for CPU work), spot for kinds that tolerate it
  (``spot_first``), on demand otherwise; rented attempts at what they cost.
  No fixed cost.
- *as all-owned*: every attempt's node-share-hours at the amortised node-hour
  of its *owned twin*, divided by the target (machines kept at the target
  utilisation, the most a fleet sustains while work still starts promptly),
  and never less than the owned clusters' fixed cost (the machines exist).

An attempt whose cluster has no twin of the other tier is counted in
``unpriced_attempts`` of that alternative and priced as it ran.

Nothing here reads the database or the clock.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from raylane.orchestrator.domain.costs import AttemptCost, node_share
from raylane.orchestrator.domain.fleet import Cluster, Fleet
from raylane.orchestrator.domain.kinds import KINDS
from raylane.orchestrator.domain.profile import NodeGroup

VERDICTS = ("grow", "keep", "shrink")


@dataclass(frozen=True)
class Twin:
    cluster: Cluster
    group: NodeGroup


def _accel(g: NodeGroup) -> str | None:
    return g.accelerator.type if g.accelerator else None


def twin(group: NodeGroup, resources: dict[str, float], clusters: list[Cluster], market: str | None) -> Twin | None:
    """The group of ``clusters`` most like ``group``: the same accelerator and GPUs per
    node, else the same accelerator at the lowest price for ``resources``; of
    ``market`` when one is asked and the clusters have it, else any market."""
    pool = [Twin(c, g) for c in clusters for g in c.profile.workers
            if _accel(g) == _accel(group) and (g.gpus > 0) == (group.gpus > 0) and g.max_nodes > 0]
    if market is not None and any(t.group.market == market for t in pool):
        pool = [t for t in pool if t.group.market == market]
    if not pool:
        return None
    exact = [t for t in pool if (t.group.gpus, t.group.cpus) == (group.gpus, group.cpus)]

    def hourly(t: Twin) -> float:
        return node_share(resources, t.group) * (t.group.price_per_hour if not t.cluster.owned
                                                 else t.cluster.amortised_node_hour(t.group))
    return min(exact or pool, key=hourly)


def _spot_ok(kind: str) -> bool:
    row = KINDS.get(kind)
    return bool(row and row.spot_first)


def owned_groups(items: dict[str, list[AttemptCost]], fleet: Fleet, *, hours: float, target: float) -> list[dict]:
    """Per owned group: utilisation against the target, its part of the fixed cost, and
    the verdict (see the module docstring)."""
    rented_like: dict[tuple[str, int, bool], float] = defaultdict(float)  # (accelerator, gpus, is gpu) -> rented cost
    for c in fleet.rented:
        for a in items.get(c.name, []):
            g = c.profile.group(a.usage.node_group or "")
            if g is not None:
                rented_like[(_accel(g) or "", g.gpus, g.gpus > 0)] += a.cost
    out = []
    for c in fleet.owned:
        held: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
        for a in items.get(c.name, []):
            held[a.usage.node_group or ""][0] += a.cpu_seconds / 3600
            held[a.usage.node_group or ""][1] += a.gpu_seconds / 3600
        for g in c.profile.workers:
            resource = "GPU" if g.gpus else "CPU"
            per_node = g.gpus if g.gpus else g.cpus
            available = g.max_nodes * per_node * hours
            used = held[g.name][1 if g.gpus else 0]
            u = used / available if available else 0.0
            spilled = rented_like.get((_accel(g) or "", g.gpus, g.gpus > 0), 0.0)
            fixed = c.amortised_node_hour(g) * g.max_nodes * hours
            name = f"{c.name} {g.name}"
            if u >= target and spilled > 0:
                verdict = "grow"
                advice = (f"{name}: {u:.0%} of its {resource}s busy, at or above the {target:.0%} target, and "
                          f"${spilled:.2f} of work of its shape ran rented: more owned capacity would pay")
            elif u >= target:
                verdict = "keep"
                advice = f"{name}: {u:.0%} of its {resource}s busy, at or above the {target:.0%} target: owning pays"
            else:
                verdict = "shrink"
                advice = (f"{name}: {u:.0%} of its {resource}s busy, below the {target:.0%} target: its "
                          f"${fixed:.2f} of fixed cost in the window buys less than renting its work would")
            out.append({"cluster": c.name, "node_group": g.name, "resource": resource, "nodes": g.max_nodes,
                        "hours_used": used, "hours_available": available, "utilisation": u, "target": target,
                        "fixed_cost": fixed, "rented_same_shape_cost": spilled, "verdict": verdict,
                        "advice": advice})
    return out


def rented_spend(items: dict[str, list[AttemptCost]], fleet: Fleet) -> list[dict]:
    """What attempts on rented clusters cost, by cluster and market, most first."""
    rows: dict[tuple[str, str], dict] = {}
    for c in fleet.rented:
        for a in items.get(c.name, []):
            g = c.profile.group(a.usage.node_group or "")
            market = g.market if g is not None else (a.usage.market or "unknown")
            r = rows.setdefault((c.name, market), {"cluster": c.name, "market": market, "cost": 0.0,
                                                   "node_hours": 0.0, "attempts": 0})
            r["cost"] += a.cost
            r["node_hours"] += a.hours * a.share
            r["attempts"] += a.n
    return sorted(rows.values(), key=lambda r: (-r["cost"], r["cluster"], r["market"]))


def _as_rented(a: AttemptCost, c: Cluster, fleet: Fleet) -> float | None:
    if not c.owned:
        return a.cost
    g = c.profile.group(a.usage.node_group or "")
    t = twin(g, a.usage.resources, fleet.rented, "SPOT" if _spot_ok(a.usage.kind) else "ON_DEMAND") if g else None
    return None if t is None else a.hours * node_share(a.usage.resources, t.group) * t.group.price_per_hour


def _as_owned(a: AttemptCost, c: Cluster, fleet: Fleet, target: float) -> float | None:
    g = c.profile.group(a.usage.node_group or "")
    t = twin(g, a.usage.resources, fleet.owned, None) if g else None
    if t is None:
        return None
    return a.hours * node_share(a.usage.resources, t.group) * t.cluster.amortised_node_hour(t.group) / target


def report(items: dict[str, list[AttemptCost]], fleet: Fleet, *, hours: float, target: float) -> dict[str, Any]:
    """The fleet section of the report: ``items`` are each cluster's priced attempts
    (or sums of them) in a window of ``hours``."""
    fixed = sum(c.fixed_per_hour for c in fleet.owned) * hours
    spend = rented_spend(items, fleet)
    rented_total = sum(r["cost"] for r in spend)
    all_rented = all_owned = 0.0
    unpriced_rented = unpriced_owned = 0
    for c in fleet.members:
        for a in items.get(c.name, []):
            r = _as_rented(a, c, fleet)
            if r is None:
                unpriced_rented += a.n
                r = a.cost if not c.owned else 0.0
            all_rented += r
            o = _as_owned(a, c, fleet, target)
            if o is None:
                unpriced_owned += a.n
                o = a.cost
            all_owned += o
    has_owned = bool(fleet.owned)
    return {
        "target_utilisation": target,
        "window_hours": hours,
        "clusters": [{"name": c.name, "tier": c.tier, "fixed_cost": c.fixed_per_hour * hours,
                      "attempts": sum(a.n for a in items.get(c.name, []))} for c in fleet.members],
        "owned_groups": owned_groups(items, fleet, hours=hours, target=target),
        "rented_spend": spend,
        "cost": {"owned_fixed": fixed, "rented": rented_total, "total": fixed + rented_total},
        "as_all_rented": {"cost": all_rented if fleet.rented else None, "unpriced_attempts": unpriced_rented},
        "as_all_owned": {"cost": max(all_owned, fixed) if has_owned else None, "unpriced_attempts": unpriced_owned},
        "notes": [
            "owned clusters cost their fixed cost.per_hour x the window, busy or idle; rented ones each node-hour "
            "used at its group's price_per_hour (its market's price)",
            "as all-rented: owned attempts priced on the rented group of their shape (spot for kinds that "
            "tolerate it, on demand otherwise); as all-owned: every attempt's node-hours at the owned group's "
            "amortised node-hour divided by the target utilisation, at least the owned fixed cost",
        ],
    }
