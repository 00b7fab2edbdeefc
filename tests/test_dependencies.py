"""Dependencies (issue #18, point 1) without Ray: a child waits out of the queue
with a reason naming its parents, is queued when they end as it needs, is
cancelled (and its own children with it) when one ends otherwise; a parent that
already ended is judged at submit; pipelines in one batch by name, cycles
refused; a child is told its parents' results and storage. Parents are moved
through their statuses with the store's own transitions, as the loops do.
tests/ray/test_dependencies.py runs a pipeline on the cluster."""

from __future__ import annotations

import json

import pytest

from raylane.orchestrator.domain.states import JobStatus
from raylane.orchestrator.store import db, dependencies, queue
from raylane.orchestrator.store.jobs import set_result
from raylane.orchestrator.store.transitions import transition, utcnow

HELLO = {"name": "step", "kind": "command", "entrypoint": "echo hi"}
PATH = {"SUCCEEDED": ["DISPATCHING", "RUNNING", "SUCCEEDED"], "FAILED": ["DISPATCHING", "RUNNING", "FAILED"]}


def _submit(api, name="step", **spec):
    r = api.post("/v1/jobs", json={**HELLO, "name": name, **spec})
    assert r.status_code == 201, r.text
    return r.json()


def _end(cp, job_id, status: str):
    with db.transaction(cp.sessions) as s:
        if status == "CANCELLED":
            transition(s, job_id, JobStatus.CANCELLED, reason="test", actor="t")
            return
        for to in PATH[status]:
            transition(s, job_id, JobStatus(to), reason="test", actor="t",
                       values={"finished_at": utcnow()} if to == status else None)


def _queued(cp) -> set[str]:
    with db.transaction(cp.sessions) as s:
        return {q.id for q in queue.queued(s, now=utcnow())}


def _job(api, job_id):
    return api.get(f"/v1/jobs/{job_id}").json()


def test_a_child_waits_out_of_the_queue_until_its_parent_succeeds(api, cp):
    parent = _submit(api, "train")
    child = _submit(api, "eval", depends_on=[parent["id"]])
    assert child["status"] == "PENDING" and child["status_reason"] == f"waiting for parents: {parent['id']} to succeed"
    assert _queued(cp) == {parent["id"]}  # admission never sees the child
    _end(cp, parent["id"], "SUCCEEDED")
    child = _job(api, child["id"])
    assert child["status"] == "PENDING" and child["status_reason"].startswith("parents done")
    assert _queued(cp) == {child["id"]}


def test_a_failed_parent_cancels_its_children_and_theirs(api, cp):
    parent = _submit(api, "train")
    child = _submit(api, "eval", depends_on=[{"job": parent["id"]}])
    grandchild = _submit(api, "score", depends_on=[child["id"]])
    _end(cp, parent["id"], "FAILED")
    child, grandchild = _job(api, child["id"]), _job(api, grandchild["id"])
    assert child["status"] == "CANCELLED"
    assert child["status_reason"] == f"parent {parent['id']} ended FAILED; this job needed it to succeed"
    assert grandchild["status"] == "CANCELLED" and child["id"] in grandchild["status_reason"]
    assert _queued(cp) == set()


@pytest.mark.parametrize("on, ends, queued", [
    ("failed", "FAILED", True), ("failed", "SUCCEEDED", False),
    ("finished", "CANCELLED", True), ("finished", "FAILED", True), ("succeeded", "CANCELLED", False),
])
def test_the_condition_decides(api, cp, on, ends, queued):
    parent = _submit(api, "p")
    child = _submit(api, "c", depends_on=[{"job": parent["id"], "on": on}])
    _end(cp, parent["id"], ends)
    assert (child["id"] in _queued(cp)) is queued
    assert _job(api, child["id"])["status"] == ("PENDING" if queued else "CANCELLED")


def test_a_child_waits_for_every_parent(api, cp):
    a, b = _submit(api, "a"), _submit(api, "b")
    child = _submit(api, "c", depends_on=[a["id"], {"job": b["id"], "on": "finished"}])
    assert child["status_reason"] == f"waiting for parents: {a['id']} to succeed, {b['id']} to finish"
    _end(cp, a["id"], "SUCCEEDED")
    assert child["id"] not in _queued(cp)
    _end(cp, b["id"], "FAILED")
    assert child["id"] in _queued(cp)


def test_a_parent_that_already_ended_is_judged_at_submit(api, cp):
    done, failed = _submit(api, "done"), _submit(api, "failed")
    _end(cp, done["id"], "SUCCEEDED")
    _end(cp, failed["id"], "FAILED")
    child = _submit(api, "c", depends_on=[done["id"]])
    assert child["id"] in _queued(cp) and not child["status_reason"].startswith("waiting for parents")
    r = api.post("/v1/jobs", json={**HELLO, "name": "never", "depends_on": [done["id"], failed["id"]]})
    assert r.status_code == 422 and "depends_on.1.job" in r.text
    assert f"job {failed['id']} already ended FAILED; this job needs it to succeed" in r.text
    assert api.get("/v1/jobs", params={"name_prefix": "never"}).json()["items"] == []


def test_unknown_or_other_projects_parents_are_refused(api, cp):
    assert api.post("/v1/projects", json={"name": "other"}).status_code == 201
    theirs = _submit(api, "theirs", project="other")
    for parent in ("01nosuchjob0000000000000000", theirs["id"]):
        r = api.post("/v1/jobs", json={**HELLO, "depends_on": [parent]})
        assert r.status_code == 422 and "not found in project default" in r.text and "depends_on.0.job" in r.text
    r = api.post("/v1/jobs", json={**HELLO, "depends_on": [theirs["id"], theirs["id"]]})
    assert r.status_code == 422
    r = api.post("/v1/jobs", json={**HELLO, "depends_on": [{"job": theirs["id"], "on": "sometimes"}]})
    assert r.status_code == 422 and "depends_on" in r.text


def test_a_pipeline_in_one_batch_by_name(api, cp):
    r = api.post("/v1/jobs/batch", json={"jobs": [
        {**HELLO, "name": "train"},
        {**HELLO, "name": "sweep", "depends_on": ["train"]},
        {**HELLO, "name": "score", "depends_on": [{"job": "sweep"}]},
    ]})
    assert r.status_code == 201, r.text
    train, sweep, score = r.json()["ids"]
    assert _queued(cp) == {train}
    assert _job(api, sweep)["spec"]["depends_on"] == [{"job": train, "on": "succeeded"}]  # stored by id
    assert _job(api, score)["status_reason"] == f"waiting for parents: {sweep} to succeed"
    _end(cp, train, "SUCCEEDED")
    assert _queued(cp) == {sweep}
    _end(cp, sweep, "SUCCEEDED")
    assert _queued(cp) == {score}


@pytest.mark.parametrize("jobs, where", [
    ([{"name": "a", "depends_on": ["b"]}, {"name": "b", "depends_on": ["a"]}], "jobs.0.depends_on"),
    ([{"name": "a", "depends_on": ["a"]}], "jobs.0.depends_on"),
    ([{"name": "a", "depends_on": ["c"]}, {"name": "b", "depends_on": ["a"]}, {"name": "c", "depends_on": ["b"]}],
     "depends_on"),
])
def test_cycles_in_a_batch_are_refused(api, jobs, where):
    r = api.post("/v1/jobs/batch", json={"jobs": [{**HELLO, **j} for j in jobs]})
    assert r.status_code == 422 and "cycle" in r.text and where in r.text, r.text
    assert api.get("/v1/jobs").json()["items"] == []


def test_a_child_is_told_its_parents_results_and_storage(api, cp):
    small, big = _submit(api, "small"), _submit(api, "big")
    child = _submit(api, "c", depends_on=[small["id"], big["id"]])
    with db.transaction(cp.sessions) as s:
        set_result(s, small["id"], {"best_lr": 0.001})
        set_result(s, big["id"], {"blob": "x" * (dependencies.MAX_PARENTS_JSON + 10)})
    with db.transaction(cp.sessions) as s:
        told = json.loads(dependencies.parents_json(s, child["id"], storage=lambda p, j: f"s3://b/{p}/{j}"))
    assert told[small["id"]] == {"name": "small", "status": "PENDING", "storage": f"s3://b/default/{small['id']}",
                                 "result": {"best_lr": 0.001}}
    assert "result" not in told[big["id"]] and "GET /v1/jobs/" in told[big["id"]]["result_omitted"]


@pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)  # SQLite has one writer: no such window
def test_a_parent_ending_while_its_child_is_submitted_is_seen(cp, db_url, monkeypatch):
    """PostgreSQL, READ COMMITTED: another replica ends the parent between the
    child's check of it and the child's commit. The parent's row is locked by the
    check, so that end waits for the child's commit and then counts it."""
    import threading

    import psycopg

    from raylane.orchestrator.domain.specs import JobSpec
    from raylane.orchestrator.store import jobs as store_jobs
    from tests.helpers import wait_for

    with db.transaction(cp.sessions) as s:
        pid, _ = store_jobs.submit(s, JobSpec(name="p", kind="command", entrypoint="echo"), project="default")
        for to in ("DISPATCHING", "RUNNING"):
            transition(s, pid, JobStatus(to), reason="t", actor="t")

    def end_parent():
        with db.transaction(cp.sessions) as s2:
            transition(s2, pid, JobStatus.SUCCEEDED, reason="t", actor="another replica")

    other = threading.Thread(target=end_parent)
    real = dependencies.resolve

    def racing(*a, **k):
        out = real(*a, **k)
        other.start()  # the parent's end arrives now, before this submit commits
        dsn = db_url.replace("postgresql+psycopg://", "postgresql://")
        with psycopg.connect(dsn, autocommit=True) as conn:
            wait_for(lambda: not other.is_alive() or conn.execute(
                "SELECT count(*) FROM pg_locks WHERE NOT granted").fetchone()[0] > 0, timeout=10, what="the end to block")
        return out

    monkeypatch.setattr(dependencies, "resolve", racing)
    with db.transaction(cp.sessions) as s:
        cid, _ = store_jobs.submit(s, JobSpec(name="c", kind="command", entrypoint="echo", depends_on=[pid]),
                                   project="default")
    other.join(30)
    assert cid in _queued(cp), "the child waits for a parent that already succeeded"


def test_long_chains_cancel_and_check_without_recursion(api, cp):
    n = 1000  # RAYLANE_MAX_BATCH_JOBS
    chain = [{**HELLO, "name": f"s{i}", **({"depends_on": [f"s{i - 1}"]} if i else {})} for i in range(n)]
    r = api.post("/v1/jobs/batch", json={"jobs": chain})
    assert r.status_code == 201, r.text[:300]
    ids = r.json()["ids"]
    assert api.post(f"/v1/jobs/{ids[0]}/cancel").status_code == 200  # the whole chain ends with it
    last = _job(api, ids[-1])
    assert last["status"] == "CANCELLED" and ids[-2] in last["status_reason"]
    ring = [{**HELLO, "name": f"r{i}", "depends_on": [f"r{(i + 1) % n}"]} for i in range(n)]
    r = api.post("/v1/jobs/batch", json={"jobs": ring})
    assert r.status_code == 422 and "cycle" in r.text


def test_an_array_waits_for_its_parents_then_runs_within_max_parallel(api, cp):
    parent = _submit(api, "prep")
    r = api.post("/v1/arrays", json={**HELLO, "name": "shard", "depends_on": [parent["id"]],
                                      "array": {"size": 6, "max_parallel": 2}})
    assert r.status_code == 201, r.text
    aid = r.json()["id"]
    members = api.get("/v1/jobs", params={"label": f"raylane.array={aid}", "limit": 50}).json()["items"]
    assert len(members) == 6 and not (_queued(cp) & {m["id"] for m in members})  # none before the parent
    assert all(m["spec"]["depends_on"] == [{"job": parent["id"], "on": "succeeded"}] for m in members)
    # Held or not, each says first what it waits for: its parent.
    assert {m["status_reason"] for m in members} == {f"waiting for parents: {parent['id']} to succeed"}
    _end(cp, parent["id"], "SUCCEEDED")
    queued = _queued(cp) & {m["id"] for m in members}
    assert len(queued) == 2  # the parent done: max_parallel members, the rest still held
    reasons = sorted(_job(api, m["id"])["status_reason"] for m in members)
    assert sum(x.endswith("; held by its array's max_parallel") for x in reasons) == 4, reasons
    assert sum(x.endswith("; queued") for x in reasons) == 2, reasons


def test_an_array_whose_parent_fails_is_cancelled_whole(api, cp):
    """Held members go first, so no cancel releases a member about to be cancelled
    (each release would scan the array: quadratic in its size, in one transaction)."""
    from sqlalchemy import func, select

    from raylane.orchestrator.store.tables import events

    parent = _submit(api, "prep")
    aid = api.post("/v1/arrays", json={**HELLO, "name": "shard", "depends_on": [parent["id"]],
                                       "array": {"size": 300, "max_parallel": 2}}).json()["id"]
    _end(cp, parent["id"], "FAILED")
    arr = api.get(f"/v1/arrays/{aid}").json()
    assert arr["counts"] == {"CANCELLED": 300} and arr["held"] == 0
    with db.transaction(cp.sessions) as s:
        released = s.execute(select(func.count()).select_from(events).where(
            events.c.reason.like("released:%"))).scalar_one()
    assert released == 0
    members = api.get("/v1/jobs", params={"label": f"raylane.array={aid}", "limit": 500}).json()["items"]
    assert len(members) == 300 and {m["status_reason"] for m in members} == {
        f"parent {parent['id']} ended FAILED; this job needed it to succeed"}


def test_an_array_names_its_parents_by_id(api):
    r = api.post("/v1/arrays", json={**HELLO, "name": "shard", "depends_on": ["prep"], "array": {"size": 2}})
    assert r.status_code == 422 and "depends_on.0.job" in r.text and "not found" in r.text
