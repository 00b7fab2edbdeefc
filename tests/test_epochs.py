"""``api.epochs``: a request gets the auth epoch from a read that began after it
asked (so a revoke committed before the request is seen), and requests waiting
together share one read; on SQLite it is read on the event loop, and busy falls
back to that read."""

from __future__ import annotations

import asyncio
import sqlite3
import threading

import pytest

from raylane.api.epochs import EpochReads
from raylane.orchestrator.services.controlplane import ControlPlane
from raylane.orchestrator.store.epoch_reader import SQLiteEpoch


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


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)  # PostgreSQL reads through the pool (above)
def test_on_sqlite_the_epoch_is_read_on_the_loop_and_a_revoke_is_seen_at_once(api, cp, monkeypatch):
    """A token kept in memory costs no pooled read on SQLite (``SQLiteEpoch``), and
    a revoke committed through another connection refuses the very next request."""
    token = api.post("/v1/tokens", json={"name": "t", "role": "member", "project": "default"}).json()
    headers = {"Authorization": f"Bearer {token['token']}"}
    assert api.get("/v1/jobs", headers=headers).status_code == 200  # verified, kept in memory
    pooled, read = [], cp.access.epoch
    monkeypatch.setattr(cp.access, "epoch", lambda: pooled.append(1) or read())
    api.app.state.auth_epochs._read = cp.access.epoch
    for _ in range(5):
        assert api.get("/v1/jobs", headers=headers).status_code == 200
    assert pooled == []
    other = ControlPlane(cp.settings)  # another replica on the same file
    try:
        other.access.revoke_token(token["id"], actor="test")
    finally:
        other.close()
    r = api.get("/v1/jobs", headers=headers)
    assert r.status_code == 401, r.text


def test_sqlite_busy_falls_back_to_the_pooled_read(tmp_path):
    """The fast read never waits on a lock: busy (here, a rollback journal with a
    writer holding it) answers None, and ``EpochReads`` reads the pooled way."""
    path = tmp_path / "e.db"
    setup = sqlite3.connect(path, isolation_level=None)
    setup.execute("CREATE TABLE auth_epoch (id INTEGER PRIMARY KEY, n INTEGER NOT NULL)")
    setup.execute("INSERT INTO auth_epoch VALUES (1, 4)")
    fast = SQLiteEpoch(str(path))
    assert fast() == 4
    setup.execute("BEGIN EXCLUSIVE")  # no WAL: an exclusive lock keeps readers out
    try:
        assert fast() is None
        pooled = []

        async def main():
            return await EpochReads(lambda: pooled.append(1) or 5, fast).current()

        assert asyncio.run(main()) == 5 and pooled == [1]
    finally:
        setup.execute("ROLLBACK")
        fast.close()
        setup.close()


def test_the_loop_reader_opens_the_engines_own_file_and_never_creates_one(tmp_path, monkeypatch):
    """A relative URL resolved by the engine, then a change of directory: the reader
    opens the engine's file (SQLite names it), not a new empty one where it stands."""
    from sqlalchemy import create_engine

    monkeypatch.chdir(tmp_path)
    engine = create_engine("sqlite:///rel.db")
    with engine.begin() as conn:
        conn.exec_driver_sql("CREATE TABLE auth_epoch (id INTEGER PRIMARY KEY, n INTEGER NOT NULL)")
        conn.exec_driver_sql("INSERT INTO auth_epoch VALUES (1, 9)")
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    fast = SQLiteEpoch.of(engine)
    try:
        assert fast() == 9
        assert list((tmp_path / "elsewhere").iterdir()) == []
    finally:
        fast.close()
        engine.dispose()
    assert SQLiteEpoch.of(create_engine("sqlite://")) is None  # in memory: the pooled read
