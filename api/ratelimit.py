"""Submit rate limiting: one token bucket per API token, in this process's memory.

A bucket holds up to ``submit_burst`` submits and refills at
``submit_rate_per_s``; an empty bucket answers 429 with ``Retry-After`` (the
seconds until one submit is available), which the SDK honours. A batch counts
as one submit: its size is capped by ``max_batch_jobs`` instead.

In memory on purpose: a limit that needs a database write per request would
cost what it protects. With N replicas behind a load balancer a token gets up
to N times the rate; the database is still protected per replica.
"""

from __future__ import annotations

import math
import threading
import time
from collections import OrderedDict

from fastapi import Request

from raylane.orchestrator.domain.errors import RateLimited

MAX_BUCKETS = 10_000  # tokens tracked at once; the least recently used bucket goes first


class TokenBuckets:
    def __init__(self, rate_per_s: float, burst: int, *, clock=time.monotonic):
        self.rate = rate_per_s
        self.burst = burst
        self.clock = clock
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()  # key -> (tokens, at)
        self._lock = threading.Lock()

    def take(self, key: str) -> float:
        """Take one; return 0 when allowed, else the seconds until one is available."""
        if self.rate <= 0:
            return 0.0
        now = self.clock()
        with self._lock:
            tokens, at = self._buckets.pop(key, (float(self.burst), now))
            tokens = min(float(self.burst), tokens + (now - at) * self.rate)
            if tokens >= 1:
                self._buckets[key] = (tokens - 1, now)
                wait = 0.0
            else:
                self._buckets[key] = (tokens, now)
                wait = (1 - tokens) / self.rate
            while len(self._buckets) > MAX_BUCKETS:
                self._buckets.popitem(last=False)
        return wait


def submit_limit(request: Request) -> None:
    """Dependency of the submit endpoints (after the caller is known)."""
    buckets: TokenBuckets | None = getattr(request.app.state, "submit_buckets", None)
    caller = getattr(request.state, "caller", None)
    if buckets is None or caller is None:
        return
    key = caller.token_id or f"{caller.name}@{request.client.host if request.client else '-'}"
    wait = buckets.take(key)
    if wait > 0:
        raise RateLimited(f"too many submits with this token: at most {buckets.rate:g}/s "
                          f"(bursts of {buckets.burst}); retry in {wait:.1f}s", retry_after_s=math.ceil(wait))
