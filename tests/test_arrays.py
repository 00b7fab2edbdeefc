"""Arrays (issue #18, point 2) without Ray: members named and labelled by index,
held past max_parallel and never queued while held, released one by one as
members end (also when several end at once on PostgreSQL), cancel and retry of
the whole array, counts per status, and bad arrays refused with the field named.
tests/test_loops_on_fake_ray.py runs one through the loops against the in-memory Ray."""

from __future__ import annotations

import threading

import pytest

from raylane.orchestrator.domain.specs import ARRAY_INDEX_LABEL, ARRAY_LABEL, JobSpec
from raylane.orchestrator.domain.states import TERMINAL
from raylane.orchestrator.store import db, queue
from raylane.orchestrator.store.tables import jobs
from raylane.orchestrator.store.transitions import utcnow

SPEC = {"name": "shard", "kind": "command", "entrypoint": "echo $RAYLANE_ARRAY_INDEX"}


def _array(api, size=12, max_parallel=3, **spec):
    r = api.post("/v1/arrays", json={**SPEC, **spec, "array": {"size": size, "max_parallel": max_parallel}})
    assert r.status_code == 201, r.text
    return r.json()


def _members(api, aid) -> list[dict]:
    items = api.get("/v1/jobs", params={"label": f"{ARRAY_LABEL}={aid}", "limit": 500}).json()["items"]
    return sorted(items, key=lambda j: (int(j["labels"][ARRAY_INDEX_LABEL]), j["id"]))


def _queued_ids(cp) -> set[str]:
    with db.transaction(cp.sessions) as s:
        return {q.id for q in queue.queued(s, now=utcnow())}


def _unheld_unfinished(cp, aid) -> int:
    from sqlalchemy import func, select

    with db.transaction(cp.sessions) as s:
        return s.execute(select(func.count()).select_from(jobs).where(
            jobs.c.array_id == aid, jobs.c.array_held.is_(False),
            jobs.c.status.not_in([t.value for t in TERMINAL]))).scalar_one()


def test_members_are_named_labelled_and_held_past_max_parallel(api, cp):
    arr = _array(api)
    assert arr["size"] == 12 and arr["max_parallel"] == 3
    assert arr["counts"] == {"PENDING": 12} and arr["held"] == 9
    members = _members(api, arr["id"])
    assert [m["name"] for m in members] == [f"shard-{i}" for i in range(12)]
    assert [m["labels"][ARRAY_INDEX_LABEL] for m in members] == [str(i) for i in range(12)]
    assert all(m["spec"].get("array") is None for m in members)  # a member is a plain job
    held = [m for m in members if m["status_reason"].startswith("held:")]
    assert [m["name"] for m in held] == [f"shard-{i}" for i in range(3, 12)]
    # The queue never reads a held member: admission sees three.
    assert _queued_ids(cp) == {m["id"] for m in members[:3]}


def test_an_ending_member_releases_the_next_one(api, cp):
    arr = _array(api)
    members = _members(api, arr["id"])
    assert api.post(f"/v1/jobs/{members[0]['id']}/cancel").status_code == 200
    assert _queued_ids(cp) == {m["id"] for m in members[1:4]}  # index 3 took its place
    events = api.get(f"/v1/jobs/{members[3]['id']}/events").json()
    assert any("released" in (e["reason"] or "") for e in events)
    assert api.get(f"/v1/arrays/{arr['id']}").json()["held"] == 8


def test_members_ending_together_never_release_past_the_bound(api, cp):
    arr = _array(api, size=30, max_parallel=5)
    members = _members(api, arr["id"])
    barrier = threading.Barrier(5)

    def end(job_id):
        barrier.wait()
        cp.cancel(job_id, project=None, actor="t")

    threads = [threading.Thread(target=end, args=(m["id"],)) for m in members[:5]]
    [t.start() for t in threads]
    [t.join() for t in threads]
    assert _unheld_unfinished(cp, arr["id"]) == 5
    assert api.get(f"/v1/arrays/{arr['id']}").json()["held"] == 20


def test_cancel_then_retry_the_whole_array(api, cp):
    arr = _array(api, size=6, max_parallel=2)
    out = api.post(f"/v1/arrays/{arr['id']}/cancel").json()
    assert len(out["jobs"]) == 6 and out["array"]["counts"] == {"CANCELLED": 6} and out["array"]["held"] == 0
    assert api.post(f"/v1/arrays/{arr['id']}/retry", params={"failed_only": True}).json()["jobs"] == []
    again = api.post(f"/v1/arrays/{arr['id']}/retry").json()
    assert len(again["jobs"]) == 6
    assert again["array"]["counts"] == {"PENDING": 6} and again["array"]["held"] == 4  # newest job per index
    assert len(_members(api, arr["id"])) == 12
    assert _queued_ids(cp) == set(again["jobs"][:2])


def test_an_array_without_max_parallel_holds_nothing(api, cp):
    r = api.post("/v1/arrays", json={**SPEC, "array": {"size": 4}})
    assert r.status_code == 201 and r.json()["held"] == 0
    assert len(_queued_ids(cp)) == 4


def test_a_members_runner_inputs_carry_its_index(tmp_path):
    from raylane.orchestrator.domain.protocol import Env
    from raylane.orchestrator.domain.views import Placement
    from raylane.orchestrator.loops.dispatcher import runner_env
    from raylane.orchestrator.store.arrays import member_spec

    spec = member_spec(JobSpec.model_validate({**SPEC, "array": {"size": 9}}), "arr_00ff", 7)
    pl = Placement(node_group="cpu", market="ON_DEMAND", strategy="PACK", colocate=False, num_workers=1,
                   worker_resources={"CPU": 1}, label_selector={}, total={"CPU": 1}, reasons=[])
    env = runner_env("01job", 1, "default", spec, pl, tmp_path)
    assert env[Env.ARRAY_ID] == "arr_00ff" and env[Env.ARRAY_INDEX] == "7"
    plain = runner_env("01job", 1, "default", JobSpec.model_validate(SPEC), pl, tmp_path)
    assert Env.ARRAY_INDEX not in plain


@pytest.mark.parametrize("body, field", [
    ({**SPEC, "array": {"size": 0}}, "size"),
    ({**SPEC, "array": {"size": 10_001}}, "size"),
    ({**SPEC, "array": {"size": 3, "max_parallel": 0}}, "max_parallel"),
    ({**SPEC, "array": {"size": 3, "extra": 1}}, "extra"),
    ({**SPEC}, "array"),
    ({**SPEC, "name": "n" * 127, "array": {"size": 100}}, "name"),
])
def test_bad_arrays_are_refused_naming_the_field(api, body, field):
    r = api.post("/v1/arrays", json=body)
    assert r.status_code == 422, r.text
    assert field in str(r.json()["detail"])
    assert api.get("/v1/jobs").json()["items"] == []


def test_an_array_spec_is_refused_where_a_job_is_expected(api):
    body = {**SPEC, "array": {"size": 2}}
    r = api.post("/v1/jobs", json=body)
    assert r.status_code == 422 and "POST /v1/arrays" in r.text and "array" in str(r.json()["detail"])
    r = api.post("/v1/jobs/batch", json={"jobs": [body]})
    assert r.status_code == 422 and "jobs.0.array" in str(r.json()["detail"])
    assert api.get("/v1/jobs").json()["items"] == []
