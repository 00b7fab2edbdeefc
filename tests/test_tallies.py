"""The counts /metrics reads (``store.tallies``) equal a real COUNT(*) over the
tables after every kind of write the store makes, on SQLite and PostgreSQL:
submits (single, idempotent, batch), every arrow of the job status table,
admission and retries, every observation the loops write, a rolled-back
transaction; and the migration that creates them fills them from the tables."""

from __future__ import annotations

from collections import deque

import pytest
from sqlalchemy import update

from raylane.orchestrator.domain.errors import InvalidTransition
from raylane.orchestrator.domain.queries import JobFilter
from raylane.orchestrator.domain.profile import default_profile
from raylane.orchestrator.domain.specs import JobSpec
from raylane.orchestrator.domain.states import ALLOWED, AttemptStatus, FailureCause, JobStatus
from raylane.orchestrator.loops.dispatcher import Dispatcher
from raylane.orchestrator.store import db, jobs as store, lifecycle, migrate, tallies
from raylane.orchestrator.store.tables import jobs
from raylane.orchestrator.store.transitions import transition
from tests.test_metrics import VIEW

CPU = JobSpec(name="c", kind="command", entrypoint="true", labels={"team": "a"})
GPU = JobSpec.model_validate({"name": "g", "kind": "command", "entrypoint": "nvidia-smi",
                              "resources": {"gpus_per_worker": 1, "cpus_per_worker": 1}})


def assert_kept_equals_counted(cp):
    with db.transaction(cp.sessions) as s:
        kept, counted = tallies.read(s), tallies.recount(s)
    _same(kept, counted)


def _same(kept, counted):
    assert set(kept) == set(counted)
    for k, v in counted.items():
        # Seconds summed: SQLite's julianday() counts in whole milliseconds, Python in microseconds.
        slack = 2e-3 * counted[(k[0], k[1], "+Inf")] if k[2] == "sum" else 0
        assert kept[k] == pytest.approx(v, abs=slack), k


def _path(to: JobStatus) -> list[JobStatus]:
    """The shortest chain of arrows from PENDING to ``to``."""
    prev, todo = {JobStatus.PENDING: None}, deque([JobStatus.PENDING])
    while todo:
        s = todo.popleft()
        for d in sorted(ALLOWED[s], key=lambda x: x.value):
            if d not in prev:
                prev[d] = s
                todo.append(d)
    out = [to]
    while prev[out[-1]] is not None:
        out.append(prev[out[-1]])
    return out[::-1][1:]


@pytest.fixture
def dispatcher(cp):
    return Dispatcher(cp.settings, cp.sessions, backend=None, profile=default_profile())


def test_every_write_keeps_the_counts(cp, dispatcher):
    with db.transaction(cp.sessions) as s:
        store.submit(s, CPU)
        store.submit(s, GPU, idempotency_key="k1")
        store.submit(s, GPU, idempotency_key="k1")  # the same job again: nothing new to count
        store.submit_batch(s, [CPU, GPU, CPU])
    assert_kept_equals_counted(cp)

    # Every arrow of the status table, each reached through real transitions.
    for src, dsts in ALLOWED.items():
        for dst in dsts:
            with db.transaction(cp.sessions) as s:
                jid = store.submit(s, CPU)[0]
                for step in _path(src):
                    transition(s, jid, step, reason="walk", actor="test",
                               values={"node_group": "cpu"} if step is JobStatus.DISPATCHING else None)
                transition(s, jid, dst, reason="arrow", actor="test")
    assert_kept_equals_counted(cp)

    # A refused arrow rolls back with its transaction, counts included.
    with pytest.raises(InvalidTransition), db.transaction(cp.sessions) as s:
        jid = store.submit(s, CPU)[0]
        transition(s, jid, JobStatus.SUCCEEDED, reason="no", actor="test")
    assert_kept_equals_counted(cp)

    # Admission (attempt rows, admission waits) and what the loops observe.
    with db.transaction(cp.sessions) as s:  # only the fresh jobs below are queued
        s.execute(update(jobs).where(jobs.c.status == JobStatus.PENDING.value).values(not_before=None))
    claimed = dispatcher.claim(VIEW)
    assert len(claimed) >= 4
    a, b, c, d = (x.job_id for x in claimed[:4])
    with db.transaction(cp.sessions) as s:
        for jid in (a, b, c):
            lifecycle.attempt_submitted(s, jid, 1, owner=dispatcher.owner, note="submitted")
        lifecycle.attempt_running(s, a, 1, driver_node_id="n1")
        lifecycle.attempt_succeeded(s, a, 1, exit_code=0, driver_node_id="n1", result={"ok": 1})
        lifecycle.attempt_pending(s, b, 1)
        lifecycle.timeout_requested(s, b, 1)
        lifecycle.attempt_ended(s, b, 1, status=AttemptStatus.STOPPED, cause=FailureCause.TIMEOUT,
                                message="timeout", headline="timeout")
        lifecycle.attempt_running(s, c, 1, driver_node_id="n2")
        lifecycle.scale_up_overdue(s, c, 1, "no node came")
        lifecycle.attempt_ended(s, c, 1, status=AttemptStatus.LOST, cause=FailureCause.PREEMPTED,
                                message="reclaimed", headline="reclaimed")
        lifecycle.submit_refused(s, d, 1, "Ray said no")
    assert_kept_equals_counted(cp)

    # The preempted job retries: its second attempt is counted as one.
    with db.transaction(cp.sessions) as s:
        s.execute(update(jobs).where(jobs.c.id == c).values(not_before=None))
    assert c in [x.job_id for x in dispatcher.claim(VIEW)]
    with db.transaction(cp.sessions) as s:
        store.cancel(s, c)
        lifecycle.cancelled_before_submit(s, c, 2)
    assert_kept_equals_counted(cp)
    with db.transaction(cp.sessions) as s:
        kept = tallies.read(s)
    assert kept[("retries", "cpu", "")] >= 1
    assert kept[("failures", "cpu", FailureCause.PREEMPTED.value)] == 1


def test_rebuild_repairs_the_counts(cp):
    with db.transaction(cp.sessions) as s:
        store.submit_batch(s, [CPU, GPU])
    with db.transaction(cp.sessions) as s:  # counts gone astray (a write outside the store)
        s.execute(update(jobs).values(status=JobStatus.FAILED.value))
    with db.transaction(cp.sessions) as s:
        assert tallies.read(s) != tallies.recount(s)
        tallies.rebuild(s)
    assert_kept_equals_counted(cp)


def test_the_migration_counts_what_is_stored(cp, dispatcher, settings):
    with db.transaction(cp.sessions) as s:
        store.submit_batch(s, [CPU, GPU, CPU])
    dispatcher.claim(VIEW)
    with db.transaction(cp.sessions) as s:
        want = tallies.recount(s)
    assert want[("jobs_created", "command", "")] == 3  # something to count: a match of two empty tallies proves nothing
    cp.engine.dispose()
    from alembic import command

    command.downgrade(migrate.alembic_config(settings.database_url), "0009_dependencies")
    migrate.upgrade(settings.database_url)
    with db.transaction(cp.sessions) as s:
        kept = tallies.read(s)
    _same(kept, want)  # asserts: the same keys, each count equal


def test_arrays_dependencies_and_their_cascades_keep_the_counts(cp):
    """Arrays store their members without store.jobs.submit, and a parent's end
    cancels its dependents inside the same transition: both must move the counts."""
    arr = JobSpec.model_validate({"name": "a", "kind": "command", "entrypoint": "true",
                                  "array": {"size": 5, "max_parallel": 2}})
    cp.submit_array(arr, project="default", actor="t")
    assert_kept_equals_counted(cp)
    with db.transaction(cp.sessions) as s:
        parent, _ = store.submit(s, CPU)
        child, _ = store.submit(s, JobSpec.model_validate({**CPU.model_dump(), "depends_on": [parent]}))
        store.submit(s, JobSpec.model_validate({**CPU.model_dump(), "depends_on": [child]}))
    with db.transaction(cp.sessions) as s:
        transition(s, parent, JobStatus.CANCELLED, reason="t", actor="t")  # cancels child and grandchild
    assert_kept_equals_counted(cp)
    aid = cp.list(JobFilter(labels={"raylane.array.index": "0"}), limit=5, cursor=None)[0][0].labels["raylane.array"]
    cp.cancel_array(aid, project=None, actor="t")
    assert_kept_equals_counted(cp)


def test_the_recount_measures_a_wait_as_the_kept_count_did(cp):
    """A histogram's recount puts each wait in the bucket ``observe`` did: the
    database's difference of two stored times is Python's ``total_seconds`` to
    the bit. (SQLite's julianday difference was ~20 us off: a wait of 0.09999 s
    recounted over the 0.1 s bound, a flake of ``test_every_write_keeps_the_counts``.)"""
    import random
    from datetime import datetime, timedelta, timezone

    from sqlalchemy import bindparam, select

    rng = random.Random(7)
    kind = jobs.c.created_at.type
    pairs = []
    for _ in range(300):
        a = datetime(2026, 12, rng.randint(1, 28), rng.randint(0, 23), rng.randint(0, 59), rng.randint(0, 59),
                     rng.randint(0, 999_999), tzinfo=timezone.utc)
        pairs.append((a, a + timedelta(microseconds=rng.choice([99_999, 100_000, 100_001, rng.randint(0, 10**8)]))))
    with db.transaction(cp.sessions) as s:
        expr = tallies._seconds_between(s, bindparam("b", type_=kind), bindparam("a", type_=kind))
        got = [s.execute(select(expr), {"a": a, "b": b}).scalar_one() for a, b in pairs]
    assert [float(g) for g in got] == [(b - a).total_seconds() for a, b in pairs]
