"""Admission without Ray: the dispatcher's claim() against a given cluster view,
on SQLite and PostgreSQL. Priority, capacity, reasons, anti-starvation, the
head-node guard, spot-to-on-demand fallback."""

from __future__ import annotations

import pytest
from sqlalchemy import update

from raylane.orchestrator.loops.dispatcher import Dispatcher
from raylane.orchestrator.domain.profile import default_profile
from raylane.orchestrator.domain.routing import GroupState
from raylane.orchestrator.domain.specs import JobSpec
from raylane.orchestrator.domain.states import JobStatus
from raylane.orchestrator.store import db
from raylane.orchestrator.store.tables import jobs
from raylane.orchestrator.store.transitions import transition

GiB = 1024**3


def view(gpus=2, cpus=4.0, spot_nodes=2):
    return {
        "gpu": GroupState(alive_nodes=1, total={"CPU": 4, "GPU": gpus, "memory": 4 * GiB}),
        "spot-cpu": GroupState(alive_nodes=spot_nodes, total={"CPU": 4.0 * spot_nodes, "memory": 2 * GiB * spot_nodes}),
        "cpu": GroupState(alive_nodes=1, total={"CPU": cpus, "memory": 2 * GiB}),
    }


@pytest.fixture
def plane(cp):
    from raylane.orchestrator.domain.routing import route

    profile = default_profile()
    cp.router = lambda spec: route(spec, profile)
    cp.dispatcher = Dispatcher(cp.settings, cp.sessions, backend=None, profile=profile)
    return cp


def gpu_job(n: int, name: str, priority: int = 50) -> JobSpec:
    return JobSpec(name=name, kind="command", entrypoint="true", priority=priority,
                   resources={"gpus_per_worker": n, "cpus_per_worker": 0.5})


def submit(cp, spec) -> str:
    return cp.submit(spec, project="default", actor="t")[0].id


def finish(cp, job_id):
    with db.transaction(cp.sessions) as s:
        transition(s, job_id, JobStatus.RUNNING, reason="t", actor="t")
        transition(s, job_id, JobStatus.SUCCEEDED, reason="t", actor="t")


def test_priority_then_age_and_waiting_reason(plane):
    a = submit(plane, gpu_job(2, "a"))
    assert [c.job_id for c in plane.dispatcher.claim(view())] == [a]
    low = submit(plane, gpu_job(1, "low", priority=10))
    high = submit(plane, gpu_job(2, "high", priority=90))
    assert plane.dispatcher.claim(view()) == []
    assert plane.get(low, project=None).status_reason == "waiting for 1 GPUs in group gpu: 0 free"
    assert plane.get(high, project=None).status_reason == "waiting for 2 GPUs in group gpu: 0 free"
    finish(plane, a)
    assert [c.job_id for c in plane.dispatcher.claim(view())] == [high]
    finish(plane, high)
    assert [c.job_id for c in plane.dispatcher.claim(view())] == [low]
    # A waiting reason is an event, written once per change, not once per pass.
    reasons = [e.reason for e in plane.events(low, project=None) if e.reason.startswith("waiting")]
    assert reasons == ["waiting for 1 GPUs in group gpu: 0 free"]


def test_big_job_is_not_starved_by_a_stream_of_small_ones(plane):
    plane.settings.starvation_skips = 3
    holder = submit(plane, gpu_job(1, "holder"))
    assert [c.job_id for c in plane.dispatcher.claim(view())] == [holder]
    big = submit(plane, gpu_job(2, "big", priority=60))
    small_started = 0
    for i in range(10):
        s = submit(plane, gpu_job(1, f"small-{i}", priority=10))
        claimed = [c.job_id for c in plane.dispatcher.claim(view())]
        if s in claimed:
            small_started += 1
            finish(plane, s)  # a short job: done before the next pass
        if big in claimed:
            break
        if i == 5:
            finish(plane, holder)
    # Small jobs backfilled at first, then the group was reserved and the big job ran.
    assert plane.get(big, project=None).status is JobStatus.DISPATCHING
    assert 1 <= small_started <= 4


def test_head_node_guard_caps_drivers(plane):
    plane.settings.max_concurrent_drivers = 2
    ids = [submit(plane, JobSpec(name=f"c{i}", kind="command", entrypoint="true",
                                 resources={"cpus_per_worker": 0.1})) for i in range(4)]
    assert len(plane.dispatcher.claim(view())) == 2
    assert "head-node guard" in plane.get(ids[2], project=None).status_reason


def test_sweep_is_admitted_with_one_trial_of_room(plane):
    sweep = JobSpec.from_file("examples/lr-sweep.yaml")
    jid = submit(plane, sweep)
    # Only 1 spot CPU free: an elastic job starts and scales into what frees up.
    claimed = plane.dispatcher.claim({**view(), "spot-cpu": GroupState(alive_nodes=1, total={"CPU": 1})})
    assert [c.job_id for c in claimed] == [jid]


def test_repeated_preemption_reroutes_to_on_demand(plane):
    sweep = JobSpec.from_file("examples/lr-sweep.yaml")
    jid = submit(plane, sweep)
    assert plane.get(jid, project=None).placement.node_group == "spot-cpu"
    with db.transaction(plane.sessions) as s:
        s.execute(update(jobs).where(jobs.c.id == jid).values(preemptions=2))
    claimed = plane.dispatcher.claim(view())
    assert claimed[0].placement.node_group == "cpu" and claimed[0].placement.market == "ON_DEMAND"
    assert any("spot to on-demand" in r for r in claimed[0].placement.reasons)


def test_cpu_jobs_queue_ahead_in_ray_up_to_the_bound_counting_those_not_yet_running(plane):
    plane.settings.queue_ahead_jobs = 2
    spec = JobSpec(name="c", kind="command", entrypoint="true", resources={"cpus_per_worker": 1})
    ids = [submit(plane, spec) for _ in range(6)]
    # 2 fit the group's 2 CPUs; they wait to start in Ray, which fills the bound.
    assert [c.job_id for c in plane.dispatcher.claim(view(cpus=2.0))] == ids[:2]
    assert plane.dispatcher.claim(view(cpus=2.0)) == []
    with db.transaction(plane.sessions) as s:
        for jid in ids[:2]:
            transition(s, jid, JobStatus.RUNNING, reason="t", actor="t")
    # Both run: 2 more go to Ray's queue, to start the moment one ends; the rest wait here.
    ahead = plane.dispatcher.claim(view(cpus=2.0))
    assert [c.job_id for c in ahead] == ids[2:4]
    assert plane.get(ids[2], project=None).status_reason == (
        "admitted to cpu; attempt 1; queued ahead in Ray until a running job ends "
        "(waiting for 1 CPUs in group cpu: 0 free)")
    assert plane.get(ids[4], project=None).status_reason == "waiting for 1 CPUs in group cpu: 0 free"
    with db.transaction(plane.sessions) as s:
        # One ended; Ray started the first queued one: one place in its queue again.
        transition(s, ids[0], JobStatus.SUCCEEDED, reason="t", actor="t")
        transition(s, ids[2], JobStatus.RUNNING, reason="t", actor="t")
    assert [c.job_id for c in plane.dispatcher.claim(view(cpus=2.0))] == [ids[4]]
    # A GPU job never waits in Ray's queue: Raylane's keeps its priority order.
    g = [submit(plane, gpu_job(2, f"g{i}")) for i in range(2)]
    assert [c.job_id for c in plane.dispatcher.claim(view())] == g[:1]
    with db.transaction(plane.sessions) as s:
        transition(s, g[0], JobStatus.RUNNING, reason="t", actor="t")
    assert plane.dispatcher.claim(view()) == []
