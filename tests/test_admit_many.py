"""An admission pass writes its admissions together (``queue.admit_many``), and
what it writes is what admitting each job alone (``queue.admit``) writes: the
jobs' rows, events, attempts, usage rows, skips, webhook deliveries and counts,
on SQLite and PostgreSQL."""

from __future__ import annotations

import contextlib
from datetime import timedelta

import pytest
from sqlalchemy import event, select, update

from raylane.orchestrator.domain.errors import InvalidTransition
from raylane.orchestrator.domain.routing import route
from raylane.orchestrator.domain.profile import default_profile
from raylane.orchestrator.domain.specs import JobSpec
from raylane.orchestrator.domain.states import AttemptStatus, FailureCause, JobStatus
from raylane.orchestrator.store import db, jobs as store, lifecycle, queue, webhooks as store_webhooks
from raylane.orchestrator.store.tables import attempt_usage, attempts, events, jobs, webhook_deliveries
from raylane.orchestrator.store.transitions import utcnow
from tests.test_tallies import assert_kept_equals_counted

PROFILE = default_profile()
NAMES = ["a", "b", "c", "d", "retry"]


def _spec(name: str, gpus: int = 0) -> JobSpec:
    return JobSpec.model_validate({"name": name, "kind": "command", "entrypoint": f"echo {name}",
                                   "resources": {"gpus_per_worker": gpus, "cpus_per_worker": 1}})


def _make_set(cp, prefix: str) -> dict[str, str]:
    """Jobs ``<prefix>a`` .. ``<prefix>d`` PENDING, and ``<prefix>retry`` RETRYING
    after a preempted first attempt: name -> id."""
    ids = {}
    with db.transaction(cp.sessions) as s:
        for n in NAMES:
            spec = _spec(prefix + n, gpus=1 if n == "d" else 0)
            ids[n] = store.submit(s, spec, placement=route(spec, PROFILE))[0]
    now = utcnow()
    with db.transaction(cp.sessions) as s:
        head = {q.id: q for q in queue.queued(s, now=now)}
        r = ids["retry"]
        queue.admit(s, head[r], head[r].placement, passed_over=[], owner="t", now=now,
                    lease_until=now + timedelta(seconds=30))
        lifecycle.attempt_submitted(s, r, 1, owner="t", note="submitted")
        lifecycle.attempt_running(s, r, 1, driver_node_id="n1")
        lifecycle.attempt_ended(s, r, 1, status=AttemptStatus.LOST, cause=FailureCause.PREEMPTED,
                                message="reclaimed", headline="reclaimed")
        s.execute(update(jobs).where(jobs.c.id == r).values(not_before=None))
    return ids


def _admit(cp, ids: dict[str, str], *, together: bool):
    now = utcnow()
    with db.transaction(cp.sessions) as s:
        head = {q.id: q for q in queue.queued(s, now=now)}
        plan = [queue.Admission(head[ids["a"]], head[ids["a"]].placement, []),
                queue.Admission(head[ids["b"]], head[ids["b"]].placement, [ids["c"]], scale_up="ahead of a node"),
                queue.Admission(head[ids["d"]], head[ids["d"]].placement, [ids["c"], ids["c"]], queued="queued"),
                queue.Admission(head[ids["retry"]], head[ids["retry"]].placement, [])]
        lease = now + timedelta(seconds=30)
        if together:
            return queue.admit_many(s, plan, owner="t", now=now, lease_until=lease)
        return [queue.admit(s, a.job, a.placement, passed_over=a.passed_over, owner="t", now=now, lease_until=lease,
                            scale_up=a.scale_up, queued=a.queued) for a in plan]


@contextlib.contextmanager
def _statements(cp):
    n = [0]

    def count(*_):
        n[0] += 1

    event.listen(cp.engine, "before_cursor_execute", count)
    try:
        yield n
    finally:
        event.remove(cp.engine, "before_cursor_execute", count)


def _written(cp, ids: dict[str, str]) -> dict:
    """What is stored for the set, its ids and times taken out."""
    name = {v: k for k, v in ids.items()}
    with db.transaction(cp.sessions) as s:
        job_rows = {name[r.id]: (r.status, r.status_reason, r.attempts, r.skips, r.node_group, r.placement,
                                 r.lease_owner, r.not_before) for r in s.execute(select(jobs).where(jobs.c.id.in_(ids.values())))}
        ev = [(name[r.job_id], r.from_status, r.to_status, r.reason, r.actor, r.attempt)  # each job's in order
              for r in s.execute(select(events).where(events.c.job_id.in_(ids.values())).order_by(events.c.id))]
        ev.sort(key=lambda e: e[0])
        att = sorted(((name[r.job_id], r.number, r.submission_id.replace(r.job_id, "<id>"), r.node_group, r.market,
                      r.status, r.message, tuple(sorted(r.resources.items())))
                      for r in s.execute(select(attempts).where(attempts.c.job_id.in_(ids.values())))), key=repr)
        use = sorted(((name[r.job_id], r.number, r.project, r.kind, r.node_group, r.market, r.cpu, r.gpu, r.review,
                      r.prev_held_to is not None, r.prev_group_held_to is not None, r.key_id)
                     for r in s.execute(select(attempt_usage).where(attempt_usage.c.job_id.in_(ids.values())))),
                    key=repr)
        hooks = sorted((name[r.job_id], r.status) for r in s.execute(
            select(webhook_deliveries).where(webhook_deliveries.c.job_id.in_(ids.values()))))
    return {"jobs": job_rows, "events": ev, "attempts": att, "usage": use, "deliveries": hooks}


@pytest.mark.parametrize("hooked", [False, True], ids=["no-hook", "a-hook-wants-DISPATCHING"])
def test_admitting_together_writes_what_admitting_each_alone_writes(cp, hooked):
    if hooked:
        with db.transaction(cp.sessions) as s:
            store_webhooks.create(s, hook_id="wh_test", project="default", url="http://127.0.0.1:9/h",
                                  secret="s" * 32, statuses=["DISPATCHING"], events=[], description=None, actor="t",
                                  now=utcnow())
    alone, together = _make_set(cp, "x-"), _make_set(cp, "y-")
    with _statements(cp) as n_alone:
        got_alone = _admit(cp, alone, together=False)
    with _statements(cp) as n_together:
        got_together = _admit(cp, together, together=True)
    # Statements sent (the queue's read and the commit's included): a few for all
    # four, not seven each; with a hook, each event is inserted with its deliveries.
    if not hooked:
        assert n_together[0] <= 14 < 28 <= n_alone[0], (n_together, n_alone)
    assert [(c.attempt, c.placement.node_group, c.scale_up) for c in got_alone] == \
           [(c.attempt, c.placement.node_group, c.scale_up) for c in got_together] == \
           [(1, "cpu", None), (1, "cpu", "ahead of a node"), (1, "gpu", None), (2, "cpu", None)]
    a, t = _written(cp, alone), _written(cp, together)
    for what in a:
        assert a[what] == t[what], what
    assert t["jobs"]["c"][3] == 3  # passed over three times: once by b, twice by d
    assert t["jobs"]["retry"][:3] == ("DISPATCHING", "admitted to cpu; attempt 2", 2)
    assert t["jobs"]["b"][1] == "admitted to cpu; attempt 1; ahead of a node"
    assert ("retry", 2, "default", "command", "cpu", "ON_DEMAND", 1.0, 0.0) == t["usage"][-1][:8]
    assert t["usage"][-1][9:11] == (True, True)  # the retry's row chains to its first attempt's
    assert len(t["deliveries"]) == (5 if hooked else 0)  # the retry was dispatched twice
    assert_kept_equals_counted(cp)


def test_a_job_that_moved_meanwhile_refuses_the_whole_pass(cp):
    ids = _make_set(cp, "z-")
    now = utcnow()
    with pytest.raises(InvalidTransition), db.transaction(cp.sessions) as s:
        head = {q.id: q for q in queue.queued(s, now=now)}
        s.execute(update(jobs).where(jobs.c.id == ids["b"]).values(status=JobStatus.CANCELLED.value))
        queue.admit_many(s, [queue.Admission(head[ids[n]], head[ids[n]].placement, []) for n in ("a", "b")],
                         owner="t", now=now, lease_until=now + timedelta(seconds=30))
    with db.transaction(cp.sessions) as s:  # rolled back: both still queued, no attempt written
        assert {r.status for r in s.execute(select(jobs.c.status).where(jobs.c.id.in_([ids["a"], ids["b"]])))} \
            == {"PENDING"}
        assert s.execute(select(attempts).where(attempts.c.job_id.in_([ids["a"], ids["b"]]))).first() is None
    assert_kept_equals_counted(cp)
