"""Admission: which queued jobs start now, and why the others wait. Pure: it
reads the queue's head, the cluster view and what is held, and returns what to
write; ``store.queue`` writes it.

Per pass, in the queue's order (priority, then fair share among equal priorities,
then age: ``domain.fairshare``, applied by the dispatcher):
- the head-node guard: at most ``max_concurrent_drivers`` jobs hold a driver;
- a job is admitted when its node group has room: the group's live capacity
  (Ray's node list, draining nodes excluded) minus what Raylane's active jobs
  hold there (dispatched or running), for the whole gang (training, commands,
  services) or for one worker (sweeps and batch jobs, which scale into what is free);
  a co-located gang (STRICT_PACK: one node) also needs one node with room for all
  of its workers (other GPU work: for one worker), where Ray says what each node
  has free (``GroupState.node_free``): two nodes with one GPU free each hold no
  2-GPU gang (``routing.node_need``, ``one_node``). What Raylane admitted and Ray
  may not have placed yet (not running, or running under ``stats.PLACING_S``: a
  driver asks for its placement group once it starts), and what this pass
  admits, is taken from the nodes with the most GPUs free: where Ray puts it is
  not known, and the largest is what a later gang needs;
- a job whose project would exceed its quota in the group (GPUs, CPUs,
  concurrent jobs; ``store.quotas``) waits with "project quota reached: ...";
  it does not count as passed over, so it never reserves a group;
- in a group where projects have shares (``domain.sharing``), jobs that stay
  within their project's share go before those that would borrow (``_owed_first``);
- a job that does not fit keeps its reason ("waiting for 2 GPUs in group gpu: 0
  free"); lower-priority jobs may backfill past it, but once it has been passed
  over ``starvation_skips`` times its group is reserved for it until it fits;
- *queued ahead* (``queue_ahead`` > 0): a command job that does not fit what is
  free now, but fits the group's live capacity, is admitted while fewer than
  ``queue_ahead`` jobs of the group wait to start in Ray: Ray starts it the
  moment a running job ends, instead of one reconcile-and-admit cycle later.
  Only where Ray's own accounting matches Raylane's (``_queue_ahead`` says
  where), and never past a job of the group that waits;
- with ``scale_ahead`` > 0 (a cluster whose groups Ray's autoscaler or KubeRay
  scales), a job that does not fit what is live but fits what the autoscaler may
  add (``max_nodes`` minus the group's nodes, times the profile's node) is
  admitted *ahead*: submitted so that Ray sees its demand, with the reason
  "waiting for the autoscaler: 0 of 1 gpu nodes up". At most ``scale_ahead``
  jobs per group are ahead at once (``ahead``: admitted, not yet running, beyond
  live room), so a queue of 10,000 never becomes 10,000 pending Ray jobs; the
  rest wait in Raylane's queue, in the same priority order and with the same
  reservation for a starving job. A group whose node count is at ``max_nodes``
  (0 included) never scales: a job that needs more waits, or, if no node exists
  and none may be added, fails with the reason.

Words: *used* is what active jobs hold per group (``store.stats.used_by_active``),
updated within the pass as jobs are admitted; *free* is capacity minus used;
*passed over*: a job that waited in a group where a later job was admitted;
*room*: what the autoscaler may add to a group, from the profile.

Sharing (``domain.sharing``, docs/sharing.md): a quota's share may be exceeded up
to its borrowing limit, never into others' idle share they do not lend (``_lent``);
a job admitted beyond its share is marked ``borrowed``; a job that waits for room
may preempt (``Preempt``: borrowers for a job within its share, lower priority
for a higher one), once at a time, and what its victims free is kept for it
(``reclaiming``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Callable, Mapping

from raylane.orchestrator.domain import sharing
from raylane.orchestrator.domain.profile import NODE_GROUP_LABEL, Profile
from raylane.orchestrator.domain.routing import GiB, ClusterView, Unroutable, node_need, one_node, route
from raylane.orchestrator.domain.kinds import traits
from raylane.orchestrator.domain.specs import JobSpec
from raylane.orchestrator.domain.values import fmt_amount
from raylane.orchestrator.domain.views import Placement
from raylane.orchestrator.store.queue import Queued
from raylane.orchestrator.store.quotas import Limits, Usage

EPS = 1e-9  # float sums of fractional CPUs: 0.1 + 0.2 must fit in 0.3
Held = dict[str, dict[str, float]]  # node group -> resource -> amount


@dataclass(frozen=True)
class Rules:
    max_concurrent_drivers: int
    starvation_skips: int
    scale_ahead: int = 0  # most jobs per group admitted ahead of a scale-up; 0: live nodes only
    fast_lane: bool = False  # small jobs may take a warm lane (domain.lanes), which holds no driver
    # Most command jobs per group waiting to start in Ray's queue (admitted, not
    # yet running) beyond what fits now (``_queue_ahead``); 0: none.
    queue_ahead: int = 0
    # A fleet's cluster (services.fleetdispatch): a driver may wait for its own
    # group's scale-up too (a rented cluster scales every group from zero), up to
    # ``scale_ahead`` jobs per driver group in a pass. Off: the driver needs room now.
    driver_scale_ahead: bool = False
    # Sharing (``domain.sharing``, docs/sharing.md): a job that cannot start because
    # others borrow its share, or because lower-priority jobs hold what it needs,
    # preempts them (``Preempt``); off: it waits.
    preemption: bool = False
    preempt_min_run_s: float = 120.0


@dataclass(frozen=True)
class Fail:
    """The job can never run on this cluster."""

    job: Queued
    message: str


@dataclass(frozen=True)
class Wait:
    """The job waits with a new reason (an unchanged reason is not a decision)."""

    job: Queued
    reason: str


@dataclass(frozen=True)
class Admit:
    job: Queued
    placement: Placement
    passed_over: list[str] = field(default_factory=list)  # job ids that waited one more time for it
    scale_up: str | None = None  # set when admitted ahead of a scale-up: the reason it waits in Ray
    queued: str | None = None  # set when queued ahead (``queue_ahead``): where it waits and for what


@dataclass(frozen=True)
class Preempt:
    """The job waits while ``victims`` are asked to checkpoint and stopped for it."""

    job: Queued
    victims: list[sharing.Victim]
    reason: str


Decision = Fail | Wait | Admit | Preempt


def needed(spec: JobSpec, placement: Placement) -> dict[str, float]:
    """What must be free to admit the job: the whole gang, or one worker of an elastic job."""
    if traits(spec.kind).elastic:
        need = dict(placement.worker_resources)
        if placement.driver_label_selector == placement.label_selector:
            need["CPU"] = need.get("CPU", 0) + spec.resources.driver_cpus
        return need
    return dict(placement.total)


def shortfall(need: dict[str, float], free: dict[str, float], group: str) -> str | None:
    for res, label in (("GPU", "GPUs"), ("CPU", "CPUs"), ("memory", "bytes of memory")):
        want = need.get(res, 0)
        have = free.get(res, 0)
        if want > EPS and want > have + EPS:
            if res == "memory":
                return f"waiting for {want / 1024**3:.1f} GB memory in group {group}: {max(have, 0) / 1024**3:.1f} GB free"
            return f"waiting for {fmt_amount(want)} {label} in group {group}: {fmt_amount(max(have, 0))} free"
    return None


def over_quota(limits: Limits | None, used: Usage | None, total: Mapping[str, float], *, project: str,
               group: str) -> str | None:
    """Why admitting a job with ``total`` would break its project's quota, or None."""
    if limits is None:
        return None
    used = used or Usage()
    if limits.max_concurrent_jobs is not None and used.jobs + 1 > limits.max_concurrent_jobs:
        return (f"project quota reached: {project} runs {used.jobs} of {limits.max_concurrent_jobs} "
                f"concurrent jobs in group {group}")
    for res, want, have, label in (("GPU", total.get("GPU", 0), used.gpus, "GPUs"),
                                   ("CPU", total.get("CPU", 0), used.cpus, "CPUs")):
        cap = limits.cap(res)
        if cap is not None and want > EPS and have + want > cap + EPS:
            share = limits.share(res)
            of = fmt_amount(cap) if cap == share else \
                f"{fmt_amount(cap)} ({fmt_amount(share)} guaranteed + {fmt_amount(cap - share)} borrowed)"
            return (f"project quota reached: {project} holds {fmt_amount(have)} of {of} {label} "
                    f"in group {group}; this job needs {fmt_amount(want)}")
    return None


def free(view: ClusterView, used: Held, group: str) -> dict[str, float]:
    total = view.get(group).total if view.get(group) else {}
    u = used.get(group, {})
    return {k: total.get(k, 0) - u.get(k, 0) for k in ("CPU", "GPU", "memory")}


def room(view: ClusterView, profile: Profile, group: str) -> tuple[int, int, dict[str, float]]:
    """(nodes up, nodes the group may have, what the autoscaler may add) for ``group``.
    Draining nodes count as up: the autoscaler replaces them only once they are gone."""
    g = profile.group(group)
    st = view.get(group)
    up = (st.alive_nodes + st.draining_nodes) if st else 0
    if g is None:
        return up, up, {}
    add = max(0, g.max_nodes - up)
    return up, g.max_nodes, {"CPU": g.cpus * add, "GPU": float(g.gpus * add), "memory": g.memory_gb * GiB * add}


def scale_up_reason(view: ClusterView, profile: Profile, group: str, need: dict[str, float],
                    free_now: dict[str, float]) -> str:
    """"waiting for the autoscaler: 0 of 1 gpu nodes up": the nodes the job needs beyond live room."""
    g = profile.group(group)
    up, _, _ = room(view, profile, group)
    per_node = {"CPU": g.cpus, "GPU": float(g.gpus), "memory": g.memory_gb * GiB}
    more = 1
    for k, v in per_node.items():
        # Below zero, free counts what jobs already admitted ahead took of the room.
        short = need.get(k, 0) - free_now.get(k, 0)
        if short > EPS and v > 0:
            more = max(more, -int(-short // v))
    return f"waiting for the autoscaler: {up} of {up + more} {group} nodes up"


def placement_for(job: Queued, profile: Profile, view: ClusterView, *, fast_lane: bool = False) -> Placement:
    """The stored placement, or a new route: after repeated preemption the next
    attempt goes to on-demand nodes. Raises ``Unroutable``."""
    avoid_spot = job.preemptions >= job.spec.retry.spot_fallback_after > 0
    if job.placement is None or (avoid_spot and job.placement.market == "SPOT"):
        return route(job.spec, profile, view, avoid_spot=avoid_spot, fast_lane=fast_lane)
    return job.placement


def decide(queue: list[Queued], view: ClusterView, profile: Profile, rules: Rules, *, used: Held, drivers: int,
           limits: Mapping[tuple[str, str], Limits], project_used: Mapping[tuple[str, str], Usage],
           ahead: Mapping[str, int] | None = None,
           waiting: Mapping[tuple[str, bool], int] | None = None,
           waiting_need: Mapping[str, float] | None = None,
           unplaced: Mapping[str, float] | None = None,
           holders: Callable[[], list[sharing.Holder]] | None = None,
           preempting: Mapping[str, list[sharing.Holder]] | None = None,
           preempted_by: Mapping[str, frozenset[str]] | None = None,
           reclaiming: Mapping[str, str] | None = None,
           now: datetime | None = None) -> list[Decision]:
    """One pass over the queue's head, in its order (but for jobs that would borrow:
    after those within their project's share, ``_owed_first``); the decisions in
    the order to write them.
    ``ahead``: per group, jobs already admitted ahead of a scale-up and not yet running.
    ``waiting``: per group, Ray jobs admitted and not yet running, and (key ``(group, True)``)
    active lane jobs (``stats.waiting_by_group``). ``unplaced``: per group, GPUs of
    attempts Ray may not have placed on a node yet (``stats.unplaced_gpus``). With ``rules.preemption``:
    ``holders`` reads the running attempts that may be preempted (called once, when
    a job first needs it); ``preempting``: per waiting job, its victims still
    stopping; ``preempted_by``: per job, those it was preempted for within the
    cycle window; ``reclaiming``: per group, the waiting job whose victims there
    stop or just stopped, for which what they free is kept (``store.sharing``)."""
    taken = _Pass(view, profile, rules, limits,
                  used={g: dict(r) for g, r in used.items()}, drivers=drivers,
                  project_used={k: Usage(u.gpus, u.cpus, u.jobs) for k, u in project_used.items()},
                  ahead=dict(ahead or {}), waiting=dict(waiting or {}), waiting_need=dict(waiting_need or {}),
                  unplaced=dict(unplaced or {}),
                  read_holders=holders, preempting=dict(preempting or {}), preempted_by=dict(preempted_by or {}),
                  now=now, reclaimed=dict(reclaiming or {}))
    out: list[Decision] = []
    for job in _owed_first(queue, limits, project_used):
        decision = taken.one(job)
        if decision is not None:
            out.append(decision)
    return out


def _owed_first(queue: list[Queued], limits: Mapping[tuple[str, str], Limits],
                project_used: Mapping[tuple[str, str], Usage]) -> list[Queued]:
    """The queue with the jobs that would borrow after those that stay within
    their project's share, each part in its order (Kueue orders a cycle's heads
    the same way). Whether a job would borrow: with what its project holds as
    the pass begins plus its jobs ahead of it in the queue (``sharing.borrowing``).
    Else a borrower ahead in the queue takes the room that a later job within its
    share needs, and that job then preempts one of the borrower's project's
    running jobs for it: a GPU given and another taken back in the same pass
    (bench/sharing.py). A job not routed yet keeps its place."""
    if not limits:
        return queue
    usage = {k: {"GPU": u.gpus, "CPU": u.cpus} for k, u in project_used.items()}
    owed, borrowers = [], []
    for job in queue:
        pl = job.placement
        borrows = False
        if pl is not None and not pl.lane:
            key = (job.project, pl.node_group)
            borrows = sharing.borrowing(limits, usage, job.project, pl.node_group, extra=pl.total)
            u = usage.setdefault(key, {"GPU": 0.0, "CPU": 0.0})
            for r in ("GPU", "CPU"):
                u[r] = u.get(r, 0.0) + pl.total.get(r, 0.0)
        (borrowers if borrows else owed).append(job)
    return owed + borrowers if borrowers and owed else queue


@dataclass
class _Pass:
    """What one ``decide`` pass has taken so far (the callers' numbers, copied, plus
    its own admissions), and the groups it reserved or passed jobs over in."""

    view: ClusterView
    profile: Profile
    rules: Rules
    limits: Mapping[tuple[str, str], Limits]
    used: Held
    drivers: int
    project_used: dict[tuple[str, str], Usage]
    ahead: dict[str, int]
    waiting: dict[tuple[str, bool], int]
    waiting_need: dict[str, float]
    unplaced: dict[str, float] = field(default_factory=dict)  # group -> GPUs Ray may not have placed yet
    reserved: set[str] = field(default_factory=set)  # groups held for a starving job this pass
    passed_over: dict[str, list[str]] = field(default_factory=dict)
    driver_ahead: dict[str, int] = field(default_factory=dict)  # per driver group, drivers sent ahead of its scale-up
    read_holders: Callable[[], list[sharing.Holder]] | None = None
    preempting: dict[str, list[sharing.Holder]] = field(default_factory=dict)  # waiting job -> victims stopping
    preempted_by: dict[str, frozenset[str]] = field(default_factory=dict)
    now: datetime | None = None
    reclaimed: dict[str, str] = field(default_factory=dict)  # group -> the job its victims stop for, this pass
    _holders: list[sharing.Holder] | None = None
    # Per group, what each node has free as Ray said, less what Ray has not placed yet
    # and what this pass admits (module docstring).
    node_free: dict[str, list[dict[str, float]]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.node_free = {}
        for g, st in self.view.items():
            if st.node_free is None:
                continue
            nodes = [dict(n) for n in st.node_free]
            # GPUs Raylane counts held beyond those Ray shows taken, as far as they are of
            # attempts Ray may not have placed yet (not all are: a sweep below its
            # concurrency, a job on a draining node hold less than counted, or none here).
            taken = st.total.get("GPU", 0.0) - sum(n.get("GPU", 0.0) for n in nodes)
            _take_gpus(nodes, min(self.used.get(g, {}).get("GPU", 0.0) - taken, self.unplaced.get(g, 0.0)))
            self.node_free[g] = nodes

    def one(self, job: Queued) -> Decision | None:
        """The decision for ``job``, the pass's tallies updated; None when it keeps waiting for the same reason."""
        try:
            placement = placement_for(job, self.profile, self.view, fast_lane=self.rules.fast_lane)
        except Unroutable as e:
            return Fail(job, e.message)
        key = (job.project, placement.node_group)
        quota = over_quota(self.limits.get(key), self.project_used.get(key), placement.total,
                           project=job.project, group=placement.node_group) if key in self.limits else None
        scale_up = queued = None
        group = placement.node_group
        stopping = self.preempting.get(job.id)
        driver_ahead = dict(self.driver_ahead)
        reason = self._held_back(placement, quota, job.id)
        if reason is None:
            reason, scale_up, queued, placement = self._room_for(job, placement)
        if reason is None and scale_up is None and queued is None:
            reason = self._lent(job, placement)
        if stopping and quota is None and (reason is not None or scale_up is not None or queued is not None):
            # Its victims are stopping and it does not fit yet: nothing else is preempted
            # for it (one preemption at a time), and what they free is kept for it. (Once
            # it fits, as when another job ended, it starts: the claim withdraws its
            # victims not yet stopped.)
            self.driver_ahead = driver_ahead
            self.reclaimed.setdefault(group, job.id)
            deadline = max((h.preempt_deadline for h in stopping if h.preempt_deadline), default=None)
            return self._wait(job, group, sharing.reason(stopping, deadline=deadline), own_quota=True)
        if reason is not None and reason.startswith(NEVER):
            return Fail(job, reason[len(NEVER):])
        if reason is not None:
            if reason is not quota and self.rules.preemption and not placement.lane and \
                    _room_short(reason) and group not in self.reserved:
                pre = self._preempt(job, placement, reason)
                if pre is not None:
                    return pre
            return self._wait(job, placement.node_group, reason, own_quota=reason is quota)
        return self._admit(job, placement, key, scale_up, queued)

    def _usage_by_res(self) -> dict[tuple[str, str], dict[str, float]]:
        return {k: {"GPU": u.gpus, "CPU": u.cpus} for k, u in self.project_used.items()}

    def _lent(self, job: Queued, placement: Placement) -> str | None:
        """Why a job that would borrow waits although its group has room: the room is
        others' idle share that they do not lend (``sharing.held_back``)."""
        group = placement.node_group
        if not self.limits or not sharing.has_shares(self.limits, group):
            return None
        usage = self._usage_by_res()
        if not sharing.borrowing(self.limits, usage, job.project, group, extra=placement.total):
            return None
        keep = sharing.held_back(self.limits, usage, group, but=job.project)
        after = free(self.view, self.used, group)
        need = needed(job.spec, placement)
        for res, label in (("GPU", "GPUs"), ("CPU", "CPUs")):
            if keep[res] > EPS and after.get(res, 0) - need.get(res, 0) < keep[res] - EPS:
                return (f"{WAITING_FOR}{fmt_amount(need.get(res, 0))} {label} in group {group} to borrow: "
                        f"{fmt_amount(max(after.get(res, 0), 0))} free, {fmt_amount(keep[res])} of it others' "
                        f"guaranteed share that they do not lend")
        return None

    def _preempt(self, job: Queued, placement: Placement, reason: str) -> Preempt | None:
        """Victims to stop so that ``job`` fits (``sharing.victims``), or None."""
        if self._holders is None:
            self._holders = list(self.read_holders()) if self.read_holders is not None else []
        if not self._holders or self.now is None:
            return None
        group = placement.node_group
        waiter = sharing.Waiter(job.id, job.project, job.spec.priority, group, needed(job.spec, placement),
                                dict(placement.total), self.preempted_by.get(job.id, frozenset()))
        chosen = sharing.victims(waiter, free(self.view, self.used, group), self._holders, limits=self.limits,
                                 used=self._usage_by_res(), now=self.now, min_run_s=self.rules.preempt_min_run_s)
        if not chosen:
            return None
        taken = {(v.holder.job_id, v.holder.number) for v in chosen}
        self._holders = [h for h in self._holders if (h.job_id, h.number) not in taken]
        self.reclaimed.setdefault(group, job.id)
        deadline = max(self.now + timedelta(seconds=v.holder.grace_s) for v in chosen)
        return Preempt(job, chosen, f"{reason}; " + sharing.reason([v.holder for v in chosen], deadline=deadline))

    def _held_back(self, placement: Placement, quota: str | None, job_id: str = "") -> str | None:
        """Why the job waits whatever room its group has: the head-node guard, its
        project's quota, or its group reserved for a starving job."""
        if self.drivers >= self.rules.max_concurrent_drivers and not placement.lane:
            return (f"head-node guard: {self.drivers} jobs already hold a driver "
                    f"(max {self.rules.max_concurrent_drivers})")
        if quota is not None:
            return quota
        if placement.node_group in self.reserved:
            return f"waiting: group {placement.node_group} is reserved for an older job that has waited longest"
        if self.reclaimed.get(placement.node_group, job_id) != job_id:
            return (f"waiting: jobs of group {placement.node_group} are being preempted for job "
                    f"{self.reclaimed[placement.node_group]}, which goes first")
        return None

    def _room_for(self, job: Queued, placement: Placement) -> tuple[str | None, str | None, str | None, Placement]:
        """(why the job waits, or None; the scale-up reason when admitted ahead of one;
        where it is queued ahead in Ray; the placement it is admitted with)."""
        reason, scale_up, placement = _fits(job, placement, self.view, self.profile, self.used, self.ahead, self.rules,
                                            self.node_free)
        group = placement.node_group  # (a fallback group only when it fits: reason is None)
        queued = None
        if reason is not None and not reason.startswith(NEVER) and not self.passed_over.get(group) and \
                _queue_ahead(job, placement, self.view, self.profile, self.rules, self.waiting,
                             self.waiting_need.get(group, 0.0)):
            queued, reason = f"queued ahead in Ray until a running job ends ({reason})", None
        if reason is None and placement.driver_label_selector.get(NODE_GROUP_LABEL) != group:
            dgroup = placement.driver_label_selector[NODE_GROUP_LABEL]
            reason = shortfall(placement.driver_resources, free(self.view, self.used, dgroup), dgroup)
            if reason and self.rules.driver_scale_ahead and \
                    _driver_group_scales(placement, self.view, self.profile, self.used, self.driver_ahead,
                                         self.rules, dgroup):
                # A cluster that scales from zero (a rented one) adds the driver's node too.
                scale_up, reason = (f"{scale_up}; " if scale_up else "") + \
                    f"its driver waits for group {dgroup} to add a node", None
                self.driver_ahead[dgroup] = self.driver_ahead.get(dgroup, 0) + 1
            if reason:
                reason += " (for the driver)"
        return reason, scale_up, queued, placement

    def _wait(self, job: Queued, group: str, reason: str, *, own_quota: bool) -> Wait | None:
        if not own_quota:
            # (Over its own project's quota, the job is not passed over by
            # others and must not reserve the group against them.)
            self.passed_over.setdefault(group, []).append(job.id)
            if job.skips >= self.rules.starvation_skips:
                self.reserved.add(group)
        return Wait(job, reason) if job.status_reason != reason else None

    def _admit(self, job: Queued, placement: Placement, key: tuple[str, str], scale_up: str | None,
               queued: str | None) -> Admit:
        group = placement.node_group
        # Everyone of lower priority order that waited in this group was passed over by a later job.
        if self.limits and sharing.borrowing(self.limits, self._usage_by_res(), job.project, group,
                                             extra=placement.total):
            placement = placement.model_copy(update={"borrowed": True, "reasons": [
                *placement.reasons, f"runs on borrowed capacity: beyond project {job.project}'s guaranteed share "
                                    f"of {group}; preempted first when the share's owner needs it"]})
        if self.reclaimed.get(group) == job.id:
            del self.reclaimed[group]  # it has what its victims freed
        admit = Admit(job, placement, self.passed_over.get(group, []), scale_up, queued)
        self.passed_over[group] = []
        if scale_up is not None:
            self.ahead[group] = self.ahead.get(group, 0) + 1
        wkey = (group, bool(placement.lane))  # Ray jobs waiting to start; lane jobs active
        self.waiting[wkey] = self.waiting.get(wkey, 0) + 1
        if not placement.lane:
            self.waiting_need[group] = max(self.waiting_need.get(group, 0.0), placement.total.get("CPU", 0))
        for k, v in placement.total.items():
            self.used.setdefault(group, {})[k] = self.used.get(group, {}).get(k, 0) + v
        nodes = self.node_free.get(group)
        if nodes is not None and scale_up is None:  # (ahead of a scale-up: for a node not up yet)
            one = node_need(placement)
            i = one_node(one, nodes) if one is not None and placement.colocate else None
            if i is not None:  # the whole gang on one node, the largest that holds it
                for k, v in one.items():
                    nodes[i][k] = nodes[i].get(k, 0.0) - v
            else:
                _take_gpus(nodes, placement.total.get("GPU", 0.0))
        self.drivers += 0 if placement.lane else 1
        if self.limits:  # (every project's: whether one borrows depends on the others')
            self.project_used.setdefault(key, Usage()).add(placement.total)
        return admit


WAITING_FOR = "waiting for "  # a _fits reason with this prefix is a shortage of room: preemption may help
NEVER = "never: "


def _room_short(reason: str) -> bool:
    """A wait for room in the job's own group that stopping running jobs there could
    end: not the autoscaler's (it may add the room), not the driver's group's."""
    return reason.startswith(WAITING_FOR) and not reason.startswith("waiting for the autoscaler") and \
        not reason.endswith("(for the driver)")  # a _fits reason with this prefix fails the job instead of keeping it waiting


def _queue_ahead(job: Queued, placement: Placement, view: ClusterView, profile: Profile, rules: Rules,
                 waiting: Mapping[tuple[str, bool], int], waiting_need: float) -> bool:
    """Whether a job that does not fit now is admitted to wait in Ray's queue for
    the next job of the group to end. Only where Ray's accounting is Raylane's:
    a command (Ray reserves its whole need for its entrypoint; a runner's driver
    would start on 0.1 CPU and its workers compete later), no GPUs (those wait
    here, where priority and reservation order them), never in a warm lane (its
    host counts slots, not CPUs), never in a group where lane jobs hold CPUs
    that Ray does not see, and never smaller than a job already waiting there.
    (``decide`` also never queues one past a job of the group that waits: Ray
    does not order its queue by priority.)"""
    group = placement.node_group
    if placement.lane or job.spec.kind.value != "command" or placement.total.get("GPU", 0) > EPS:
        return False
    if rules.queue_ahead <= 0 or waiting.get((group, False), 0) >= rules.queue_ahead:
        return False
    if placement.total.get("CPU", 0) < waiting_need - EPS:
        return False  # smaller than a job waiting in Ray's queue: Ray would start it in that one's room, again and again
    if waiting.get((group, True), 0):
        return False
    g = profile.group(group)
    if rules.scale_ahead > 0 and g is not None and g.max_nodes > g.min_nodes:
        return False  # Ray's autoscaler reads a pending job as demand for a node: scale-ahead's rules decide
    st = view.get(group)
    live = {k: st.total.get(k, 0) for k in ("CPU", "GPU", "memory")} if st else {}
    return shortfall(needed(job.spec, placement), live, group) is None  # it fits the group once jobs end


def _take_gpus(nodes: list[dict[str, float]], gpus: float) -> None:
    """Take ``gpus`` from the nodes with the most GPUs free (where it lands is Ray's)."""
    while gpus > EPS and nodes:
        n = max(nodes, key=lambda x: x.get("GPU", 0.0))
        t = min(gpus, n.get("GPU", 0.0))
        if t <= EPS:
            return
        n["GPU"] -= t
        gpus -= t


def _qty(res: str, x: float) -> str:
    return f"{x / GiB:.1f} GB" if res == "memory" else fmt_amount(x)


def _amount(res: str, x: float) -> str:
    return f"{_qty(res, x)} {'memory' if res == 'memory' else res + 's'}"


def _one_node_short(placement: Placement, nodes: list[dict[str, float]] | None, group: str) -> str | None:
    """Why the job does not fit one node of ``group`` now, though the group's sum
    would hold it (a co-located gang, or one GPU worker: ``routing.node_need``);
    None when one node holds it, or no node bounds it, or Ray did not say what its
    nodes have free."""
    need = node_need(placement)
    if need is None or nodes is None or one_node(need, nodes) is not None:
        return None
    what = (f"its {placement.num_workers} workers are co-located" if placement.colocate
            else "one worker, which no node splits")
    for res in ("GPU", "CPU", "memory"):
        most = max((n.get(res, 0.0) for n in nodes), default=0.0)
        if need.get(res, 0.0) > most + EPS:
            return (f"{WAITING_FOR}{_amount(res, need[res])} on one node of group {group} ({what}): "
                    f"at most {_qty(res, max(most, 0.0))} free on any one node")
    wants = " and ".join(_amount(r, need[r]) for r in ("GPU", "CPU", "memory") if need.get(r, 0.0) > EPS)
    return f"{WAITING_FOR}one node of group {group} with {wants} free at once ({what})"


def _fits(job: Queued, placement: Placement, view: ClusterView, profile: Profile, used: Held,
          ahead: Mapping[str, int], rules: Rules,
          node_free: Mapping[str, list[dict[str, float]]] | None = None) -> tuple[str | None, str | None, Placement]:
    """(why the job waits, or None; the scale-up reason when it is admitted ahead
    of one; the placement it is admitted with). ``node_free``: per group, what each
    node has free, where Ray said (``_Pass.node_free``)."""
    node_free = node_free or {}
    group = placement.node_group
    need = needed(job.spec, placement)
    free_now = free(view, used, group)
    short = shortfall(need, free_now, group) or _one_node_short(placement, node_free.get(group), group)
    if short is None:
        return None, None, placement
    for fb in placement.fallback_node_groups:
        # The router's soft fallback ("falls back to cpu if spot-cpu has no
        # room"): room there now beats waiting for a scale-up of the first
        # choice. Never from on-demand onto spot: such a job was put on
        # on-demand because it does not tolerate a reclaim.
        g = profile.group(fb)
        if g is None or (g.is_spot and placement.market != "SPOT"):
            continue
        if shortfall(need, free(view, used, fb), fb) is None and \
                _one_node_short(placement, node_free.get(fb), fb) is None:
            return None, None, on_fallback(placement, profile, fb)
    up, most, add = room(view, profile, group)
    if up == 0 and most == 0:
        return f"{NEVER}group {group} has no node and max_nodes 0: the autoscaler may add none", None, placement
    if rules.scale_ahead <= 0 or not add.get("CPU", 0) + add.get("GPU", 0):
        if up >= most > 0 and rules.scale_ahead > 0:
            return f"{short}; the group is at its max_nodes ({most})", None, placement
        return short, None, placement
    with_room = {k: free_now.get(k, 0) + add.get(k, 0) for k in free_now}
    if shortfall(need, with_room, group) is not None:
        return f"{short}, counting the {most - up} more the autoscaler may add (max_nodes {most})", None, placement
    wait = scale_up_reason(view, profile, group, need, free_now)
    if ahead.get(group, 0) >= rules.scale_ahead:
        return f"{wait}; {ahead.get(group, 0)} jobs already wait for it in Ray (max {rules.scale_ahead})", None, placement
    return None, wait, placement


def _driver_group_scales(placement: Placement, view: ClusterView, profile: Profile, used: Held,
                         ahead: Mapping[str, int], rules: Rules, dgroup: str) -> bool:
    """The driver's group lacks room now, but the autoscaler may add what it needs
    and fewer than ``scale_ahead`` jobs already wait for that group."""
    if rules.scale_ahead <= 0 or ahead.get(dgroup, 0) >= rules.scale_ahead:
        return False
    _, _, add = room(view, profile, dgroup)
    free_now = free(view, used, dgroup)
    with_room = {k: free_now.get(k, 0) + add.get(k, 0) for k in set(free_now) | set(add)}
    return bool(add) and shortfall(placement.driver_resources, with_room, dgroup) is None


def on_fallback(placement: Placement, profile: Profile, group: str) -> Placement:
    """The same placement moved to its fallback group ``group``."""
    g = profile.group(group)
    moved: dict = {}
    if placement.driver_label_selector == placement.label_selector:
        # A driver that sat with its workers (a command is its own driver) moves with them.
        moved = {"driver_label_selector": {NODE_GROUP_LABEL: group}, "driver_market": g.market}
    return placement.model_copy(update={
        **moved, "node_group": group, "market": g.market, "label_selector": {NODE_GROUP_LABEL: group},
        "fallback_node_groups": [],
        "reasons": [*placement.reasons, f"{placement.node_group} has no room now: runs on its fallback {group}"]})
