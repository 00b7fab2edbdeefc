"""Followed logs cost no thread per client (#14.1).

Against a real uvicorn server: a hundred followed streams of a viewer on
pending jobs leave /healthz and GET /v1/jobs answering, a stream past the
token's cap is 429, heartbeats arrive, and closing the streams frees them (the
server's own gauges drop to 0). In process, with an in-memory control plane
standing in for the database and Ray: one log read per job per tick whatever
the number of streams, each stream gets only the new text, and the poller goes
with its last stream.
"""

from __future__ import annotations

import asyncio
import json
import re
import threading
from contextlib import AsyncExitStack

import anyio
import httpx
import pytest

from raylane.orchestrator.domain.errors import RateLimited
from raylane.orchestrator.domain.states import JobStatus
from raylane.orchestrator.services.logfollow import HEARTBEAT, LogFollowers
from tests.conftest import ADMIN_TOKEN
from tests.helpers import wait_for

STREAMS = 100
JOBS = 10
HELLO = {"name": "hello", "kind": "command", "entrypoint": "python -c 'print(42)'"}
BOUND_S = 5.0  # a healthy request's timeout while the streams are open
ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


def _gauge(url: str, name: str) -> float:
    text = httpx.get(url + "/metrics", headers=ADMIN, timeout=BOUND_S).text
    return float(re.search(rf"^{name} (\S+)$", text, re.M).group(1))


@pytest.fixture
def srv(server_factory, db_url, tmp_path):
    return server_factory({"RAYLANE_DATABASE_URL": db_url, "RAYLANE_DATA_DIR": str(tmp_path),
                           "RAYLANE_LOOPS_ENABLED": "false", "RAYLANE_AUTH_ENABLED": "true",
                           "RAYLANE_LOG_STREAMS_PER_TOKEN": str(STREAMS),
                           "RAYLANE_LOG_FOLLOW_HEARTBEAT_S": "1"}).start()


def test_a_hundred_followed_streams_leave_the_api_answering_and_go_when_closed(srv):
    r = httpx.post(srv.url + "/v1/tokens", json={"name": "viewer", "project": "default", "role": "viewer"},
                   headers=ADMIN)
    assert r.status_code == 201, r.text
    viewer = {"Authorization": f"Bearer {r.json()['token']}"}
    ids = [httpx.post(srv.url + "/v1/jobs", json=HELLO, headers=ADMIN).json()["id"] for _ in range(JOBS)]
    opened = threading.Event()
    release = threading.Event()
    seen: dict[str, object] = {}

    async def follow_all():
        limits = httpx.Limits(max_connections=STREAMS + 10)
        async with httpx.AsyncClient(base_url=srv.url, headers=viewer, limits=limits, timeout=30) as c:
            async with AsyncExitStack() as stack:
                for i in range(STREAMS):
                    accept = {"Accept": "application/x-ndjson"} if i == 0 else {}
                    resp = await stack.enter_async_context(
                        c.stream("GET", f"/v1/jobs/{ids[i % JOBS]}/logs", params={"follow": "true"}, headers=accept))
                    assert resp.status_code == 200
                    if i == 0:
                        first = resp
                # A heartbeat, not log text, on the NDJSON stream of a job that has not started.
                # (The line iterator is kept: dropping it would close the stream.)
                lines = first.aiter_lines()
                seen["heartbeat"] = await lines.__anext__()
                over = await c.get(f"/v1/jobs/{ids[0]}/logs", params={"follow": "true"})
                seen["over"] = (over.status_code, over.headers.get("retry-after"), over.json()["detail"])
                opened.set()
                await anyio.to_thread.run_sync(release.wait)

    follower = threading.Thread(target=lambda: asyncio.run(follow_all()), daemon=True)
    follower.start()
    try:
        wait_for(lambda: opened.is_set() or not follower.is_alive(), timeout=120, what="streams open")
        assert opened.is_set(), "the follower thread failed"
        assert seen["heartbeat"] == ""
        code, retry_after, detail = seen["over"]
        assert code == 429 and retry_after and "RAYLANE_LOG_STREAMS_PER_TOKEN" in detail
        assert _gauge(srv.url, "raylane_log_streams") == STREAMS
        assert _gauge(srv.url, "raylane_log_pollers") == JOBS
        # A second client, while every stream is open: each call answers within the bound.
        with httpx.Client(base_url=srv.url, headers=ADMIN, timeout=BOUND_S) as other:
            for _ in range(20):
                assert other.get("/healthz").status_code == 200
                assert len(other.get("/v1/jobs").json()["items"]) == JOBS
    finally:
        release.set()
        follower.join(60)
    assert not follower.is_alive()
    wait_for(lambda: _gauge(srv.url, "raylane_log_streams") == 0, what="streams released")
    wait_for(lambda: _gauge(srv.url, "raylane_log_pollers") == 0, what="pollers gone")
    # The cap counted only open streams: the token may follow again.
    with httpx.stream("GET", srv.url + f"/v1/jobs/{ids[0]}/logs", params={"follow": "true"},
                      headers=viewer, timeout=BOUND_S) as again:
        assert again.status_code == 200


class FakePlane:
    """The control plane's three reads that followers make, in memory."""

    def __init__(self):
        self.status, self.attempts, self.log = JobStatus.RUNNING, 1, "one\n"
        self.reads = self.ticks = 0

    def logs(self, job_id, *, project, attempt):
        from types import SimpleNamespace

        return self.log, SimpleNamespace(status=self.status, attempts=self.attempts)

    def progress(self, ids):
        self.ticks += 1
        return {i: (self.status, self.attempts) for i in ids}

    def attempt_log(self, job_id, attempt):
        self.reads += 1
        return self.log


def test_one_read_per_job_per_tick_fanned_out_and_the_poller_goes_with_its_streams():
    plane = FakePlane()
    hub = LogFollowers(lambda: plane, poll_s=0.01, heartbeat_s=60, max_s=60, per_token=3, max_streams=10)

    async def main():
        streams = [await hub.open("j1", project=None, attempt=None, owner="t") for _ in range(3)]
        with pytest.raises(RateLimited, match="RAYLANE_LOG_STREAMS_PER_TOKEN"):
            await hub.open("j1", project=None, attempt=None, owner="t")
        assert [await s.__anext__() for s in streams] == ["one\n"] * 3
        assert hub.pollers == 1 and hub.streams == 3
        plane.log += "two\n"
        assert [await s.__anext__() for s in streams] == ["two\n"] * 3  # only the new text
        # The hub's own ticker runs beside these ticks (every 10 ms), so count every
        # tick, its and ours, by its one progress query: three streams, yet never
        # more than one read per tick (a read comes after its tick's query).
        ticks_before = plane.ticks
        for _ in range(5):
            await hub._tick()
        assert plane.ticks - ticks_before >= 5 and plane.reads <= plane.ticks
        plane.log += "three\n"
        plane.status = JobStatus.SUCCEEDED
        rest = [[c async for c in s if c is not HEARTBEAT] for s in streams]
        assert rest == [["three\n"]] * 3  # the last read after the end, then the streams end
        assert hub.pollers == 0 and hub.streams == 0
        await hub.close()

    asyncio.run(main())


def test_a_stream_closed_by_its_client_frees_its_slot_and_poller():
    plane = FakePlane()
    plane.attempts, plane.log, plane.status = 0, "", JobStatus.PENDING
    hub = LogFollowers(lambda: plane, poll_s=0.01, heartbeat_s=0.05, max_s=60, per_token=1, max_streams=10)

    async def main():
        s = await hub.open("j1", project=None, attempt=None, owner="t")
        assert await s.__anext__() is HEARTBEAT  # a job that has not started: heartbeats only
        assert plane.reads == 0  # and no Ray read
        await s.aclose()
        assert hub.pollers == 0 and hub.streams == 0
        s = await hub.open("j1", project=None, attempt=None, owner="t")  # the slot is free again
        await s.aclose()
        await hub.close()

    asyncio.run(main())


def test_ndjson_lines_carry_text_with_newlines_and_carriage_returns():
    from raylane.client.sdk import _log_text

    line = json.dumps({"text": "a\r\nb\n"})
    assert "\n" not in line and _log_text(line) == "a\r\nb\n" and _log_text("") == ""
