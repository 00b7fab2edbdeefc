"""The auth epoch for requests with a token this replica verified before: one
read serves every request that was already waiting when it started.

A revoke raises the epoch in its own transaction (``services.access``), so a
request that arrives after that commit must see the new value: it needs a read
that *started after it arrived*. ``EpochReads.current()`` gives exactly that.
The requests that arrive while a read runs wait for the next one, which starts
as soon as the running one ends; each read answers everyone waiting when it
began. Alone, a request costs one read, as before; with 32 in flight, a few
share each read and its hop through a worker thread.

On SQLite the read comes first from ``store.epoch_reader.SQLiteEpoch``: a
connection of its own, read on the event loop. In WAL mode a reader never
waits for the writer, and an autocommit SELECT starts a fresh snapshot, so it
sees every commit before it: about 5 us, against 300-380 us of CPU for the pooled read through a worker
thread (a fifth to a third of a single submit's server CPU, docs/benchmarks.md).
When SQLite answers busy (not WAL, a recovery), the read goes the pooled way.
"""

from __future__ import annotations

import asyncio
from typing import Callable

import anyio.to_thread


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
