"""Rate limits: submits per API token, and requests per client address before
authentication.

**Submits.** A token may make ``submit_burst`` submits in any window of
``submit_burst / submit_rate_per_s`` seconds (the window rounded to whole
seconds, at least one): a burst of ``submit_burst`` at once, ``submit_rate_per_s``
on average. Past it the answer is 429 with ``Retry-After``, which the SDK
honours. A batch counts as one submit: its size is capped by ``max_batch_jobs``
instead. A refused submit does not count.

Where the window lives is ``rate_limit_storage``: ``memory://`` (this process, a
moving window of the ``limits`` package; with N replicas a token gets up to N
times the rate), ``redis://host:port/db`` (the same, shared by every replica
naming that Redis), ``database`` (a sliding window counter in the database,
``orchestrator/store/ratelimits.py``: shared by every replica on it, one short
write per submit), or ``auto``: ``database`` on PostgreSQL, the database
replicas share; ``memory://`` on SQLite, which serves one server, where memory
is exact and costs nothing. A storage that fails (Redis or the database down)
lets submits through, with a warning: the limit protects the database, and
refusing every submit would be the outage it guards against.

**Addresses.** ``AddressGate`` counts, per client address and in this process's
memory, the requests that carry no token this process has seen valid: no token,
a bad one, an unknown one. It is asked before authentication (no database read),
so a flood of such requests gets a cheap 429 with ``Retry-After`` once its
address spent ``address_burst``; requests with a token seen valid pass by it (a
revoked token is still refused by authentication, and forgotten here). It is per
replica on purpose: it guards each replica's own threads and database pool.
"""

from __future__ import annotations

import logging
import math
import time
from collections import OrderedDict

import anyio

from fastapi import Request
from limits import RateLimitItemPerSecond
from limits.storage import storage_from_string
from limits.strategies import MovingWindowRateLimiter

from raylane.orchestrator.domain.errors import RateLimited

log = logging.getLogger(__name__)

AUTO = "auto"
DATABASE = "database"
MEMORY = "memory://"

# A failing storage is reported at most this often, not on every submit.
STORAGE_WARNING_EVERY_S = 60.0


def resolve_storage(storage: str, database_url: str | None) -> str:
    """``auto`` -> ``database`` on PostgreSQL, ``memory://`` on SQLite; others as given."""
    if storage != AUTO:
        return storage
    return DATABASE if (database_url or "").startswith(("postgres://", "postgresql")) else MEMORY


class SubmitLimit:
    """The submit limit of one app; ``take(key)`` spends one submit of ``key``.
    With ``database`` storage it needs ``bind(windows)`` (the app's start-up)."""

    def __init__(self, rate_per_s: float, burst: int, storage_uri: str = MEMORY):
        self.rate = rate_per_s
        self.burst = burst
        self.storage_uri = storage_uri
        self._warned_at = -math.inf
        self._limiter = None
        self._windows = None
        if rate_per_s <= 0:  # unlimited
            return
        self.window_s = max(1, round(burst / rate_per_s))
        if storage_uri != DATABASE:
            self._item = RateLimitItemPerSecond(burst, self.window_s, namespace="raylane-submit")
            self._limiter = MovingWindowRateLimiter(storage_from_string(storage_uri))

    @property
    def limited(self) -> bool:
        return self.rate > 0

    def bind(self, windows) -> None:
        """Count in ``windows`` (``services.ratelimits.DatabaseWindows``) when the storage is the database."""
        if self.storage_uri == DATABASE:
            self._windows = windows

    def take(self, key: str) -> float:
        """Take one; return 0 when allowed, else the seconds until one is available."""
        if not self.limited:
            return 0.0
        try:
            return self._take(key)
        except Exception as e:  # noqa: BLE001 - any storage failure: see the module docstring
            now = time.monotonic()
            if now - self._warned_at >= STORAGE_WARNING_EVERY_S:
                self._warned_at = now
                log.warning("submit rate limit storage %s failed (%s: %s); submits are not limited while it does",
                            self.storage_uri, type(e).__name__, e)
            return 0.0

    def _take(self, key: str) -> float:
        if self.storage_uri == DATABASE:
            if self._windows is None:
                raise RuntimeError("the database storage was never bound to the app's database")
            return self._windows.take(f"submit:{self.window_s}:{key}", limit=self.burst, window_s=self.window_s)
        if self._limiter.hit(self._item, key):
            return 0.0
        reset_at, _ = self._limiter.get_window_stats(self._item, key)
        # limits keeps window times on the wall clock; a refusal always waits a little.
        return max(reset_at - time.time(), 0.001)


async def submit_limit(request: Request) -> None:
    """Dependency of the submit endpoints (after the caller is known). Async, so
    that no limit costs no thread hop; a limit's storage may block (the
    database, Redis), so ``take`` runs in a worker thread."""
    limit: SubmitLimit | None = getattr(request.app.state, "submit_limit", None)
    caller = getattr(request.state, "caller", None)
    if limit is None or caller is None or not limit.limited:
        return
    key = caller.token_id or f"{caller.name}@{request.client.host if request.client else '-'}"
    wait = await anyio.to_thread.run_sync(limit.take, key)
    if wait > 0:
        raise RateLimited(f"too many submits with this token: at most {limit.rate:g}/s "
                          f"(bursts of {limit.burst}); retry in {wait:.1f}s", retry_after_s=math.ceil(wait))


# Addresses and token hashes an AddressGate remembers, at most: a flood from many
# addresses evicts the least recently seen, which then start with a full burst.
MAX_ADDRESSES = 100_000
MAX_KNOWN_TOKENS = 10_000


class AddressGate:
    """Requests per client address without a token seen valid, before authentication.

    A token bucket per address (``burst`` deep, refilled at ``rate_per_s``). Used
    from the event loop only (the auth middleware), so it needs no lock.
    """

    def __init__(self, rate_per_s: float, burst: int):
        self.rate = rate_per_s
        self.burst = burst
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()  # address -> (tokens, at)
        self._known: OrderedDict[str, None] = OrderedDict()  # sha256 of tokens authentication accepted

    def knows(self, token_hash: str | None) -> bool:
        if token_hash is None or token_hash not in self._known:
            return False
        self._known.move_to_end(token_hash)
        return True

    def vouch(self, token_hash: str) -> None:
        self._known[token_hash] = None
        self._known.move_to_end(token_hash)
        while len(self._known) > MAX_KNOWN_TOKENS:
            self._known.popitem(last=False)

    def forget(self, token_hash: str | None) -> None:
        if token_hash is not None:
            self._known.pop(token_hash, None)

    def take(self, address: str) -> float:
        """Spend one request of ``address``: 0 when allowed, else the seconds until one is."""
        if self.rate <= 0:
            return 0.0
        now = time.monotonic()
        tokens, at = self._buckets.pop(address, (float(self.burst), now))
        tokens = min(float(self.burst), tokens + (now - at) * self.rate)
        wait = 0.0 if tokens >= 1 else (1 - tokens) / self.rate
        self._buckets[address] = (tokens - 1 if tokens >= 1 else tokens, now)
        while len(self._buckets) > MAX_ADDRESSES:
            self._buckets.popitem(last=False)
        return wait
