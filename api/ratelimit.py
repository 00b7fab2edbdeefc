"""Submit rate limiting per API token, with the ``limits`` package.

A token may make ``submit_burst`` submits in any window of ``submit_burst /
submit_rate_per_s`` seconds (a moving window, the window rounded to whole
seconds, at least one): a burst of ``submit_burst`` at once, ``submit_rate_per_s``
on average. Past it the answer is 429 with ``Retry-After`` (the seconds until the
oldest submit in the window leaves it), which the SDK honours. A batch counts as
one submit: its size is capped by ``max_batch_jobs`` instead. A refused submit
does not count.

Where the window lives is ``rate_limit_storage``: ``memory://`` (this process;
with N replicas a token gets up to N times the rate) or ``redis://host:port/db``
(shared by every replica that names the same Redis: the limit is the cluster's).
A storage that fails (Redis down) lets submits through, with a warning: the limit
protects the database, and refusing every submit would be the outage it guards
against.
"""

from __future__ import annotations

import logging
import math
import time

from fastapi import Request
from limits import RateLimitItemPerSecond
from limits.storage import storage_from_string
from limits.strategies import MovingWindowRateLimiter

from raylane.orchestrator.domain.errors import RateLimited

log = logging.getLogger(__name__)

# A failing storage is reported at most this often, not on every submit.
STORAGE_WARNING_EVERY_S = 60.0


class SubmitLimit:
    """The submit limit of one app; ``take(key)`` spends one submit of ``key``."""

    def __init__(self, rate_per_s: float, burst: int, storage_uri: str = "memory://"):
        self.rate = rate_per_s
        self.burst = burst
        self.storage_uri = storage_uri
        self._warned_at = -math.inf
        if rate_per_s <= 0:  # unlimited
            self._limiter = None
            return
        self.window_s = max(1, round(burst / rate_per_s))
        self._item = RateLimitItemPerSecond(burst, self.window_s, namespace="raylane-submit")
        self._limiter = MovingWindowRateLimiter(storage_from_string(storage_uri))

    def take(self, key: str) -> float:
        """Take one; return 0 when allowed, else the seconds until one is available."""
        if self._limiter is None:
            return 0.0
        try:
            if self._limiter.hit(self._item, key):
                return 0.0
            reset_at, _ = self._limiter.get_window_stats(self._item, key)
        except Exception as e:  # noqa: BLE001 - any storage failure: see the module docstring
            now = time.monotonic()
            if now - self._warned_at >= STORAGE_WARNING_EVERY_S:
                self._warned_at = now
                log.warning("submit rate limit storage %s failed (%s: %s); submits are not limited while it does",
                            self.storage_uri, type(e).__name__, e)
            return 0.0
        # limits keeps window times on the wall clock; a refusal always waits a little.
        return max(reset_at - time.time(), 0.001)


def submit_limit(request: Request) -> None:
    """Dependency of the submit endpoints (after the caller is known)."""
    limit: SubmitLimit | None = getattr(request.app.state, "submit_limit", None)
    caller = getattr(request.state, "caller", None)
    if limit is None or caller is None:
        return
    key = caller.token_id or f"{caller.name}@{request.client.host if request.client else '-'}"
    wait = limit.take(key)
    if wait > 0:
        raise RateLimited(f"too many submits with this token: at most {limit.rate:g}/s "
                          f"(bursts of {limit.burst}); retry in {wait:.1f}s", retry_after_s=math.ceil(wait))
