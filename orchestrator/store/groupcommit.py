"""Group commit: many small write transactions made durable by one commit.

A submit writes a few rows and then waits for the commit's fsync (SQLite) or
the WAL flush and round trip (PostgreSQL); the writes themselves are cheap. On
SQLite every write transaction also queues for the one write lock. So requests
hand their *unit* (a function of a session) to a writer thread, which runs
every unit waiting, up to ``max_units``, in one transaction and commits once.
Each caller gets its unit's result, or its exception, only after that commit
returned: nothing is acknowledged before it is durable. If the commit itself
fails, every unit of the batch gets that error (none of them is stored, none
is acknowledged, none is run again: whether a COMMIT that failed took effect
is unknown).

A unit runs without a savepoint of its own (a SAVEPOINT and a RELEASE were a
quarter of a SQLite submit's CPU, and two round trips on PostgreSQL, where
the rows a batch defers, ``store.prepared``, then go as one statement: a batch
is BEGIN, one statement, COMMIT). If such a unit raises, or a statement fails
before COMMIT, the batch is rolled back and each of its units runs again alone,
in a transaction of its own: a unit is a function of the session, so running
it again is running it, not repeating it (nothing of the first run was kept).
A unit that may be refused in the normal course of things (an Idempotency-Key
reused with another spec, a parent that is gone) is ``isolated``, so a client
sending refused submits cannot make every batch run twice: with one writer
(SQLite) it runs in a SAVEPOINT of the batch, and its error rolls back that
savepoint only; with several writers or processes (``alone_isolated``,
PostgreSQL) it runs alone, in a transaction of its own, after the batch.
Batched there, two writers' batches could take such units' locks (an
Idempotency-Key's entry in a unique index, a parent's row) in opposite orders
and deadlock, as two submits of one key, a client's retry racing its first
try, did in tests/test_load.py.

With ``max_units=1`` there is no grouping: each unit is a transaction of its
own, and ``threads`` writers run that many at once. What it keeps is
``run_async``, a unit handed from the event loop and its answer handed back,
without a worker thread of the loop's pool in between.

Words: a *unit* is ``fn(session) -> result``, written with the store's functions
like any ``db.transaction`` body, and must not wait on anything but the
database nor change anything but it; a *batch* is the units one commit serves;
a unit's *settle* is called by the writer with ``(ok, result or exception)``
once its batch is committed.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from concurrent.futures import Future
from typing import Any, Callable, TypeVar

from sqlalchemy.orm import Session, sessionmaker

from raylane.orchestrator.store import db, tallies

log = logging.getLogger(__name__)
T = TypeVar("T")
MAX_UNITS = 256  # per commit: bounds one transaction's size and the wait of its first unit
Settle = Callable[[bool, Any], None]
Unit = tuple[Callable[[Session], Any], Settle, bool]  # (fn, settle, isolated)


class GroupCommit:
    def __init__(self, sessions: sessionmaker[Session], *, max_units: int = MAX_UNITS, threads: int = 1,
                 alone_isolated: bool = False):
        self._sessions = sessions
        self._max = max(1, max_units)
        self._alone_isolated = alone_isolated
        self._queue: queue.SimpleQueue[Unit | None] = queue.SimpleQueue()
        self._threads = [threading.Thread(target=self._run, name=f"raylane-group-commit-{i}", daemon=True)
                         for i in range(max(1, threads))]
        self._closed = False
        self._started = False  # the writers start with the first unit (a CLI command never writes one)
        self._start_lock = threading.Lock()

    def run(self, fn: Callable[[Session], T], *, isolated: bool = False) -> T:
        """Run ``fn`` in the next batch; return its result once the batch is committed.
        ``isolated``: in a savepoint of its own (one that may be refused)."""
        fut: Future = Future()
        self._put(fn, lambda ok, value: fut.set_result(value) if ok else fut.set_exception(value), isolated)
        return fut.result()

    async def run_async(self, fn: Callable[[Session], T], *, isolated: bool = False,
                        committed: Callable[[T], None] | None = None) -> T:
        """``run`` from the event loop: the loop waits on an asyncio future that the
        writer settles through ``call_soon_threadsafe`` (one wake-up of the loop, no
        worker thread held while the batch commits). ``committed(result)``: called by
        the writer once the unit is committed, before the loop is woken (a submit
        wakes the dispatcher from there, not one hop of the loop later); it must be
        quick and must not raise."""
        loop = asyncio.get_running_loop()
        fut = loop.create_future()

        def settle(ok: bool, value: Any) -> None:
            if ok and committed is not None:
                try:
                    committed(value)
                except Exception:
                    log.exception("a unit's commit callback failed")
            try:
                loop.call_soon_threadsafe(_settle, fut, ok, value)
            except RuntimeError:  # the loop is closed: nobody waits for this answer
                pass

        self._put(fn, settle, isolated)
        return await fut

    def _put(self, fn: Callable[[Session], Any], settle: Settle, isolated: bool) -> None:
        if self._closed:
            raise RuntimeError("the group committer is closed")
        if not self._started:
            with self._start_lock:
                if not self._started:
                    for t in self._threads:
                        t.start()
                    self._started = True
        self._queue.put((fn, settle, isolated))

    def waiting(self) -> int:
        """Units queued for the next batch (not the one being committed)."""
        return self._queue.qsize()

    def close(self) -> None:
        """Commit what is queued, then stop the writer threads."""
        if not self._closed:
            self._closed = True
            with self._start_lock:
                if not self._started:
                    return
            for _ in self._threads:
                self._queue.put(None)
            for t in self._threads:
                t.join(timeout=30)

    def _run(self) -> None:
        stop = False
        while not stop:
            first = self._queue.get()
            if first is None:
                return
            batch = [first]
            while len(batch) < self._max:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is None:
                    stop = True
                    break
                batch.append(item)
            try:
                self._commit(batch)
            except BaseException:  # a unit raised SystemExit or the like: its batch is answered, the writer goes on
                log.exception("group commit: a unit raised a BaseException; its batch was refused, the writer goes on")

    def _commit(self, batch: list[Unit]) -> None:
        if not (self._alone_isolated and any(isolated for *_, isolated in batch)):
            return self._together(batch)
        parts = [[u for u in batch if not u[2]], *([u] for u in batch if u[2])]
        error: BaseException | None = None
        for part in parts:  # every part answered, even after one raised a BaseException
            try:
                self._together(part)
            except BaseException as e:
                error = error or e
        if error is not None:
            raise error

    def _together(self, batch: list[Unit]) -> None:
        if not batch:
            return
        if len(batch) == 1:
            return self._alone(*batch[0][:2])
        outcomes: list[tuple[bool, Any]] = []
        sent = False  # the commit's own statements (deferred rows, tallies) went through: COMMIT is next
        try:
            with db.transaction(self._sessions) as s:
                for fn, _, isolated in batch:
                    if not isolated:
                        outcomes.append((True, fn(s)))
                        continue
                    try:
                        with s.begin_nested():
                            outcomes.append((True, fn(s)))
                    except Exception as e:  # this unit's savepoint is rolled back; the rest go on
                        outcomes.append((False, e))
                tallies.flush(s)
                sent = True
        except Exception as e:
            if not sent:  # rolled back before COMMIT: nothing of the batch was kept; each unit alone
                self._each_alone(batch)
                return
            log.warning("group commit of %d units failed: %s", len(batch), e)
            for _, settle, _ in batch:
                settle(False, e)
            return
        except BaseException as e:  # a unit raised SystemExit or the like: nothing of this batch is stored
            for _, settle, _ in batch:
                settle(False, _answerable(e))
            raise
        for (ok, value), (_, settle, _) in zip(outcomes, batch):
            settle(ok, value)

    def _each_alone(self, batch: list[Unit]) -> None:
        """Every unit in a transaction of its own, each answered even after one raised
        a BaseException (raised again once all are answered)."""
        error: BaseException | None = None
        for fn, settle, _ in batch:
            try:
                self._alone(fn, settle)
            except BaseException as e:
                error = error or e
        if error is not None:
            raise error

    def _alone(self, fn: Callable[[Session], Any], settle: Settle) -> None:
        """One unit, one transaction: its error rolls back the transaction itself."""
        try:
            with db.transaction(self._sessions) as s:
                value = fn(s)
        except BaseException as e:
            settle(False, _answerable(e))
            if not isinstance(e, Exception):
                raise
            return
        settle(True, value)


class UnitAborted(RuntimeError):
    """A unit of the batch raised a ``BaseException`` (``SystemExit``, ``KeyboardInterrupt``):
    the batch was rolled back, and each caller gets this instead of that exception,
    which would stop the caller's own thread or event loop (a request's loop is
    uvicorn's: a ``SystemExit`` set on its future would end the server)."""


def _answerable(e: BaseException) -> Exception:
    """What a caller may be handed for ``e``: ``e`` itself, or ``UnitAborted`` from a BaseException."""
    if isinstance(e, Exception):
        return e
    err = UnitAborted(f"not stored: a unit of its group commit raised {type(e).__name__}; nothing of the batch was kept")
    err.__cause__ = e
    return err


def _settle(fut: asyncio.Future, ok: bool, value: Any) -> None:
    if fut.cancelled():  # the request went away; its unit was committed (or not) all the same
        return
    if ok:
        fut.set_result(value)
    else:
        fut.set_exception(value)
