"""A sweep's experiment snapshots (jobs/sweep.py): Tune's automatic period, which
keeps snapshots to ~5% of the driver's loop, from Raylane's 2 s floor instead of
Tune's 10 s. It wraps a private class of the pinned Ray release: this fails if
that class changes, rather than the floor or the adaptation quietly going."""

from __future__ import annotations

import pytest

from raylane.jobs import sweep


@pytest.fixture
def manager():
    from ray.tune.execution.experiment_state import _ExperimentCheckpointManager

    assert sweep._adaptive_snapshots()
    assert sweep._adaptive_snapshots()  # once is enough: a second call wraps nothing twice
    return _ExperimentCheckpointManager


def test_the_snapshot_period_starts_at_the_floor_and_adapts_to_the_snapshots_cost(manager):
    m = manager(storage=None, checkpoint_period="auto")
    assert m.auto_checkpoint_enabled and m._checkpoint_period == sweep.EXPERIMENT_SNAPSHOT_S
    m._update_auto_checkpoint_time(time_taken=0.01)  # a small sweep: every 2 s
    assert m._checkpoint_period == sweep.EXPERIMENT_SNAPSHOT_S
    m._update_auto_checkpoint_time(time_taken=0.5)  # a large one: 19 times its cost, ~5% of the loop
    assert m._checkpoint_period == pytest.approx(9.5)
    m._update_auto_checkpoint_time(time_taken=0.05)  # and back, as the snapshot gets cheaper
    assert m._checkpoint_period == sweep.EXPERIMENT_SNAPSHOT_S


def test_a_period_the_job_sets_is_kept(manager):
    m = manager(storage=None, checkpoint_period=7)
    assert not m.auto_checkpoint_enabled and m._checkpoint_period == 7.0
    m._update_auto_checkpoint_time(time_taken=1.0)
    assert m._checkpoint_period == 7.0


def test_the_driver_asks_tune_for_the_adaptive_period_unless_the_job_set_one(monkeypatch):
    """``run`` sets TUNE_GLOBAL_CHECKPOINT_S before anything else (it raises on the
    context here, after that): "auto", which the wrapped manager reads from the floor."""
    monkeypatch.delenv("TUNE_GLOBAL_CHECKPOINT_S", raising=False)
    with pytest.raises(AttributeError):
        sweep.run(None)
    import os

    assert os.environ["TUNE_GLOBAL_CHECKPOINT_S"] == "auto"
    monkeypatch.setenv("TUNE_GLOBAL_CHECKPOINT_S", "30")
    with pytest.raises(AttributeError):
        sweep.run(None)
    assert os.environ["TUNE_GLOBAL_CHECKPOINT_S"] == "30"
