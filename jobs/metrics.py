"""Raylane's metrics from inside a running job, as Ray custom metrics
(``ray.util.metrics``), so they show next to Ray's own in Ray's Prometheus
endpoint and the dashboard's Grafana panels.

Every series is tagged with the job: ``raylane_job_id``, ``project``, ``kind``,
``node_group`` and ``attempt`` (the same keys as the Ray job's metadata).

- ``raylane_job_running`` (gauge): 1 while the driver runs the job.
- ``raylane_trials_done`` (counter): finished trials of a sweep.
- ``raylane_rows_done`` (counter): output rows of a batch-inference job.

Ray's Prometheus exposition prefixes them with ``ray_`` (and counters end in
``_total``). Ray exports a process's metrics every ``metrics_report_interval_ms``
(10 s by default): values recorded by a driver that exits sooner may never be
exported. Runners therefore count as they go (``trial_done`` from a Tune
callback, ``rows_done`` per batch); ``finish`` tops the counters up to the
result's totals, and waits ``RAYLANE_METRICS_FLUSH_S`` seconds (default 0: no
wait) for one more export when a job's last numbers matter more than its exit time.

Ray 2.60 exports a gauge only in the interval it was set in, and the node's agent
drops a gauge series it has not heard of for two intervals (checked on this
version: a gauge set once shows for one scrape, then vanishes). A job's
``raylane_job_running`` is therefore set again every second by a daemon thread
for as long as the job runs.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any

TAG_KEYS = ("raylane_job_id", "project", "kind", "node_group", "attempt")
MAX_FLUSH_S = 30.0  # a driver never lingers longer than this for its metrics
HEARTBEAT_S = 1.0  # below Ray's smallest export interval (1 s), so no export misses the gauge

log = logging.getLogger(__name__)
_current: "JobMetrics | None" = None


class JobMetrics:
    def __init__(self, job_id: str, project: str, kind: str, node_group: str, attempt: int):
        from ray.util.metrics import Counter, Gauge

        self.tags = {"raylane_job_id": job_id, "project": project, "kind": kind, "node_group": node_group,
                     "attempt": str(attempt)}
        self.running = Gauge("raylane_job_running", "1 while a Raylane job's driver runs it.", tag_keys=TAG_KEYS)
        self.trials = Counter("raylane_trials_done", "Finished trials of a Raylane sweep.", tag_keys=TAG_KEYS)
        self.rows = Counter("raylane_rows_done", "Output rows of a Raylane batch-inference job.", tag_keys=TAG_KEYS)
        self.trials_counted = 0
        self.rows_counted = 0
        self._stop = threading.Event()
        self._beat: threading.Thread | None = None

    def _heartbeat(self) -> None:
        while not self._stop.is_set():
            try:
                self.running.set(1, tags=self.tags)
            except Exception as e:  # pragma: no cover - metrics must never fail the job
                log.warning("raylane: job metrics heartbeat stopped: %s", e)
                return
            self._stop.wait(HEARTBEAT_S)

    @classmethod
    def start(cls, ctx) -> "JobMetrics":
        """Create the job's metrics (after ``ray.init``) and mark it running."""
        global _current
        try:
            m = cls(ctx.job_id, ctx.project, ctx.spec.kind.value, ctx.placement.node_group, ctx.attempt)
            m.running.set(1, tags=m.tags)
            m._beat = threading.Thread(target=m._heartbeat, name="raylane-metrics", daemon=True)
            m._beat.start()
        except Exception as e:  # metrics must never fail the job
            log.warning("raylane: job metrics unavailable: %s", e)
            m = _Off()
        _current = m
        return m

    def trial_done(self, n: int = 1) -> None:
        if n > 0:
            self.trials.inc(n, tags=self.tags)
            self.trials_counted += n

    def rows_done(self, n: int) -> None:
        if n > 0:
            self.rows.inc(n, tags=self.tags)
            self.rows_counted += n

    def finish(self, result: dict[str, Any]) -> None:
        """Top the counters up to the result's totals and mark the job no longer running."""
        trials = result.get("num_trials")
        if isinstance(trials, int):
            self.trial_done(trials - self.trials_counted)
        rows = result.get("rows_out")
        if isinstance(rows, int):
            self.rows_done(rows - self.rows_counted)
        self._stop.set()
        if self._beat is not None:
            self._beat.join(timeout=5)  # so no late heartbeat sets 1 after the 0 below
        self.running.set(0, tags=self.tags)
        try:
            flush = min(float(os.environ.get("RAYLANE_METRICS_FLUSH_S", "0")), MAX_FLUSH_S)
        except ValueError:
            flush = 0.0
        if flush > 0:
            time.sleep(flush)


class _Off(JobMetrics):
    """Metrics that record nothing (Ray's metrics could not be created)."""

    def __init__(self):
        self.trials_counted = self.rows_counted = 0

    def trial_done(self, n: int = 1) -> None:
        pass

    def rows_done(self, n: int) -> None:
        pass

    def finish(self, result: dict[str, Any]) -> None:
        pass


def current() -> JobMetrics | None:
    """The running job's metrics, or None outside ``python -m raylane.jobs.run``."""
    return _current


def trial_callback():
    """A Ray Tune callback that counts finished trials (pass it in ``RunConfig(callbacks=[...])``)."""
    from ray import tune

    class TrialProgress(tune.Callback):
        # Tune pickles its callbacks with the experiment state, and this local
        # class is pickled by value: look the job's metrics up through the module
        # (pickled by reference), never through a global captured here, which
        # would drag the heartbeat's thread lock into the pickle.
        def on_trial_complete(self, iteration, trials, trial, **info):
            from raylane.jobs import metrics

            if (m := metrics.current()) is not None:
                m.trial_done()
            metrics.trial_finished(trial, error=False)

        def on_trial_error(self, iteration, trials, trial, **info):
            from raylane.jobs import metrics

            if (m := metrics.current()) is not None:
                m.trial_done()
            metrics.trial_finished(trial, error=True)

    return TrialProgress()


# Trials as they finish ------------------------------------------------------------

MAX_LIVE_TRIALS_BYTES = 512 * 1024  # past this, the live list keeps the newest trials; the final result has all
# The live list is written at most this often: the reconciler reads it at most
# once a second (``LIVE_TRIALS_EVERY_S``), and each write encodes the whole list in
# Tune's driver loop, which also starts every next trial (per trial, that was
# quadratic in the sweep's size: 10,000 trials encoded 50 million entries).
LIVE_TRIALS_WRITE_S = 1.0


class LiveTrials:
    """The finished trials so far, written to Ray's store (``put(value)``) at most
    once per ``every_s``; a change inside the interval is written by a timer at
    its end, so the last trials show within ``every_s`` even if none follow."""

    def __init__(self, put, *, every_s: float = LIVE_TRIALS_WRITE_S, clock=time.monotonic):
        self._put, self._every, self._clock = put, every_s, clock
        self._items: dict[str, dict] = {}
        self._lock = threading.Lock()
        # Writes one at a time, each encoding the list as it is then: a slow write
        # (a busy GCS) is never followed by an older list than the one it wrote.
        self._write_lock = threading.Lock()
        self._written_at = float("-inf")
        self._dirty = False
        self._timer: threading.Timer | None = None

    def add(self, item: dict) -> None:
        with self._lock:
            self._items[item["trial_id"]] = item
            self._dirty = True
            wait = self._written_at + self._every - self._clock()
            if wait > 0:
                if self._timer is None:
                    self._timer = threading.Timer(wait, self.flush)
                    self._timer.daemon = True
                    self._timer.start()
                return
        self.flush()

    def encoded(self) -> bytes:
        import json

        items = list(self._items.values())
        value = json.dumps(items).encode()
        while len(value) > MAX_LIVE_TRIALS_BYTES and len(items) > 1:
            items = items[len(items) // 4:]
            value = json.dumps(items).encode()
        return value

    def flush(self) -> None:
        with self._write_lock:
            with self._lock:
                self._timer = None
                if not self._dirty:
                    return
                self._dirty = False
                self._written_at = self._clock()
                value = self.encoded()
            try:
                self._put(value)
            except Exception as e:  # pragma: no cover - live progress is a nicety, never a failure
                log.warning("raylane: could not report finished trials: %s", e)


_live: LiveTrials | None = None


def _put_live_trials(value: bytes) -> None:
    from ray.experimental import internal_kv

    from raylane.orchestrator.domain import ids, protocol

    if not internal_kv._internal_kv_initialized():
        return
    sid = ids.submission_id(os.environ[protocol.Env.JOB_ID], int(os.environ[protocol.Env.ATTEMPT]))
    internal_kv._internal_kv_put(protocol.trials_key(sid), value, overwrite=True, namespace=protocol.KV_NAMESPACE)


def trial_finished(trial, *, error: bool) -> None:
    """Leave the finished trials in Ray's store (``protocol.trials_key``) for the
    reconciler, which shows them while the sweep runs. Never fails the sweep."""
    import json

    global _live
    try:
        if _live is None:
            _live = LiveTrials(_put_live_trials)
        res = dict(getattr(trial, "last_result", None) or {})
        _live.add({
            "trial_id": str(trial.trial_id)[:64], "config": json.loads(json.dumps(trial.config, default=str)),
            "status": "ERROR" if error else "TERMINATED", "node_id": res.get("node_id"),
            "node_group": res.get("node_group"),
            "metrics": {k: v for k, v in res.items() if isinstance(v, (int, float, str)) and not isinstance(v, bool)},
            "error": str(getattr(trial, "error_file", "") or "")[:500] or None if error else None})
    except Exception as e:  # pragma: no cover - live progress is a nicety, never a failure
        log.warning("raylane: could not report a finished trial: %s", e)


def flush_live_trials() -> None:
    """Write what is pending now (the sweep's fit has ended; its timer would die with the process)."""
    if _live is not None:
        _live.flush()
