"""Fair share (issue 46): among queued jobs of equal priority, the project that
used less of a node group recently goes first. Pure: ``store.fairshare`` reads
the usage, the dispatcher keeps it a while and calls ``order`` on the queue's
head before admission (``loops.admission``) looks at it.

Words used here:

- *unit* of a node group: GPU-seconds if the profile gives its nodes GPUs,
  CPU-seconds otherwise (Slurm's TRES-seconds of the resource that is scarce
  there). A group the profile does not name (another cluster's, or one since
  removed) counts GPU-seconds if an attempt held GPUs there within the
  lookback, CPU-seconds otherwise;
- *decayed usage* of a project in a group: the sum, over its attempts' held
  spans there (``attempt_usage``: ``held_from`` to ``held_to``, or to now while
  still holding), of the span's resource (GPUs or CPUs, per the unit) times
  its seconds, each second weighted by 2^(-age / half-life): a GPU-second used
  one half-life ago counts half, two half-lives ago a quarter (Slurm's
  ``PriorityDecayHalfLife``). For one span [a, b] held with ``r`` of the unit's
  resource, at ``now``: r * H/ln2 * (2^(-(now-b)/H) - 2^(-(now-a)/H));
- *lookback*: ``LOOKBACK_HALF_LIVES`` half-lives; a span that ended before it
  counts less than 1/1000 of its seconds and is not read;
- *mean run* of a group: the seconds its attempts that ended within the
  lookback held, over their number (every project's); ``NOMINAL_RUN_S`` where
  none ended;
- *projected usage*: while ``order`` orders one priority's jobs of a group, a
  project's decayed usage plus, for each of its jobs already ordered ahead,
  the job's resource times the group's mean run: what the project will have
  used once those ran. So a pass does not put a project's whole backlog ahead
  because its usage was lowest when the pass began: a project far behind gets
  as many jobs ahead as it takes to catch up, and two projects level with each
  other alternate.

``order`` only permutes jobs of equal priority and of the same group (an
unrouted job's group is every group of its unit: ``UNROUTED_GPU`` or
``UNROUTED_CPU``), among the positions those jobs held: priorities, the
positions of other groups' jobs, and a project's own jobs' order stay as they
were; equal projected usage keeps the older job first. Anti-starvation is
admission's and unchanged: a job passed over ``starvation_skips`` times
reserves its group whatever its project's usage.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from dataclasses import dataclass, field
from typing import Mapping, Sequence, TypeVar

LN2 = math.log(2)
LOOKBACK_HALF_LIVES = 10  # 2^-10: older spans count less than 1/1000 of their seconds
NOMINAL_RUN_S = 60.0  # a group's mean run while none of its attempts ended within the lookback
UNROUTED_GPU = "(unrouted GPU jobs)"  # the group key of a queued job not routed yet that asks GPUs
UNROUTED_CPU = "(unrouted CPU jobs)"  # ... and of one that asks none


def decayed(amount: float, held_from_s: float, held_to_s: float, now_s: float, half_life_s: float) -> float:
    """The decayed usage of one held span (seconds on any common clock): ``amount``
    of a resource held from ``held_from_s`` to ``held_to_s`` (now, while still holding)."""
    if held_to_s <= held_from_s:
        return 0.0
    h = half_life_s
    return amount * h / LN2 * (2.0 ** (-(now_s - held_to_s) / h) - 2.0 ** (-(now_s - held_from_s) / h))


@dataclass(frozen=True)
class Used:
    """One project's attempts in one node group within the lookback (``store.fairshare``)."""

    gpu_s: float = 0.0  # decayed GPU-seconds
    cpu_s: float = 0.0  # decayed CPU-seconds
    ran_s: float = 0.0  # seconds held by those that ended (not decayed): the mean run's numerator
    ended: int = 0  # how many ended


@dataclass
class Standing:
    """Every project's decayed usage per group, in each group's unit, as ``order`` reads it.

    ``admitted``: what jobs admitted since ``used`` was read will add, each its
    resource times its group's mean run (``admit``), so that the passes between
    two reads do not each put the same project first; the next read counts what
    they really held instead."""

    used: Mapping[tuple[str, str], Used]
    gpu_groups: frozenset[str]  # groups whose unit is GPU-seconds
    mean_runs: Mapping[str, float] = field(default_factory=dict)  # group -> its mean run (seconds), where known
    admitted: dict[tuple[str, str], float] = field(default_factory=dict)

    @classmethod
    def of(cls, used: Mapping[tuple[str, str], Used], profile_gpu_groups: set[str] | frozenset[str],
           profile_groups: set[str] | frozenset[str]) -> "Standing":
        """``used`` from the store; the profile's groups and those of them with GPUs
        (a group it does not name: GPU-seconds if GPUs were held there)."""
        unnamed_gpu = {g for (_, g), u in used.items() if g not in profile_groups and u.gpu_s > 0}
        ran: dict[str, list[float]] = {}
        for (_, g), u in used.items():
            acc = ran.setdefault(g, [0.0, 0])
            acc[0] += u.ran_s
            acc[1] += u.ended
        runs = {g: s / n for g, (s, n) in ran.items() if n}
        return cls(used, frozenset(profile_gpu_groups) | frozenset(unnamed_gpu), runs)

    def is_gpu(self, group: str) -> bool:
        return group == UNROUTED_GPU or (group != UNROUTED_CPU and group in self.gpu_groups)

    def usage(self, project: str, group: str) -> float:
        """The project's decayed usage of ``group`` in its unit; of an unrouted job's
        group, the sum over every group of that unit."""
        if group in (UNROUTED_GPU, UNROUTED_CPU):
            return sum(self._in_unit(u, group == UNROUTED_GPU) for (p, g), u in self.used.items()
                       if p == project and self.is_gpu(g) == (group == UNROUTED_GPU))
        u = self.used.get((project, group))
        return (0.0 if u is None else self._in_unit(u, self.is_gpu(group))) + self.admitted.get((project, group), 0.0)

    def admit(self, project: str, group: str, total: Mapping[str, float]) -> None:
        """A job of ``project`` holding ``total`` (its placement's) was admitted to ``group``."""
        held = float(total.get("GPU" if self.is_gpu(group) else "CPU", 0.0))
        self.admitted[(project, group)] = self.admitted.get((project, group), 0.0) + held * self.mean_run(group)

    def mean_run(self, group: str) -> float:
        return self.mean_runs.get(group, NOMINAL_RUN_S)

    @staticmethod
    def _in_unit(u: Used, gpu: bool) -> float:
        return u.gpu_s if gpu else u.cpu_s


Q = TypeVar("Q")  # a queued job (``store.queue.Queued``): its project, spec and placement are read


def group_of(job) -> str:
    """The group a queued job competes in: its placement's, or an unrouted one's of its unit."""
    if job.placement is not None:
        return job.placement.node_group
    return UNROUTED_GPU if job.spec.resources.total_gpus > 0 else UNROUTED_CPU


def amount(job, standing: Standing, group: str) -> float:
    """How much of the group's unit resource the job holds (its whole placement)."""
    gpu = standing.is_gpu(group)
    if job.placement is not None:
        return float(job.placement.total.get("GPU" if gpu else "CPU", 0.0))
    return float(job.spec.resources.total_gpus if gpu else job.spec.resources.total_cpus)


def order(queue: Sequence[Q], standing: Standing | None) -> list[Q]:
    """The queue's head (in priority-then-age order) with each priority's jobs of
    a group in fair-share order: lowest projected usage first, ties by the
    existing order. ``standing`` None (fair share off): the queue as it was."""
    out = list(queue)
    if standing is None or len(out) < 2:
        return out
    lo = 0
    while lo < len(out):
        hi = lo + 1
        while hi < len(out) and out[hi].spec.priority == out[lo].spec.priority:
            hi += 1
        if hi - lo > 1:
            _one_priority(queue, lo, hi, standing, out)
        lo = hi
    return out


def _one_priority(queue: Sequence[Q], lo: int, hi: int, standing: Standing, out: list[Q]) -> None:
    """Reorder ``queue[lo:hi]`` (one priority) into ``out``, group by group, in place."""
    positions: dict[str, list[int]] = {}
    lanes: dict[str, dict[str, deque[int]]] = {}  # group -> project -> its jobs' indexes, in order
    for i in range(lo, hi):
        g = group_of(queue[i])
        positions.setdefault(g, []).append(i)
        lanes.setdefault(g, {}).setdefault(queue[i].project, deque()).append(i)
    for g, slots in positions.items():
        projects = lanes[g]
        if len(projects) < 2:
            continue  # one project: its own order
        projected = {p: standing.usage(p, g) for p in projects}
        run = standing.mean_run(g)
        heap = [(projected[p], idx[0], p) for p, idx in projects.items()]
        heapq.heapify(heap)
        for slot in slots:
            _, i, p = heapq.heappop(heap)
            out[slot] = queue[i]
            projects[p].popleft()
            projected[p] += amount(queue[i], standing, g) * run
            if projects[p]:
                heapq.heappush(heap, (projected[p], projects[p][0], p))
