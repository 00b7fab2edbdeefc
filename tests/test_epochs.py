"""``api.epochs``: a request gets the auth epoch from a read that began after it
asked (so a revoke committed before the request is seen), and requests waiting
together share one read."""

from __future__ import annotations

import asyncio
import threading

import pytest

from raylane.api.epochs import EpochReads


def test_a_request_arriving_during_a_read_waits_for_the_next_one():
    value = {"n": 1}
    reads: list[int] = []
    in_read = threading.Event()
    release = threading.Event()

    def read() -> int:
        n = value["n"]
        reads.append(n)
        if len(reads) == 1:
            in_read.set()
            release.wait(10)
        return n

    async def main():
        epochs = EpochReads(read)
        first = asyncio.create_task(epochs.current())
        await asyncio.to_thread(in_read.wait, 10)
        value["n"] = 2  # a revoke commits while the first read runs
        later = [asyncio.create_task(epochs.current()) for _ in range(5)]
        await asyncio.sleep(0)
        release.set()
        return await first, await asyncio.gather(*later)

    first, later = asyncio.run(main())
    assert first == 1
    assert later == [2] * 5  # every one of them saw the revoke
    assert reads == [1, 2]  # the five shared one read


def test_a_failed_read_fails_its_waiters_and_the_next_read_runs():
    calls = {"n": 0}

    def read() -> int:
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("database down")
        return 7

    async def main():
        epochs = EpochReads(read)
        with pytest.raises(RuntimeError, match="database down"):
            await epochs.current()
        return await epochs.current()

    assert asyncio.run(main()) == 7
