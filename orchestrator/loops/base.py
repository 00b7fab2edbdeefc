"""Background loops share one base: ``interval``, ``run_once()``, a wake-up
event, errors logged with the traceback and the loop kept alive, and a warning
when a pass overruns its interval. Loops keep no state that matters: it is all
in the database, so a restarted process picks up where the last one stopped."""

from __future__ import annotations

import logging
import threading
import time

from raylane.orchestrator import logcontext

log = logging.getLogger(__name__)


class LoopService:
    name = "loop"

    def __init__(self, interval: float, wake: threading.Event | None = None):
        self.interval = interval
        self.wake = wake or threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.passes = 0
        self.last_took = 0.0  # seconds the last pass ran (``next_wait`` may count it)
        self.last_cpu = 0.0  # CPU-seconds the last pass took, of its own thread

    def run_once(self) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=f"raylane-{self.name}", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 15) -> None:
        self._stop.set()
        self.wake.set()
        if self._thread:
            self._thread.join(timeout)

    def _run(self) -> None:
        while not self._stop.is_set():
            t0, c0 = time.monotonic(), time.thread_time()
            logcontext.bind_job(None)  # a pass starts about no job; run_once binds the one it works on
            try:
                self.run_once()
            except Exception:
                log.exception("%s pass failed; the loop goes on", self.name)
            self.passes += 1
            took = self.last_took = time.monotonic() - t0
            self.last_cpu = time.thread_time() - c0
            if took > max(self.interval, 1.0) * 5:
                log.warning("%s pass took %.1fs (interval %.1fs)", self.name, took, self.interval)
            # Wait for new work or the polling interval, whichever comes first.
            self.wake.wait(self.next_wait())
            self.wake.clear()

    def next_wait(self) -> float:
        return self.interval
