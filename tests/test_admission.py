"""Admission's decisions alone: ``loops.admission.decide`` on queue rows built
here, with no database and no Ray. What it returns is all that gets written
(tests/test_scheduler.py and tests/test_quotas.py check the writes)."""

from __future__ import annotations

from raylane.orchestrator.domain.profile import default_profile
from raylane.orchestrator.domain.routing import GroupState, route
from raylane.orchestrator.domain.specs import JobSpec
from raylane.orchestrator.domain.states import JobStatus
from raylane.orchestrator.loops.admission import Admit, Fail, Rules, Wait, decide
from raylane.orchestrator.store.queue import Queued
from raylane.orchestrator.store.quotas import Limits

PROFILE = default_profile()
RULES = Rules(max_concurrent_drivers=64, starvation_skips=3)
VIEW = {"gpu": GroupState(alive_nodes=1, total={"CPU": 4, "GPU": 2, "memory": 4 * 1024**3})}


def queued(job_id: str, gpus: int, *, project: str = "default", skips: int = 0, reason: str | None = None) -> Queued:
    spec = JobSpec(name=job_id, kind="command", entrypoint="true",
                   resources={"gpus_per_worker": gpus, "cpus_per_worker": 0.5})
    return Queued(id=job_id, project=project, status=JobStatus.PENDING, status_reason=reason, spec=spec,
                  placement=route(spec, PROFILE), attempts=0, skips=skips, preemptions=0)


def run(queue, *, limits=None, used=None):
    return decide(queue, VIEW, PROFILE, RULES, used=used or {}, drivers=0, limits=limits or {}, project_used={})


def summary(decisions):
    return [(type(d).__name__, d.job.id, getattr(d, "reason", None) or getattr(d, "passed_over", None))
            for d in decisions]


def test_a_pass_counts_what_it_admits_and_writes_a_reason_only_when_it_changes():
    first = run([queued("a", 2), queued("b", 1)])
    assert summary(first) == [("Admit", "a", []), ("Wait", "b", "waiting for 1 GPUs in group gpu: 0 free")]
    # The same wait again, with its reason already stored: nothing to write.
    again = run([queued("b", 1, reason="waiting for 1 GPUs in group gpu: 0 free")], used={"gpu": {"GPU": 2}})
    assert again == []


def test_a_backfill_passes_over_the_big_job_until_it_reserves_its_group():
    passed = run([queued("big", 2), queued("small", 1)], used={"gpu": {"GPU": 1}})
    assert summary(passed) == [("Wait", "big", "waiting for 2 GPUs in group gpu: 1 free"),
                               ("Admit", "small", ["big"])]
    starving = run([queued("big", 2, skips=3), queued("small", 1)], used={"gpu": {"GPU": 1}})
    assert [type(d) for d in starving] == [Wait, Wait]
    assert starving[1].reason == "waiting: group gpu is reserved for an older job that has waited longest"


def test_a_job_held_by_its_own_quota_is_not_passed_over():
    limits = {("p", "gpu"): Limits(max_gpus=0)}
    out = run([queued("held", 1, project="p", skips=10), queued("other", 1)], limits=limits)
    assert isinstance(out[0], Wait) and out[0].reason.startswith("project quota reached: p holds 0 of 0 GPUs")
    assert isinstance(out[1], Admit) and out[1].passed_over == []


def test_a_job_that_no_longer_fits_the_profile_fails():
    job = queued("x", 1)
    gone = Queued(**{**job.__dict__, "placement": None,
                     "spec": job.spec.model_copy(update={"resources": job.spec.resources.model_copy(
                         update={"gpus_per_worker": 64})})})
    out = run([gone])
    assert [type(d) for d in out] == [Fail] and "64" in out[0].message
