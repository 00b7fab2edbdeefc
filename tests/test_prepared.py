"""``store.prepared``: a row inserted through a prepared insert reads back the same
as one inserted by ``insert(table)``, on SQLite and PostgreSQL (types, defaults,
JSON, UTC datetimes), and a unique violation is still SQLAlchemy's IntegrityError.
Deferred rows (PostgreSQL: sent at commit as one statement) are all stored or none."""

from __future__ import annotations

import pytest
from sqlalchemy import event, func, insert, select
from sqlalchemy.exc import IntegrityError

from raylane.orchestrator.domain.ids import new_job_id
from raylane.orchestrator.domain.specs import JobSpec
from raylane.orchestrator.store import db, tallies
from raylane.orchestrator.store.jobs import _job_row
from raylane.orchestrator.store.prepared import PreparedInsert
from raylane.orchestrator.store.tables import audit_log, events, job_labels, jobs
from raylane.orchestrator.store.transitions import utcnow

SPEC = JobSpec(name="p", kind="command", entrypoint="echo 'a \"b\"' %s", labels={"k": "v"})


def _row():
    r = _job_row(SPEC, project="default", job_id=new_job_id(), now=utcnow(), placement=None,
                 idempotency_key="key-" + new_job_id(), reason=None)
    del r["skips"], r["preemptions"]  # left to their column defaults
    return r


def test_a_prepared_row_reads_back_as_an_inserted_one(cp):
    prepared = PreparedInsert(jobs)
    a, b = _row(), _row()
    b["created_at"] = b["updated_at"] = a["created_at"]
    with db.transaction(cp.sessions) as s:
        prepared.execute(s, a)
        s.execute(insert(jobs), b)
        PreparedInsert(job_labels).execute(s, [{"job_id": a["id"], "key": "x", "value": "1"},
                                               {"job_id": a["id"], "key": "y", "value": "2"}])
    with db.transaction(cp.sessions) as s:
        got = {r["id"]: dict(r) for r in s.execute(select(jobs)).mappings()}
        labels = dict(s.execute(select(job_labels.c.key, job_labels.c.value)).all())
    ra, rb = got[a["id"]], got[b["id"]]
    for r in (ra, rb):
        r.pop("id"), r.pop("idempotency_key")
    assert ra == rb
    assert ra["spec"] == SPEC.model_dump(mode="json", exclude_none=True) and ra["skips"] == 0
    assert ra["created_at"] == a["created_at"] and ra["created_at"].tzinfo is not None
    assert labels == {"x": "1", "y": "2"}


def test_a_duplicate_is_an_integrity_error(cp):
    row = _row()
    with pytest.raises(IntegrityError):
        with db.transaction(cp.sessions) as s:
            PreparedInsert(jobs).execute(s, row)
            PreparedInsert(jobs).execute(s, row)


# Deferred rows (PreparedInsert.defer) ---------------------------------------------


def _writes(engine):
    """The INSERT statements (a WITH of them counts once) the engine sends, as a list."""
    sent = []

    def note(conn, cursor, statement, parameters, context, executemany):
        if statement.lstrip().upper().startswith(("INSERT", "WITH")):
            sent.append(statement)

    event.listen(engine, "before_cursor_execute", note)
    return sent, lambda: event.remove(engine, "before_cursor_execute", note)


def test_a_submits_rows_are_one_statement_on_postgresql_and_all_stored(api, cp):
    sent, stop = _writes(cp.engine)
    try:
        r = api.post("/v1/jobs", json={"name": "one", "kind": "command", "entrypoint": "echo hi",
                                       "labels": {"team": "a", "tier": "b"}})
    finally:
        stop()
    assert r.status_code == 201, r.text
    job_id = r.json()["id"]
    # PostgreSQL: the job, its two labels, its event, the audit row and the
    # tallies' upsert in one statement. SQLite: a statement (an executemany) a table.
    assert len(sent) == (1 if cp.engine.dialect.name == "postgresql" else 5), sent
    with db.transaction(cp.sessions) as s:
        assert s.execute(select(jobs.c.status).where(jobs.c.id == job_id)).scalar_one() == "PENDING"
        assert dict(s.execute(select(job_labels.c.key, job_labels.c.value)
                              .where(job_labels.c.job_id == job_id)).all()) == {"team": "a", "tier": "b"}
        assert s.execute(select(events.c.to_status).where(events.c.job_id == job_id)).scalars().all() == ["PENDING"]
        assert s.execute(select(audit_log.c.status_code).where(audit_log.c.target == job_id)).scalars().all() == [201]
        assert tallies.read(s, ["jobs"]) == {("jobs", "PENDING", "none"): 1}
    assert api.get(f"/v1/jobs/{job_id}").json()["labels"] == {"team": "a", "tier": "b"}


def test_deferred_rows_go_parents_first_whatever_order_they_were_deferred_in(cp):
    """A group commit's units defer rows of several tables in turn: an event for a
    job stored earlier, then a new job and its event. Sent a table at a time
    (SQLite: an executemany each, whose foreign keys are checked row by row),
    the jobs go before the events that reference them."""
    old, new = _row(), _row()
    with db.transaction(cp.sessions) as s:
        PreparedInsert(jobs).execute(s, old)

    def ev(job_id):
        return {"job_id": job_id, "at": utcnow(), "from_status": None, "to_status": "PENDING", "reason": "t",
                "actor": "t", "attempt": None}

    with db.transaction(cp.sessions) as s:
        PreparedInsert(events).defer(s, ev(old["id"]))
        PreparedInsert(jobs).defer(s, new)
        PreparedInsert(events).defer(s, ev(new["id"]))
    with db.transaction(cp.sessions) as s:
        assert sorted(s.execute(select(events.c.job_id)).scalars()) == sorted([old["id"], new["id"]])


def test_deferred_rows_go_with_the_commit_or_not_at_all(cp):
    first, second, third = _row(), _row(), _row()
    with pytest.raises(RuntimeError):
        with db.transaction(cp.sessions) as s:
            PreparedInsert(jobs).defer(s, first)
            raise RuntimeError("rolled back")
    # A savepoint's rows run at once: its rollback drops them, the rest commits.
    with db.transaction(cp.sessions) as s:
        with pytest.raises(RuntimeError):
            with s.begin_nested():
                PreparedInsert(jobs).defer(s, second)
                raise RuntimeError("savepoint rolled back")
        PreparedInsert(jobs).defer(s, third)
        PreparedInsert(job_labels).defer(s, [{"job_id": third["id"], "key": "x", "value": "1"},
                                             {"job_id": third["id"], "key": "y", "value": "2"}])
        tallies.add(s, "jobs_created", "command")
    with db.transaction(cp.sessions) as s:
        assert s.execute(select(jobs.c.id)).scalars().all() == [third["id"]]
        assert dict(s.execute(select(job_labels.c.key, job_labels.c.value)).all()) == {"x": "1", "y": "2"}
        assert tallies.read(s, ["jobs_created"]) == {("jobs_created", "command", ""): 1}


def test_a_deferred_row_that_breaks_a_constraint_fails_its_commit_and_keeps_nothing(cp):
    row = _row()
    with pytest.raises(IntegrityError):
        with db.transaction(cp.sessions) as s:
            PreparedInsert(jobs).defer(s, row)
            PreparedInsert(job_labels).defer(s, {"job_id": "no-such-job", "key": "x", "value": "1"})
    with db.transaction(cp.sessions) as s:
        assert s.execute(select(jobs.c.id)).scalars().all() == []
        assert s.execute(select(job_labels.c.key)).scalars().all() == []


def test_deferred_rows_survive_a_savepoint_that_commits_inside_one_rolled_back(cp):
    """SQLAlchemy runs the commit hook at a savepoint's commit too: deferred rows wait
    for the transaction's own commit, so rolling back an enclosing savepoint keeps them."""
    row = _row()
    with db.transaction(cp.sessions) as s:
        PreparedInsert(jobs).defer(s, row)
        with pytest.raises(RuntimeError):
            with s.begin_nested():
                with s.begin_nested():
                    tallies.add(s, "jobs_created", "command")
                raise RuntimeError("outer savepoint rolled back")
    with db.transaction(cp.sessions) as s:
        assert s.execute(select(jobs.c.id)).scalars().all() == [row["id"]]
        assert tallies.read(s, ["jobs_created"]) == {}


def test_past_the_parameter_bound_what_waits_is_sent_first(cp, monkeypatch):
    """PostgreSQL: a row that would take the deferred statement past its bound of
    parameters sends what waits (in order: a row may reference it) and waits
    itself; one over the bound alone executes at once. SQLite has no such bound."""
    from raylane.orchestrator.store import prepared

    monkeypatch.setattr(prepared, "MAX_DEFERRED_PARAMS", 40)  # a job row is ~30
    first, second = _row(), _row()
    sent, stop = _writes(cp.engine)
    pg = cp.engine.dialect.name == "postgresql"
    try:
        with db.transaction(cp.sessions) as s:
            PreparedInsert(jobs).defer(s, first)
            PreparedInsert(jobs).defer(s, second)
            assert len(sent) == (1 if pg else 0)  # PostgreSQL: the first went, the second waits
            PreparedInsert(jobs).defer(s, [_row(), _row()])  # ~60 parameters: over the bound alone
            assert len(sent) == (3 if pg else 0)  # the second, then these two at once
    finally:
        stop()
    with db.transaction(cp.sessions) as s:
        assert {first["id"], second["id"]} <= set(s.execute(select(jobs.c.id)).scalars())
        assert s.execute(select(func.count()).select_from(jobs)).scalar_one() == 4


# Many rows at once (PreparedInsert.execute_many: a batch) -------------------------


@pytest.mark.parametrize("encoded", [("spec",), ("spec", "placement")])
def test_execute_many_reads_back_as_inserted_rows_with_common_and_encoded_values(cp, monkeypatch, encoded):
    """Common values bound once, the spec given as its JSON text: the rows read back
    as ``insert(table)``'s do. PostgreSQL takes them by COPY (no statement); SQLite
    in one executemany whose statement lists the rows' own columns first."""
    spec = JobSpec(name="p", kind="command", entrypoint="echo 'ü \"b\"' %s \\n", labels={"k": "v"})
    now = utcnow()
    many = []
    for _ in range(11):
        r = _job_row(spec, project="default", job_id=new_job_id(), now=now, placement=None,
                     idempotency_key=None, reason=None)
        many.append(r)
    reference = _job_row(spec, project="default", job_id=new_job_id(), now=now, placement=None,
                         idempotency_key=None, reason=None)
    common = {k: many[0][k] for k in ("project", "created_at", "updated_at", "attempts", "cancel_requested")}
    given = [{k: v for k, v in r.items() if k not in common} for r in many]
    for r in given:
        r["spec"] = spec.model_dump_json(exclude_none=True)
        if "placement" in encoded:
            r["placement"] = "null"
    sent, stop = _writes(cp.engine)
    try:
        with db.transaction(cp.sessions) as s:
            PreparedInsert(jobs).execute_many(s, given, common=common, encoded=encoded)
            s.execute(insert(jobs), reference)
    finally:
        stop()
    # + the reference's insert
    if cp.engine.dialect.name == "postgresql":
        assert len(sent) == 1, sent  # the reference's INSERT; the eleven went by COPY
    else:
        assert len(sent) == 2 and sent[0].count("?") == 22, sent  # a row's 20 columns and the 2 with defaults
        head = sent[0].split(") VALUES")[0]
        assert head.index("project") > head.index("name"), head  # the shared values last
    with db.transaction(cp.sessions) as s:
        got = {r["id"]: dict(r) for r in s.execute(select(jobs)).mappings()}
    want = got.pop(reference["id"])
    want.pop("id")
    assert sorted(got) == sorted(r["id"] for r in many)
    for row in got.values():
        row.pop("id")
        assert row == want
    assert want["spec"]["entrypoint"] == "echo 'ü \"b\"' %s \\n"


def test_execute_many_fails_as_any_statement_does_and_stores_nothing(cp):
    """A row the database refuses (a label of no job) is SQLAlchemy's IntegrityError
    on both databases (PostgreSQL's rows go by COPY, outside SQLAlchemy's execute),
    the transaction rolls back, and the pooled connection serves the next one."""
    rows = [{"job_id": f"nope{i}", "key": "k", "value": "v"} for i in range(3)]
    with pytest.raises(IntegrityError):
        with db.transaction(cp.sessions) as s:
            PreparedInsert(job_labels).execute_many(s, rows)
    with db.transaction(cp.sessions) as s:
        assert s.execute(select(func.count()).select_from(job_labels)).scalar_one() == 0
        job = _job_row(JobSpec(name="p", kind="command", entrypoint="true"), project="default",
                       job_id=new_job_id(), now=utcnow(), placement=None, idempotency_key=None, reason=None)
        s.execute(insert(jobs), job)
        PreparedInsert(job_labels).execute_many(s, [{"job_id": job["id"], "key": "k", "value": "v\t\n\\ \u00fc"}])
    with db.transaction(cp.sessions) as s:
        assert s.execute(select(job_labels.c.value)).scalars().all() == ["v\t\n\\ \u00fc"]  # COPY's escapes


def test_execute_many_refuses_rows_with_other_keys(cp):
    a, b = {"job_id": "j1", "key": "k", "value": "v"}, {"job_id": "j2", "key": "k"}
    with db.transaction(cp.sessions) as s:
        with pytest.raises(ValueError, match="same keys"):
            PreparedInsert(job_labels).execute_many(s, [a, b])
        with pytest.raises(ValueError, match="same keys"):
            PreparedInsert(job_labels).execute_many(s, [a], common={"value": "w"})


def test_execute_many_of_nothing_sends_nothing(cp):
    sent, stop = _writes(cp.engine)
    try:
        with db.transaction(cp.sessions) as s:
            PreparedInsert(job_labels).execute_many(s, [])
    finally:
        stop()
    assert sent == []


@pytest.mark.parametrize("routed", [False, True])
def test_a_batch_stores_what_single_submits_store(cp, routed):
    """The batch path builds its rows its own way (``_batch_row``, common values,
    the spec's JSON text, as the API hands it from ``check_exec_size``): a job
    submitted in a batch reads back as one submitted alone, and an unrouted job's
    placement is JSON null on both paths, not SQL NULL."""
    from sqlalchemy import func

    from raylane.orchestrator.domain.specs import check_exec_size
    from raylane.orchestrator.domain.views import Placement
    from raylane.orchestrator.store import jobs as store_jobs

    spec = JobSpec(name="same", kind="command", entrypoint="python -c 'print(\"ü\")'", labels={"a": "1", "b": "2"},
                   priority=7)
    placement = Placement(node_group="cpu-spot", market="SPOT", strategy="SPREAD", colocate=False, num_workers=1,
                          worker_resources={"CPU": 1.0}, label_selector={"group": "cpu-spot"},
                          reasons=["CPU work: spot"]) if routed else None
    with db.transaction(cp.sessions) as s:
        alone, _ = store_jobs.submit(s, spec, project="default", actor="me", placement=placement)
        batch = store_jobs.submit_batch(s, [spec, spec], project="default", actor="me",
                                        placements=[placement, placement] if routed else None,
                                        texts=[check_exec_size(spec)] * 2)
        with pytest.raises(ValueError, match="texts"):
            store_jobs.submit_batch(s, [spec, spec], project="default", actor="me", texts=[check_exec_size(spec)])
    with db.transaction(cp.sessions) as s:
        assert s.execute(select(func.count()).select_from(jobs).where(jobs.c.placement.is_(None))).scalar() == 0
        rows = {r["id"]: dict(r) for r in s.execute(select(jobs)).mappings()}
        for job_id in [alone, *batch]:
            assert dict(s.execute(select(job_labels.c.key, job_labels.c.value)
                                  .where(job_labels.c.job_id == job_id)).all()) == {"a": "1", "b": "2"}
            ev = s.execute(select(events).where(events.c.job_id == job_id)).mappings().one()
            assert (ev["to_status"], ev["actor"], ev["from_status"]) == ("PENDING", "me", None)
        group = "cpu-spot" if routed else "none"
        assert tallies.read(s, ["jobs"]) == {("jobs", "PENDING", group): 3}
        assert tallies.read(s, ["jobs_created"]) == {("jobs_created", "command", ""): 3}
    assert rows[alone]["placement"] == (placement.model_dump(mode="json") if routed else None)
    skip = {"id", "created_at", "updated_at"}
    a = {k: v for k, v in rows[alone].items() if k not in skip}
    for job_id in batch:
        assert {k: v for k, v in rows[job_id].items() if k not in skip} == a


def test_a_submits_statement_is_parsed_once_by_psycopg(pg_template, tmp_path, monkeypatch):
    """PostgreSQL only (psycopg's parser). A submit's one statement (~6 KB, ~60
    parameters) is over psycopg's own cache bounds; ``db.make_engine`` raises them,
    so submits after the first reuse its parse instead of running the regex again."""
    from fastapi.testclient import TestClient
    from psycopg import _queries

    from raylane.api.app import create_app
    from raylane.orchestrator.services.controlplane import ControlPlane
    from raylane.orchestrator.settings import Settings
    from tests.conftest import ADMIN_HEADERS, ADMIN_TOKEN, fresh_pg_database

    settings = Settings(database_url=fresh_pg_database(pg_template), data_dir=tmp_path, auto_migrate=False,
                        loops_enabled=False, admin_token=ADMIN_TOKEN, submit_rate_per_s=0)
    plane = ControlPlane(settings)
    parsed = []
    real = _queries._query2pg_nocache
    monkeypatch.setattr(_queries, "_query2pg_nocache", lambda q, enc: parsed.append(q) or real(q, enc))
    try:
        with TestClient(create_app(settings, cp=plane), headers=ADMIN_HEADERS) as c:
            spec = {"name": "p", "kind": "command", "entrypoint": "true", "labels": {"a": "1"}}
            for _ in range(2):  # the first may parse (cache cold)
                assert c.post("/v1/jobs", json=spec).status_code == 201
            parsed.clear()
            for _ in range(3):
                assert c.post("/v1/jobs", json=spec).status_code == 201
    finally:
        plane.close()
    assert [q[:60] for q in parsed] == []
