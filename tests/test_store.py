"""The store on SQLite and PostgreSQL: compare-and-set transitions, events,
idempotent submit under concurrency, restarts."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
from sqlalchemy import select, update

from raylane.orchestrator.domain.errors import InvalidTransition
from raylane.orchestrator.domain.queries import JobFilter
from raylane.orchestrator.domain.specs import JobSpec
from raylane.orchestrator.domain.states import ALLOWED, JobStatus, allowed_from
from raylane.orchestrator.store import db, job_reads, jobs as store
from raylane.orchestrator.store.tables import events, jobs
from raylane.orchestrator.store.transitions import transition

SPEC = JobSpec(name="t", kind="command", entrypoint="true")


def _submit(cp, spec=SPEC, **kw) -> str:
    with db.transaction(cp.sessions) as s:
        return store.submit(s, spec, **kw)[0]


def test_every_arrow_in_the_table_is_taken_and_others_refused(cp):
    for src in JobStatus:
        for dst in JobStatus:
            job_id = _submit(cp)
            with db.transaction(cp.sessions) as s:  # force the source status (test set-up only)
                s.execute(update(jobs).where(jobs.c.id == job_id).values(status=src.value))
            if dst in ALLOWED[src]:
                with db.transaction(cp.sessions) as s:
                    assert transition(s, job_id, dst, reason="t", actor="test") is src
            else:
                with pytest.raises(InvalidTransition), db.transaction(cp.sessions) as s:
                    transition(s, job_id, dst, reason="t", actor="test")
                with db.transaction(cp.sessions) as s:
                    assert s.execute(select(jobs.c.status).where(jobs.c.id == job_id)).scalar() == src.value


def test_transition_writes_an_event_row(cp):
    job_id = _submit(cp)
    with db.transaction(cp.sessions) as s:
        transition(s, job_id, JobStatus.DISPATCHING, reason="admitted", actor="scheduler", attempt=1)
    evs = cp.events(job_id, project=None)
    assert [(e.from_status, e.to_status, e.reason, e.actor) for e in evs] == [
        (None, JobStatus.PENDING, "submitted", "api"),
        (JobStatus.PENDING, JobStatus.DISPATCHING, "admitted", "scheduler"),
    ]
    assert evs[1].attempt == 1 and evs[1].at >= evs[0].at


def test_two_concurrent_transitions_from_the_same_state_one_wins(cp):
    # PENDING -> DISPATCHING (a dispatcher) races PENDING -> CANCELLED (a user).
    for _ in range(10):
        job_id = _submit(cp)
        barrier = threading.Barrier(2)
        outcomes = []

        def go(to):
            barrier.wait()
            try:
                with db.transaction(cp.sessions) as s:
                    transition(s, job_id, to, reason="race", actor="t", expected={JobStatus.PENDING})
                outcomes.append(("won", to))
            except InvalidTransition:
                outcomes.append(("lost", to))

        ts = [threading.Thread(target=go, args=(to,)) for to in (JobStatus.DISPATCHING, JobStatus.CANCELLED)]
        [t.start() for t in ts]
        [t.join() for t in ts]
        assert sorted(o for o, _ in outcomes) == ["lost", "won"], outcomes
        winner = next(to for o, to in outcomes if o == "won")
        job = cp.get(job_id, project=None)
        assert job.status is winner
        with db.transaction(cp.sessions) as s:
            n = s.execute(select(events).where(events.c.job_id == job_id, events.c.from_status == "PENDING")).all()
        assert len(n) == 1


def test_fifty_concurrent_submits_with_one_key_make_one_job(cp):
    barrier = threading.Barrier(50)

    def go(_):
        barrier.wait()
        job, created = cp.submit(SPEC, project="default", actor="t", idempotency_key="same-key")
        return job.id, created

    with ThreadPoolExecutor(50) as ex:
        results = list(ex.map(go, range(50)))
    assert len({jid for jid, _ in results}) == 1
    assert sum(created for _, created in results) == 1
    page, _ = cp.list(JobFilter(project=None), limit=100, cursor=None)
    assert len(page) == 1


def test_same_key_different_spec_is_a_conflict(cp):
    from raylane.orchestrator.domain.errors import Conflict

    cp.submit(SPEC, project="default", actor="t", idempotency_key="k")
    with pytest.raises(Conflict, match="different job spec"):
        cp.submit(SPEC.model_copy(update={"priority": 99}), project="default", actor="t", idempotency_key="k")


def test_allowed_from_matches_table():
    assert allowed_from(JobStatus.CANCELLED) == {JobStatus.PENDING, JobStatus.RETRYING, JobStatus.CANCELLING}
    assert allowed_from(JobStatus.PENDING) == set()  # a job is born PENDING, never returns to it


def test_only_transitions_module_writes_status():
    """Nothing but store.transitions updates jobs.status (a grep over the code)."""
    import pathlib
    import re

    root = pathlib.Path(__file__).resolve().parent.parent
    offenders = []
    for path in list((root / "orchestrator").rglob("*.py")) + list((root / "api").rglob("*.py")):
        if path.name == "transitions.py":
            continue
        text = path.read_text()
        if re.search(r"update\(jobs\)[^\n]*\.values\([^)\n]*\bstatus\s*=[^=]", text) or re.search(r"\"status\":\s*JobStatus\.(?!PENDING)", text):
            offenders.append(str(path))
    assert not offenders


def test_a_pooled_connection_killed_while_idle_is_replaced_before_use(pg_template, monkeypatch):
    """db.make_engine pings a PostgreSQL connection idle longer than PING_IDLE_S
    (not every checkout): one the server dropped meanwhile is never handed out."""
    from sqlalchemy import text

    from tests.conftest import _pg_admin, fresh_pg_database

    monkeypatch.setattr(db, "PING_IDLE_S", 0.0)  # every connection counts as idle
    engine = db.make_engine(fresh_pg_database(pg_template), pool_size=1)
    try:
        with engine.connect() as conn:
            pid = conn.execute(text("SELECT pg_backend_pid()")).scalar_one()
        with _pg_admin() as admin:
            admin.execute("SELECT pg_terminate_backend(%s, 5000)", (pid,))  # waits until it is gone
        with engine.connect() as conn:  # no error: the dead one was pinged and replaced
            assert conn.execute(text("SELECT pg_backend_pid()")).scalar_one() != pid
    finally:
        engine.dispose()


def test_a_job_read_on_a_connection_is_the_same_view_as_in_a_session(cp):
    """GET /v1/jobs/{id} reads a job in two statements on a Core connection
    (``read_job``) instead of three in an ORM session (``get_job``): the view
    must be the same, labels and result included, and so must the project's
    scope (another project's job is not found)."""
    from raylane.orchestrator.domain.errors import NotFound

    plain = _submit(cp)
    rich = _submit(cp, SPEC.model_copy(update={"labels": {"team": "ml", "run": "7"}}), project="p1")
    with db.transaction(cp.sessions) as s:
        store.set_result(s, rich, {"loss": 0.25, "nested": {"k": [1, 2]}}, attempt=1)
    link = "http://ray.example:8265"
    for jid, project in ((plain, None), (plain, "default"), (rich, None), (rich, "p1")):
        with db.read(cp.sessions) as s:
            want = job_reads.get_job(s, jid, project=project, dashboard_url=link)
        with db.read_connection(cp.sessions) as conn:
            got = job_reads.read_job(conn, jid, project=project, dashboard_url=link)
        assert got == want
    with db.read_connection(cp.sessions) as conn:
        seen = job_reads.read_job(conn, rich, project="p1")
        assert seen.labels == {"team": "ml", "run": "7"} and seen.result == {"loss": 0.25, "nested": {"k": [1, 2]}}
        with pytest.raises(NotFound):
            job_reads.read_job(conn, rich, project="default")
        with pytest.raises(NotFound):
            job_reads.read_job(conn, "0" * 26, project=None)
    assert cp.get(rich, project="p1") == seen
