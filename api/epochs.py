"""The auth epoch for requests with a token this replica verified before: one
read serves every request that was already waiting when it started.

A revoke raises the epoch in its own transaction (``services.access``), so a
request that arrives after that commit must see the new value: it needs a read
that *started after it arrived*. ``EpochReads.current()`` gives exactly that.
The requests that arrive while a read runs wait for the next one, which starts
as soon as the running one ends; each read answers everyone waiting when it
began. Alone, a request costs one read, as before; with 32 in flight, a few
share each read and its hop through a worker thread.

On SQLite the read comes first from ``SQLiteEpoch``: a connection of its own,
read on the event loop. In WAL mode a reader never waits for the writer, and
an autocommit SELECT starts a fresh snapshot, so it sees every commit before
it: about 5 us, against 300-380 us of CPU for the pooled read through a worker
thread (a fifth to a third of a single submit's server CPU, docs/benchmarks.md).
When SQLite answers busy (not WAL, a recovery), the read goes the pooled way.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sqlite3
from typing import Callable
from urllib.parse import quote

import anyio.to_thread
from sqlalchemy.engine import Engine

log = logging.getLogger(__name__)


class SQLiteEpoch:
    """The auth epoch from a SQLite file, without blocking: ``None`` when SQLite
    is busy or the read fails (the caller reads the pooled way)."""

    SQL = "SELECT n FROM auth_epoch WHERE id = 1"

    def __init__(self, path: str):
        # mode=rw: the file the engine uses or an error, never a new empty one;
        # timeout=0: never wait on a lock on the event loop; autocommit: no
        # snapshot kept between reads.
        self._conn = sqlite3.connect(f"file:{quote(path)}?mode=rw", uri=True, timeout=0, isolation_level=None,
                                     check_same_thread=False)

    @classmethod
    def of(cls, engine: Engine) -> "SQLiteEpoch | None":
        """One for ``engine``'s database when it is a SQLite file (not in memory):
        the file a pooled connection has open, as SQLite names it (absolute), so a
        relative URL and a later change of directory cannot point it elsewhere."""
        if engine.dialect.name != "sqlite":
            return None
        with engine.connect() as conn:
            path = next((row[2] for row in conn.exec_driver_sql("PRAGMA database_list") if row[1] == "main"), "")
        if not path or not os.path.isabs(path):  # in memory (or a temporary database): ""
            return None
        try:
            return cls(path)
        except sqlite3.Error as e:
            log.warning("auth epoch: cannot open %s for reads on the event loop (%s); reading through the pool",
                        path, e)
            return None

    def __call__(self) -> int | None:
        try:
            rows = self._conn.execute(self.SQL).fetchall()  # stepped to the end: the read transaction is over
        except sqlite3.Error as e:
            log.debug("auth epoch: SQLite read failed (%s); reading through the pool", e)
            return None
        return rows[0][0] if rows else None

    def close(self) -> None:
        self._conn.close()


class EpochReads:
    def __init__(self, read: Callable[[], int], fast: Callable[[], int | None] | None = None):
        self._read = read  # blocking: ``Access.epoch``
        self._fast = fast  # non-blocking, on the loop: ``SQLiteEpoch``; None when it cannot answer
        self._waiting: list[asyncio.Future] = []
        self._reader: asyncio.Task | None = None

    async def current(self) -> int:
        """The epoch as read by a statement that began after this call."""
        if self._fast is not None:
            value = self._fast()
            if value is not None:
                return value
        fut = asyncio.get_running_loop().create_future()
        self._waiting.append(fut)
        if self._reader is None:
            self._reader = asyncio.create_task(self._drain())
        return await fut

    async def _drain(self) -> None:
        try:
            while self._waiting:
                batch, self._waiting = self._waiting, []
                try:
                    value = await anyio.to_thread.run_sync(self._read)
                except Exception as e:  # the database is down: each waiting request gets the error
                    for fut in batch:
                        if not fut.done():
                            fut.set_exception(e)
                    continue
                for fut in batch:
                    if not fut.done():  # a request that went away meanwhile is cancelled
                        fut.set_result(value)
        finally:
            self._reader = None
