"""Sharing a node group between projects: guaranteed shares, borrowing and
preemption (docs/sharing.md). Pure: admission (``loops.admission``) hands it what
it read and writes what it returns.

Words:

- a project's *share* of a group is its quota's ``max_gpus`` / ``max_cpus``
  (``store.quotas.Limits``): what it is guaranteed. A project without a quota
  there has a share of 0 and no cap;
- it *borrows* while its active jobs hold more than its share, in a group where
  some project has a share (where nobody has one, nothing is borrowed: the group is
  everyone's, first come first served, as before shares existed). A quota's
  ``borrow_*`` bounds how much (None: nothing, the hard cap quotas always were);
- ``lend_*`` bounds how much of its *idle* share others may borrow (None: all of
  it). The rest of its idle share is *held back*: a job that would borrow waits
  rather than take it;
- a *holder* is a running attempt that could be preempted: its job's kind (or its
  spec, within policy) allows it, it has run at least ``min_run_s``, it is not
  being preempted already, and it did not preempt the waiting job within the
  cycle window;
- *victims* are the holders stopped for one waiting job: borrowers (for a job that
  stays within its own share), then lower priority (for a job of higher priority);
  among them, borrowers first, then the lowest priority, then the most recently
  started. Never more than the waiting job needs: a victim whose stop the job does
  not need once the others are chosen is left running.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Iterable, Mapping

EPS = 1e-9
RES = ("GPU", "CPU")


@dataclass(frozen=True)
class Holder:
    """A running attempt of the group, as preemption sees it."""

    job_id: str
    number: int
    project: str
    group: str
    total: Mapping[str, float]  # what it holds (its placement's total)
    priority: int
    started_at: datetime | None
    preemptible: bool
    grace_s: float
    preempt_for: str | None = None  # set: already being preempted for that job
    preempt_deadline: datetime | None = None
    name: str = ""


@dataclass(frozen=True)
class Waiter:
    job_id: str
    project: str
    priority: int
    group: str
    need: Mapping[str, float]  # what must be free for it to start (``admission.needed``)
    total: Mapping[str, float]  # what it holds once started (its project's usage grows by this)
    preempted_by: frozenset[str] = frozenset()  # jobs it was preempted for within the cycle window


@dataclass(frozen=True)
class Victim:
    holder: Holder
    why: str  # "borrowing" or "priority 20 < 80"


def has_shares(limits: Mapping[tuple[str, str], object], group: str) -> bool:
    """Whether some project has a guaranteed share of ``group``."""
    return any(g == group and (lim.share("GPU") or lim.share("CPU")) for (_, g), lim in limits.items())


def share(limits: Mapping[tuple[str, str], object], project: str, group: str, res: str) -> float | None:
    lim = limits.get((project, group))
    return lim.share(res) if lim is not None else None


def borrowing(limits, used: Mapping[tuple[str, str], Mapping[str, float]], project: str, group: str,
              extra: Mapping[str, float] | None = None) -> bool:
    """Whether ``project`` holds (with ``extra`` added) more than its share of ``group``,
    in a group where shares exist. ``used``: (project, group) -> {"GPU": .., "CPU": ..}."""
    if not has_shares(limits, group):
        return False
    u = used.get((project, group), {})
    for res in RES:
        want = u.get(res, 0.0) + (extra or {}).get(res, 0.0)
        if want <= EPS:
            continue
        s = share(limits, project, group, res)
        if s is None:
            # No share of this resource: a project with a GPU share and no CPU
            # share borrows no CPUs (it never had a cap on them); one without any
            # quota in a group of shares borrows everything it holds.
            if (project, group) not in limits:
                return True
            continue
        if want > s + EPS:
            return True
    return False


def held_back(limits, used: Mapping[tuple[str, str], Mapping[str, float]], group: str, *,
              but: str) -> dict[str, float]:
    """Of each resource, the idle share of projects other than ``but`` that they do
    not lend: a job that would borrow leaves that much free."""
    out = {r: 0.0 for r in RES}
    for (p, g), lim in limits.items():
        if g != group or p == but:
            continue
        u = used.get((p, g), {})
        for res in RES:
            keep = lim.unlendable(res)
            if keep > EPS:
                out[res] += max(0.0, keep - u.get(res, 0.0))
    return out


def within_share(limits, used, waiter: Waiter) -> bool:
    """The waiting job would hold no more than its project's share: it may reclaim from borrowers."""
    if (waiter.project, waiter.group) not in limits:
        return False
    u = used.get((waiter.project, waiter.group), {})
    guaranteed = False
    for res in RES:
        want = waiter.total.get(res, 0.0)
        s = share(limits, waiter.project, waiter.group, res)
        if want <= EPS or s is None:
            continue  # (a resource its quota sets no share of is neither guaranteed nor capped)
        if u.get(res, 0.0) + want > s + EPS:
            return False
        guaranteed = True
    return guaranteed


def victims(waiter: Waiter, free: Mapping[str, float], holders: Iterable[Holder], *, limits,
            used: Mapping[tuple[str, str], Mapping[str, float]], now: datetime,
            min_run_s: float) -> list[Victim] | None:
    """The fewest holders to stop so that ``waiter`` fits, or None when stopping every
    one it may preempt would not make room (then none is stopped)."""
    reclaim = within_share(limits, used, waiter)
    usage = {k: dict(v) for k, v in used.items()}
    ranked = []
    for h in holders:
        if h.group != waiter.group or not h.preemptible or h.preempt_for is not None or h.job_id in waiter.preempted_by:
            continue
        if h.started_at is None or (now - h.started_at).total_seconds() < min_run_s:
            continue
        if h.project == waiter.project and h.priority >= waiter.priority:
            continue  # a project never preempts its own jobs but for priority
        ranked.append(h)
    # Borrowers first (while they borrow), then the lowest priority, then the youngest.
    ranked.sort(key=lambda h: (not borrowing(limits, usage, h.project, h.group), h.priority,
                               -(h.started_at.timestamp() if h.started_at else 0.0)))
    room = {r: free.get(r, 0.0) for r in RES}
    chosen: list[Victim] = []
    for h in ranked:
        if _fits(waiter.need, room):
            break
        if not any(h.total.get(r, 0.0) > EPS and waiter.need.get(r, 0.0) > room[r] + EPS for r in RES):
            continue  # stopping it frees nothing the job lacks
        why = None
        if reclaim and borrowing(limits, usage, h.project, h.group):
            why = "borrowing"
        elif h.priority < waiter.priority:
            why = f"priority {h.priority} < {waiter.priority}"
        if why is None:
            continue
        chosen.append(Victim(h, why))
        for r in RES:
            room[r] += h.total.get(r, 0.0)
            key = (h.project, h.group)
            usage.setdefault(key, {})[r] = usage.get(key, {}).get(r, 0.0) - h.total.get(r, 0.0)
    if not _fits(waiter.need, room):
        return None
    # Never more than it needs: drop a chosen victim (the last chosen first) whose
    # stop the job does not need once the others are stopped.
    for v in list(reversed(chosen)):
        without = {r: room[r] - v.holder.total.get(r, 0.0) for r in RES}
        if _fits(waiter.need, without):
            chosen.remove(v)
            room = without
    return chosen


def _fits(need: Mapping[str, float], room: Mapping[str, float]) -> bool:
    return all(need.get(r, 0.0) <= room.get(r, 0.0) + EPS for r in RES)


def reason(victims: Iterable[Holder], *, deadline: datetime | None) -> str:
    """The waiting job's reason while its victims stop."""
    names = ", ".join(f"{h.job_id} ({h.project}"
                      f"{', ' + h.name if h.name else ''})" for h in victims)
    at = f"; stopped by {deadline.strftime('%H:%M:%S')} UTC at the latest" if deadline else ""
    return f"preempting {names} for it: asked to checkpoint{at}"
