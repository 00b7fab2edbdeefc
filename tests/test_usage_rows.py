"""The rows /v1/costs and /v1/report sum (``store.usage_rows``) equal a
recomputation from the tables after a random walk of admissions, starts, ends,
refusals, preemptions, retries and cancels, on SQLite and PostgreSQL; the
windowed sums give the answers that pricing every attempt one by one gives
(``costs.costs`` over ``load_usage``, what the endpoints did before); the
migration that creates the rows fills them from what is stored; and the models
match the migrations."""

from __future__ import annotations

import random
from datetime import timedelta

import pytest
from sqlalchemy import update

from raylane.orchestrator.domain import costs
from raylane.orchestrator.domain.profile import default_profile
from raylane.orchestrator.domain.specs import JobSpec
from raylane.orchestrator.domain.states import AttemptStatus, FailureCause, JobStatus
from raylane.orchestrator.loops import dispatcher as dispatcher_mod
from raylane.orchestrator.loops.dispatcher import Dispatcher
from raylane.orchestrator.store import db, jobs as store, lifecycle, migrate, usage, usage_rows
from raylane.orchestrator.store.tables import jobs
from raylane.orchestrator.store.transitions import utcnow
from tests.test_metrics import VIEW

SPECS = [
    JobSpec(name="etl", kind="command", entrypoint="python etl.py"),
    # GPU commands: one names a GPU tool, one names none (always a cheaper-placement candidate).
    JobSpec.model_validate({"name": "smi", "kind": "command", "entrypoint": "nvidia-smi",
                            "resources": {"gpus_per_worker": 1, "cpus_per_worker": 1}}),
    JobSpec.model_validate({"name": "idle", "kind": "command", "entrypoint": "sleep 5",
                            "resources": {"gpus_per_worker": 1, "cpus_per_worker": 2}}),
    # A sweep on on-demand nodes: spot-basis work placed on demand.
    JobSpec.model_validate({"name": "sw", "kind": "sweep", "entrypoint": "examples.sweep:objective",
                            "placement": {"market": "ON_DEMAND"},
                            "sweep": {"metric": "loss", "search_space": {"lr": {"uniform": [0.1, 0.2]}}}}),
    JobSpec.model_validate({"name": "sw2", "kind": "sweep", "entrypoint": "examples.sweep:objective",
                            "sweep": {"metric": "loss", "search_space": {"lr": {"uniform": [0.1, 0.2]}}}}),
]


class Clock:
    def __init__(self):
        self.t = utcnow()

    def __call__(self):
        return self.t


def _step(s, rnd, a, clock):
    """One random observation of live attempt ``a``; True if it ended."""
    jid, n, st = a["job_id"], a["number"], AttemptStatus(a["status"])
    roll = rnd.random()
    if st is AttemptStatus.CLAIMED:
        if roll < 0.1:
            lifecycle.submit_refused(s, jid, n, "Ray said no")
            return True
        if roll < 0.2:
            store.cancel(s, jid, project=None)
            return lifecycle.cancelled_before_submit(s, jid, n) or True
        lifecycle.attempt_submitted(s, jid, n, owner="test", note="submitted")
    elif st is AttemptStatus.SUBMITTED and roll < 0.3:
        lifecycle.attempt_pending(s, jid, n)
    elif st in (AttemptStatus.SUBMITTED, AttemptStatus.PENDING) and roll < 0.8:
        lifecycle.attempt_running(s, jid, n, driver_node_id="n1")
    elif roll < 0.45:
        result = rnd.choice([None, {"gpu_utilization": 0}, {"gpu_utilization": 0.9}, {"loss": 1.0}])
        lifecycle.attempt_succeeded(s, jid, n, exit_code=0, driver_node_id="n1", result=result)
        return True
    elif roll < 0.7:
        lifecycle.attempt_ended(s, jid, n, status=AttemptStatus.LOST, cause=FailureCause.PREEMPTED,
                                message="reclaimed", headline="reclaimed")
        return True
    elif roll < 0.85:
        lifecycle.attempt_ended(s, jid, n, status=AttemptStatus.FAILED, cause=FailureCause.APP_ERROR,
                                message="exit 1", headline="exit 1")
        return True
    elif roll < 0.95:
        store.cancel(s, jid, project=None)
        lifecycle.attempt_ended(s, jid, n, status=AttemptStatus.STOPPED, cause=FailureCause.CANCELLED,
                                message="stopped", headline="stopped")
        return True
    return False


def _walk(cp, monkeypatch, seed: int, steps: int = 60) -> Clock:
    clock = Clock()
    monkeypatch.setattr(lifecycle, "utcnow", clock)
    monkeypatch.setattr(dispatcher_mod, "utcnow", clock)
    d = Dispatcher(cp.settings, cp.sessions, backend=None, profile=default_profile())
    rnd = random.Random(seed)
    with db.transaction(cp.sessions) as s:
        for i in range(16):
            spec = SPECS[i % len(SPECS)]
            store.submit(s, spec, project="research" if spec.kind == "sweep" else "default")
    for _ in range(steps):
        clock.t += timedelta(minutes=rnd.uniform(0, 90))
        with db.transaction(cp.sessions) as s:  # retries are due at once
            s.execute(update(jobs).where(jobs.c.status.in_([JobStatus.PENDING.value, JobStatus.RETRYING.value]))
                      .values(not_before=None))
        d.claim(VIEW)
        with db.transaction(cp.sessions) as s:
            for a in lifecycle.live_attempts(s) + _claimed(s):
                if rnd.random() < 0.6:
                    _step(s, rnd, a, clock)
    return clock


def _claimed(s):
    from sqlalchemy import select

    from raylane.orchestrator.store.tables import attempts

    return [dict(r._mapping) for r in s.execute(
        select(attempts.c.job_id, attempts.c.number, attempts.c.status)
        .where(attempts.c.status == AttemptStatus.CLAIMED.value))]


def _close(a, b, path="") -> None:
    """``a`` equals ``b``, floats to 1e-9 relative."""
    if isinstance(a, dict):
        assert isinstance(b, dict) and set(a) == set(b), (path, a, b)
        for k in a:
            _close(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, list):
        assert isinstance(b, list) and len(a) == len(b), (path, a, b)
        for i, (x, y) in enumerate(zip(a, b)):
            _close(x, y, f"{path}[{i}]")
    elif isinstance(a, float) and not isinstance(b, bool):
        assert b == pytest.approx(a, rel=1e-9, abs=1e-9), path
    else:
        assert a == b, path


def assert_rows_match(cp):
    with db.transaction(cp.sessions) as s:
        kept, counted = usage_rows.read(s), usage_rows.recount(s)
    assert kept == counted


def assert_sums_match_pricing_each_attempt(cp, start, end, now, project=None):
    prof = default_profile()
    kw = {"start": start, "end": end, "now": now, "project": project}
    with db.transaction(cp.sessions) as s:
        each = costs.costs(usage.load_usage(s, start=start, end=end, project=project), prof,
                           start=start, end=end, now=now)
        rows = usage.sums(s, **kw)
        summed = [costs.key_cost(r.usage, r.seconds, prof, r.attempts) for r in rows]
        total = usage.jobs_by(rows, None).get("", 0)
        for group_by in costs.GROUP_BY:
            _close(costs.breakdown(each, group_by),
                   costs.breakdown(summed, group_by, usage.jobs_by(rows, group_by), total))
        reviewed = costs.costs(usage.reviewed(s, **kw), prof, start=start, end=end, now=now)
        by_group = usage.jobs_by(rows, "node_group")
    _close(costs.report_of(each, each, prof, start=start, end=end, break_even=0.7),
           costs.report_of(summed, reviewed, prof, start=start, end=end, break_even=0.7,
                           jobs_by_group=by_group, total_jobs=total))
    return each


@pytest.mark.parametrize("seed", [1, 2])
def test_a_random_walk_keeps_the_rows_and_the_sums_match_pricing_each_attempt(cp, monkeypatch, seed):
    clock = _walk(cp, monkeypatch, seed)
    assert_rows_match(cp)
    t0, t1 = clock.t - timedelta(days=3), clock.t + timedelta(hours=1)
    everything = assert_sums_match_pricing_each_attempt(cp, t0, t1, t1)
    # And through the service the endpoints call (its profile, its job totals).
    from raylane.orchestrator.services import accounting

    monkeypatch.setattr(accounting, "utcnow", lambda: t1)
    prof = accounting.profile(cp)
    for project in (None, "research"):
        with db.transaction(cp.sessions) as s:
            each = costs.costs(usage.load_usage(s, start=t0, end=t1, project=project), prof, start=t0, end=t1, now=t1)
        for group_by in costs.GROUP_BY:
            got = accounting.cost_breakdown(cp, group_by=group_by, start=t0, end=t1, project=project)
            _close(costs.breakdown(each, group_by), {k: got[k] for k in ("group_by", "rows", "total",
                                                                          "unpriced_attempts")})
    assert len({c.usage.job_id for c in everything}) > 3, "the walk made too little to compare"
    rnd = random.Random(seed)
    span = (t1 - t0).total_seconds()
    for _ in range(12):  # windows that cut attempts, some before now with attempts still running
        a, b = sorted(rnd.uniform(0, span) for _ in range(2))
        now = t0 + timedelta(seconds=rnd.uniform(b, span))
        assert_sums_match_pricing_each_attempt(cp, t0 + timedelta(seconds=a), t0 + timedelta(seconds=b), now,
                                               project=rnd.choice([None, "default", "research"]))


def test_the_migration_fills_the_rows_from_what_is_stored(cp, monkeypatch, settings):
    _walk(cp, monkeypatch, seed=3, steps=15)
    with db.transaction(cp.sessions) as s:
        want = usage_rows.recount(s)
    assert want
    cp.engine.dispose()
    from alembic import command

    command.downgrade(migrate.alembic_config(settings.database_url), "0011_schedule_hooks")
    migrate.upgrade(settings.database_url)
    with db.transaction(cp.sessions) as s:
        got = usage_rows.read(s)
    assert set(got) == set(want)
    for k in want:
        assert got[k] == want[k], {c: (got[k][c], want[k][c]) for c in want[k] if got[k][c] != want[k][c]}


def test_rebuild_repairs_the_rows(cp, monkeypatch):
    _walk(cp, monkeypatch, seed=4, steps=10)
    from sqlalchemy import delete

    from raylane.orchestrator.store.tables import attempt_usage

    with db.transaction(cp.sessions) as s:
        s.execute(delete(attempt_usage))
    with db.transaction(cp.sessions) as s:
        usage_rows.rebuild(s, chunk=3)
    assert_rows_match(cp)



def test_an_earlier_attempts_end_that_moves_rechains_the_later_ones(cp, monkeypatch):
    """A job counts once per window at its first attempt there, read from the later
    rows' prev columns: an earlier attempt's span that moves (its cause rewritten,
    so it held nothing) moves them too."""
    from sqlalchemy import func, select

    from raylane.orchestrator.store import transitions
    from raylane.orchestrator.store.tables import attempt_usage

    _walk(cp, monkeypatch, seed=5, steps=40)
    u = attempt_usage.c
    with db.transaction(cp.sessions) as s:
        retried = s.execute(select(u.job_id).where(u.number == 2, u.prev_held_to.is_not(None))
                            .order_by(u.job_id).limit(1)).scalar_one()
        assert s.execute(select(func.count()).where(u.job_id == retried)).scalar_one() >= 2
        transitions.set_attempt_cause(s, retried, 1, costs.SUBMIT_ERROR)
    assert_rows_match(cp)
    with db.transaction(cp.sessions) as s:
        assert s.execute(select(u.prev_held_to).where(u.job_id == retried, u.number == 2)).scalar_one() is None


def test_a_key_without_rows_is_left_out(cp, monkeypatch):
    """A key listed by ``key_ids`` whose last row a purge removed before its columns
    were read is skipped, not an error; a listed key maps to its own columns."""
    _walk(cp, monkeypatch, seed=6, steps=5)
    with db.transaction(cp.sessions) as s:
        ids = usage.key_ids(s)
        keys = usage._keys(s, ids + [12345])
    assert ids and set(keys) == set(ids)
    for i, k in keys.items():
        assert usage_rows.key_id(*k) == i


def test_live_attempts_count(cp, monkeypatch):
    """Attempts still running count up to now: their held seconds and their jobs are
    in the sums (the second range per key, on both backends)."""
    from sqlalchemy import func, select

    from raylane.orchestrator.store.tables import attempt_usage

    clock = _walk(cp, monkeypatch, seed=7, steps=10)
    d = Dispatcher(cp.settings, cp.sessions, backend=None, profile=default_profile())
    with db.transaction(cp.sessions) as s:
        for spec in SPECS[:3]:
            store.submit(s, spec, project="default")
    d.claim(VIEW)
    with db.transaction(cp.sessions) as s:
        for a in _claimed(s):
            lifecycle.attempt_submitted(s, a["job_id"], a["number"], owner="test", note="submitted")
            lifecycle.attempt_running(s, a["job_id"], a["number"], driver_node_id="n1")
    clock.t += timedelta(hours=2)
    u = attempt_usage.c
    with db.transaction(cp.sessions) as s:
        live = s.execute(select(func.count()).where(u.held_to.is_(None), u.held_from.is_not(None))).scalar_one()
    assert live >= 1
    for start in (clock.t - timedelta(days=1), clock.t - timedelta(hours=1)):  # before and after they started
        each = assert_sums_match_pricing_each_attempt(cp, start, clock.t + timedelta(hours=1), clock.t)
        assert any(c.usage.ended_at is None and c.hours > 0 for c in each)
