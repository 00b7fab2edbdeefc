"""A sweep's cap on live trials follows its trials' lengths (jobs/sweep.py,
``TrialSizedConcurrency``): Tune's own trial generator, driven here without a
cluster, with a clock the test moves."""

from __future__ import annotations

import time

import pytest
from ray import cloudpickle, tune
from ray.tune.experiment import Experiment

from raylane.jobs.sweep import ACTOR_START_S, LONG_AFTER_S, TrialSizedConcurrency, concurrency_for


def searcher(cap: int, trials: int = 40):
    now = [0.0]
    s = TrialSizedConcurrency(max_concurrent=cap, clock=lambda: now[0])
    s.add_configurations([Experiment("e", run=lambda config: None, config={"x": tune.grid_search(list(range(trials)))})])
    return s, now


def take(s, n: int) -> list[str]:
    """Ask for up to ``n`` trials, as Tune's loop does; the ids it got."""
    out = []
    for _ in range(n):
        t = s.next_trial()
        if t is None:
            break
        out.append(t.trial_id)
    return out


def test_concurrency_for_trial_lengths():
    # One at a time where an actor started for a second trial would be thrown away:
    # the other live trials, (cap - 1) of them, end before an actor's start.
    assert concurrency_for(8, 0.0004) == 1
    assert concurrency_for(8, 0.1) == 1  # 7 x 0.1 s < 1 s
    assert concurrency_for(8, 0.3) == 8  # 7 x 0.3 s > 1 s: every actor started is used
    assert concurrency_for(2, ACTOR_START_S * 0.9) == 1
    assert concurrency_for(2, ACTOR_START_S) == 2
    assert concurrency_for(8, 60.0) == 8
    assert concurrency_for(1, 0.0) == 1


def test_short_trials_run_one_at_a_time_once_their_length_is_known(capsys):
    s, now = searcher(8)
    live = take(s, 20)
    assert len(live) == 8  # the router's cap, before any trial has ended
    for tid in live[:7]:
        s.on_trial_complete(tid, result={"time_total_s": 0.002})
    assert take(s, 5) == []  # one is still live, and one is what microsecond trials need
    s.on_trial_complete(live[7], result={"time_total_s": 0.001})
    assert len(take(s, 5)) == 1
    assert "sweep concurrency 8 -> 1 of 8" in capsys.readouterr().out


def test_long_trials_keep_the_cap_and_failed_trials_say_nothing_of_length():
    s, now = searcher(8)
    live = take(s, 20)
    s.on_trial_complete(live[0], result={"time_total_s": 0.001}, error=True)  # failed early: not a length
    s.on_trial_complete(live[1], result={"time_total_s": 30.0})
    assert len(take(s, 20)) == 2  # two ended, two more: still 8 at once
    assert s.max_concurrent == 8


def test_a_straggler_adds_one_so_it_holds_short_trials_up_for_a_few_seconds_at_most():
    s, now = searcher(8)
    live = take(s, 20)
    for tid in live[1:]:
        s.on_trial_complete(tid, result={"time_total_s": 0.001})
    # live[0] is still running: short trials get one slot beside it, once it has lived long.
    assert take(s, 5) == []
    now[0] = LONG_AFTER_S + 1
    assert len(take(s, 5)) == 1
    assert s.max_concurrent == 2


@pytest.mark.parametrize("how", ["pickle", "state"])
def test_a_restored_sweep_keeps_the_lengths_and_ages_its_live_trials_from_the_restore(how, monkeypatch):
    s, now = searcher(8)
    live = take(s, 20)
    for tid in live[:7]:
        s.on_trial_complete(tid, result={"time_total_s": 0.001})
    now[0] = 1e9  # a reading of the old process's clock
    if how == "pickle":  # a Tuner pickled with its search (cloudpickle, as Tune does)
        r = cloudpickle.loads(cloudpickle.dumps(s))
    else:  # the experiment's snapshot of its search
        r = TrialSizedConcurrency(max_concurrent=8)
        r.set_state(s.get_state())
    assert list(r.lengths) == [0.001] * 7 and r.cap == 8 and r._said == 8
    # live[7] was live at the snapshot: its age counts from the restore, on this
    # process's clock, so once it has lived LONG_AFTER_S it is a straggler and the
    # short trials get a slot beside it.
    assert set(r._born) == {live[7]}
    born = r._born[live[7]]
    assert abs(born - time.monotonic()) < 60
    monkeypatch.setattr(r, "_clock", lambda: born + 1)
    r._resize()
    assert r.max_concurrent == 1
    monkeypatch.setattr(r, "_clock", lambda: born + LONG_AFTER_S + 1)
    r._resize()
    assert r.max_concurrent == 2
