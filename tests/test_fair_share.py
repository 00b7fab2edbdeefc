"""Fair share (issue 46, ``domain.fairshare``): the decay, the order of one
priority's jobs, the store's sums (SQLite and PostgreSQL) against the decay of
each span, and two projects' streams through the real loops on an in-memory Ray
(``FakeRay``) under a virtual clock: each gets about half of the 2-GPU group
while both have work queued, and a project that ran alone the hour before
starts behind."""

from __future__ import annotations

import random
import sys
from dataclasses import dataclass, field
from datetime import timedelta
from types import SimpleNamespace

import pytest
from sqlalchemy import insert, select

from raylane.orchestrator.domain import fairshare
from raylane.orchestrator.domain.fairshare import (NOMINAL_RUN_S, UNROUTED_GPU, Standing, Used, decayed,
                                                   order)
from raylane.orchestrator.domain.ids import submission_id
from raylane.orchestrator.domain.profile import default_profile
from raylane.orchestrator.domain.specs import JobSpec
from raylane.orchestrator.loops.dispatcher import FAIR_SHARE_KEPT_S, Dispatcher
from raylane.orchestrator.services import assembly
from raylane.orchestrator.store import db, fairshare as store_fairshare, transitions
from raylane.orchestrator.store.tables import attempt_usage, attempts, jobs
from raylane.orchestrator.store.usage_rows import micros
from raylane.orchestrator.testing import FakeRay

DAY = 86400.0


# The decay ----------------------------------------------------------------------------------


def test_a_span_ending_now_counts_its_seconds_and_one_a_half_life_ago_counts_half():
    # 1 GPU for 60 s, ended just now: ~60 GPU-seconds (the decay within a minute of a day is tiny).
    assert decayed(1.0, 0.0, 60.0, 60.0, DAY) == pytest.approx(60.0, rel=1e-3)
    # The same minute, a half-life earlier: half; two: a quarter.
    assert decayed(1.0, 0.0, 60.0, 60.0 + DAY, DAY) == pytest.approx(30.0, rel=1e-3)
    assert decayed(2.0, 0.0, 60.0, 60.0 + 2 * DAY, DAY) == pytest.approx(30.0, rel=1e-3)
    # A span is the integral of 2^(-age/H): a day held from a day ago to now counts H/ln2 * (1 - 1/2).
    assert decayed(1.0, 0.0, DAY, DAY, DAY) == pytest.approx(DAY / fairshare.LN2 / 2)
    # Split anywhere, the parts add up; an empty span counts nothing.
    whole = decayed(1.5, 100.0, 5000.0, 9000.0, 3600.0)
    assert decayed(1.5, 100.0, 777.0, 9000.0, 3600.0) + decayed(1.5, 777.0, 5000.0, 9000.0, 3600.0) \
        == pytest.approx(whole)
    assert decayed(1.0, 50.0, 50.0, 60.0, DAY) == 0.0


# The order ----------------------------------------------------------------------------------


def q(jid: str, project: str, *, group: str | None = "gpu", priority: int = 50, gpus: float = 1.0):
    """A queued job as ``order`` reads it (``store.queue.Queued``'s project, spec, placement)."""
    spec = SimpleNamespace(priority=priority, resources=SimpleNamespace(total_gpus=gpus, total_cpus=1.0))
    placement = None if group is None else SimpleNamespace(node_group=group, total={"GPU": gpus, "CPU": 1.0})
    return SimpleNamespace(id=jid, project=project, spec=spec, placement=placement)


def standing(usage: dict[tuple[str, str], float], *, runs: dict[str, tuple[float, int]] | None = None) -> Standing:
    used = {k: Used(gpu_s=v, cpu_s=v) for k, v in usage.items()}
    for g, (ran, n) in (runs or {}).items():
        k = ("someone", g)
        used[k] = Used(gpu_s=used.get(k, Used()).gpu_s, ran_s=ran, ended=n)
    return Standing.of(used, {"gpu"}, {"gpu", "cpu"})


def ids(jobs_) -> list[str]:
    return [j.id for j in jobs_]


def test_off_or_one_project_keeps_the_order():
    head = [q("a1", "A"), q("b1", "B"), q("a2", "A")]
    assert ids(order(head, None)) == ["a1", "b1", "a2"]
    assert ids(order([q("a1", "A"), q("a2", "A")], standing({("A", "gpu"): 1e6}))) == ["a1", "a2"]


def test_less_usage_goes_first_and_level_projects_alternate():
    head = [q("a1", "A"), q("a2", "A"), q("a3", "A"), q("b1", "B"), q("b2", "B"), q("b3", "B")]
    # No usage: level; the older first, then each job ahead counts a mean run for its project.
    assert ids(order(head, standing({}))) == ["a1", "b1", "a2", "b2", "a3", "b3"]
    # A used the group: B first, and as many of B's as it takes to catch up (a mean run each).
    s = standing({("A", "gpu"): 2.5 * NOMINAL_RUN_S})
    assert ids(order(head, s)) == ["b1", "b2", "b3", "a1", "a2", "a3"]
    s = standing({("A", "gpu"): 1.5 * NOMINAL_RUN_S})
    assert ids(order(head, s)) == ["b1", "b2", "a1", "b3", "a2", "a3"]
    # The mean run comes from the group's ended attempts: 10 runs of 30 s.
    s = standing({("A", "gpu"): 45.0}, runs={"gpu": (300.0, 10)})
    assert s.mean_run("gpu") == 30.0
    assert ids(order(head, s)) == ["b1", "b2", "a1", "b3", "a2", "a3"]
    # A 2-GPU job ahead counts twice a 1-GPU one.
    big = [q("a1", "A", gpus=2), q("a2", "A"), q("b1", "B"), q("b2", "B"), q("b3", "B")]
    assert ids(order(big, standing({}))) == ["a1", "b1", "b2", "a2", "b3"]


def test_jobs_admitted_since_the_read_count_a_mean_run_each_until_the_next():
    s = standing({("A", "gpu"): 1.5 * NOMINAL_RUN_S})
    head = [q("a1", "A"), q("b1", "B"), q("b2", "B")]
    assert ids(order(head, s)) == ["b1", "b2", "a1"]
    s.admit("B", "gpu", {"GPU": 2.0, "CPU": 1.0})  # a pass admitted a 2-GPU job of B's: 2 mean runs ahead
    assert s.usage("B", "gpu") == 2 * NOMINAL_RUN_S
    assert ids(order(head, s)) == ["a1", "b1", "b2"]
    s.admit("A", "cpu", {"CPU": 4.0})  # in a CPU group: CPUs
    assert s.usage("A", "cpu") == 4 * NOMINAL_RUN_S


def test_priorities_groups_and_a_projects_own_order_stay():
    head = [q("a-hi", "A", priority=90), q("a1", "A"), q("c1", "A", group="cpu"), q("a2", "A"), q("b1", "B"),
            q("c2", "B", group="cpu"), q("b-lo", "B", priority=10)]
    s = standing({("A", "gpu"): 1e6, ("B", "cpu"): 1e6})
    # A high-priority job stays first whatever its project used; gpu jobs take gpu
    # jobs' places (B's first), cpu jobs cpu jobs' places (A's first there, B used cpu).
    assert ids(order(head, s)) == ["a-hi", "b1", "c1", "a1", "a2", "c2", "b-lo"]


def test_a_groups_unit_is_gpu_seconds_where_its_nodes_have_gpus_else_cpu_seconds():
    used = {("A", "gpu"): Used(gpu_s=10.0, cpu_s=500.0), ("A", "cpu"): Used(gpu_s=0.0, cpu_s=70.0),
            ("A", "elsewhere-gpu"): Used(gpu_s=3.0, cpu_s=9.0), ("A", "elsewhere-cpu"): Used(cpu_s=4.0)}
    s = Standing.of(used, {"gpu"}, {"gpu", "cpu"})
    assert (s.usage("A", "gpu"), s.usage("A", "cpu")) == (10.0, 70.0)
    # Groups the profile does not name (another cluster's): GPU-seconds where GPUs were held.
    assert (s.usage("A", "elsewhere-gpu"), s.usage("A", "elsewhere-cpu")) == (3.0, 4.0)
    assert s.usage("B", "gpu") == 0.0
    # A job not routed yet competes on the project's usage of its unit over every group.
    assert s.usage("A", UNROUTED_GPU) == 13.0
    head = [q("a1", "A", group=None), q("b1", "B", group=None)]
    assert ids(order(head, s)) == ["b1", "a1"]


# The store's sums ---------------------------------------------------------------------------


def test_the_stores_sums_are_the_decay_of_each_span(cp):
    """Random spans on two groups (ended long ago, recently, still holding), summed by
    the database, equal the domain's decay of each span; ended beyond the lookback:
    not read."""
    rnd = random.Random(46)
    now = transitions.utcnow()
    half_life = 3600.0
    spec = JobSpec(name="x", kind="command", entrypoint="true")
    expected: dict[tuple[str, str], list[float]] = {}
    for p in ("A", "B"):
        cp.access.create_project(p, description=None, actor="t")
    picks = [(rnd.choice(["A", "B"]), rnd.choice(["gpu", "cpu"])) for _ in range(60)]
    job_ids = [cp.submit(spec, project=p, actor="t")[0].id for p, _ in picks]
    with db.transaction(cp.sessions) as s:
        for i, ((project, group), jid) in enumerate(zip(picks, job_ids)):
            start = now - timedelta(seconds=rnd.uniform(0, 12 * half_life))
            length = rnd.choice([0.5, 60, 3600, 5 * 3600])
            end = start + timedelta(seconds=length)
            holding = end >= now or rnd.random() < 0.1
            gpu, cpu = (rnd.choice([1.0, 2.0]), 1.0) if group == "gpu" else (0.0, rnd.choice([0.5, 4.0]))
            s.execute(insert(attempt_usage).values(
                job_id=jid, number=1, project=project, kind="command", node_group=group, market="ON_DEMAND",
                cpu=cpu, gpu=gpu, held_from=micros(start), held_to=None if holding else micros(end), key_id=i))
            end_s = (now if holding else end).timestamp()
            if not holding and (now - end).total_seconds() > fairshare.LOOKBACK_HALF_LIVES * half_life:
                continue
            e = expected.setdefault((project, group), [0.0, 0.0, 0.0, 0])
            e[0] += decayed(gpu, start.timestamp(), end_s, now.timestamp(), half_life)
            e[1] += decayed(cpu, start.timestamp(), end_s, now.timestamp(), half_life)
            if not holding:
                e[2] += length
                e[3] += 1
    with db.read(cp.sessions) as s:
        got = store_fairshare.usage(s, now=now, half_life_s=half_life)
        only_a = store_fairshare.usage(s, now=now, half_life_s=half_life, project="A")
    assert set(got) == set(expected)
    for k, (gpu_s, cpu_s, ran, n) in expected.items():
        assert got[k].gpu_s == pytest.approx(gpu_s, rel=1e-9, abs=1e-6), k
        assert got[k].cpu_s == pytest.approx(cpu_s, rel=1e-9, abs=1e-6), k
        assert (got[k].ran_s, got[k].ended) == (pytest.approx(ran), n), k
    assert set(only_a) == {k for k in got if k[0] == "A"}
    assert all(only_a[k].gpu_s == pytest.approx(got[k].gpu_s) and only_a[k].ended == got[k].ended for k in only_a)


def test_the_dispatcher_keeps_the_usage_30_s_by_the_store_clock_and_reads_none_when_off(cp, settings):
    d = Dispatcher(settings, cp.sessions, backend=None, profile=default_profile())
    t = transitions.utcnow()
    first = d.fair_share(t)
    assert first.usage("alpha", "gpu") == 0.0
    cp.access.create_project("alpha", description=None, actor="t")
    jid = cp.submit(JobSpec(name="x", kind="command", entrypoint="true"), project="alpha", actor="t")[0].id
    with db.transaction(cp.sessions) as s:  # it held 2 GPUs for the minute before t (written around the writers)
        s.execute(insert(attempt_usage).values(
            job_id=jid, number=1, project="alpha", kind="command", node_group="gpu", market="ON_DEMAND", cpu=1.0,
            gpu=2.0, held_from=micros(t - timedelta(seconds=60)), held_to=micros(t), key_id=1))
    assert d.fair_share(t + timedelta(seconds=FAIR_SHARE_KEPT_S - 1)) is first
    later = d.fair_share(t + timedelta(seconds=FAIR_SHARE_KEPT_S))
    assert later.usage("alpha", "gpu") == pytest.approx(120.0, rel=1e-3)  # GPU-seconds in a GPU group
    assert d.fair_share(t + timedelta(seconds=FAIR_SHARE_KEPT_S + 1)) is later
    assert d.fair_share(t) is not later  # a clock that moved back: read again
    off = Dispatcher(settings.model_copy(update={"fair_share_half_life_s": 0.0}), cp.sessions, backend=None,
                     profile=default_profile())
    assert off.fair_share(t) is None


# Two projects on the 2-GPU group, through the loops --------------------------------------


class Clock:
    """The store's clock, moved by the test (every ``utcnow`` of the control plane reads it)."""

    def __init__(self):
        self.t = transitions.utcnow()

    def __call__(self):
        return self.t


@pytest.fixture
def clock(monkeypatch) -> Clock:
    c = Clock()
    real = transitions.utcnow
    for name, mod in list(sys.modules.items()):
        if name.startswith("raylane.") and getattr(mod, "utcnow", None) is real:
            monkeypatch.setattr(mod, "utcnow", c)
    return c


@pytest.fixture
def settings(settings, request):
    """Every job a Ray job (FakeRay runs no warm lane); fair share's half-life the
    test's parameter (``FAIR_OR_FIFO``), else its default."""
    half_life = getattr(request, "param", settings.fair_share_half_life_s)
    return settings.model_copy(update={"fast_lane": False, "fair_share_half_life_s": half_life})


# Each test of the loops runs with fair share at its default, and off: what it changes.
FAIR_OR_FIFO = pytest.mark.parametrize("settings", [DAY, 0.0], ids=["fair", "fifo"], indirect=True)


@pytest.fixture
def ray(cp, clock) -> FakeRay:
    ray = FakeRay()
    assembly.attach_backend(cp, ray, ray.profile)
    for p in ("alpha", "beta"):
        cp.access.create_project(p, description=None, actor="t")
    return ray


def gpu_job(name: str, seconds: int) -> JobSpec:
    return JobSpec(name=name, kind="command", entrypoint=f"sleep {seconds}",
                   resources={"gpus_per_worker": 1, "cpus_per_worker": 0.5})


@dataclass
class Runner:
    """Ray's side under the virtual clock: an attempt starts the step after its submit
    and ends once it ran as many seconds as its ``sleep`` says."""

    cp: object
    ray: FakeRay
    clock: Clock
    started: dict = field(default_factory=dict)  # submission id -> when Ray started it

    def step(self, seconds: float = 5.0) -> None:
        self.clock.t += timedelta(seconds=seconds)
        for sid in self.ray.running():
            sub = self.ray.submission(sid)
            if sid not in self.started:
                self.ray.start(sid)
                self.started[sid] = self.clock.t
            elif (self.clock.t - self.started[sid]).total_seconds() >= float(sub.entrypoint.split()[-1]):
                self.ray.finish(sid)
        self.cp.dispatcher.run_once()
        self.cp.reconciler.run_once()


def first_attempts(cp) -> dict[str, dict]:
    """job id -> its first attempt's project, admission time and held span (microseconds)."""
    with db.read(cp.sessions) as s:
        rows = s.execute(select(attempts.c.job_id, attempts.c.created_at, jobs.c.project, attempt_usage.c.held_from,
                                attempt_usage.c.held_to)
                         .join(jobs, jobs.c.id == attempts.c.job_id)
                         .join(attempt_usage, (attempt_usage.c.job_id == attempts.c.job_id)
                               & (attempt_usage.c.number == attempts.c.number))
                         .where(attempts.c.number == 1)).all()
    return {r.job_id: {"project": r.project, "admitted": micros(r.created_at), "held": (r.held_from, r.held_to)}
            for r in rows}


STREAM = [40, 90, 60, 120, 30, 75, 45, 100] * 2  # each project's jobs' seconds, in submit order


@FAIR_OR_FIFO
def test_two_projects_streams_each_get_about_half_of_the_gpu_seconds(cp, ray, clock, settings):
    """A submits its stream, and is admitted on both GPUs; then B submits the same
    stream. While both have jobs queued, each holds 45-55% of the GPU-seconds with
    fair share on (FIFO: A holds them all, until its stream is admitted)."""
    run = Runner(cp, ray, clock)
    a = [cp.submit(gpu_job(f"a{i}", t), project="alpha", actor="t")[0].id for i, t in enumerate(STREAM)]
    run.step()
    run.step()
    assert [ray.jobs[submission_id(j, 1)].job.status for j in a[:2]] == ["RUNNING", "RUNNING"]
    since = micros(clock.t)
    b = [cp.submit(gpu_job(f"b{i}", t), project="beta", actor="t")[0].id for i, t in enumerate(STREAM)]
    for _ in range(2000):
        run.step()
        if len(ray.submitted) == len(a + b) and not ray.running():  # (the step's reconcile read their ends)
            break
    else:
        raise AssertionError("the streams did not drain")
    assert {cp.get(j, project=None).status.value for j in a + b} == {"SUCCEEDED"}
    got = first_attempts(cp)
    # The period both had work queued: from B's submit until the first stream's last admission.
    until = min(max(got[j]["admitted"] for j in a), max(got[j]["admitted"] for j in b))
    held = {"alpha": 0.0, "beta": 0.0}
    for g in got.values():
        lo, hi = max(g["held"][0], since), min(g["held"][1], until)
        held[g["project"]] += max(0, hi - lo) / 1e6
    share = held["beta"] / (held["alpha"] + held["beta"])
    print(f"B's share {share:.3f} of {held} over {(until - since) / 1e6:.0f} s")
    if settings.fair_share_half_life_s:
        assert (until - since) / 1e6 > 10 * 60  # ten minutes of contention, as the test
        assert 0.45 <= share <= 0.55, held
    else:
        assert share < 0.05, held  # FIFO: A's stream first; what fair share changes


@FAIR_OR_FIFO
def test_a_project_that_ran_alone_the_hour_before_starts_behind(cp, ray, clock, settings):
    """alpha kept both GPUs busy for the hour before; then alpha, and after it beta,
    submit two jobs each: beta's are admitted first with fair share on (FIFO: alpha's,
    the older)."""
    run = Runner(cp, ray, clock)
    warm = [cp.submit(gpu_job(f"warm{i}", 20 * 60), project="alpha", actor="t")[0].id for i in range(6)]
    for _ in range(200):
        run.step(60.0)
        if all(cp.get(j, project=None).status.value == "SUCCEEDED" for j in warm):
            break
    got = first_attempts(cp)
    assert (max(g["held"][1] for g in got.values()) - min(g["held"][0] for g in got.values())) / 1e6 >= 3600
    held = sum((g["held"][1] - g["held"][0]) / 1e6 for g in got.values())  # GPU-seconds: 1 GPU each
    quota = cp.access.quota("alpha", profile=ray.profile).node_groups
    if settings.fair_share_half_life_s:  # what the quota API shows: the hour, barely decayed
        assert 0.97 * held < quota["gpu"].fair_share_usage < held
    else:
        assert quota == {}  # no limit, nothing active, no fair share to show
    a = [cp.submit(gpu_job(f"a{i}", 60), project="alpha", actor="t")[0].id for i in range(2)]
    b = [cp.submit(gpu_job(f"b{i}", 60), project="beta", actor="t")[0].id for i in range(2)]
    run.step()
    first, second = (b, a) if settings.fair_share_half_life_s else (a, b)
    assert [x.submission_id for x in ray.submitted[-2:]] == [submission_id(j, 1) for j in first]
    assert [cp.get(j, project=None).status.value for j in first] == ["DISPATCHING", "DISPATCHING"]
    for j in second:
        got = cp.get(j, project=None)
        assert (got.status.value, got.status_reason) == ("PENDING", "waiting for 1 GPUs in group gpu: 0 free")
