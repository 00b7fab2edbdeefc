"""Admission, dispatch, reconcile, retries, arrays and dependencies through the API
and the real loops, on SQLite and PostgreSQL, against the in-memory Ray
(``raylane.orchestrator.testing.FakeRay``). The loops are turned by the test
(``turn``), so each step is seen; Ray's side is moved by the test too (``start``,
``finish``, ``fail``, ``lose``) or by ``autorun``.

These were tests/ray/ tests whose subject is Raylane's decisions, not Ray's
behaviour; what only a live cluster shows (placement on real nodes, logs, node
loss, runtime envs) stays there."""

from __future__ import annotations

import json

import pytest

from raylane.orchestrator.domain.ids import submission_id
from raylane.orchestrator.domain.protocol import Env
from raylane.orchestrator.domain.specs import JobSpec
from raylane.orchestrator.domain.states import JobStatus
from raylane.orchestrator.services import assembly
from raylane.orchestrator.testing import FakeRay, Outcome
from tests.helpers import wait_for

TERMINAL = {"SUCCEEDED", "FAILED", "CANCELLED"}
MAX_TURNS = 200  # a test's loop passes: far more than any test here needs, so a stuck one fails, not hangs


def gate(name: str, gpus: int, priority: int = 50) -> dict:
    """A command job holding ``gpus`` GPUs until the test ends its attempt."""
    return {"name": name, "kind": "command", "entrypoint": "sleep infinity",
            "resources": {"gpus_per_worker": gpus, "cpus_per_worker": 0.5}, "priority": priority}


@pytest.fixture
def settings(settings):
    """Every job a Ray job of its own: these tests are about Ray jobs, and FakeRay
    runs no warm lane (the lanes' own tests are tests/test_lane_*.py)."""
    return settings.model_copy(update={"fast_lane": False})


@pytest.fixture
def ray(cp) -> FakeRay:
    """One in-memory cluster of the default profile, the control plane's loops attached to it."""
    ray = FakeRay()
    assembly.attach_backend(cp, ray, ray.profile)
    cp.dashboard_url = ray.dashboard_url
    return ray


def turn(cp, times: int = 1) -> None:
    """One pass of each loop: admit and submit, then read Ray's answers."""
    for _ in range(times):
        cp.dispatcher.run_once()
        cp.reconciler.run_once()


def job(api, job_id: str) -> dict:
    return api.get(f"/v1/jobs/{job_id}").json()


def run_until(cp, done, what: str):
    for _ in range(MAX_TURNS):
        turn(cp)
        got = done()
        if got:
            return got
    raise AssertionError(f"{what}: not after {MAX_TURNS} passes of the loops")


# Dispatch and admission (were tests/ray/test_dispatch.py) -----------------------------------


def test_never_fits_is_refused_at_submit_with_reason(api, ray):
    spec = {"name": "huge", "kind": "training", "entrypoint": "m:f",
            "resources": {"num_workers": 4, "gpus_per_worker": 1}}
    r = api.post("/v1/jobs", json=spec)
    assert r.status_code == 422
    assert "4 GPUs co-located; group gpu has 2 on one node" in r.json()["detail"][0]["msg"]
    r = api.post("/v1/jobs", json={**spec, "resources": {"gpus_per_worker": 1}, "placement": {"node_group": "cpu"}})
    assert r.status_code == 422 and "has no GPUs" in r.text
    assert api.get("/v1/jobs", params={"name_prefix": "huge"}).json()["items"] == []
    plan = api.post("/v1/plan", json={**spec, "resources": {"num_workers": 2, "gpus_per_worker": 1}}).json()
    assert plan["node_group"] == "gpu" and any("co-locate" in r for r in plan["reasons"])
    assert ray.submitted == []


def test_waits_with_reason_then_priority_order_when_capacity_frees(api, cp, ray):
    a = api.post("/v1/jobs", json=gate("gate-a", 2)).json()
    turn(cp)
    sid_a = submission_id(a["id"], 1)
    ray.start(sid_a)
    turn(cp)
    assert job(api, a["id"])["status"] == "RUNNING"
    # The GPU group is full: a low-priority job, then a high-priority one.
    low = api.post("/v1/jobs", json=gate("low", 1, priority=10)).json()
    high = api.post("/v1/jobs", json=gate("high", 2, priority=90)).json()
    assert job(api, low["id"])["status_reason"] == "waiting for admission"  # the submit's own reason
    turn(cp)  # an admission pass replaces it with what the group lacks
    j = job(api, low["id"])
    assert (j["status"], j["status_reason"]) == ("PENDING", "waiting for 1 GPUs in group gpu: 0 free")
    ray.finish(sid_a)
    turn(cp)  # the gate's end is read ...
    assert job(api, a["id"])["status"] == "SUCCEEDED"
    turn(cp)  # ... and the freed GPUs go to the high-priority job
    assert job(api, high["id"])["status"] in {"DISPATCHING", "RUNNING"}
    assert [s.submission_id for s in ray.submitted] == [sid_a, submission_id(high["id"], 1)]
    # The high-priority job took the whole group; the low one still waits.
    assert job(api, low["id"])["status"] == "PENDING"
    api.post(f"/v1/jobs/{low['id']}/cancel")
    api.post(f"/v1/jobs/{high['id']}/cancel")
    run_until(cp, lambda: job(api, high["id"])["status"] == "CANCELLED", "the high job cancelled")
    assert submission_id(high["id"], 1) in ray.stopped


def test_a_gang_takes_one_node_and_one_not_yet_placed_by_ray_keeps_its_node_for_a_pass(api, cp, ray):
    """Per-node free resources (as Ray's GCS gives them) in the real loops: a 2-GPU
    training admitted, not yet placed by Ray (the fake does not place), holds the
    node it needs against the next gang; once running a while, Ray's figures alone
    count (``stats.unplaced_gpus``)."""
    from datetime import timedelta

    from raylane.orchestrator.store import db, stats
    from raylane.orchestrator.store.transitions import utcnow

    first, second = ray.node_ids("gpu")[0], ray.add_node("gpu")
    for n in (first, second):
        ray.set_free(n, {"CPU": 4.0, "GPU": 2.0, "memory": 4 * 2**30})
    ray.set_free(second, {"CPU": 3.0, "GPU": 1.0, "memory": 4 * 2**30})  # a job not of Raylane holds one
    train = {"kind": "training", "entrypoint": "m:f", "resources": {"num_workers": 2, "gpus_per_worker": 1}}
    t1 = api.post("/v1/jobs", json={**train, "name": "t1"}).json()
    turn(cp)
    assert job(api, t1["id"])["status"] == "DISPATCHING"
    with db.read(cp.sessions) as s:
        assert stats.unplaced_gpus(s, utcnow()) == {"gpu": 2.0}
    t2 = api.post("/v1/jobs", json={**train, "name": "t2"}).json()
    turn(cp)  # Ray still shows 2 + 1 free: t1's 2 are taken from the first node, the second holds 1
    assert job(api, t2["id"])["status_reason"] == ("waiting for 2 GPUs on one node of group gpu (its 2 workers "
                                                   "are co-located): at most 1 free on any one node")
    ray.start(submission_id(t1["id"], 1))
    ray.set_free(first, {"CPU": 2.0, "GPU": 0.0, "memory": 4 * 2**30})  # where Ray put it
    turn(cp)
    with db.read(cp.sessions) as s:
        assert stats.unplaced_gpus(s, utcnow()) == {"gpu": 2.0}  # running, maybe still placing its workers
        assert stats.unplaced_gpus(s, utcnow() + timedelta(seconds=stats.PLACING_S + 1)) == {}
    assert job(api, t2["id"])["status"] == "PENDING"


def test_node_groups_and_cluster(api, ray):
    groups = {g["name"]: g for g in api.get("/v1/node-groups").json()}
    assert set(groups) == {"head", "gpu", "spot-cpu", "cpu"}
    assert groups["gpu"]["capacity"]["GPU"] == 2 and groups["spot-cpu"]["alive_nodes"] >= 1
    assert groups["spot-cpu"]["market"] == "SPOT"
    nodes = api.get("/v1/cluster").json()["nodes"]
    assert {n["node_group"] for n in nodes if n["state"] == "ALIVE"} >= {"head", "gpu", "spot-cpu", "cpu"}


def test_cancel_running_job_stops_ray_job(api, cp, ray):
    j = api.post("/v1/jobs", json=gate("to-cancel", 0)).json()
    sid = submission_id(j["id"], 1)
    turn(cp)
    ray.start(sid)
    turn(cp)
    assert job(api, j["id"])["status"] == "RUNNING"
    r = api.post(f"/v1/jobs/{j['id']}/cancel").json()
    assert r["job"]["status"] == "CANCELLING"
    run_until(cp, lambda: job(api, j["id"])["status"] == "CANCELLED", "the job cancelled")
    assert ray.stopped == [sid] and ray.get(sid).status == "STOPPED"


def test_a_job_is_submitted_once_with_its_group_and_metadata_and_ends_with_its_result(api, cp, ray):
    j = api.post("/v1/jobs", json={"name": "t", "kind": "training", "entrypoint": "m:f",
                                   "resources": {"num_workers": 1, "cpus_per_worker": 0.5}}).json()
    sid = submission_id(j["id"], 1)
    turn(cp)
    (sent,) = ray.submitted
    assert sent.submission_id == sid and sent.metadata["raylane_job_id"] == j["id"]
    assert sent.metadata["raylane_node_group"] == j["placement"]["node_group"]
    assert JobSpec.model_validate_json(sent.inputs[Env.SPEC]).entrypoint == "m:f"  # from Ray's KV store
    # The command line names only the key, and the user's entrypoint as a comment for Ray's dashboard.
    assert sent.entrypoint.split("#")[0].find("m:f") == -1 and sent.entrypoint.endswith("# raylane training: m:f")
    ray.finish(sid, result={"loss": 0.25})
    done = run_until(cp, lambda: (lambda x: x if x["status"] in TERMINAL else None)(job(api, j["id"])), "the end")
    assert (done["status"], done["result"]) == ("SUCCEEDED", {"loss": 0.25})
    assert ray.gcs.kv == {}  # the inputs and the result leave Ray's store once stored
    evs = [e["to_status"] for e in api.get(f"/v1/jobs/{j['id']}/events").json()]
    assert evs[0] == "PENDING" and evs[-3:] == ["DISPATCHING", "RUNNING", "SUCCEEDED"]


# Idempotent dispatch and retries (were tests/ray/test_idempotent_dispatch.py) ---------------


class Crash(BaseException):
    """Stands in for SIGKILL at the worst moment (not an Exception: nothing catches it)."""


def _plane(settings, ray: FakeRay, **kw):
    from raylane.orchestrator.services.controlplane import ControlPlane

    cp = ControlPlane(settings.model_copy(update={"loops_enabled": False, **kw}))
    assembly.attach_backend(cp, ray, ray.profile)
    return cp


def test_crash_between_ray_submit_and_db_write_runs_once(settings):
    from sqlalchemy import select

    from raylane.orchestrator.store.tables import attempts

    ray = FakeRay(autorun=lambda sub: Outcome())
    cp1, cp2 = _plane(settings, ray, lease_s=0.5), _plane(settings, ray, lease_s=0.5)
    try:
        j, _ = cp1.submit(JobSpec(name="once", kind="command", entrypoint="python -c 'print(7)'"),
                          project="default", actor="t")

        def crash(_claimed):
            raise Crash()

        cp1.dispatcher.after_submit_hook = crash
        with pytest.raises(Crash):
            cp1.dispatcher.run_once()
        # Ray has the attempt; our database still says CLAIMED with a lease held by the dead process.
        with cp1.sessions() as s:
            assert s.execute(select(attempts.c.status).where(attempts.c.job_id == j.id)).scalar() == "CLAIMED"
        assert cp1.get(j.id, project=None).status is JobStatus.DISPATCHING
        # A second control plane (a restart, or a replica) takes the attempt over once the lease expires.
        wait_for(lambda: cp2.dispatcher.run_once() or ray.refused, timeout=10, what="the lease's expiry")
        run_until(cp2, lambda: cp2.get(j.id, project=None).status is JobStatus.SUCCEEDED, "the job succeeded")
        assert [s.submission_id for s in ray.submitted] == [submission_id(j.id, 1)]  # Ray ran it once
        assert cp2.get(j.id, project=None).attempts == 1
    finally:
        cp1.close()
        cp2.close()


def test_attempt_ray_never_heard_of_is_lost_and_retried(cp, ray):
    """The head restarted without GCS fault tolerance: Ray forgot the attempt."""
    j, _ = cp.submit(JobSpec(name="lost", kind="command", entrypoint="python -c 'print(1)'",
                             retry={"backoff_s": 0}), project="default", actor="t")
    turn(cp)
    ray.start(submission_id(j.id, 1))
    turn(cp)
    assert cp.get(j.id, project=None).status is JobStatus.RUNNING
    ray.lose(submission_id(j.id, 1))
    cp.reconciler.run_once()
    got = cp.get(j.id, project=None)
    assert got.status is JobStatus.RETRYING and got.failure_cause.value == "LOST"
    assert "no record of this attempt" in got.status_reason
    ray.autorun = lambda sub: Outcome()
    run_until(cp, lambda: cp.get(j.id, project=None).status is JobStatus.SUCCEEDED, "the retried attempt")
    atts = cp.attempts(j.id, project=None)
    assert [(a.number, a.cause.value if a.cause else None) for a in atts] == [(1, "LOST"), (2, None)]


def test_an_app_error_is_retried_up_to_max_attempts_and_an_oom_is_not(cp, ray):
    def exits(code: int):
        return lambda sub: Outcome("FAILED", exit_code=code)

    flaky, _ = cp.submit(JobSpec(name="flaky", kind="command", entrypoint="exit 3",
                                 retry={"max_attempts": 3, "backoff_s": 0, "retry_app_errors": True}),
                         project="default", actor="t")
    ray.autorun = exits(3)
    run_until(cp, lambda: cp.get(flaky.id, project=None).status.value in TERMINAL, "the flaky job's end")
    got = cp.get(flaky.id, project=None)
    assert (got.status.value, got.failure_cause.value, got.attempts) == ("FAILED", "APP_ERROR", 3)
    oom, _ = cp.submit(JobSpec(name="oom", kind="command", entrypoint="true",
                               retry={"max_attempts": 3, "backoff_s": 0, "retry_app_errors": True}),
                       project="default", actor="t")
    ray.autorun = exits(137)
    run_until(cp, lambda: cp.get(oom.id, project=None).status.value in TERMINAL, "the OOM job's end")
    got = cp.get(oom.id, project=None)
    assert (got.status.value, got.failure_cause.value, got.attempts) == ("FAILED", "OOM", 1)


# Arrays (was tests/ray/test_arrays.py) ---------------------------------------------------------


def test_an_array_of_20_runs_at_most_4_at_once_and_each_member_is_told_its_index(api, cp, ray):
    spec = {"name": "shard", "kind": "command", "entrypoint": "echo shard-index=$RAYLANE_ARRAY_INDEX",
            "resources": {"cpus_per_worker": 0.1}, "array": {"size": 20, "max_parallel": 4}}
    arr = api.post("/v1/arrays", json=spec).json()
    assert arr["held"] == 16
    ray.autorun = lambda sub: Outcome()
    most = 0

    def done():
        nonlocal most
        most = max(most, len(ray.running()))
        a = api.get(f"/v1/arrays/{arr['id']}").json()
        assert a["counts"].get("FAILED", 0) == 0, a
        return a["counts"] == {"SUCCEEDED": 20}

    run_until(cp, done, "20 members SUCCEEDED")
    assert 2 <= most <= 4, most  # side by side, never more than max_parallel
    members = api.get("/v1/jobs", params={"label": f"raylane.array={arr['id']}", "limit": 100}).json()["items"]
    assert len(members) == 20 and len(ray.submitted) == 20
    told = {m["id"]: ray.submission(submission_id(m["id"], 1)).env[Env.ARRAY_INDEX] for m in members}
    assert {m["id"]: m["labels"]["raylane.array.index"] for m in members} == told
    assert sorted(map(int, told.values())) == list(range(20))


# Dependencies (was tests/ray/test_dependencies.py) -----------------------------------------------


def test_a_pipeline_passes_results_along_and_a_failure_cancels_what_follows(api, cp, ray):
    r = api.post("/v1/jobs/batch", json={"jobs": [
        {"name": "train", "kind": "training", "entrypoint": "funcs:where",
         "resources": {"num_workers": 1, "cpus_per_worker": 0.5}},
        {"name": "report", "kind": "command", "depends_on": ["train"],
         "entrypoint": "python -c 'import os; print(\"PARENTS=\" + os.environ[\"RAYLANE_PARENTS\"])'"},
        {"name": "broken", "kind": "command", "entrypoint": "exit 3", "retry": {"max_attempts": 1}},
        {"name": "after-broken", "kind": "command", "entrypoint": "echo never", "depends_on": ["broken"]},
    ]})
    assert r.status_code == 201, r.text
    train, report, broken, after = r.json()["ids"]
    assert job(api, report)["status_reason"] == f"waiting for parents: {train} to succeed"

    def outcome(sub):
        if sub.metadata["raylane_job_id"] == train:
            return Outcome(result={"workers": 1})
        if sub.metadata["raylane_job_id"] == broken:
            return Outcome("FAILED", exit_code=3)
        return Outcome()

    ray.autorun = outcome
    done = run_until(cp, lambda: (lambda x: x if x["status"] in TERMINAL else None)(job(api, report)), "report")
    assert done["status"] == "SUCCEEDED", done["status_reason"]
    trained = job(api, train)
    assert trained["status"] == "SUCCEEDED"
    # The child started after its parent ended, and was told the parent's result and storage.
    assert done["started_at"] >= trained["finished_at"]
    parents = json.loads(ray.submission(submission_id(report, 1)).env[Env.PARENTS])
    assert parents[train]["status"] == "SUCCEEDED" and parents[train]["result"] == trained["result"] == {"workers": 1}
    assert parents[train]["storage"].endswith(f"/default/{train}")

    assert job(api, broken)["status"] == "FAILED" and job(api, broken)["failure_cause"]
    skipped = job(api, after)
    assert skipped["status"] == "CANCELLED"
    assert skipped["status_reason"] == f"parent {broken} ended FAILED; this job needed it to succeed"
    assert skipped["attempts"] == 0  # never reached Ray
    assert submission_id(after, 1) not in ray.jobs
