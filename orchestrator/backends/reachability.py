"""Whether Ray answers, as a state with a start time instead of a log line per failure.

Words used here:

- *outage*: from the first failed call to Ray (``down``) until the next call that
  worked (``up``); ``since`` is when it began, and it does not move while the
  outage lasts, so a reason written from it ("Ray cluster unreachable since ...")
  is the same string on every pass and is stored once per job per outage;
- *state*: ``unknown`` until Ray was first asked, then ``reachable`` or
  ``unreachable``; ``checked_at`` (monotonic) is the last observation, so a reader
  can tell a fresh answer from an old one.

One warning is logged when an outage begins and one info line when it ends; the
callers (the dispatcher, the reconciler, API requests, each in its own thread)
report every failure and success here and log nothing of their own about it.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timezone

log = logging.getLogger(__name__)

UNKNOWN, REACHABLE, UNREACHABLE = "unknown", "reachable", "unreachable"


def unreachable_reason(since: datetime) -> str:
    """A queued job's reason while Ray cannot be reached (seconds, UTC: stable for the outage)."""
    return f"Ray cluster unreachable since {since:%Y-%m-%d %H:%M:%S} UTC"


@dataclass(frozen=True)
class RayState:
    state: str  # UNKNOWN, REACHABLE or UNREACHABLE
    since: datetime | None  # when the current state began (UTC); None while unknown
    error: str | None  # the failure that began (or last happened in) the outage
    checked_at: float | None  # time.monotonic() of the last observation


class Reachability:
    """The reachability of one Ray cluster, shared by every caller of its backend."""

    def __init__(self, where: str):
        self.where = where  # named in the log lines: the dashboard's URL
        self._lock = threading.Lock()
        self._state = RayState(UNKNOWN, None, None, None)

    def now(self) -> RayState:
        with self._lock:
            return self._state

    def down(self, error: BaseException | str) -> datetime:
        """Ray could not be used: begin an outage (warning once) or extend it. Returns its start."""
        text = str(error)
        with self._lock:
            began = self._state.state != UNREACHABLE
            since = datetime.now(timezone.utc).replace(microsecond=0) if began else self._state.since
            self._state = RayState(UNREACHABLE, since, text, time.monotonic())
        if began:
            log.warning("Ray cluster at %s unreachable (logged once until it is back; queued jobs say so): %s",
                        self.where, text)
        return since

    def up(self) -> None:
        """A call to Ray worked: end the outage, if there was one (info once)."""
        with self._lock:
            prev = self._state
            if prev.state == REACHABLE:
                self._state = RayState(REACHABLE, prev.since, None, time.monotonic())
                return
            self._state = RayState(REACHABLE, datetime.now(timezone.utc).replace(microsecond=0), None,
                                   time.monotonic())
        if prev.state == UNREACHABLE:
            log.info("Ray cluster at %s reachable again (unreachable since %s)", self.where, prev.since.isoformat())
