"""Rate limits shared through the database: what ``api.ratelimit`` calls when
``RAYLANE_RATE_LIMIT_STORAGE`` resolves to ``database``.

Each ``take`` is one short transaction (a read of the previous window and one
upsert, ``store.ratelimits``). Old windows are pruned by whichever call finds
``PRUNE_EVERY_S`` passed since this process last pruned: one DELETE a minute
per replica, never one per hit. Times are the replicas' wall clocks (windows
are absolute), so replicas need synchronised clocks, as PostgreSQL replicas
behind one load balancer have anyway.
"""

from __future__ import annotations

import threading
import time

from raylane.orchestrator.store import db, ratelimits as store

PRUNE_EVERY_S = 60.0


class DatabaseWindows:
    def __init__(self, sessions):
        self.sessions = sessions
        self._lock = threading.Lock()
        self._pruned_at = time.monotonic()

    def take(self, key: str, *, limit: int, window_s: int) -> float:
        """Take one hit of ``key``; 0 when allowed, else the seconds to wait."""
        now = time.time()
        with db.transaction(self.sessions) as s:
            wait = store.take(s, key, limit=limit, window_s=window_s, now=now)
        if self._due():
            with db.transaction(self.sessions) as s:
                store.prune(s, now=now, keep_s=2 * window_s)
        return wait

    def _due(self) -> bool:
        with self._lock:
            if time.monotonic() - self._pruned_at < PRUNE_EVERY_S:
                return False
            self._pruned_at = time.monotonic()
            return True
