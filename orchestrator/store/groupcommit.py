"""Group commit: many small write transactions made durable by one commit.

A submit writes a few rows and then waits for the commit's fsync (SQLite) or
the WAL flush and round trip (PostgreSQL); the writes themselves are cheap. On
SQLite every write transaction also queues for the one write lock. So requests
hand their *unit* (a function of a session) to one writer thread, which runs
every unit waiting, up to ``max_units``, in one transaction, each unit in its
own SAVEPOINT, and commits once. Each caller gets its unit's result, or its
exception, only after that commit returned: nothing is acknowledged before it
is durable. A unit that raises rolls back its savepoint only; the others commit.
If the commit itself fails, every unit of the batch gets that error (none of
them is stored, none is acknowledged).

Words: a *unit* is ``fn(session) -> result``, written with the store's functions
like any ``db.transaction`` body, and must not wait on anything but the
database; a *batch* is the units one commit serves.
"""

from __future__ import annotations

import logging
import queue
import threading
from concurrent.futures import Future
from typing import Any, Callable, TypeVar

from sqlalchemy.orm import Session, sessionmaker

from raylane.orchestrator.store import db

log = logging.getLogger(__name__)
T = TypeVar("T")
MAX_UNITS = 256  # per commit: bounds one transaction's size and the wait of its first unit


class GroupCommit:
    def __init__(self, sessions: sessionmaker[Session], *, max_units: int = MAX_UNITS):
        self._sessions = sessions
        self._max = max(1, max_units)
        self._queue: queue.SimpleQueue[tuple[Callable[[Session], Any], Future] | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="raylane-group-commit", daemon=True)
        self._closed = False
        self._thread.start()

    def run(self, fn: Callable[[Session], T]) -> T:
        """Run ``fn`` in the next batch; return its result once the batch is committed."""
        if self._closed:
            raise RuntimeError("the group committer is closed")
        fut: Future = Future()
        self._queue.put((fn, fut))
        return fut.result()

    def waiting(self) -> int:
        """Units queued for the next batch (not the one being committed)."""
        return self._queue.qsize()

    def close(self) -> None:
        """Commit what is queued, then stop the writer thread."""
        if not self._closed:
            self._closed = True
            self._queue.put(None)
            self._thread.join(timeout=30)

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
            self._commit(batch)

    def _commit(self, batch: list[tuple[Callable[[Session], Any], Future]]) -> None:
        outcomes: list[tuple[bool, Any]] = []
        try:
            with db.transaction(self._sessions) as s:
                for fn, _ in batch:
                    try:
                        with s.begin_nested():
                            outcomes.append((True, fn(s)))
                    except Exception as e:  # this unit's savepoint is rolled back; the rest go on
                        outcomes.append((False, e))
        except BaseException as e:  # the commit failed: nothing of this batch is stored
            log.warning("group commit of %d units failed: %s", len(batch), e)
            for _, fut in batch:
                fut.set_exception(e)
            if not isinstance(e, Exception):
                raise
            return
        for (ok, value), (_, fut) in zip(outcomes, batch):
            if ok:
                fut.set_result(value)
            else:
                fut.set_exception(value)
