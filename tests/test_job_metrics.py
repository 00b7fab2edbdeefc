"""jobs/metrics.py: the Ray custom metrics a job's driver records (tagged with the
job), counted live and topped up to the result's totals; never failing a job."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from raylane.jobs import metrics
from tests.helpers import wait_for


def ctx(kind="sweep"):
    return SimpleNamespace(job_id="01jobid", project="research", spec=SimpleNamespace(kind=SimpleNamespace(value=kind)),
                           placement=SimpleNamespace(node_group="spot-cpu"), attempt=2)


def test_counts_live_then_tops_up_to_the_result():
    m = metrics.JobMetrics.start(ctx())
    assert metrics.current() is m
    assert m.tags == {"raylane_job_id": "01jobid", "project": "research", "kind": "sweep", "node_group": "spot-cpu",
                      "attempt": "2"}
    m.trial_done()
    m.trial_done(2)
    m.finish({"num_trials": 5, "rows_out": 1000})
    assert m.trials_counted == 5  # 3 live + 2 at the end, never counted twice
    assert m.rows_counted == 1000
    m.finish({"num_trials": 5})  # a second finish adds nothing
    assert m.trials_counted == 5


def test_metrics_that_cannot_be_created_do_not_fail_the_job(monkeypatch):
    import ray.util.metrics

    def broken(*a, **k):
        raise RuntimeError("no metrics agent")

    monkeypatch.setattr(ray.util.metrics, "Gauge", broken)
    m = metrics.JobMetrics.start(ctx("batch_inference"))
    m.rows_done(10)
    m.finish({"rows_out": 10})
    assert m.rows_counted == 0


def test_flush_wait_is_bounded(monkeypatch):
    slept = []
    monkeypatch.setattr(metrics.time, "sleep", slept.append)
    monkeypatch.setenv("RAYLANE_METRICS_FLUSH_S", "3600")
    metrics.JobMetrics.start(ctx()).finish({})
    assert slept == [metrics.MAX_FLUSH_S]


@pytest.fixture(autouse=True)
def _reset():
    yield
    metrics._current = None


def test_running_gauge_is_set_again_while_the_job_runs_and_stops_after(monkeypatch):
    """Ray exports a gauge only in an interval it was set in: the heartbeat re-sets it."""
    monkeypatch.setattr(metrics, "HEARTBEAT_S", 0.01)
    m = metrics.JobMetrics.start(ctx())
    sets = []
    monkeypatch.setattr(m.running, "set", lambda v, tags: sets.append(v))
    wait_for(lambda: sets.count(1) >= 3, timeout=10, what="three heartbeats")
    m.finish({})
    assert sets[-1] == 0  # the heartbeat has stopped before the final 0 ...
    assert not m._beat.is_alive()  # ... and sets nothing after it


def test_tune_callback_pickles_while_a_job_runs():
    """Tune pickles callbacks with its experiment state; the job's metrics (a thread
    lock in the heartbeat) must not be dragged along."""
    from ray import cloudpickle

    m = metrics.JobMetrics.start(ctx())
    cb = cloudpickle.loads(cloudpickle.dumps(metrics.trial_callback()))
    cb.on_trial_complete(0, [], None)
    assert m.trials_counted == 1
    m.finish({})


# The live list of finished trials --------------------------------------------


class FakeClock:
    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


def trial(i: int) -> dict:
    return {"trial_id": f"t{i}", "config": {"x": i}, "status": "TERMINATED"}


def test_live_trials_are_written_at_most_once_per_interval_and_the_last_change_is_not_lost():
    import json

    writes: list[list[dict]] = []
    clock = FakeClock()
    live = metrics.LiveTrials(lambda v: writes.append(json.loads(v)), every_s=0.2, clock=clock)
    live.add(trial(1))
    assert [[t["trial_id"] for t in w] for w in writes] == [["t1"]]  # the first is written at once
    for i in range(2, 50):  # a burst inside the interval: no write per trial
        live.add(trial(i))
    assert len(writes) == 1
    clock.t += 0.2  # the interval ends: the timer writes everything seen, once
    wait_for(lambda: len(writes) == 2, timeout=5)
    assert [t["trial_id"] for t in writes[-1]] == [f"t{i}" for i in range(1, 50)]
    live.flush()  # nothing new: no write
    assert len(writes) == 2


def test_live_trials_keep_the_newest_under_the_size_cap(monkeypatch):
    import json

    monkeypatch.setattr(metrics, "MAX_LIVE_TRIALS_BYTES", 2_000)
    writes: list[list[dict]] = []
    live = metrics.LiveTrials(lambda v: writes.append(json.loads(v)), every_s=0)
    for i in range(200):
        live.add(trial(i))
    last = writes[-1]
    assert len(json.dumps(last)) <= 2_000 and last[-1]["trial_id"] == "t199"


def test_a_failing_store_never_fails_the_sweep():
    tried = []

    def put(value):
        tried.append(value)
        raise RuntimeError("GCS down")

    live = metrics.LiveTrials(put, every_s=0)
    live.add(trial(1))  # logged, not raised
    live.add(trial(2))  # and the next trial is still written
    assert len(tried) == 2
