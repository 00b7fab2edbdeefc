"""Schedules, pure: which ticks of a cron expression are due, and what to do
with them (docs/schedules.md).

Words:
- *tick*: an instant the cron expression names, in the schedule's time zone
  (so ``0 2 * * *`` in Europe/Berlin is 02:00 local time in winter and summer;
  a local time that does not exist, on the night clocks go forward, is skipped
  as croniter skips it). Stored and compared in UTC.
- *due*: a tick at or before now that has not been handled.
- *missed*: a due tick older than ``starting_deadline_s`` (the control plane
  was down, or the schedule paused). What happens to missed ticks is the
  schedule's ``missed`` policy: ``skip`` them all, ``run_once`` (one run for
  the latest of them) or ``run_all`` (one run each, at most
  ``MAX_CATCH_UP``). A due tick that is not missed always runs (subject to the
  overlap policy).
- *overlap*: a tick comes while the schedule's previous job is still active.
  ``skip`` the tick, ``queue`` it (hold it; it runs when the previous job has
  ended), or ``replace`` the previous job (cancel it, run the new one).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import croniter

OVERLAP_POLICIES = ("skip", "queue", "replace")
MISSED_POLICIES = ("skip", "run_once", "run_all")
MAX_CATCH_UP = 100  # run_all: at most this many runs for one outage
MAX_SCAN = 10_000  # ticks looked at in one pass (a per-second schedule down for hours)


def zone(name: str) -> ZoneInfo:
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError) as e:
        raise ValueError(f"unknown time zone {name!r} (an IANA name such as 'UTC' or 'Europe/Berlin')") from e


def check_cron(expr: str) -> str:
    """The expression if croniter reads it (5 fields, or 6 with seconds last, or @daily
    and friends); ValueError otherwise."""
    if not croniter.is_valid(expr):
        raise ValueError(f"{expr!r} is not a cron expression (5 fields: minute hour day month weekday; "
                         f"a 6th for seconds; or @hourly, @daily, @weekly, @monthly, @yearly)")
    return expr


def next_ticks(expr: str, tz: str, after: datetime, n: int) -> list[datetime]:
    """The next ``n`` ticks strictly after ``after``, in UTC."""
    it = croniter(expr, after.astimezone(zone(tz)))
    return [it.get_next(datetime).astimezone(timezone.utc) for _ in range(n)]


@dataclass(frozen=True)
class Plan:
    """What one pass does with a schedule's due ticks."""

    run: list[datetime]  # ticks to make a job for, oldest first
    skipped: list[datetime]  # ticks recorded as skipped (missed, policy skip)
    next_at: datetime  # the first tick after the last one handled


def plan(expr: str, tz: str, *, next_at: datetime, now: datetime, missed: str, starting_deadline_s: float) -> Plan:
    """Sort the ticks from ``next_at`` (the first unhandled one) up to ``now``."""
    if next_at > now:
        return Plan([], [], next_at)
    it = croniter(expr, (next_at - timedelta(microseconds=1)).astimezone(zone(tz)))
    due: list[datetime] = []
    tick = it.get_next(datetime).astimezone(timezone.utc)
    while tick <= now and len(due) < MAX_SCAN:
        due.append(tick)
        tick = it.get_next(datetime).astimezone(timezone.utc)
    if len(due) == MAX_SCAN:  # more than a pass can look at: the rest counts as missed, unseen
        tick = next_ticks(expr, tz, now, 1)[0]
    cutoff = now - timedelta(seconds=starting_deadline_s)
    late = [t for t in due if t < cutoff]
    fresh = [t for t in due if t >= cutoff]
    if missed == "run_all":
        run = late[-MAX_CATCH_UP:]
        skipped = late[:-MAX_CATCH_UP] if len(late) > MAX_CATCH_UP else []
    elif missed == "run_once":
        run, skipped = late[-1:], late[:-1]
    else:
        run, skipped = [], late
    if missed == "run_once" and fresh and run:
        # The latest missed tick and a fresh one: the fresh one is the one run.
        skipped, run = skipped + run, []
    return Plan(run + fresh, skipped, tick)
