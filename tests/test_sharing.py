"""Sharing a group between projects (docs/sharing.md): guaranteed shares, borrowing,
lending limits and preemption with a grace period. The choice of victims alone
(``domain.sharing``), then through the API and the real loops on SQLite and
PostgreSQL against the in-memory Ray (``orchestrator.testing.FakeRay``), the test
turning the loops. tests/ray/test_preemption_cluster.py does it on the local
cluster with real checkpoints."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from raylane.orchestrator.domain import protocol, sharing
from raylane.orchestrator.domain.ids import submission_id
from raylane.orchestrator.services import assembly
from raylane.orchestrator.store.quotas import Limits
from raylane.orchestrator.testing import FakeRay
from tests.test_loops_on_fake_ray import job, run_until, turn

NOW = datetime(2026, 12, 7, 12, 0, tzinfo=timezone.utc)


def holder(jid: str, project: str = "a", *, gpus: float = 1, priority: int = 50, age_s: float = 600,
           preemptible: bool = True, **kw) -> sharing.Holder:
    return sharing.Holder(jid, 1, project, "gpu", {"GPU": gpus, "CPU": 1}, priority,
                          NOW - timedelta(seconds=age_s), preemptible, 60.0, **kw)


def waiter(project: str = "b", *, gpus: float = 1, priority: int = 50, **kw) -> sharing.Waiter:
    need = {"GPU": gpus, "CPU": 1}
    return sharing.Waiter("w", project, priority, "gpu", need, need, **kw)


SHARES = {("a", "gpu"): Limits(max_gpus=1, borrow_gpus=1), ("b", "gpu"): Limits(max_gpus=1)}


def pick(w, holders, *, free=None, limits=SHARES, min_run_s=120.0):
    used: dict = {}
    for h in holders:
        u = used.setdefault((h.project, h.group), {"GPU": 0.0, "CPU": 0.0})
        for r in ("GPU", "CPU"):
            u[r] += h.total.get(r, 0)
    out = sharing.victims(w, free or {"GPU": 0, "CPU": 8}, holders, limits=limits, used=used, now=NOW,
                          min_run_s=min_run_s)
    return None if out is None else [(v.holder.job_id, v.why) for v in out]


# The choice of victims ------------------------------------------------------------------


def test_a_job_within_its_share_reclaims_from_the_borrower_youngest_first():
    # a holds both GPUs (1 guaranteed + 1 borrowed); b asks for its guaranteed 1.
    assert pick(waiter(), [holder("old", age_s=900), holder("young", age_s=300)]) == [("young", "borrowing")]


def test_never_more_than_needed_and_none_when_stopping_all_would_not_do():
    # b needs 1 GPU: one victim, though a third job of a's also borrows.
    hs = [holder("x", age_s=900), holder("y", age_s=800), holder("z", age_s=700, gpus=0.5)]
    limits = {("a", "gpu"): Limits(max_gpus=0.5, borrow_gpus=4), ("b", "gpu"): Limits(max_gpus=2)}
    got = pick(waiter(gpus=1), hs, limits=limits)
    assert len(got) == 1 and got[0][0] in {"x", "y"}
    # Needing 2 GPUs of 2.5 preemptible: the two whole GPUs, not the half one as well.
    assert sorted(j for j, _ in pick(waiter(gpus=2), hs, limits=limits)) == ["x", "y"]
    # More than all of them together: nothing is stopped.
    assert pick(waiter(gpus=4), hs, limits=limits) is None


def test_a_borrower_goes_first_then_the_lowest_priority():
    limits = {("a", "gpu"): Limits(max_gpus=0, borrow_gpus=2), ("c", "gpu"): Limits(max_gpus=1),
              ("b", "gpu"): Limits(max_gpus=1)}
    hs = [holder("c-low", "c", priority=10, age_s=100_000), holder("a-high", "a", priority=70)]
    # b (priority 80, within its share): a borrows, so a goes first though c's job is of lower priority.
    assert pick(waiter(priority=80), hs, limits=limits) == [("a-high", "borrowing")]
    # Without shares anywhere: the lowest priority goes.
    assert pick(waiter(priority=80), hs, limits={}) == [("c-low", "priority 10 < 80")]
    # Of equal priority and nobody borrowing: nothing.
    assert pick(waiter(priority=50), [holder("p", "c", priority=50)], limits={}) is None


def test_who_is_never_a_victim():
    hs = [holder("svc", preemptible=False), holder("young", age_s=30),
          holder("busy", preempt_for="other"), holder("peer", "b", priority=90)]
    assert pick(waiter(priority=90), hs, limits={}) is None
    # ... and a job that was preempted for "back" does not preempt it back within the window.
    assert pick(waiter(priority=90, preempted_by=frozenset({"back"})), [holder("back", priority=10)],
                limits={}) is None
    assert pick(waiter(priority=90), [holder("back", priority=10)], limits={}) == [("back", "priority 10 < 90")]


def test_borrowing_and_held_back_share():
    limits = {("a", "gpu"): Limits(max_gpus=1, borrow_gpus=1),
              ("b", "gpu"): Limits(max_gpus=1, lend_gpus=0)}
    used = {("a", "gpu"): {"GPU": 1.0}}
    assert sharing.borrowing(limits, used, "a", "gpu", extra={"GPU": 1})
    assert not sharing.borrowing(limits, used, "a", "gpu")
    # b lends none of its idle share: 1 GPU held back from a's borrowing.
    assert sharing.held_back(limits, used, "gpu", but="a")["GPU"] == 1.0
    # No shares in the group: nobody borrows.
    assert not sharing.borrowing({}, used, "a", "gpu", extra={"GPU": 5})
    # A project without a quota in a group of shares borrows all it holds.
    assert sharing.borrowing(limits, {("z", "gpu"): {"GPU": 1.0}}, "z", "gpu")


# Through the API and the loops on the in-memory Ray ------------------------------------


@pytest.fixture
def settings(settings):
    return settings.model_copy(update={"fast_lane": False, "preempt_min_run_s": 0.0, "preempt_grace_s": 0.0})


@pytest.fixture
def ray(cp) -> FakeRay:
    ray = FakeRay()
    assembly.attach_backend(cp, ray, ray.profile)
    return ray


def one_gpu(name: str, project: str, *, kind: str = "command", priority: int = 50, **kw) -> dict:
    spec = {"name": name, "kind": kind, "entrypoint": "sleep infinity" if kind == "command" else "m:f",
            "project": project, "priority": priority,
            "resources": {"gpus_per_worker": 1, "cpus_per_worker": 0.5}, **kw}
    if kind == "service":
        spec["entrypoint"] = "m:app"
    return spec


def running(api, cp, ray, spec: dict) -> dict:
    j = api.post("/v1/jobs", json=spec)
    assert j.status_code == 201, j.text
    j = j.json()
    run_until(cp, lambda: ray.jobs.get(submission_id(j["id"], job(api, j["id"])["attempts"]))
              if job(api, j["id"])["attempts"] else None, f"{spec['name']} submitted")
    sid = submission_id(j["id"], job(api, j["id"])["attempts"])
    ray.start(sid)
    run_until(cp, lambda: job(api, j["id"])["status"] == "RUNNING", f"{spec['name']} running")
    return job(api, j["id"])


def shares(api, a: dict, b: dict) -> None:
    for p, groups in (("a", a), ("b", b)):
        assert api.post("/v1/projects", json={"name": p}).status_code in (200, 201)
        r = api.put(f"/v1/projects/{p}/quota", json={"node_groups": groups})
        assert r.status_code == 200, r.text


def events(api, job_id: str) -> list[str]:
    return [e["reason"] or "" for e in api.get(f"/v1/jobs/{job_id}/events").json()]


def test_a_job_within_its_share_preempts_a_borrower_which_resumes_uncharged(api, cp, ray):
    shares(api, {"gpu": {"max_gpus": 1, "borrow_gpus": 1}}, {"gpu": {"max_gpus": 1}})
    first = running(api, cp, ray, one_gpu("a-first", "a"))
    second = running(api, cp, ray, one_gpu("a-second", "a", retry={"max_attempts": 1}))
    assert not first["placement"]["borrowed"] and second["placement"]["borrowed"]
    assert any("borrowed capacity" in r for r in second["placement"]["reasons"])
    q = api.get("/v1/projects/a/quota").json()["node_groups"]["gpu"]
    assert (q["used_gpus"], q["borrowed_gpus"], q["borrow_gpus"]) == (2, 1, 1)
    assert 'raylane_borrowed_jobs{node_group="gpu"} 1.0' in api.get("/metrics").text

    b = api.post("/v1/jobs", json=one_gpu("b-job", "b")).json()
    turn(cp)
    # The youngest borrower is the victim; the waiting job says so, the victim says for whom.
    w = job(api, b["id"])
    assert w["status"] == "PENDING" and f"preempting {second['id']} (a, a-second)" in w["status_reason"]
    assert any(f"preempted for job {b['id']} (borrowing)" in r for r in events(api, second["id"]))
    # Grace 0: stopped at the next reconcile; its attempt ends PREEMPTED_BY_PRIORITY.
    run_until(cp, lambda: job(api, second["id"])["status"] == "RETRYING" or
              job(api, second["id"])["status"] == "PENDING", "the borrower stopped")
    sid = submission_id(second["id"], 1)
    assert sid in ray.stopped and submission_id(first["id"], 1) not in ray.stopped
    att = api.get(f"/v1/jobs/{second['id']}/attempts").json()[0]
    assert att["cause"] == "PREEMPTED_BY_PRIORITY" and att["preempt_for"] == b["id"]
    assert "grace period" in att["message"]
    # b's job takes the GPU; a's job queues again though max_attempts is 1 (not charged).
    run_until(cp, lambda: job(api, b["id"])["status"] in ("DISPATCHING", "RUNNING"), "b admitted")
    assert job(api, second["id"])["status"] in ("RETRYING", "PENDING")
    ray.finish(submission_id(first["id"], 1))
    run_until(cp, lambda: job(api, second["id"])["attempts"] == 2, "a's job admitted again")
    ray.finish(submission_id(second["id"], 2))
    run_until(cp, lambda: job(api, second["id"])["status"] == "SUCCEEDED", "a's job done")


def test_a_free_gpu_goes_to_the_job_within_its_share_not_to_an_older_borrower(api, cp, ray):
    # a and b each hold their one GPU; a's second job (would borrow) queued before b's
    # second. b's first ends: its GPU is b's to use. Before, a's older job took it as a
    # borrower and b's job then preempted a's first job in the same pass (bench/sharing.py).
    shares(api, {"gpu": {"max_gpus": 1, "borrow_gpus": 1}}, {"gpu": {"max_gpus": 1, "borrow_gpus": 1}})
    a1 = running(api, cp, ray, one_gpu("a-1", "a"))
    b1 = running(api, cp, ray, one_gpu("b-1", "b"))
    a2 = api.post("/v1/jobs", json=one_gpu("a-2", "a")).json()
    turn(cp)
    b2 = api.post("/v1/jobs", json=one_gpu("b-2", "b")).json()
    turn(cp)
    ray.finish(submission_id(b1["id"], 1))
    run_until(cp, lambda: job(api, b2["id"])["status"] in ("DISPATCHING", "RUNNING"), "b's second job admitted")
    turn(cp, 3)
    assert ray.stopped == [] and job(api, a1["id"])["status"] == "RUNNING"
    assert job(api, a2["id"])["status"] == "PENDING" and not job(api, b2["id"])["placement"]["borrowed"]


def test_a_service_is_never_a_victim(api, cp, ray):
    shares(api, {"gpu": {"max_gpus": 1, "borrow_gpus": 1}}, {"gpu": {"max_gpus": 1}})
    running(api, cp, ray, one_gpu("svc-1", "a", kind="service"))
    running(api, cp, ray, one_gpu("svc-2", "a", kind="service"))
    b = api.post("/v1/jobs", json=one_gpu("b-job", "b")).json()
    turn(cp, 3)
    assert job(api, b["id"])["status_reason"] == "waiting for 1 GPUs in group gpu: 0 free"
    assert ray.stopped == []


def test_a_job_that_checkpoints_within_its_grace_is_stopped_then(api, cp, ray, monkeypatch):
    cp.settings = cp.settings.model_copy(update={"preempt_grace_s": 3600.0})
    cp.reconciler.settings = cp.dispatcher.settings = cp.settings
    low = running(api, cp, ray, one_gpu("low", "a", priority=10, resources={"gpus_per_worker": 2,
                                                                              "cpus_per_worker": 0.5}))
    # The plan says submitting now would preempt it (and stores nothing, stops nothing).
    plan = api.post("/v1/plan", json=one_gpu("high", "b", priority=90)).json()
    assert plan["preempts"] == [low["id"]] and any("would preempt" in r for r in plan["reasons"])
    assert api.post("/v1/plan", json=one_gpu("peer", "b", priority=10)).json()["preempts"] == []
    high = api.post("/v1/jobs", json=one_gpu("high", "b", priority=90)).json()
    turn(cp, 3)
    sid = submission_id(low["id"], 1)
    # Asked to checkpoint; an hour's grace: not stopped yet.
    assert ray.gcs.checkpoint_request(sid)["reason"] == f"preempted for job {high['id']}"
    assert sid not in ray.stopped and "priority 10 < 90" in " ".join(events(api, low["id"]))
    assert "at the latest" in job(api, high["id"])["status_reason"]
    # Its runner says the checkpoint is saved (raylane.jobs.base.checkpoint_saved): stopped at once.
    ray.gcs.kv[protocol.checkpointed_key(sid)] = b"saved"
    run_until(cp, lambda: sid in ray.stopped, "the victim stopped once it checkpointed")
    run_until(cp, lambda: job(api, high["id"])["status"] in ("DISPATCHING", "RUNNING"), "high admitted")
    att = api.get(f"/v1/jobs/{low['id']}/attempts").json()[0]
    assert att["cause"] == "PREEMPTED_BY_PRIORITY" and "checkpoint was saved" in att["message"]


def test_a_waiting_job_starts_where_another_ended_and_its_victim_runs_on(api, cp, ray, monkeypatch):
    cp.settings = cp.settings.model_copy(update={"preempt_grace_s": 3600.0})
    cp.reconciler.settings = cp.dispatcher.settings = cp.settings
    low = running(api, cp, ray, one_gpu("low", "a", priority=10))
    mid = running(api, cp, ray, one_gpu("mid", "a", priority=50))
    high = api.post("/v1/jobs", json=one_gpu("high", "b", priority=90)).json()
    turn(cp, 2)
    sid = submission_id(low["id"], 1)
    assert ray.gcs.checkpoint_request(sid) is not None
    # mid ends: high starts on mid's GPU at once (it used to wait for low's checkpoint
    # or grace, then low was stopped all the same), and low, no longer needed, runs on.
    ray.finish(submission_id(mid["id"], 1))
    turn(cp)  # (the reconciler sees mid's end)
    ray.gcs.kv[protocol.checkpointed_key(sid)] = b"saved"  # low answers as high is admitted
    turn(cp)
    assert job(api, high["id"])["status"] in ("DISPATCHING", "RUNNING")
    turn(cp, 2)
    assert sid not in ray.stopped and job(api, low["id"])["status"] == "RUNNING"
    assert any(f"no longer preempted: job {high['id']} started without it" in r for r in events(api, low["id"]))
    # The request and its answer are withdrawn in Ray too: a later preemption asks
    # again and waits for a checkpoint of its own, not stopped at once by the old answer.
    assert ray.gcs.checkpoint_request(sid) is None and protocol.checkpointed_key(sid) not in ray.gcs.kv
    again = api.post("/v1/jobs", json=one_gpu("again", "c", priority=90)).json()
    turn(cp, 3)
    assert ray.gcs.checkpoint_request(sid)["reason"] == f"preempted for job {again['id']}"
    assert sid not in ray.stopped


def test_a_lending_limit_holds_back_an_idle_share(api, cp, ray):
    # b lends none of its 1 GPU: a (1 + 1 borrowed) gets only the GPU not guaranteed to b.
    shares(api, {"gpu": {"max_gpus": 1, "borrow_gpus": 1}}, {"gpu": {"max_gpus": 1, "lend_gpus": 0}})
    running(api, cp, ray, one_gpu("a-1", "a"))
    j = api.post("/v1/jobs", json=one_gpu("a-2", "a")).json()
    turn(cp, 2)
    assert "others' guaranteed share that they do not lend" in job(api, j["id"])["status_reason"]


def test_quota_borrow_and_lend_are_checked(api):
    api.post("/v1/projects", json={"name": "a"})
    r = api.put("/v1/projects/a/quota", json={"node_groups": {"gpu": {"borrow_gpus": 1}}})
    assert r.status_code == 422 and "borrow_gpus needs max_gpus" in r.text
    r = api.put("/v1/projects/a/quota", json={"node_groups": {"gpu": {"max_gpus": 1, "lend_gpus": 2}}})
    assert r.status_code == 422 and "lend_gpus" in r.text
    r = api.put("/v1/projects/a/quota", json={"node_groups": {"gpu": {"max_gpus": 1, "borrow_gpus": -1}}})
    assert r.status_code == 422


def test_a_spec_may_not_opt_out_of_preemption_or_ask_too_long_a_grace(api):
    r = api.post("/v1/jobs", json=one_gpu("x", "default", preemption={"preemptible": False}))
    assert r.status_code == 403 and "policy.preemption.opt_out" in r.text
    r = api.post("/v1/jobs", json=one_gpu("x", "default", preemption={"grace_s": 100_000}))
    assert r.status_code == 422
    r = api.post("/v1/jobs", json=one_gpu("x", "default", preemption={"grace_s": 3600}))
    assert r.status_code == 403 and "policy.preemption.max_grace_s" in r.text
    assert api.post("/v1/jobs", json=one_gpu("x", "default", preemption={"grace_s": 300})).status_code == 201
