"""Project quotas in admission, without Ray: the dispatcher's claim() against a
given cluster view (as in tests/test_scheduler.py), on SQLite and PostgreSQL,
with the quota API's usage numbers checked against what was admitted."""

from __future__ import annotations

import pytest

from raylane.orchestrator.loops.dispatcher import Dispatcher
from raylane.orchestrator.domain.profile import default_profile
from raylane.orchestrator.domain.views import GroupLimits
from raylane.orchestrator.domain.specs import JobSpec
from raylane.orchestrator.domain.states import JobStatus
from raylane.orchestrator.store import db
from raylane.orchestrator.store.transitions import transition
from tests.test_scheduler import view


@pytest.fixture
def plane(cp):
    from raylane.orchestrator.domain.routing import route

    profile = default_profile()
    cp.profile = profile
    cp.router = lambda spec: route(spec, profile)
    cp.dispatcher = Dispatcher(cp.settings, cp.sessions, backend=None, profile=profile)
    for p in ("alpha", "beta"):
        cp.access.create_project(p, description=None, actor="t")
    return cp


def gpu_job(name: str, priority: int = 50, gpus: int = 1) -> JobSpec:
    return JobSpec(name=name, kind="command", entrypoint="true", priority=priority,
                   resources={"gpus_per_worker": gpus, "cpus_per_worker": 0.5})


def finish(cp, job_id: str) -> None:
    with db.transaction(cp.sessions) as s:
        transition(s, job_id, JobStatus.RUNNING, reason="t", actor="t")
        transition(s, job_id, JobStatus.SUCCEEDED, reason="t", actor="t")


def active_gpus(cp, project: str) -> float:
    jobs = [j for j in cp.list(_flt(project), limit=500, cursor=None)[0]
            if j.status in (JobStatus.DISPATCHING, JobStatus.RUNNING)]
    return sum(j.placement.total.get("GPU", 0) for j in jobs)


def _flt(project):
    from raylane.orchestrator.domain.queries import JobFilter

    return JobFilter(project=project)


def test_two_projects_share_the_gpu_group_within_their_quotas(plane):
    # The gpu group has 2 GPUs; alpha may hold 1, beta 1 and one job at a time.
    plane.access.set_quota("alpha", {"gpu": GroupLimits(max_gpus=1)}, actor="t")
    plane.access.set_quota("beta", {"gpu": GroupLimits(max_gpus=2, max_concurrent_jobs=1)}, actor="t")
    # alpha's jobs have the higher priority: without quotas they would take the whole group.
    queued = {p: [plane.submit(gpu_job(f"{p}-{i}", priority=90 if p == "alpha" else 10), project=p, actor="t")[0].id
                  for i in range(4)] for p in ("alpha", "beta")}
    done: dict[str, list[str]] = {"alpha": [], "beta": []}
    passes = 0
    while any(len(done[p]) < 4 for p in done):
        passes += 1
        assert passes <= 10, "the queue did not drain"
        claimed = plane.dispatcher.claim(view(gpus=2))
        by_project = {p: [c for c in claimed if c.project == p] for p in done}
        # Each project within its quota, and the quota (not capacity) is what held it back.
        for p in done:
            q = plane.access.quota(p).node_groups["gpu"]
            assert q.used_gpus == active_gpus(plane, p) == len(by_project[p])
            assert q.active_jobs == len(by_project[p])
            assert q.used_cpus == pytest.approx(0.5 * len(by_project[p]))
        assert len(by_project["alpha"]) == (1 if len(done["alpha"]) < 4 else 0)
        assert len(by_project["beta"]) == (1 if len(done["beta"]) < 4 else 0)
        waiting = [plane.get(j, project=None) for p in queued for j in queued[p]
                   if j not in done[p] and j not in {c.job_id for c in claimed}]
        for j in waiting:
            assert j.status is JobStatus.PENDING  # waiting, never failed
            assert j.status_reason.startswith("project quota reached: "), j.status_reason
        if waiting and any(j.project == "alpha" for j in waiting):
            assert any(j.status_reason == "project quota reached: alpha holds 1 of 1 GPUs in group gpu; "
                                          "this job needs 1" for j in waiting if j.project == "alpha")
        if any(j.project == "beta" for j in waiting):
            assert any(j.status_reason == "project quota reached: beta runs 1 of 1 concurrent jobs in group gpu"
                       for j in waiting if j.project == "beta")
        for c in claimed:
            finish(plane, c.job_id)
            done[c.project].append(c.job_id)
    assert passes == 4 and sorted(done["alpha"]) == sorted(queued["alpha"])
    for p in done:
        q = plane.access.quota(p).node_groups["gpu"]
        assert (q.used_gpus, q.used_cpus, q.active_jobs) == (0, 0, 0)


def test_a_job_held_by_its_quota_does_not_reserve_the_group(plane):
    # Anti-starvation reserves a group for a job passed over too often; a job that
    # waits on its own project's quota must not block the group for others.
    plane.settings.starvation_skips = 0
    plane.access.set_quota("alpha", {"gpu": GroupLimits(max_gpus=1)}, actor="t")
    a1 = plane.submit(gpu_job("a1", priority=90), project="alpha", actor="t")[0].id
    a2 = plane.submit(gpu_job("a2", priority=90), project="alpha", actor="t")[0].id
    assert [c.job_id for c in plane.dispatcher.claim(view(gpus=2))] == [a1]
    b = [plane.submit(gpu_job(f"b{i}", priority=10), project="beta", actor="t")[0].id for i in range(3)]
    for i in range(3):
        claimed = [c.job_id for c in plane.dispatcher.claim(view(gpus=2))]
        assert claimed == [b[i]], (i, claimed)
        finish(plane, b[i])
    assert plane.get(a2, project=None).status_reason.startswith("project quota reached: alpha holds 1 of 1 GPUs")
    finish(plane, a1)
    assert [c.job_id for c in plane.dispatcher.claim(view(gpus=2))] == [a2]


def test_quota_on_cpus_and_capacity_still_applies(plane):
    plane.settings.queue_ahead_jobs = 0  # capacity alone (test_scheduler covers jobs queued ahead in Ray)
    plane.access.set_quota("alpha", {"cpu": GroupLimits(max_cpus=2.2)}, actor="t")
    spec = JobSpec(name="c", kind="command", entrypoint="true", resources={"cpus_per_worker": 1})
    ids = [plane.submit(spec, project="alpha", actor="t")[0].id for _ in range(3)]
    # A command holds its worker's CPU (its driver is the entrypoint): 1 CPU each, so two fit in 2.2.
    assert [c.job_id for c in plane.dispatcher.claim(view(cpus=4.0))] == ids[:2]
    r = plane.get(ids[2], project=None).status_reason
    assert r == "project quota reached: alpha holds 2 of 2.2 CPUs in group cpu; this job needs 1"
    # With room in the quota, the group's capacity is the limit again.
    plane.access.set_quota("alpha", {"cpu": GroupLimits(max_cpus=100)}, actor="t")
    assert plane.dispatcher.claim(view(cpus=2.0)) == []
    assert plane.get(ids[2], project=None).status_reason == "waiting for 1 CPUs in group cpu: 0 free"
    # Projects without a quota are not limited by others' quotas. (Fair share alone would
    # put beta's job first, alpha's two admitted jobs counting against it (docs/scheduling.md);
    # but alpha's stays within its guaranteed share and beta's borrows, so alpha's goes
    # first (docs/sharing.md).)
    other = plane.submit(spec, project="beta", actor="t")[0].id
    assert [c.job_id for c in plane.dispatcher.claim(view(cpus=8.0))] == [ids[2], other]
    assert plane.access.quota("alpha").node_groups["cpu"].active_jobs == 3
    assert plane.access.quota("beta").node_groups["cpu"].max_cpus is None
