"""Group commit (``store.groupcommit``) on SQLite and PostgreSQL, units with a
savepoint of their own (``isolated``) and without (a batch's rows as one
statement; a failed batch run again unit by unit): every unit answered is
committed (another connection sees it at once), a unit that raises takes only
its own writes back, a COMMIT that fails is not run twice, the counts /metrics
reads stay exact, and many concurrent submits through the control plane are
each stored once."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
from sqlalchemy import func, select

from raylane.orchestrator.domain.errors import Conflict
from raylane.orchestrator.domain.specs import JobSpec
from raylane.orchestrator.store import db, jobs as store, tallies
from raylane.orchestrator.store.groupcommit import GroupCommit, UnitAborted
from raylane.orchestrator.store.tables import events, jobs
from tests.helpers import wait_for
from tests.test_tallies import assert_kept_equals_counted

SPEC = JobSpec(name="g", kind="command", entrypoint="true", labels={"k": "v"})


def _count(cp, table=jobs) -> int:
    with db.transaction(cp.sessions) as s:
        return s.execute(select(func.count()).select_from(table)).scalar_one()


ISOLATED = pytest.mark.parametrize("isolated", [True, False], ids=["savepoint", "batch-again-alone"])


@ISOLATED
def test_a_failing_unit_takes_back_only_its_own_writes(cp, isolated):
    """The refused unit's job is not kept, the others' are, once each. Isolated
    (in its savepoint), the others ran once; not isolated, its error rolled the
    batch back and each unit ran again alone."""
    writer = GroupCommit(cp.sessions)
    runs = {"good": 0, "bad": 0}

    def good(s):
        runs["good"] += 1
        return store.submit(s, SPEC)[0]

    def bad(s):
        runs["bad"] += 1
        store.submit(s, SPEC)
        raise Conflict("refused after writing")

    try:
        writer.run(lambda s: None)  # the writer's thread started
        futures = _held_batch(writer, [good, bad, good], isolated=isolated)
        ids = [futures[0].result(30), futures[2].result(30)]
        with pytest.raises(Conflict):
            futures[1].result(30)
    finally:
        writer.close()
    # Not isolated: the batch stopped at the refused unit (the last good one had not run), then each alone.
    assert runs == ({"good": 2, "bad": 1} if isolated else {"good": 3, "bad": 2}), runs
    assert _count(cp) == 2 and _count(cp, events) == 2
    with db.transaction(cp.sessions) as s:
        assert set(s.execute(select(jobs.c.id)).scalars()) == set(ids)
    assert_kept_equals_counted(cp)


def test_an_answered_unit_is_already_committed(cp):
    writer = GroupCommit(cp.sessions)
    try:
        def submit_and_look():
            job_id = writer.run(lambda s: store.submit(s, SPEC)[0])
            # Another connection, right after the answer: the row is there.
            with db.transaction(cp.sessions) as s:
                return s.execute(select(jobs.c.id).where(jobs.c.id == job_id)).scalar_one_or_none() == job_id

        with ThreadPoolExecutor(16) as pool:
            assert all(pool.map(lambda _: submit_and_look(), range(64)))
    finally:
        writer.close()


def test_concurrent_submits_are_each_stored_once(cp):
    def one(i):
        key = f"k{i % 50}"  # two submits per key: the second gets the first's job
        job, _ = cp.submit(SPEC, project="default", actor="t", idempotency_key=key)
        return key, job.id

    with ThreadPoolExecutor(32) as pool:
        answers = list(pool.map(one, range(100)))
    by_key: dict[str, set[str]] = {}
    for key, jid in answers:
        by_key.setdefault(key, set()).add(jid)
    assert all(len(v) == 1 for v in by_key.values())
    assert _count(cp) == 50
    shown = cp.get(answers[0][1], project="default")
    assert shown.labels == {"k": "v"} and shown.spec == SPEC
    assert_kept_equals_counted(cp)


def test_submits_that_may_be_refused_get_a_savepoint():
    from raylane.orchestrator.services.controlplane import _refusable

    child = JobSpec(name="c", kind="command", entrypoint="true", depends_on=[{"job": "job_0123456789abcdef"}])
    assert not _refusable(SPEC, None)
    assert _refusable(SPEC, "key") and _refusable(child, None)


def test_a_rolled_back_savepoint_takes_its_counts_back(cp):
    with db.transaction(cp.sessions) as s:
        store.submit(s, SPEC)
        with pytest.raises(RuntimeError):
            with s.begin_nested():
                store.submit_batch(s, [SPEC, SPEC])
                raise RuntimeError("undo")
        with s.begin_nested():
            store.submit(s, SPEC)
    assert _count(cp) == 2
    with db.transaction(cp.sessions) as s:
        assert tallies.read(s)[("jobs", "PENDING", "none")] == 2
    assert_kept_equals_counted(cp)


def test_async_submits_from_the_event_loop_are_each_stored_once(cp):
    """``submit_async``, the API's path: the group commit; a refused unit (a
    reused key with another spec, in a savepoint of its own) takes back only its
    own writes, and a reused key's answer is the whole job, its labels and spec."""
    import asyncio

    other = SPEC.model_copy(update={"name": "other"})

    async def main():
        async def one(i):
            key = f"k{i % 20}"
            try:
                job, _ = await cp.submit_async(SPEC if i < 60 else other, project="default", actor="t",
                                               idempotency_key=key)
            except Conflict:
                return key, None
            assert job.labels == {"k": "v"} and job.spec == SPEC, job
            return key, job.id

        # The keys' jobs first (two submits of each key at once); then, at once, a
        # third submit of each key with the same spec (answered with the stored job)
        # and a fourth with another spec (refused), so refused and answered units
        # share groups. All 80 at once let a key's other-spec submit be stored first
        # when PostgreSQL's writer threads committed its group before the others.
        first = await asyncio.gather(*(one(i) for i in range(40)))
        return first + await asyncio.gather(*(one(i) for i in range(40, 80)))

    answers = asyncio.run(main())
    by_key: dict[str, set[str]] = {}
    for key, jid in answers:
        if jid is not None:
            by_key.setdefault(key, set()).add(jid)
    assert len(by_key) == 20 and all(len(v) == 1 for v in by_key.values())
    assert sum(1 for _, jid in answers if jid is None) == 20  # the last 20: same keys, another spec
    assert _count(cp) == 20 and _count(cp, events) == 20
    assert_kept_equals_counted(cp)


def test_one_unit_per_transaction_rolls_back_alone(cp):
    writer = GroupCommit(cp.sessions, max_units=1, threads=4)

    def bad(s):
        store.submit(s, SPEC)
        raise Conflict("refused after writing")

    try:
        with ThreadPoolExecutor(8) as pool:
            futures = [pool.submit(writer.run, bad if i % 3 == 0 else (lambda s: store.submit(s, SPEC)[0]))
                       for i in range(30)]
            errors = sum(1 for f in futures if isinstance(f.exception(), Conflict))
    finally:
        writer.close()
    assert errors == 10 and _count(cp) == 20
    assert_kept_equals_counted(cp)


@ISOLATED
@pytest.mark.parametrize("max_units", [1, 256])
def test_a_unit_that_raises_a_base_exception_leaves_the_writer_running(cp, max_units, isolated):
    """A unit raising SystemExit (not an Exception) is refused to its caller, as
    ``UnitAborted`` (a SystemExit handed to the caller's thread would end it), and
    the writer thread lives on: had it died, every later submit would wait forever."""
    writer = GroupCommit(cp.sessions, max_units=max_units)
    try:
        def exits(s):
            store.submit(s, SPEC)
            raise SystemExit(3)

        with pytest.raises(UnitAborted) as refused:
            writer.run(exits, isolated=isolated)
        assert isinstance(refused.value.__cause__, SystemExit)
        got: list = []
        # In a daemon thread, waited for with a bound: with its writer dead, this call would never return.
        t = threading.Thread(target=lambda: got.append(writer.run(lambda s: store.submit(s, SPEC)[0])), daemon=True)
        t.start()
        t.join(30)
        assert got and got[0] is not None, "the unit after a SystemExit was never answered: the writer died"
        assert _count(cp) == 1  # the refused unit stored nothing; the next one committed
    finally:
        writer.close()


@ISOLATED
def test_a_base_exception_in_a_batch_reaches_no_event_loop(cp, isolated):
    """Submits await their unit on the server's event loop (``run_async``). A
    unit raising SystemExit rolls its whole batch back; every caller of that
    batch, the innocent ones too, gets ``UnitAborted``: a SystemExit set on an
    asyncio future re-raises in the loop that awaits it, and uvicorn's would stop
    the server."""
    import asyncio

    writer = GroupCommit(cp.sessions)
    hold, taken = threading.Event(), threading.Event()

    def held(s):
        taken.set()
        hold.wait(30)  # the writer is busy until both units below are queued: they share a batch
        return store.submit(s, SPEC)[0]

    def exits(s):
        raise SystemExit(3)

    async def both():
        first = asyncio.get_running_loop().run_in_executor(None, writer.run, held)
        await asyncio.get_running_loop().run_in_executor(None, taken.wait, 30)
        innocent = asyncio.ensure_future(writer.run_async(lambda s: store.submit(s, SPEC)[0]))
        guilty = asyncio.ensure_future(writer.run_async(exits, isolated=isolated))
        await asyncio.sleep(0)  # both queued behind the held unit (the writer takes them as one batch)
        wait_for(lambda: writer._queue.qsize() == 2, timeout=10, what="both units queued")
        hold.set()
        await first
        return await asyncio.gather(innocent, guilty, return_exceptions=True)

    try:
        innocent, guilty = asyncio.run(both())
        assert isinstance(guilty, UnitAborted) and isinstance(innocent, UnitAborted), (innocent, guilty)
        assert _count(cp) == 1  # the held unit's job alone: the aborted batch kept nothing
    finally:
        writer.close()


def _held_batch(writer, units, *, isolated=False):
    """``units`` committed as one batch: the writer is held on a first unit until
    all of them are queued behind it. Returns the futures of ``units``' answers."""
    hold, taken = threading.Event(), threading.Event()

    def held(s):
        taken.set()
        hold.wait(30)
        return None

    pool = ThreadPoolExecutor(len(units) + 1)
    first = pool.submit(writer.run, held)
    wait_for(taken.is_set, timeout=10, what="the writer took the first unit")
    flags = isolated if isinstance(isolated, list) else [isolated] * len(units)
    futures = [pool.submit(writer.run, fn, isolated=flag) for fn, flag in zip(units, flags)]
    wait_for(lambda: writer.waiting() == len(units), timeout=10, what=f"{len(units)} units queued")
    hold.set()
    first.result(30)
    pool.shutdown(wait=True)
    return futures


def test_one_statement_a_batch_on_postgresql(cp):
    """A batch of submits is one statement between BEGIN and COMMIT on
    PostgreSQL, however many units it holds (SQLite: every row at once)."""
    from sqlalchemy import event

    writer = GroupCommit(cp.sessions)
    sent: list[str] = []

    def count(conn, cursor, statement, *args):
        sent.append(statement)

    try:
        writer.run(lambda s: store.submit_view(s, SPEC)[0].id)  # the writer's connection is open and warm
        event.listen(cp.engine, "before_cursor_execute", count)
        try:
            futures = _held_batch(writer, [lambda s: store.submit_view(s, SPEC)[0].id for _ in range(8)])
            ids = [f.result(30) for f in futures]
        finally:
            event.remove(cp.engine, "before_cursor_execute", count)
    finally:
        writer.close()
    if cp.engine.dialect.name == "postgresql":
        assert len(sent) == 1, sent  # the held unit wrote nothing; the 8 submits' rows and tallies: one statement
    assert len(set(ids)) == 8 and _count(cp) == 9 and _count(cp, events) == 9
    shown = cp.get(ids[-1], project="default")
    assert shown.labels == {"k": "v"} and shown.spec == SPEC
    assert_kept_equals_counted(cp)


def test_a_failed_commit_is_not_run_again(cp):
    """A batch whose COMMIT fails is answered with that error, each unit run once:
    whether a COMMIT that failed took effect is unknown, and running the units
    again alone could store them twice. Units that failed before it are run again."""
    from sqlalchemy import event

    writer = GroupCommit(cp.sessions)
    runs = {"a": 0, "b": 0}
    fail = {"on": True}

    def failing_commit(conn):
        if fail["on"]:
            fail["on"] = False
            raise RuntimeError("the connection went away during COMMIT")

    def unit(name):
        def fn(s):
            runs[name] += 1
            return store.submit(s, SPEC)[0]
        return fn

    try:
        writer.run(lambda s: None)  # the writer's thread started
        event.listen(cp.engine, "commit", failing_commit)
        try:
            futures = _held_batch(writer, [unit("a"), unit("b")])
            errors = [f.exception(30) for f in futures]
        finally:
            event.remove(cp.engine, "commit", failing_commit)
    finally:
        writer.close()
    # (The held unit touched no connection, so the first COMMIT to fail is the batch's.)
    assert runs == {"a": 1, "b": 1}, runs
    assert all(isinstance(e, RuntimeError) and "COMMIT" in str(e) for e in errors), errors
    assert _count(cp) == 0
    assert_kept_equals_counted(cp)


def test_with_several_writers_a_refusable_unit_runs_alone(cp):
    """``alone_isolated`` (PostgreSQL's writers and processes): the batch's other
    units share one transaction, the isolated one has its own after it (batched,
    two writers' units of one Idempotency-Key deadlocked); one that raises
    SystemExit there is refused to its caller alone, the others are committed,
    and the writer lives on."""
    writer = GroupCommit(cp.sessions, alone_isolated=True)
    sessions: dict = {}  # the sessions themselves, kept alive: ids of freed ones could be reused

    def unit(name, exits=False):
        def fn(s):
            sessions[name] = s
            job = store.submit(s, SPEC)[0]
            if exits:
                raise SystemExit(3)
            return job
        return fn

    try:
        writer.run(lambda s: None)  # the writer's thread started
        futures = _held_batch(writer, [unit("a"), unit("b", exits=True), unit("c"), unit("d")],
                              isolated=[False, True, False, True])
        assert futures[0].result(30) and futures[2].result(30) and futures[3].result(30)
        with pytest.raises(UnitAborted):
            futures[1].result(30)
        assert sessions["a"] is sessions["c"] and len({id(sessions[k]) for k in "abd"}) == 3
        assert writer.run(lambda s: store.submit(s, SPEC)[0])  # the writer lives on
    finally:
        writer.close()
    assert _count(cp) == 4  # a, c, d and the last; b's job was not kept
    assert_kept_equals_counted(cp)


def test_every_unit_is_answered_when_one_run_alone_raises_a_base_exception(cp):
    """A batch rolled back is run again unit by unit; one of them raising SystemExit
    there does not leave the units after it unanswered (their callers would wait forever)."""
    writer = GroupCommit(cp.sessions)

    def fails(s):
        raise ValueError("refused")

    def exits(s):
        raise SystemExit(3)

    try:
        writer.run(lambda s: None)
        futures = _held_batch(writer, [fails, exits, lambda s: store.submit(s, SPEC)[0]])
        assert isinstance(futures[0].exception(30), ValueError)
        assert isinstance(futures[1].exception(30), UnitAborted)
        assert futures[2].result(30)
    finally:
        writer.close()
    assert _count(cp) == 1


def test_an_isolated_unit_rolled_back_keeps_the_batchs_deferred_rows(cp):
    """Rows the batch's earlier units deferred stay the transaction's: a refused
    isolated unit (in its savepoint) that asks for them to be sent takes none of
    them with its rollback (an acknowledged submit was lost so, in review)."""
    from raylane.orchestrator.store import prepared

    writer = GroupCommit(cp.sessions)

    def refused(s):
        prepared.send_deferred(s)
        raise Conflict("refused")

    try:
        writer.run(lambda s: None)
        futures = _held_batch(writer, [lambda s: store.submit_view(s, SPEC)[0].id, refused], isolated=[False, True])
        job_id = futures[0].result(30)
        assert isinstance(futures[1].exception(30), Conflict)
    finally:
        writer.close()
    assert cp.get(job_id, project="default").labels == {"k": "v"}
    assert _count(cp) == 1 and _count(cp, events) == 1
    assert_kept_equals_counted(cp)


def test_a_committed_unit_wakes_its_waiter_from_the_writer_and_only_once_stored(cp):
    """``committed`` runs in the writer thread once the unit is durable, before the
    event loop is woken: a submit wakes the dispatcher there, one hop of the loop
    sooner. A unit that failed calls nothing; a replayed key wakes nobody."""
    import asyncio
    import threading

    writer = GroupCommit(cp.sessions)
    seen = []

    def committed(result):
        with db.transaction(cp.sessions) as s:  # durable before the call
            stored = s.execute(select(func.count()).select_from(jobs).where(jobs.c.id == result)).scalar_one()
        seen.append((result, threading.current_thread().name, stored))

    def bad(s):
        store.submit(s, SPEC)
        raise ValueError("refused")

    async def main():
        jid = await writer.run_async(lambda s: store.submit(s, SPEC)[0], committed=committed)
        assert seen == [(jid, seen[0][1], 1)] and seen[0][1].startswith("raylane-group-commit")
        with pytest.raises(ValueError):
            await writer.run_async(bad, committed=committed)
        assert len(seen) == 1

        cp.new_work.clear()
        await cp.submit_async(SPEC, project="default", actor="t", idempotency_key="once")
        assert cp.new_work.is_set()
        cp.new_work.clear()
        _, created = await cp.submit_async(SPEC, project="default", actor="t", idempotency_key="once")
        assert not created and not cp.new_work.is_set()

    try:
        asyncio.run(main())
    finally:
        writer.close()
