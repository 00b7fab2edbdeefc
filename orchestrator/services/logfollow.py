"""Followed logs: one poller per followed job, fanned out to its streams.

Words:

- stream: one client's ``GET /v1/jobs/{id}/logs?follow=true``. An async
  generator; it holds no thread. It keeps its own offset into its poller's text
  and waits on the poller's change event, with a timeout that makes a heartbeat.
- poller: one followed (job, attempt): the attempt's log text read so far, the
  attempt it belongs to, whether the job has ended, its streams. It exists while
  it has a stream; the last stream to leave removes it.
- tick: one pass of the hub's single ticker task, every ``poll_s``: one query
  for the status of every followed job, then one Ray log read per followed job
  that has an attempt. A job nobody follows is not read; a job with a hundred
  streams costs what a job with one costs. A job that has not started costs its
  streams nothing but an await on a shared event.

Invariants:

- Every blocking read (the database, Ray) runs under the hub's own thread
  limiter (``READ_THREADS``): however many streams are open, they never take a
  token of the pool that sync endpoints and authentication share.
- Streams are capped per token and per process; a refusal (``RateLimited``:
  429 with Retry-After) is decided before any read.
- A stream ends when its job ends (after a read of the log made after the end
  was seen), when its lifetime ``max_s`` passes, or when its client goes.
- The ticker runs only while a poller exists.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from dataclasses import dataclass, field
from typing import AsyncIterator, Callable

import anyio

from raylane.orchestrator.domain.errors import RateLimited

log = logging.getLogger(__name__)

# Blocking reads in flight at once for all followers together: enough to read a
# few slow Ray logs side by side, few enough to leave the default pool alone.
READ_THREADS = 4
# A refused stream is told to come back after this long: streams are long-lived,
# so a slot frees when someone's job ends or someone's client goes.
CAP_RETRY_AFTER_S = 10

HEARTBEAT = None  # what a stream yields when nothing new came for heartbeat_s
_PRIMED = object()  # a stream's first yield, taken by ``open`` itself


@dataclass(eq=False)
class Poller:
    job_id: str
    attempt: int | None  # None: the job's latest attempt
    text: str = ""  # the log of ``seen_attempt`` as last read
    seen_attempt: int = 0  # 0: no attempt yet
    generation: int = 0  # bumped when the latest attempt changes: streams start over
    done: bool = False
    streams: int = 0
    warned: bool = False  # a failing read is logged once per poller, not per tick
    changed: anyio.Event = field(default_factory=anyio.Event)

    def notify(self) -> None:
        self.changed.set()
        self.changed = anyio.Event()

    def publish(self, attempt: int, text: str) -> None:
        if attempt != self.seen_attempt:
            self.seen_attempt, self.text, self.generation = attempt, text, self.generation + 1
            self.notify()
        elif len(text) > len(self.text):
            self.text = text
            self.notify()

    def finish(self) -> None:
        self.done = True
        self.notify()


class LogFollowers:
    """The followed logs of one server process (``app.state.log_followers``).

    ``cp`` is the control plane (``logs``, ``progress``, ``attempt_log``)."""

    def __init__(self, cp: Callable[[], object], *, poll_s: float, heartbeat_s: float, max_s: float,
                 per_token: int, max_streams: int):
        self._cp = cp
        self.poll_s, self.heartbeat_s, self.max_s = poll_s, heartbeat_s, max_s
        self.per_token, self.max_streams = per_token, max_streams
        self._pollers: dict[tuple[str, int | None], Poller] = {}
        self._owners: Counter[str] = Counter()
        self._limiter = anyio.CapacityLimiter(READ_THREADS)
        self._ticker: asyncio.Task | None = None
        self.reads = 0  # Ray log reads made by ticks (a test counts them)

    @property
    def streams(self) -> int:
        return sum(self._owners.values())

    @property
    def pollers(self) -> int:
        return len(self._pollers)

    async def _read(self, fn, *args):
        return await anyio.to_thread.run_sync(fn, *args, limiter=self._limiter)

    def _reserve(self, owner: str) -> None:
        if self.streams >= self.max_streams:
            raise RateLimited(f"this server holds {self.max_streams} followed log streams, its cap "
                              f"(RAYLANE_LOG_STREAMS_MAX); retry later", retry_after_s=CAP_RETRY_AFTER_S)
        if self._owners[owner] >= self.per_token:
            raise RateLimited(f"this token holds {self.per_token} followed log streams, its cap "
                              f"(RAYLANE_LOG_STREAMS_PER_TOKEN); close one first", retry_after_s=CAP_RETRY_AFTER_S)
        self._owners[owner] += 1

    def _release(self, owner: str) -> None:
        self._owners[owner] -= 1
        if self._owners[owner] <= 0:
            del self._owners[owner]

    async def open(self, job_id: str, *, project: str | None, attempt: int | None,
                   owner: str) -> AsyncIterator[str | None]:
        """A stream of the job's log: text chunks, and ``HEARTBEAT`` after
        ``heartbeat_s`` without any. Raises before the stream exists: NotFound,
        Invalid (no such attempt, no Ray), RateLimited (a cap)."""
        self._reserve(owner)
        try:
            text, job = await self._read(lambda: self._cp().logs(job_id, project=project, attempt=attempt))
        except BaseException:
            self._release(owner)
            raise
        if job.status.is_terminal():
            self._release(owner)
            return _once(text)
        key = (job_id, attempt)
        poller = self._pollers.get(key)
        if poller is None:
            poller = self._pollers[key] = Poller(job_id, attempt)
            if attempt or job.attempts:
                poller.publish(attempt or job.attempts, text)
        poller.streams += 1
        if self._ticker is None:
            self._ticker = asyncio.get_running_loop().create_task(self._run())
        stream = self._stream(poller, owner)
        # Run it to its first yield, inside its ``try``: a generator that never
        # started would never run its ``finally``, and its slot would leak if the
        # client left before the response began. Once started, closing it or
        # dropping it (the event loop's async-generator finalizer) releases it.
        await stream.__anext__()
        return stream

    async def _stream(self, p: Poller, owner: str) -> AsyncIterator[str | None]:
        deadline = anyio.current_time() + self.max_s
        generation, offset = p.generation, 0
        try:
            yield _PRIMED
            while True:
                if p.generation != generation:
                    generation, offset = p.generation, 0
                if len(p.text) > offset:
                    chunk, offset = p.text[offset:], len(p.text)
                    yield chunk
                    continue
                left = deadline - anyio.current_time()
                if p.done or left <= 0:
                    return
                changed = p.changed
                with anyio.move_on_after(min(self.heartbeat_s, left)) as waited:
                    await changed.wait()
                if waited.cancelled_caught and anyio.current_time() < deadline:
                    yield HEARTBEAT
        finally:
            self._leave(p, owner)

    def _leave(self, p: Poller, owner: str) -> None:
        self._release(owner)
        p.streams -= 1
        key = (p.job_id, p.attempt)
        if p.streams <= 0 and self._pollers.get(key) is p:
            del self._pollers[key]

    async def _run(self) -> None:
        try:
            while self._pollers:
                try:
                    await self._tick()
                except Exception:  # noqa: BLE001 - the database failed: the next tick tries again
                    log.exception("followed logs: a tick failed")
                await anyio.sleep(self.poll_s)
        finally:
            self._ticker = None

    async def _tick(self) -> None:
        pollers = list(self._pollers.values())
        progress = await self._read(self._cp().progress, sorted({p.job_id for p in pollers}))
        async with anyio.create_task_group() as tg:
            for p in pollers:
                tg.start_soon(self._refresh, p, progress.get(p.job_id))

    async def _refresh(self, p: Poller, progress) -> None:
        if progress is None:  # the job is gone (deleted): nothing more will come
            p.finish()
            return
        status, attempts = progress
        n = p.attempt or attempts
        if n:
            try:
                text = await self._read(self._cp().attempt_log, p.job_id, n)
                self.reads += 1
            except Exception as e:  # noqa: BLE001 - Ray unreachable: the streams wait, the next tick reads again
                if not p.warned:
                    p.warned = True
                    log.warning("followed log of job %s unreadable for now: %s", p.job_id, e)
                return
            p.warned = False
            p.publish(n, text)
        if status.is_terminal():
            p.finish()

    async def close(self) -> None:
        """Stop the ticker (server shutdown); open streams end with their clients."""
        if self._ticker is not None:
            self._ticker.cancel()
        for p in list(self._pollers.values()):
            p.finish()


async def _once(text: str) -> AsyncIterator[str | None]:
    if text:
        yield text


class LogFollowersCollector:
    """``raylane_log_streams`` and ``raylane_log_pollers`` of this process (per
    replica, like the HTTP histogram): both drop to 0 when every follower has gone."""

    def __init__(self, followers: LogFollowers):
        self._f = followers

    def collect(self):
        from prometheus_client.core import GaugeMetricFamily

        yield GaugeMetricFamily("raylane_log_streams", "Followed log streams open in this process.",
                                value=self._f.streams)
        yield GaugeMetricFamily("raylane_log_pollers", "Jobs whose logs this process polls for followers.",
                                value=self._f.pollers)
