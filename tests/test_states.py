"""The lifecycle's rules (``domain.states``) and the store functions that apply
them (``store.lifecycle``), on SQLite and PostgreSQL: every attempt-status arrow
taken and every other refused, every failure cause with one rule that the docs
show, and the reconciler's path for an OOM and for a cancelled attempt Ray has
forgotten (a stand-in for Ray's Jobs API answers; no cluster needed)."""

from __future__ import annotations

import re
import time
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import insert, select, update

from raylane.orchestrator.backends.ray_jobs import RayJob
from raylane.orchestrator.domain import lanes, protocol
from raylane.orchestrator.domain.errors import InvalidTransition
from raylane.orchestrator.domain.queries import JobFilter
from raylane.orchestrator.domain.ids import submission_id
from raylane.orchestrator.domain.specs import JobSpec, RetryPolicy
from raylane.orchestrator.domain.states import (ATTEMPT_ALLOWED, CAUSES, MAX_INFRA_RETRIES, AttemptStatus,
                                                FailureCause, JobStatus, cause_table_markdown, decide)
from raylane.orchestrator.loops.reconciler import Reconciler
from raylane.orchestrator.store import db, job_reads, jobs as store, lifecycle, tallies
from raylane.orchestrator.store.tables import attempts, jobs
from raylane.orchestrator.store.transitions import set_attempt, transition, utcnow
from raylane.orchestrator.testing import FakeRay

SPEC = JobSpec(name="t", kind="command", entrypoint="true")
DOC = Path(__file__).resolve().parent.parent / "docs" / "reliability.md"


def _dispatched(cp, spec: JobSpec = SPEC, attempt: AttemptStatus = AttemptStatus.CLAIMED) -> str:
    """A DISPATCHING job with attempt 1 in status ``attempt`` (test set-up writes it directly)."""
    with db.transaction(cp.sessions) as s:
        jid = store.submit(s, spec)[0]
        transition(s, jid, JobStatus.DISPATCHING, reason="admitted", actor="test", attempt=1, values={"attempts": 1})
        s.execute(insert(attempts).values(job_id=jid, number=1, submission_id=submission_id(jid, 1),
                                          status=attempt.value, created_at=utcnow()))
    return jid


def _row(cp, table, job_id: str):
    with db.transaction(cp.sessions) as s:
        key = table.c.job_id if table is attempts else table.c.id
        return s.execute(select(table).where(key == job_id)).mappings().one()


# The rules ---------------------------------------------------------------------


def test_every_failure_cause_has_one_rule():
    assert set(CAUSES) == set(FailureCause)


def test_the_docs_cause_table_is_the_states_table():
    text = DOC.read_text()
    block = re.search(r"<!-- cause-table:begin[^>]*-->\n(.*?)<!-- cause-table:end -->", text, re.S)
    assert block is not None, "docs/reliability.md lost its cause-table markers"
    assert block.group(1) == cause_table_markdown(), "regenerate it with states.cause_table_markdown()"
    for cause in FailureCause:  # and the table of how each is told names every cause too
        assert f"| `{cause.value}` | " in text[:block.start()], cause


@pytest.mark.parametrize("cause", [FailureCause.OOM, FailureCause.RUNTIME_ENV, FailureCause.TIMEOUT,
                                   FailureCause.CANCELLED, FailureCause.SUBMIT_ERROR, FailureCause.UNSCHEDULABLE])
def test_causes_that_are_never_retried(cause):
    generous = RetryPolicy(max_attempts=10, retry_app_errors=True)
    d = decide(cause, generous, attempts_done=1, app_attempts=1)
    assert d.status is JobStatus.FAILED and d.delay_s == 0 and "not retried" in d.reason


def test_app_errors_retry_only_when_switched_on_and_spend_attempts():
    off = RetryPolicy(max_attempts=3)
    assert decide(FailureCause.APP_ERROR, off, attempts_done=1, app_attempts=1).status is JobStatus.FAILED
    on = RetryPolicy(max_attempts=3, retry_app_errors=True, backoff_s=2, max_backoff_s=5)
    first = decide(FailureCause.APP_ERROR, on, attempts_done=1, app_attempts=1)
    assert first.status is JobStatus.RETRYING and first.delay_s == 2
    assert decide(FailureCause.APP_ERROR, on, attempts_done=2, app_attempts=2).delay_s == 4
    assert decide(FailureCause.APP_ERROR, on, attempts_done=3, app_attempts=3).status is JobStatus.FAILED
    # Earlier preemptions did not spend attempts: the third app error is the last allowed.
    assert decide(FailureCause.APP_ERROR, on, attempts_done=7, app_attempts=2).delay_s == 5  # capped


@pytest.mark.parametrize("cause", [FailureCause.PREEMPTED, FailureCause.NODE_LOST, FailureCause.LOST])
def test_infrastructure_causes_retry_past_max_attempts_up_to_their_bound(cause):
    p = RetryPolicy(max_attempts=1)
    assert decide(cause, p, attempts_done=5, app_attempts=1).status is JobStatus.RETRYING
    assert decide(cause, p, attempts_done=MAX_INFRA_RETRIES, app_attempts=0).status is JobStatus.RETRYING
    last = decide(cause, p, attempts_done=1 + MAX_INFRA_RETRIES, app_attempts=0)
    assert last.status is JobStatus.FAILED and "giving up" in last.reason


def test_a_job_being_cancelled_ends_cancelled_whatever_the_cause():
    for cause in FailureCause:
        assert decide(cause, RetryPolicy(), attempts_done=1, app_attempts=0, cancelling=True).status \
            is JobStatus.CANCELLED


# Attempt statuses in the store -------------------------------------------------------


def test_every_attempt_arrow_is_taken_and_every_other_refused(cp):
    jid = _dispatched(cp)
    n = 1
    for src in AttemptStatus:
        for dst in AttemptStatus:
            n += 1
            with db.transaction(cp.sessions) as s:  # an attempt in status src (test set-up only)
                s.execute(insert(attempts).values(job_id=jid, number=n, submission_id=submission_id(jid, n),
                                                  status=src.value, created_at=utcnow()))
            if dst in ATTEMPT_ALLOWED[src]:
                with db.transaction(cp.sessions) as s:
                    assert set_attempt(s, jid, n, dst) is src
                want = dst
            else:
                with pytest.raises(InvalidTransition), db.transaction(cp.sessions) as s:
                    set_attempt(s, jid, n, dst)
                want = src
            with db.transaction(cp.sessions) as s:
                assert s.execute(select(attempts.c.status).where(attempts.c.job_id == jid, attempts.c.number == n)
                                 ).scalar_one() == want.value, (src, dst)


def test_an_attempt_observed_from_claim_to_success(cp):
    jid = _dispatched(cp)
    with db.transaction(cp.sessions) as s:
        assert lifecycle.attempt_submitted(s, jid, 1, owner="me", note="submitted to Ray")
    with db.transaction(cp.sessions) as s:
        lifecycle.attempt_pending(s, jid, 1)
    with db.transaction(cp.sessions) as s:
        lifecycle.attempt_running(s, jid, 1, driver_node_id="n1")
    assert _row(cp, jobs, jid)["status"] == JobStatus.RUNNING.value
    with db.transaction(cp.sessions) as s:
        assert lifecycle.attempt_succeeded(s, jid, 1, exit_code=None, driver_node_id="n1",
                                           result={"x": 1}) is JobStatus.SUCCEEDED
    att = _row(cp, attempts, jid)
    assert (att["status"], att["exit_code"], att["driver_node_id"]) == ("SUCCEEDED", 0, "n1")
    job = cp.get(jid, project=None)
    assert job.status is JobStatus.SUCCEEDED and job.result == {"x": 1}
    assert [e.to_status for e in cp.events(jid, project=None)] == [
        JobStatus.PENDING, JobStatus.DISPATCHING, JobStatus.RUNNING, JobStatus.SUCCEEDED]


def test_a_lane_attempt_names_the_host_that_ran_it(cp):
    """A warm lane's attempt is no Ray job of its own: the reconciler records the
    host that took it (``ray_job``); its link is its own page in Ray's dashboard,
    the record its host writes there (a host's page serves every project: admins only)."""
    ray = "http://ray:8265"
    jid = _dispatched(cp)
    with db.transaction(cp.sessions) as s:
        s.execute(update(jobs).where(jobs.c.id == jid).values(placement={
            "node_group": "cpu", "market": "ON_DEMAND", "strategy": "PACK", "colocate": False, "num_workers": 1,
            "worker_resources": {"CPU": 1}, "label_selector": {"ray.io/node-group": "cpu"}, "reasons": [],
            "lane": "cpu"}))
        assert lifecycle.attempt_submitted(s, jid, 1, owner="me", note="queued in the lane")
    with db.transaction(cp.sessions) as s:
        lifecycle.attempt_running(s, jid, 1, driver_node_id="n1", ray_job="raylane-lane-v1-cpu-3")
    with db.transaction(cp.sessions) as s:
        lifecycle.attempt_succeeded(s, jid, 1, exit_code=0, driver_node_id="n1", result=None)  # not named again
    with db.transaction(cp.sessions) as s:
        job = job_reads.get_job(s, jid, project=None, dashboard_url=ray)
        att = job_reads.list_attempts(s, jid, project=None, dashboard_url=ray)[0]
    assert att.ray_job == "raylane-lane-v1-cpu-3"
    assert job.dashboard_url == att.dashboard_url == f"{ray}/#/jobs/{submission_id(jid, 1)}"
    # A Ray job's attempt runs in its own Ray job: no ray_job, a link to its page.
    other = _dispatched(cp, attempt=AttemptStatus.SUBMITTED)
    with db.transaction(cp.sessions) as s:
        lifecycle.attempt_running(s, other, 1, driver_node_id="n1")
    with db.transaction(cp.sessions) as s:
        att = job_reads.list_attempts(s, other, project=None, dashboard_url=ray)[0]
    assert att.ray_job is None and att.dashboard_url == f"{ray}/#/jobs/{submission_id(other, 1)}"
    # Past the dashboard's tail (an hour after it ended) the lane attempt's record is
    # gone: its link is Ray's job list. A Ray job's own page stays (Ray keeps it).
    long_ago = utcnow() - timedelta(seconds=lanes.RECORD_KEEP_S + 60)
    with db.transaction(cp.sessions) as s:
        s.execute(update(attempts).where(attempts.c.job_id.in_([jid, other])).values(ended_at=long_ago))
        s.execute(update(jobs).where(jobs.c.id.in_([jid, other])).values(finished_at=long_ago))
    with db.transaction(cp.sessions) as s:
        job = job_reads.get_job(s, jid, project=None, dashboard_url=ray)
        att = job_reads.list_attempts(s, jid, project=None, dashboard_url=ray)[0]
        own = job_reads.list_attempts(s, other, project=None, dashboard_url=ray)[0]
    assert job.dashboard_url == att.dashboard_url == f"{ray}/#/jobs"
    assert own.dashboard_url == f"{ray}/#/jobs/{submission_id(other, 1)}"
    # A lane attempt that ended before a host took it (stopped) has no record at all.
    unhosted = _dispatched(cp)
    with db.transaction(cp.sessions) as s:
        s.execute(update(jobs).where(jobs.c.id == unhosted).values(placement={**job.placement.model_dump(mode="json")}))
        s.execute(update(attempts).where(attempts.c.job_id == unhosted).values(status="STOPPED", ended_at=utcnow()))
    with db.transaction(cp.sessions) as s:
        assert job_reads.list_attempts(s, unhosted, project=None, dashboard_url=ray)[0].dashboard_url == f"{ray}/#/jobs"


def test_an_attempt_and_its_job_change_together_or_not_at_all(cp):
    """A refused job arrow rolls the attempt's write back with it."""
    jid = _dispatched(cp, attempt=AttemptStatus.RUNNING)
    with db.transaction(cp.sessions) as s:  # a job that cannot become RETRYING or FAILED (test set-up only)
        s.execute(update(jobs).where(jobs.c.id == jid).values(status=JobStatus.PENDING.value))
    with pytest.raises(InvalidTransition), db.transaction(cp.sessions) as s:
        lifecycle.attempt_ended(s, jid, 1, status=AttemptStatus.FAILED, cause=FailureCause.PREEMPTED,
                                message="gone", headline="gone")
    att = _row(cp, attempts, jid)
    assert (att["status"], att["cause"]) == ("RUNNING", None)


def test_a_refused_submission_fails_the_job(cp):
    jid = _dispatched(cp)
    with db.transaction(cp.sessions) as s:
        d = lifecycle.submit_refused(s, jid, 1, "bad entrypoint")
    assert d.status is JobStatus.FAILED
    job, att = _row(cp, jobs, jid), _row(cp, attempts, jid)
    assert (job["status"], job["failure_cause"], job["lease_owner"]) == ("FAILED", "SUBMIT_ERROR", None)
    assert (att["status"], att["cause"], att["message"]) == ("FAILED", "SUBMIT_ERROR", "bad entrypoint")


def test_a_cancel_that_wins_the_race_with_submit_is_reported_to_the_dispatcher(cp):
    """Cancelled while Ray was accepting it: the attempt stays STOPPED and the
    dispatcher is told, so it stops the Ray job no one else knows of."""
    jid = _dispatched(cp)
    with db.transaction(cp.sessions) as s:
        store.cancel(s, jid, project=None)
    with db.transaction(cp.sessions) as s:
        assert lifecycle.cancelled_before_submit(s, jid, 1)
    with db.transaction(cp.sessions) as s:
        assert not lifecycle.attempt_submitted(s, jid, 1, owner="me", note="submitted to Ray")
    job, att = _row(cp, jobs, jid), _row(cp, attempts, jid)
    assert (job["status"], job["failure_cause"]) == ("CANCELLED", "CANCELLED")
    assert (att["status"], att["cause"]) == ("STOPPED", "CANCELLED")


def test_a_cancel_after_the_attempt_reached_ray_waits_for_ray(cp):
    jid = _dispatched(cp, attempt=AttemptStatus.SUBMITTED)
    with db.transaction(cp.sessions) as s:
        store.cancel(s, jid, project=None)
    with db.transaction(cp.sessions) as s:
        assert not lifecycle.cancelled_before_submit(s, jid, 1)
    assert _row(cp, jobs, jid)["status"] == JobStatus.CANCELLING.value


# The reconciler's path, with Ray's answers stood in -------------------------------------


def fake_ray(answers: dict[str, RayJob | None], cls=FakeRay) -> FakeRay:
    """Ray with one record per submission id (None: Ray has no record of it), and no
    GCS address known (no drain checks)."""
    ray = cls(gcs=False)
    ray.record(*(j for j in answers.values() if j is not None))
    return ray


def _reconcile(cp, settings, answers) -> FakeRay:
    ray = fake_ray(answers)
    Reconciler(settings, cp.sessions, ray).run_once()
    return ray


def test_a_job_cancelled_before_its_attempt_reached_ray_is_stopped_there_too(cp, settings):
    """Its dispatcher may have died mid-submit, leaving the attempt in Ray."""
    jid = _dispatched(cp)
    with db.transaction(cp.sessions) as s:
        store.cancel(s, jid, project=None)
    ray = _reconcile(cp, settings, {})
    assert ray.stopped == [submission_id(jid, 1)]
    job, att = _row(cp, jobs, jid), _row(cp, attempts, jid)
    assert (job["status"], job["failure_cause"]) == ("CANCELLED", "CANCELLED")
    assert (att["status"], att["cause"]) == ("STOPPED", "CANCELLED")


def test_an_oom_is_not_retried(cp, settings):
    spec = JobSpec(name="t", kind="command", entrypoint="true",
                   retry=RetryPolicy(max_attempts=5, retry_app_errors=True))
    jid = _dispatched(cp, spec, attempt=AttemptStatus.RUNNING)
    sid = submission_id(jid, 1)
    _reconcile(cp, settings, {sid: RayJob(sid, "FAILED", "killed", "JOB_ENTRYPOINT_COMMAND_ERROR",
                                          1, 2, "aa" * 28, 137, {})})
    job, att = _row(cp, jobs, jid), _row(cp, attempts, jid)
    assert (job["status"], job["failure_cause"], job["attempts"]) == ("FAILED", "OOM", 1)
    assert (att["status"], att["cause"], att["exit_code"]) == ("FAILED", "OOM", 137)
    assert "OOM is not retried" in job["status_reason"]


def test_a_cancelled_job_whose_ray_job_vanished_ends_cancelled_not_lost(cp, settings):
    jid = _dispatched(cp, attempt=AttemptStatus.RUNNING)
    with db.transaction(cp.sessions) as s:
        lifecycle.attempt_running(s, jid, 1, driver_node_id=None)
        store.cancel(s, jid, project=None)
    ray = _reconcile(cp, settings, {})  # Ray has no record of the attempt
    assert ray.stopped == []
    job, att = _row(cp, jobs, jid), _row(cp, attempts, jid)
    assert (job["status"], job["failure_cause"]) == ("CANCELLED", "CANCELLED")
    assert (att["status"], att["cause"]) == ("LOST", "CANCELLED")


def test_an_attempt_ray_forgot_is_lost_and_retried(cp, settings):
    jid = _dispatched(cp, attempt=AttemptStatus.RUNNING)
    _reconcile(cp, settings, {})
    job, att = _row(cp, jobs, jid), _row(cp, attempts, jid)
    assert (job["status"], job["failure_cause"]) == ("RETRYING", "LOST")
    assert (att["status"], att["cause"]) == ("LOST", "LOST")


def test_an_outcome_another_replica_wrote_first_is_no_error_and_each_line_names_its_job(cp, settings, caplog):
    """Two replicas read the same finished attempts; the other one records them
    while this one asks Ray. This one's writes are refused (the jobs moved): a
    race, logged at DEBUG with the job each line is about, never an ERROR."""
    import logging

    from raylane.orchestrator import logcontext

    ids = [_dispatched(cp, attempt=AttemptStatus.RUNNING) for _ in range(3)]
    answers = {submission_id(j, 1): RayJob(submission_id(j, 1), "SUCCEEDED", "", None, 1, 2, "aa" * 28, 0, {})
               for j in ids}

    class Raced(FakeRay):
        def get_many(self, sids):
            Reconciler(settings, cp.sessions, fake_ray(answers)).run_once()  # the other replica, first
            return super().get_many(sids)

    caplog.handler.addFilter(logcontext.ContextFilter())
    with caplog.at_level(logging.DEBUG, logger="raylane"):
        Reconciler(settings, cp.sessions, fake_ray(answers, Raced)).run_once()
    assert all(_row(cp, jobs, j)["status"] == "SUCCEEDED" for j in ids)
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text
    refused = [r for r in caplog.records if "moved since this pass read it" in r.getMessage()]
    assert sorted(r.job_id for r in refused) == sorted(ids), caplog.text
    assert all(r.job_id in r.getMessage() for r in refused)


def test_an_outcome_refused_again_and_again_is_warned_once(settings, caplog):
    """A race resolves by the next pass; the same attempt refused pass after pass
    is something else, and says so once."""
    import logging

    from raylane.orchestrator.loops.reconciler import CONFLICTS_WARN

    rec = Reconciler(settings, None, fake_ray({}))
    with caplog.at_level(logging.DEBUG, logger="raylane"):
        for _ in range(3 * CONFLICTS_WARN):
            rec._conflict("j1", 1, InvalidTransition("job j1 is SUCCEEDED; it cannot become SUCCEEDED"))
    warned = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 1 and "j1" in warned[0].getMessage(), caplog.text


def test_a_refused_submission_of_a_job_being_cancelled_ends_it_cancelled(cp):
    jid = _dispatched(cp)
    with db.transaction(cp.sessions) as s:
        store.cancel(s, jid, project=None)
    with db.transaction(cp.sessions) as s:
        assert lifecycle.submit_refused(s, jid, 1, "bad entrypoint").status is JobStatus.CANCELLED
    job, att = _row(cp, jobs, jid), _row(cp, attempts, jid)
    assert (job["status"], job["failure_cause"]) == ("CANCELLED", "CANCELLED")
    assert (att["status"], att["cause"]) == ("FAILED", "SUBMIT_ERROR")


def test_only_set_attempt_writes_an_attempts_status():
    """Nothing but store.transitions.set_attempt updates attempts.status (a grep
    over the code; a new attempt is inserted CLAIMED by the claim)."""
    root = Path(__file__).resolve().parent.parent
    offenders = []
    for path in list((root / "orchestrator").rglob("*.py")) + list((root / "api").rglob("*.py")):
        if path.name == "transitions.py":
            continue
        text = path.read_text()
        for m in re.finditer(r"update\(attempts\)", text):
            statement = re.split(r"\n\s*\n|s\.execute\(", text[m.end():m.end() + 600])[0]
            if re.search(r"\.values\([^)]*\bstatus\s*=[^=]", statement):
                offenders.append(f"{path.relative_to(root)}: {statement[:80]}")
    assert not offenders, offenders


def test_a_scale_up_that_never_comes_ends_the_job_with_the_reason(cp, settings):
    """An attempt admitted ahead of a scale-up (its message says so) whose driver
    is still pending in Ray past scale_up_deadline_s is stopped, and ends FAILED
    with cause SCALE_UP_TIMEOUT and a reason naming the group; an attempt
    pending in Ray for another reason (a runtime env being set up) is left alone."""
    waiting = "waiting for the autoscaler: 0 of 1 gpu nodes up"
    ahead, other = _dispatched(cp, attempt=AttemptStatus.SUBMITTED), _dispatched(cp, attempt=AttemptStatus.SUBMITTED)
    long_ago = utcnow() - timedelta(seconds=120)
    with db.transaction(cp.sessions) as s:
        s.execute(update(jobs).where(jobs.c.id == ahead).values(placement={"node_group": "gpu"}))
        s.execute(update(attempts).where(attempts.c.job_id == ahead).values(message=waiting, created_at=long_ago))
        s.execute(update(attempts).where(attempts.c.job_id == other).values(created_at=long_ago))
    fast = settings.model_copy(update={"scale_up_deadline_s": 60})
    sids = {jid: submission_id(jid, 1) for jid in (ahead, other)}
    pending = {sid: RayJob(sid, "PENDING", None, None, None, None, None, None, {}) for sid in sids.values()}
    assert _reconcile(cp, fast, pending).stopped == [sids[ahead]]
    assert _row(cp, jobs, ahead)["status_reason"] == f"scale-up of group gpu did not come within 60 s " \
                                                     f"(scale_up_deadline_s); {waiting}"
    stopped = {sids[ahead]: RayJob(sids[ahead], "STOPPED", "stopped", None, 1, 2, None, None, {}),
               sids[other]: pending[sids[other]]}
    _reconcile(cp, fast, stopped)
    job, att = _row(cp, jobs, ahead), _row(cp, attempts, ahead)
    assert (job["status"], job["failure_cause"]) == ("FAILED", "SCALE_UP_TIMEOUT")
    assert (att["status"], att["cause"]) == ("STOPPED", "SCALE_UP_TIMEOUT")
    assert "scale-up of group gpu did not come within 60 s" in job["status_reason"]
    assert _row(cp, jobs, other)["status"] == "DISPATCHING"


def test_a_burst_of_completions_is_one_commit_and_one_bad_write_undoes_no_other(cp, settings, monkeypatch):
    """30 attempts ended in Ray since the last pass: one transaction writes them all
    (each in a savepoint); the one whose write fails stays as it was, its result
    kept in Ray's store for the next pass; the others are stored and forgotten."""
    from sqlalchemy import event

    spec = JobSpec(name="t", kind="training", entrypoint="m:f", resources={"num_workers": 1})
    ids = [_dispatched(cp, spec, attempt=AttemptStatus.RUNNING) for _ in range(30)]
    bad = ids[7]
    real = lifecycle.attempt_succeeded

    def attempt_succeeded(s, job_id, *a, **kw):
        out = real(s, job_id, *a, **kw)
        if job_id == bad:  # after its rows (and tallies) were written: the savepoint must undo them
            raise RuntimeError("disk full")
        return out

    monkeypatch.setattr(lifecycle, "attempt_succeeded", attempt_succeeded)
    commits = []

    def count(conn):
        commits.append(1)

    sids = {j: submission_id(j, 1) for j in ids}
    ray = FakeRay()  # ... with Ray's store of results, as a runner job's end reads it
    ray.record(*(RayJob(sid, "SUCCEEDED", None, None, 1, 2, "n1", 0, {}) for sid in sids.values()))
    for sid in sids.values():
        ray.gcs.put_result(sid, {"loss": 0.1})

    def forgotten() -> list[str]:
        return [sid for sid in sids.values() if protocol.result_key(sid) not in ray.gcs.kv]

    event.listen(cp.engine, "commit", count)
    try:
        Reconciler(settings, cp.sessions, ray).run_once()
    finally:
        event.remove(cp.engine, "commit", count)
    assert len(commits) <= 2, len(commits)  # the pass's read of live attempts, and one write of 30 outcomes
    assert {j: _row(cp, jobs, j)["status"] for j in ids} == {j: "DISPATCHING" if j == bad else "SUCCEEDED"
                                                             for j in ids}
    assert sorted(forgotten()) == sorted(sid for j, sid in sids.items() if j != bad)
    assert _row(cp, attempts, bad)["status"] == "RUNNING"
    with db.transaction(cp.sessions) as s:
        kept, counted = tallies.read(s), tallies.recount(s)
    assert {k: v for k, v in kept.items() if k[0] == "jobs"} == {k: v for k, v in counted.items() if k[0] == "jobs"}
    monkeypatch.setattr(lifecycle, "attempt_succeeded", real)
    Reconciler(settings, cp.sessions, ray).run_once()  # the next pass writes it
    assert _row(cp, jobs, bad)["status"] == "SUCCEEDED" and sids[bad] in forgotten()


def test_a_status_change_naming_no_column_is_refused_not_dropped(cp):
    """The statements take their SET from the parameters: a misspelt column must
    still fail loudly, as ``.values(...)`` did."""
    jid = _dispatched(cp)
    with pytest.raises(ValueError, match="no column finshed_at"), db.transaction(cp.sessions) as s:
        transition(s, jid, JobStatus.RUNNING, reason="x", actor="test", values={"finshed_at": utcnow()})
    with pytest.raises(ValueError, match="no column ended"), db.transaction(cp.sessions) as s:
        set_attempt(s, jid, 1, AttemptStatus.STOPPED, values={"ended": utcnow()})


def test_live_attempts_are_polled_at_a_rate_not_a_pause_after_each_pass(settings):
    """While attempts live, passes start every FAST_POLL_S (a pass's own time is
    not added to the period); a pass of more than half the period waits as long
    as it took, one longer than the period the whole period (as before); idle,
    the loop waits the full interval."""
    from raylane.orchestrator.loops.reconciler import FAST_POLL_S

    rec = Reconciler(settings, None, fake_ray({}))
    assert rec.next_wait() == settings.reconcile_interval_s
    rec._live = 1
    for took, period in ((0.0, FAST_POLL_S), (0.3 * FAST_POLL_S, FAST_POLL_S), (0.75 * FAST_POLL_S, 1.5 * FAST_POLL_S),
                         (3 * FAST_POLL_S, 4 * FAST_POLL_S)):
        rec.last_took = took
        assert took + rec.next_wait() == pytest.approx(period), took


def test_fast_polling_takes_at_most_its_share_of_a_core(settings):
    """The passes' own CPU (the median of the last PASS_CPU_KEPT) sets a floor
    under the fast period (PASS_CPU_SHARE of a core): passes of 1 ms keep the 20
    ms period, passes of 2 ms (a burst's many attempts on a busy head) start every
    40 ms, one dear pass among cheap ones (a sweep) changes nothing; the quiet
    rule's cap and the interval still bound it. The loop measures each pass's CPU,
    of its own thread."""
    from raylane.orchestrator.loops import reconciler as rmod

    rec = Reconciler(settings.model_copy(update={"reconcile_interval_s": 1.0}), None, fake_ray({}))
    rec._live = 1

    def period(*cpus: float) -> float:  # the period after passes of these CPU-seconds
        for cpu in cpus:
            rec.last_took, rec.last_cpu = 0.0, cpu
            wait = rec.next_wait()
        return wait

    steady = [0.0] * rmod.PASS_CPU_KEPT
    assert period(*steady) == pytest.approx(rmod.FAST_POLL_S, abs=1e-3)
    assert period(*[rmod.FAST_POLL_S * rmod.PASS_CPU_SHARE] * rmod.PASS_CPU_KEPT) == \
        pytest.approx(rmod.FAST_POLL_S, abs=1e-3)
    assert period(*[0.002] * rmod.PASS_CPU_KEPT) == pytest.approx(0.002 / rmod.PASS_CPU_SHARE, abs=1e-3)
    assert 0.002 / rmod.PASS_CPU_SHARE > 1.5 * rmod.FAST_POLL_S
    assert period(*steady, 0.5) == pytest.approx(rmod.FAST_POLL_S, abs=1e-3)  # one dear pass
    assert period(*[1.0] * rmod.PASS_CPU_KEPT) == pytest.approx(rmod.QUIET_POLL_MAX_S, abs=1e-3)

    class Spin(Reconciler):  # a pass that burns 3 ms of CPU: the loop measures it
        def run_once(self):
            self._live = 1
            t = time.thread_time()
            while time.thread_time() - t < 0.003:
                pass
            if self.passes >= 2:
                self._stop.set()

    spin = Spin(settings, None, fake_ray({}))
    spin.start()
    try:
        spin._thread.join(10)
        assert not spin._thread.is_alive()
        assert 0.003 <= spin.last_cpu < 0.05
    finally:
        spin.stop()


def test_a_quiet_live_attempt_is_polled_less_often_until_something_changes(cp, settings):
    """A job running with nothing changing is polled at a period that grows with
    the quiet time (QUIET_POLL_SHARE of it) up to QUIET_POLL_MAX_S; a pass that
    sees a change (Ray's status, a new attempt, a cancel) polls fast again."""
    from raylane.orchestrator.loops import reconciler as rmod

    jid = _dispatched(cp, attempt=AttemptStatus.RUNNING)
    with db.transaction(cp.sessions) as s:
        transition(s, jid, JobStatus.RUNNING, reason="started", actor="test", attempt=1)
    sid = submission_id(jid, 1)
    ray = fake_ray({sid: RayJob(sid, "RUNNING", None, None, 1, None, "n1", None, {})})
    rec = Reconciler(settings, cp.sessions, ray)

    def period() -> float:
        rec.last_took = 0.0  # the period alone, not less the pass's own time
        return rec.next_wait()

    rec.run_once()
    assert period() == pytest.approx(rmod.FAST_POLL_S, abs=1e-3)  # just seen: fast

    def quiet_for(seconds: float) -> float:
        rec._changed_at -= seconds  # as if the passes since had seen the same
        rec.run_once()  # ... and so does this one: the quiet time stands
        return period()

    assert quiet_for(5) == pytest.approx(5 * rmod.QUIET_POLL_SHARE, rel=0.05)
    assert quiet_for(3600) == pytest.approx(rmod.QUIET_POLL_MAX_S, abs=1e-3)
    # Ray says it ended: the pass writes the outcome and polls fast again.
    ray.record(RayJob(sid, "SUCCEEDED", None, None, 1, 2, "n1", 0, {}))
    rec.run_once()
    assert period() == pytest.approx(rmod.FAST_POLL_S, abs=1e-3)
    # A cancel (the API wakes the loop) is a change too.
    other = _dispatched(cp, attempt=AttemptStatus.RUNNING)
    osid = submission_id(other, 1)
    ray.record(RayJob(osid, "RUNNING", None, None, 1, None, "n1", None, {}))
    rec.run_once()  # writes it RUNNING: the next pass sees that change
    rec.run_once()
    assert period() == pytest.approx(rmod.FAST_POLL_S, abs=1e-3)
    rec._changed_at -= 3600
    rec.run_once()
    assert period() == pytest.approx(rmod.QUIET_POLL_MAX_S, abs=1e-3)
    with db.transaction(cp.sessions) as s:
        store.cancel(s, other, project=None)
    rec.run_once()
    assert ray.stopped == [osid]
    assert period() == pytest.approx(rmod.FAST_POLL_S, abs=1e-3)


def test_a_live_attempts_spec_and_placement_are_read_once_while_it_is_current(cp):
    """The reconciler reads the live attempts every 20 ms: each job's spec and
    placement (JSON, decoded) only when its attempt is new to the caller's map,
    not on every read; a retry is a new attempt (its placement is new), read
    again, and an attempt no longer live leaves the map."""
    from sqlalchemy import event

    a = _dispatched(cp, attempt=AttemptStatus.RUNNING)
    b = _dispatched(cp, spec=SPEC.model_copy(update={"timeout_s": 30.0}), attempt=AttemptStatus.SUBMITTED)
    details = []

    def count(conn, cursor, statement, *args):
        if "jobs.spec" in statement:
            details.append(statement)

    event.listen(cp.engine, "before_cursor_execute", count)
    try:
        known: dict = {}
        for _ in range(3):
            with db.read(cp.sessions) as s:
                live = lifecycle.live_attempts(s, known)
            assert [(r["job_id"], r["spec"]["timeout_s"] if r["job_id"] == b else r["spec"]["kind"]) for r in live] == \
                sorted([(a, SPEC.kind.value), (b, 30.0)])
        assert len(details) == 1  # the first read only
        with db.transaction(cp.sessions) as s:  # a's attempt ends; its retry is admitted elsewhere
            set_attempt(s, a, 1, AttemptStatus.FAILED)
            transition(s, a, JobStatus.RETRYING, reason="retry", actor="test", attempt=1)
            transition(s, a, JobStatus.DISPATCHING, reason="admitted", actor="test", attempt=2,
                       values={"attempts": 2, "placement": {"node_group": "gpu", "lane": None}})
            s.execute(insert(attempts).values(job_id=a, number=2, submission_id=submission_id(a, 2),
                                              status=AttemptStatus.SUBMITTED.value, created_at=utcnow()))
        with db.read(cp.sessions) as s:
            live = lifecycle.live_attempts(s, known)
        assert {(r["job_id"], r["number"]): r["placement"] for r in live}[(a, 2)] == {"node_group": "gpu", "lane": None}
        assert len(details) == 2 and set(known) == {(a, 2), (b, 1)}
    finally:
        event.remove(cp.engine, "before_cursor_execute", count)


def _sqlite_plane(tmp_path):
    """(settings, control plane) on a SQLite file of its own, without loops: for
    tests that open a second connection to the same file."""
    from raylane.orchestrator.services.controlplane import ControlPlane
    from raylane.orchestrator.settings import Settings
    from raylane.orchestrator.store import migrate
    from tests.conftest import ADMIN_TOKEN

    url = f"sqlite:///{tmp_path / 'raylane.db'}"
    migrate.upgrade(url)
    settings = Settings(database_url=url, data_dir=tmp_path, auto_migrate=False, loops_enabled=False,
                        admin_token=ADMIN_TOKEN, submit_rate_per_s=0, gc_freeze=False)
    return settings, ControlPlane(settings)


def _while_write_locked(db_file, reads: dict) -> dict:
    """Each of ``reads`` run while another connection holds SQLite's write lock (a
    commit in progress elsewhere); their answers. Taking the lock, a read would wait
    SQLITE_BUSY_TIMEOUT_MS (30 s): it must read its snapshot instead."""
    import sqlite3
    import threading

    writer = sqlite3.connect(db_file, timeout=0)
    writer.execute("BEGIN IMMEDIATE")
    try:
        got: dict = {}

        def run():
            for k, f in reads.items():
                try:
                    got[k] = f()
                except Exception as e:  # noqa: BLE001 - shown as the read's answer
                    got[k] = e

        t = threading.Thread(target=run, daemon=True)
        t.start()
        t.join(10)
        assert not t.is_alive(), f"a read waited for the write lock: {next(k for k in reads if k not in got)}"
        return got
    finally:
        writer.rollback()
        writer.close()


def test_a_reconciler_pass_reads_without_the_write_lock(tmp_path):
    """It polls every 20 ms while attempts live: on SQLite its reads must not take
    the one write lock that submits' commits wait for. Here another connection
    holds that lock for the whole pass, which must still see the live attempt."""
    settings, plane = _sqlite_plane(tmp_path)
    try:
        jid = _dispatched(plane, attempt=AttemptStatus.RUNNING)
        sid = submission_id(jid, 1)
        running = {sid: RayJob(sid, "RUNNING", None, None, 1, None, "n1", None, {})}
        rec = Reconciler(settings, plane.sessions, fake_ray(running))
        rec.run_once()  # its first sight of the attempt running: written
        got = _while_write_locked(tmp_path / "raylane.db", {"pass": rec.run_once})
        assert not isinstance(got["pass"], Exception), got  # "database is locked" at once fails it too
        assert rec._live == 1
    finally:
        plane.close()


def test_the_apis_reads_do_not_wait_for_the_write_lock(tmp_path):
    """A client polling its jobs (``GET /v1/jobs/{id}``, the list, events,
    attempts, a log follower's progress) only reads: on SQLite it must read its
    snapshot, not queue for the one write lock behind the loops' and submits'
    commits (a burst of 60 jobs polled every 0.2 s is 300 such reads a second).
    Another connection holds the lock while they run; each must still answer."""
    _, plane = _sqlite_plane(tmp_path)
    try:
        jid = _dispatched(plane, attempt=AttemptStatus.RUNNING)
        got = _while_write_locked(tmp_path / "raylane.db", {
            "get": lambda: plane.get(jid, project=None).id,
            "list": lambda: [j.id for j in plane.list(JobFilter(), limit=10, cursor=None)[0]],
            "events": lambda: len(plane.events(jid, project=None)),
            "attempts": lambda: [a.number for a in plane.attempts(jid, project=None)],
            "progress": lambda: plane.progress([jid])[jid][1],
        })
        assert got == {"get": jid, "list": [jid], "events": got["events"], "attempts": [1], "progress": 1}
        assert got["events"] >= 2  # submitted, admitted
    finally:
        plane.close()


def test_the_other_services_reads_do_not_wait_for_the_write_lock(tmp_path):
    """The same for what admins, dashboards and the schedule loop read: tokens,
    projects, a quota, the audit log, webhooks and their deliveries, a package's
    existence, schedules (and the loop's look for due ones, every tick), costs."""
    from raylane.orchestrator.domain.views import ScheduleCreate, TokenCreate, WebhookCreate
    from raylane.orchestrator.services import accounting

    _, plane = _sqlite_plane(tmp_path)
    try:
        jid = _dispatched(plane, attempt=AttemptStatus.RUNNING)
        plane.access.create_token(TokenCreate(name="alice", project="default"), actor="t")
        hook = plane.webhooks.create(WebhookCreate(url="http://8.8.8.8/hook"), project="default", actor="t")
        sched = plane.schedules.create(ScheduleCreate(name="nightly", cron="@daily", spec=SPEC),
                                       project="default", actor="t")
        got = _while_write_locked(tmp_path / "raylane.db", {
            "tokens": lambda: [t.name for t in plane.access.list_tokens()],
            "projects": lambda: "default" in [p.name for p in plane.access.list_projects()],
            "quota": lambda: plane.access.quota("ml").node_groups,
            "audit": lambda: plane.access.audit(limit=10, cursor=None)[0],
            "hooks": lambda: [h.id for h in plane.webhooks.list(project="default")],
            "hook": lambda: plane.webhooks.get(hook.id, project="default").id,
            "deliveries": lambda: plane.webhooks.deliveries(hook.id, project="default"),
            "package": lambda: plane.packages.exists("0" * 64),
            "schedules": lambda: [x.name for x in plane.schedules.list(project="default")],
            "schedule": lambda: plane.schedules.get(sched.id, project="default").name,
            "due": lambda: plane.schedules.run_due(owner="t"),  # none due: it only looks
            "costs": lambda: type(accounting.cost_breakdown(plane, group_by="project", start=None, end=None,
                                                            project=None)),
            "report": lambda: type(accounting.report(plane, start=None, end=None, project=None)),
            "job cost": lambda: accounting.job_cost(plane, jid, project=None)["job_id"],
        })
        assert got == {"tokens": ["alice"], "projects": True, "quota": {}, "audit": [],
                       "hooks": [hook.id], "hook": hook.id, "deliveries": [], "package": False,
                       "schedules": ["nightly"], "schedule": "nightly", "due": 0, "costs": dict,
                       "report": dict, "job cost": jid}
    finally:
        plane.close()
