"""What the loops observed, written: one function per observation.

The dispatcher and the reconciler say what happened ("attempt 3 was accepted by
Ray", "attempt 3 ended: OOM"); each function here writes the attempt
(``transitions.set_attempt``) and the job (``transitions.transition``, with its
event) in the caller's one transaction (``db.transaction``), so both change or
neither. What a job does after a failed attempt is ``states.decide``'s call;
these functions read what it needs (the job's spec, its attempts so far) and
apply it. The job's status is read here, inside the transaction, never taken
from the loop's earlier snapshot: a cancel may have come in between.

Words: an *observation* is one thing a loop saw happen to one attempt; the
attempt is named by its job id and number.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import and_, bindparam, or_, select, update
from sqlalchemy.orm import Session

from raylane.orchestrator.domain.errors import InvalidTransition
from raylane.orchestrator.domain.specs import JobSpec
from raylane.orchestrator.domain.states import (ATTEMPT_LIVE, INFRASTRUCTURE_CAUSES, AttemptStatus, Decision,
                                                FailureCause, JobStatus, MOVES_AT_ONCE, decide)
from raylane.orchestrator.store.fleet import TO_PLACE, Scope, attempts_on, jobs_on
from raylane.orchestrator.store.jobs import save_trials, set_result
from raylane.orchestrator.store.tables import attempts, jobs, results
from raylane.orchestrator.store.transitions import set_attempt, set_attempt_cause, transition, utcnow

MESSAGE_CHARS = 4000  # of an attempt's error message kept in its row


# Reading what the reconciler watches ---------------------------------------------


# Built once: the reconciler reads them every 20 ms while attempts live.
_LIVE = (select(attempts.c.job_id, attempts.c.number, attempts.c.submission_id, attempts.c.status,
                attempts.c.cause, attempts.c.message, attempts.c.created_at, attempts.c.preempt_for,
                attempts.c.preempt_deadline, jobs.c.status.label("job_status"), jobs.c.started_at,
                jobs.c.attempts.label("job_attempts"), jobs.c.cancel_requested)
         .join(jobs, jobs.c.id == attempts.c.job_id)
         .where(attempts.c.status.in_([a.value for a in ATTEMPT_LIVE]), jobs.c.attempts == attempts.c.number)
         .order_by(attempts.c.job_id))
_DETAILS = select(jobs.c.id, jobs.c.attempts, jobs.c.spec, jobs.c.placement).where(
    jobs.c.id.in_(bindparam("b_ids", expanding=True)))
_CANCELLING = select(jobs.c.id, jobs.c.attempts, jobs.c.placement).where(jobs.c.status == JobStatus.CANCELLING.value)


def live_attempts(s: Session, known: dict[tuple[str, int], tuple[Any, Any]] | None = None,
                  scope: Scope | None = None) -> list[dict[str, Any]]:
    """The current attempt of every job whose attempt Ray may be running, with its job's columns,
    in job id order: the reconciler writes a pass's outcomes in one transaction, and
    replicas that lock rows in one order cannot deadlock each other.

    ``known``: the job's spec and placement of attempts read before, by (job id,
    attempt number), which the caller keeps from one call to the next: neither
    changes while the attempt is current (a spec is written once, a placement at
    the attempt's admission), so only new attempts' are read and decoded, and the
    map keeps the live ones only. A pass over 60 live attempts read and decoded
    both JSON columns of each every 20 ms.

    ``scope``: the attempts on one cluster of a fleet (``store.fleet``)."""
    known = {} if known is None else known
    rows = [dict(r) for r in s.execute(_LIVE if scope is None else _LIVE.where(attempts_on(scope))).mappings()]
    new = [r["job_id"] for r in rows if (r["job_id"], r["number"]) not in known]
    for i in range(0, len(new), 500):  # IN lists of a bounded size
        for jid, n, spec, placement in s.execute(_DETAILS, {"b_ids": new[i:i + 500]}):
            known[(jid, n)] = (spec, placement)
    live = set()
    for r in rows:
        key = (r["job_id"], r["number"])
        # A job read between the two statements may have moved on to another attempt: the next pass sees it.
        r["spec"], r["placement"] = known.get(key) or (None, None)
        live.add(key)
    for key in [k for k in known if k not in live]:
        del known[key]
    return [r for r in rows if r["spec"] is not None]


def cancelling_jobs(s: Session, scope: Scope | None = None) -> list[tuple[str, int, str | None, str | None]]:
    """(job id, attempts made, its warm lane or None, its lane env or None) of every
    CANCELLING job (``scope``: nominated to one cluster of a fleet)."""
    return [(jid, n, (placement or {}).get("lane"), (placement or {}).get("lane_env"))
            for jid, n, placement in s.execute(_CANCELLING if scope is None else _CANCELLING.where(jobs_on(scope)))]


def ended_attempts(s: Session, *, after: tuple[datetime, int] | None, until: datetime,
                   limit: int, scope: Scope | None = None) -> list[dict[str, Any]]:
    """Attempts that ended after ``after`` ((ended_at, row id), exclusive) and by
    ``until``, oldest first, with the group they ran in and their job's spec: the
    lane sweep's next batch (``ix_attempts_ended_at``, whatever the number of
    attempts ever made). Every attempt, not only those of jobs placed in a lane
    now: a retry may have been routed elsewhere than the attempt it follows.
    ``scope``: those on one cluster of a fleet (whose Ray store holds their keys)."""
    q = (select(attempts.c.id, attempts.c.ended_at, attempts.c.submission_id, attempts.c.node_group, jobs.c.spec)
         .join(jobs, jobs.c.id == attempts.c.job_id)
         .where(attempts.c.ended_at.is_not(None), attempts.c.ended_at <= until, attempts_on(scope))
         .order_by(attempts.c.ended_at, attempts.c.id).limit(limit))
    if after is not None:
        q = q.where(or_(attempts.c.ended_at > after[0], and_(attempts.c.ended_at == after[0], attempts.c.id > after[1])))
    return [dict(r) for r in s.execute(q).mappings()]


def nth_newest_end(s: Session, n: int, scope: Scope | None = None) -> datetime | None:
    """When the attempt ended that has ``n`` attempts ended after it (or at the
    same time): where the tail of the newest ``n`` ended attempts starts, read
    backwards through ``ix_attempts_ended_at``. None while fewer have ended.
    ``scope``: of those on one cluster of a fleet."""
    return s.execute(select(attempts.c.ended_at).where(attempts.c.ended_at.is_not(None), attempts_on(scope))
                     .order_by(attempts.c.ended_at.desc()).offset(n).limit(1)).scalar_one_or_none()


def has_result(s: Session, job_id: str) -> bool:
    return s.execute(select(results.c.job_id).where(results.c.job_id == job_id)).first() is not None


# Built once (bound parameters): each observation reads them (store.transitions says why).
_JOB_STATUS = select(jobs.c.status).where(jobs.c.id == bindparam("b_id"))
_ATTEMPT_STATUS = select(attempts.c.status).where(attempts.c.job_id == bindparam("b_job"),
                                                  attempts.c.number == bindparam("b_number"))
_RELEASE_LEASE = update(jobs).where(jobs.c.id == bindparam("b_id"), jobs.c.lease_owner == bindparam("b_owner"))


def _job_status(s: Session, job_id: str) -> JobStatus:
    return JobStatus(s.execute(_JOB_STATUS, {"b_id": job_id}).scalar_one())


def _attempt_status(s: Session, job_id: str, number: int) -> AttemptStatus | None:
    seen = s.execute(_ATTEMPT_STATUS, {"b_job": job_id, "b_number": number}).scalar_one_or_none()
    return AttemptStatus(seen) if seen is not None else None


# The dispatcher's observations -------------------------------------------------


def attempt_submitted(s: Session, job_id: str, number: int, *, owner: str, note: str) -> bool:
    """Ray accepted the attempt (or already had it). Returns False when the
    attempt was stopped before this write (a cancel won the race): the caller
    must stop the Ray job, which nothing else will."""
    try:
        set_attempt(s, job_id, number, AttemptStatus.SUBMITTED, expected={AttemptStatus.CLAIMED})
    except InvalidTransition:
        # Another dispatcher that took over the lease may have recorded it already;
        # STOPPED: a cancel won the race; LOST: given up with its cluster meanwhile.
        if _attempt_status(s, job_id, number) in (AttemptStatus.STOPPED, AttemptStatus.LOST):
            return False
    s.execute(_RELEASE_LEASE, {"b_id": job_id, "b_owner": owner, "lease_owner": None, "lease_expires_at": None,
                               "status_reason": note})
    return True


def submit_refused(s: Session, job_id: str, number: int, message: str) -> Decision:
    """Ray refused the attempt's submission."""
    now = utcnow()
    cause = FailureCause.SUBMIT_ERROR
    set_attempt(s, job_id, number, AttemptStatus.FAILED, expected={AttemptStatus.CLAIMED},
                values={"ended_at": now, "cause": cause.value, "message": message[-MESSAGE_CHARS:]})
    spec = _spec(s, job_id)
    d = decide(cause, spec.retry, attempts_done=number, app_attempts=_app_attempts(s, job_id),
               cancelling=_job_status(s, job_id) is JobStatus.CANCELLING)
    # A job cancelled meanwhile ends CANCELLED with that cause, like any cancelled job.
    job_cause = FailureCause.CANCELLED if d.status is JobStatus.CANCELLED else cause
    transition(s, job_id, d.status, reason=f"Ray refused attempt {number}: {message[:500]}", actor="dispatcher",
               attempt=number, expected={JobStatus.DISPATCHING, JobStatus.CANCELLING},
               values={"failure_cause": job_cause.value, "finished_at": now, "lease_owner": None})
    return d


def cancelled_before_submit(s: Session, job_id: str, number: int) -> bool:
    """A CANCELLING job whose attempt Ray is not running: its claimed attempt
    (if any) is STOPPED and the job CANCELLED. Returns False, writing nothing,
    when the attempt reached Ray meanwhile: the reconciler then stops it there."""
    now = utcnow()
    reason = "cancelled before its attempt reached Ray"
    seen = _attempt_status(s, job_id, number) if number else None
    if seen in ATTEMPT_LIVE:
        return False
    if seen is AttemptStatus.CLAIMED:
        set_attempt(s, job_id, number, AttemptStatus.STOPPED, expected={AttemptStatus.CLAIMED},
                    values={"ended_at": now, "cause": FailureCause.CANCELLED.value})
    elif seen is not None:
        reason = f"cancelled; attempt {number} had already ended"
    transition(s, job_id, JobStatus.CANCELLED, reason=reason, actor="reconciler", expected={JobStatus.CANCELLING},
               values={"finished_at": now, "failure_cause": FailureCause.CANCELLED.value})
    return True


# The reconciler's observations -------------------------------------------------


def attempt_pending(s: Session, job_id: str, number: int) -> None:
    """Ray holds the attempt; its driver has not started."""
    set_attempt(s, job_id, number, AttemptStatus.PENDING, expected={AttemptStatus.SUBMITTED})


def _ray_job(ray_job: str | None) -> dict[str, Any]:
    """``ray_job``: the Ray job the attempt runs in when not its own (a lane's host)."""
    return {"ray_job": ray_job} if ray_job else {}


def attempt_running(s: Session, job_id: str, number: int, *, driver_node_id: str | None,
                    ray_job: str | None = None) -> None:
    """The attempt's driver runs; a DISPATCHING job becomes RUNNING."""
    now = utcnow()
    if _attempt_status(s, job_id, number) is not AttemptStatus.RUNNING:
        # message: its wait for a scale-up (``queue.admit``) is over.
        set_attempt(s, job_id, number, AttemptStatus.RUNNING,
                    values={"started_at": now, "driver_node_id": driver_node_id, "message": None, **_ray_job(ray_job)})
    if _job_status(s, job_id) is JobStatus.DISPATCHING:
        transition(s, job_id, JobStatus.RUNNING, reason=f"attempt {number} running on Ray", actor="reconciler",
                   attempt=number, expected={JobStatus.DISPATCHING}, values={"started_at": now, "lease_owner": None})


def attempt_succeeded(s: Session, job_id: str, number: int, *, exit_code: int | None,
                      driver_node_id: str | None, result: dict[str, Any] | None,
                      ray_job: str | None = None) -> JobStatus:
    """The attempt finished cleanly; its result (if any) is stored with it.
    Returns the job's new status: SUCCEEDED, or CANCELLED when a cancel came first."""
    now = utcnow()
    set_attempt(s, job_id, number, AttemptStatus.SUCCEEDED, expected=ATTEMPT_LIVE,
                values={"ended_at": now, "exit_code": exit_code if exit_code is not None else 0,
                        "driver_node_id": driver_node_id, **_ray_job(ray_job)})
    if result is not None:
        if isinstance(result.get("trials"), list):
            # Trials go to their own table (served at /trials); the result keeps the summary.
            save_trials(s, job_id, result.pop("trials"), attempt=number)
        set_result(s, job_id, result, attempt=number)
    status = _job_status(s, job_id)
    if status is JobStatus.CANCELLING:
        transition(s, job_id, JobStatus.CANCELLED, reason="finished before the stop reached Ray",
                   actor="reconciler", attempt=number, values={"finished_at": now})
        return JobStatus.CANCELLED
    if status is JobStatus.DISPATCHING:
        transition(s, job_id, JobStatus.RUNNING, reason=f"attempt {number} ran on Ray", actor="reconciler",
                   attempt=number, values={"started_at": now})
    transition(s, job_id, JobStatus.SUCCEEDED, reason=f"attempt {number} succeeded", actor="reconciler",
               attempt=number, expected={JobStatus.RUNNING},
               values={"finished_at": now, "failure_cause": None})
    return JobStatus.SUCCEEDED


def attempt_ended(s: Session, job_id: str, number: int, *, status: AttemptStatus, cause: FailureCause,
                  message: str, headline: str, exit_code: int | None = None,
                  driver_node_id: str | None = None, ray_job: str | None = None,
                  elsewhere: bool = False) -> Decision:
    """The attempt ended badly (``status``: FAILED, STOPPED or LOST, as Ray
    reported it) with ``cause``; ``headline`` is the message in one line. The job
    goes where ``states.decide`` says: RETRYING after a backoff, FAILED, or
    CANCELLED when a cancel was asked for. ``elsewhere``: the job is on a fleet of
    several clusters (``states.decide``); a job retried for its cluster's fault
    (CLUSTER_LOST, a scale-up that did not come) is to be placed again
    (``store.fleet.TO_PLACE``), on another cluster when one can take it."""
    now = utcnow()
    set_attempt(s, job_id, number, status, expected=ATTEMPT_LIVE | _LOSABLE if cause is FailureCause.CLUSTER_LOST
                else ATTEMPT_LIVE,
                values={"ended_at": now, "cause": cause.value, "message": message,
                        "exit_code": exit_code, "driver_node_id": driver_node_id, **_ray_job(ray_job)})
    job_status = _job_status(s, job_id)
    job = s.execute(select(jobs.c.preemptions, jobs.c.attempts, jobs.c.spec).where(jobs.c.id == job_id)).one()
    d = decide(cause, JobSpec.from_stored(job.spec).retry, attempts_done=job.attempts,
               app_attempts=_app_attempts(s, job_id), cancelling=job_status is JobStatus.CANCELLING,
               elsewhere=elsewhere)
    if d.status is JobStatus.CANCELLED:
        transition(s, job_id, JobStatus.CANCELLED, reason=d.reason, actor="reconciler", attempt=number,
                   values={"finished_at": now, "failure_cause": cause.value})
        return d
    if job_status is JobStatus.DISPATCHING and cause is not FailureCause.CLUSTER_LOST:
        transition(s, job_id, JobStatus.RUNNING, reason=f"attempt {number} started on Ray", actor="reconciler",
                   attempt=number, values={"started_at": now})
    values: dict[str, Any] = {
        "failure_cause": cause.value,
        "preemptions": job.preemptions + (1 if cause is FailureCause.PREEMPTED else 0)}
    summary = f"attempt {number} ended: {cause.value}: {headline}"
    if d.status is JobStatus.RETRYING:
        reason = f"{summary}; {d.reason}; next in {d.delay_s:.0f}s"
        values["not_before"] = now + timedelta(seconds=d.delay_s)
        if elsewhere and (cause in MOVES_AT_ONCE or cause is FailureCause.SCALE_UP_TIMEOUT):
            values["cluster"] = TO_PLACE
            values["nominated_at"] = None  # placed again at the placer's next pass
    else:
        reason = f"{summary}; {d.reason}"
        values["finished_at"] = now
    transition(s, job_id, d.status, reason=reason, actor="reconciler", attempt=number, values=values)
    return d


def timeout_requested(s: Session, job_id: str, number: int) -> None:
    """The attempt ran past timeout_s and Raylane is stopping it: when Ray
    reports it stopped, its cause is TIMEOUT (not a cancel)."""
    set_attempt_cause(s, job_id, number, FailureCause.TIMEOUT.value)


def preempt_stop(s: Session, job_id: str, number: int, message: str) -> None:
    """The attempt's grace period is over (or it checkpointed) and Raylane is
    stopping it for the job it was preempted for: when Ray reports it stopped,
    its cause is PREEMPTED_BY_PRIORITY (``states.CAUSES``: queued again at once,
    not counted against max_attempts)."""
    set_attempt_cause(s, job_id, number, FailureCause.PREEMPTED_BY_PRIORITY.value, message=message)


def scale_up_overdue(s: Session, job_id: str, number: int, message: str) -> None:
    """The attempt waited for a scale-up past its deadline and Raylane is
    stopping it: when Ray reports it stopped, its cause is SCALE_UP_TIMEOUT."""
    set_attempt_cause(s, job_id, number, FailureCause.SCALE_UP_TIMEOUT.value, message=message)
    s.execute(update(jobs).where(jobs.c.id == job_id).values(status_reason=message))


def _spec(s: Session, job_id: str) -> JobSpec:
    return JobSpec.from_stored(s.execute(select(jobs.c.spec).where(jobs.c.id == job_id)).scalar_one())


def _app_attempts(s: Session, job_id: str) -> int:
    """The job's ended attempts that spent one of its max_attempts."""
    causes = s.execute(select(attempts.c.cause).where(attempts.c.job_id == job_id)).scalars().all()
    return sum(1 for c in causes if c and FailureCause(c) not in INFRASTRUCTURE_CAUSES)


# An attempt claimed for a cluster that is then lost may have reached it or not: it is given up too.
_LOSABLE = frozenset({AttemptStatus.CLAIMED})
_ON_CLUSTER = (select(attempts.c.job_id, attempts.c.number)
               .join(jobs, jobs.c.id == attempts.c.job_id)
               .where(attempts.c.status.in_([a.value for a in ATTEMPT_LIVE | _LOSABLE]),
                      jobs.c.attempts == attempts.c.number)
               .order_by(attempts.c.job_id))


def cluster_lost(s: Session, scope: Scope, message: str) -> list[str]:
    """A fleet's cluster unreachable past its grace (docs/fleet.md): every attempt
    it may be running ends LOST with cause CLUSTER_LOST (retried at once, not
    counted against max_attempts) and its job is to be placed again; the attempts
    are stopped there when the cluster answers (``unfenced``). The jobs' ids."""
    ids = []
    for job_id, number in s.execute(_ON_CLUSTER.where(attempts_on(scope))).all():
        try:
            with s.begin_nested():  # one that moved since (another replica, a cancel) is left to its mover
                attempt_ended(s, job_id, number, status=AttemptStatus.LOST, cause=FailureCause.CLUSTER_LOST,
                              message=message, headline=message, elsewhere=True)
        except InvalidTransition:
            continue
        ids.append(job_id)
    return ids


def unfenced(s: Session, scope: Scope) -> list[tuple[str, int, str | None, str | None]]:
    """(job id, attempt, its warm lane, its lane env) of each attempt given up with
    ``scope``'s cluster and not stopped there since."""
    rows = s.execute(select(attempts.c.job_id, attempts.c.number, jobs.c.placement)
                     .join(jobs, jobs.c.id == attempts.c.job_id)
                     .where(attempts.c.cause == FailureCause.CLUSTER_LOST.value, attempts.c.fenced_at.is_(None),
                            attempts_on(scope)).order_by(attempts.c.job_id, attempts.c.number)).all()
    # The job's placement is its latest attempt's; a lane is a group's, the same on every attempt there.
    return [(jid, n, (pl or {}).get("lane"), (pl or {}).get("lane_env")) for jid, n, pl in rows]


def fenced(s: Session, stopped: list[tuple[str, int]], *, now: datetime) -> None:
    """Those attempts were stopped on their cluster (or it no longer had them)."""
    for job_id, number in stopped:
        s.execute(update(attempts).where(attempts.c.job_id == job_id, attempts.c.number == number)
                  .values(fenced_at=now))
