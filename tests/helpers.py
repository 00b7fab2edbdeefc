"""Test helpers: wait on conditions, never on fixed sleeps."""

from __future__ import annotations

import time
from typing import Any, Callable


def wait_for(cond: Callable[[], Any], *, timeout: float = 30, interval: float = 0.05, what: str = "condition",
             max_interval: float = 1.0) -> Any:
    """Poll ``cond`` until it returns a truthy value; return that value.

    Assertion errors inside ``cond`` count as "not yet" until the deadline, then
    the last one is raised so the failure says what was wrong.
    """
    deadline = time.monotonic() + timeout
    last_exc: BaseException | None = None
    while True:
        try:
            value = cond()
            if value:
                return value
            last_exc = None
        except AssertionError as e:
            last_exc = e
        if time.monotonic() > deadline:
            if last_exc:
                raise last_exc
            raise TimeoutError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)
        interval = min(interval * 1.5, max_interval)
