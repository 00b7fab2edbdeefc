"""The audit of refused requests without a valid token, bounded: aggregated per
client address, minute and status code, never one row per request.

Words: a *bucket* is (client address, UTC minute, status code: 401 without a
valid token, 429 from the address gate). The first refusal of a bucket writes
its audit row at once (``count`` 1), so a single mistaken request is in the
trail when its answer arrives; later ones only add to a counter in memory,
which ``flush`` adds to the row's ``count`` in one transaction every
``FLUSH_EVERY_S`` and when the app stops.

Bounds: at most ``MAX_BUCKETS`` buckets per minute per replica; past that, the
refusals of new addresses go to one bucket whose client is ``*``. So a flood
costs at most ``2 * (MAX_BUCKETS + 1)`` rows per replica and minute, plus one
UPDATE per flush, whatever its rate. Counts not yet flushed when a replica is
killed are lost (at most ``FLUSH_EVERY_S`` of them); their rows are not.
Used from the event loop only, so it needs no lock.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import anyio

log = logging.getLogger(__name__)

FLUSH_EVERY_S = 5.0
MAX_BUCKETS = 1000
OTHERS = "*"  # the client of the bucket that takes the addresses past MAX_BUCKETS


@dataclass
class _Bucket:
    row_id: int | None = None  # None until its row is written (or when writing it failed)
    pending: int = 0  # refusals counted since the last flush, not yet in the row


class RefusalTally:
    def __init__(self, access, *, clock=time.time):
        self.access = access
        self.clock = clock  # wall-clock seconds: buckets are UTC minutes
        self._buckets: dict[tuple[str, int, int], _Bucket] = {}

    async def refused(self, entry: dict) -> None:
        """Count one refused request; ``entry`` is its audit row (``api.auth._entry``)."""
        minute = int(self.clock() // 60)
        key = (entry["client"] or "-", minute, entry["status_code"])
        bucket = self._buckets.get(key)
        if bucket is None and sum(1 for k in self._buckets if k[1] == minute) >= MAX_BUCKETS:
            key = (OTHERS, minute, entry["status_code"])
            entry = {**entry, "client": OTHERS}
            bucket = self._buckets.get(key)
        if bucket is not None:
            bucket.pending += 1
            return
        bucket = self._buckets[key] = _Bucket()  # before the write: a refusal meanwhile counts here
        try:
            bucket.row_id = await anyio.to_thread.run_sync(self.access.record, entry)
        except Exception:  # the refusal happened; losing its audit row must be loud, not fatal
            log.exception("could not write the audit row for refused %s %s", entry["method"], entry["path"])

    async def flush(self) -> None:
        """Add the pending counts to their rows; drop buckets of past minutes."""
        minute = int(self.clock() // 60)
        counts = {}
        for key, b in list(self._buckets.items()):
            if b.row_id is not None and b.pending:
                counts[b.row_id] = b.pending
                b.pending = 0
            if key[1] < minute:
                del self._buckets[key]
        if not counts:
            return
        try:
            await anyio.to_thread.run_sync(self.access.add_to_counts, counts)
        except Exception:
            log.exception("could not add %d refused requests to their audit rows", sum(counts.values()))

    async def run(self) -> None:
        """Flush every FLUSH_EVERY_S until cancelled (the app's lifespan)."""
        while True:
            await anyio.sleep(FLUSH_EVERY_S)
            await self.flush()
