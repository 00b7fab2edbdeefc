"""The queue's statements: claim and lease. Functions take a session and leave
committing to the dispatcher's one transaction per pass.

Words used here:

- *queued*: a job in PENDING or RETRYING whose ``not_before`` has passed, read in
  priority order then id (age), at most ``CLAIM_BATCH`` per pass;
- *lease*: ``lease_owner`` + ``lease_expires_at`` on a DISPATCHING job: the
  dispatcher that claimed it is submitting it. A *stale* lease has expired: its
  dispatcher died mid-submit, and the same attempt is taken over and submitted
  again with the same submission id (Ray answers "already exists" if the first
  one got through);
- *admit*: DISPATCHING + a new attempt row (CLAIMED) + a lease, and one more skip
  for every job this admission passed over;
- *waiting reason*: why a queued job was not admitted, written (with an event)
  only when it changed, so an idle queue writes nothing. ``wait_all`` gives every
  queued job one reason at once (Ray unreachable: no job is looked at one by
  one), at most ``CLAIM_BATCH`` jobs per pass, those that say something else.

On PostgreSQL both reads lock their rows ``FOR UPDATE SKIP LOCKED``, so several
control planes split the queue instead of claiming the same job. SQLite
serialises writers already (``store.db`` begins transactions IMMEDIATE).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import json

from sqlalchemy import Text, bindparam, cast, insert, or_, select, update
from sqlalchemy.orm import Session

from raylane.orchestrator.domain.ids import submission_id
from raylane.orchestrator.domain.specs import JobSpec
from raylane.orchestrator.domain.states import AttemptStatus, FailureCause, JobStatus
from raylane.orchestrator.domain.views import Placement
from raylane.orchestrator.store import tallies, usage_rows
from raylane.orchestrator.store import policy  # noqa: F401 (a transition runs the registered effects)
from raylane.orchestrator.store.fleet import Scope, jobs_on
from raylane.orchestrator.store.prepared import PreparedInsert
from raylane.orchestrator.store.tables import attempts, events, jobs
from raylane.orchestrator.store.transitions import transition, transition_many

CLAIM_BATCH = 200  # queued jobs looked at per pass; the rest wait for the next


@dataclass
class Claimed:
    """An attempt this dispatcher holds the lease of and must submit to Ray."""

    job_id: str
    attempt: int
    spec: JobSpec
    placement: Placement
    project: str
    scale_up: str | None = None  # admitted ahead of a scale-up: why it will wait in Ray


@dataclass(frozen=True)
class Queued:
    """A queued job as admission reads it (``placement`` None: not routed yet)."""

    id: str
    project: str
    status: JobStatus
    status_reason: str | None
    spec: JobSpec
    placement: Placement | None
    attempts: int
    skips: int
    preemptions: int
    created_at: datetime | None = None  # None: admit reads it (admission's unit tests build these)


def _locked(session: Session, q):
    return q.with_for_update(skip_locked=True) if session.bind.dialect.name == "postgresql" else q


def take_stale_leases(session: Session, *, owner: str, now: datetime, lease_until: datetime,
                      limit: int = CLAIM_BATCH, scope: Scope | None = None) -> list[Claimed]:
    """Attempts whose dispatcher died mid-submit, leased to ``owner``: same attempt,
    same id, again (``scope``: of one cluster of a fleet, ``store.fleet``)."""
    stale = _locked(session, select(jobs.c.id, jobs.c.attempts, jobs.c.spec, jobs.c.placement, jobs.c.project).where(
        jobs.c.status == JobStatus.DISPATCHING.value, jobs.c.lease_owner.is_not(None),
        jobs.c.lease_expires_at < now, jobs_on(scope),
    ).limit(limit))
    out = []
    for jid, n, spec, placement, project in session.execute(stale).all():
        session.execute(update(jobs).where(jobs.c.id == jid, jobs.c.status == JobStatus.DISPATCHING.value)
                        .values(lease_owner=owner, lease_expires_at=lease_until))
        out.append(Claimed(jid, n, JobSpec.from_stored(spec), Placement.model_validate(placement), project))
    return out


def release_unsubmitted(session: Session, job_ids: list[str], *, owner: str, reason: str, now: datetime) -> None:
    """Claimed attempts that Ray could not be reached to take: each job says
    ``reason`` (with an event, once), and its lease ends now, so that the next
    pass that sees Ray takes the same attempt over (``take_stale_leases``) and
    submits it with the same id."""
    if not job_ids:
        return
    rows = session.execute(select(jobs.c.id, jobs.c.status_reason).where(
        jobs.c.id.in_(job_ids), jobs.c.status == JobStatus.DISPATCHING.value, jobs.c.lease_owner == owner)).all()
    if not rows:
        return
    session.execute(update(jobs).where(jobs.c.id.in_([r.id for r in rows]),
                                       jobs.c.status == JobStatus.DISPATCHING.value, jobs.c.lease_owner == owner)
                    .values(status_reason=reason, lease_expires_at=now))
    changed = [r.id for r in rows if r.status_reason != reason]
    if changed:
        _WAIT_EVENT.defer(session, [{"job_id": jid, "at": now, "from_status": JobStatus.DISPATCHING.value,
                                     "to_status": JobStatus.DISPATCHING.value, "reason": reason,
                                     "actor": "scheduler", "attempt": None} for jid in changed])


# Held array members (store.arrays) and jobs whose parents have not ended
# (store.dependencies) are PENDING but not queued yet.
NOT_HELD = (jobs.c.array_held.is_(False), jobs.c.deps_waiting == 0)


def _head(session: Session, cols, *conds, limit: int) -> list:
    """The first ``limit`` queued jobs in admission order: priority (high first),
    then id (old first). One read per queued status, each in the order of
    ``ix_jobs_status_priority_id`` (an IN over both would sort every queued job
    to find the first few), merged here. On PostgreSQL both reads lock their
    rows, so up to ``limit`` rows past the head stay locked until this pass commits."""
    rows = []
    for status in (JobStatus.PENDING.value, JobStatus.RETRYING.value):
        rows += session.execute(_locked(session, select(*cols).where(
            jobs.c.status == status, *conds).order_by(jobs.c.priority.desc(), jobs.c.id).limit(limit))).all()
    rows.sort(key=lambda r: (-r.priority, r.id))
    return rows[:limit]


# A job's spec never changes once stored: parsed once per process, not once per
# admission pass (a pass reads up to CLAIM_BATCH queued jobs, and a burst of
# completions makes many passes over the same head).
_SPECS: dict[str, JobSpec] = {}
SPEC_CACHE_MAX = 20_000


def _specs(session: Session, ids: list[str]) -> dict[str, JobSpec]:
    """The specs of ``ids``, parsed once per process. Shared: read them, never change them."""
    out = {i: spec for i in ids if (spec := _SPECS.get(i)) is not None}
    missing = [i for i in ids if i not in out]
    if missing:
        if len(_SPECS) + len(missing) > SPEC_CACHE_MAX:
            _SPECS.clear()  # the head moves on; what it held is read again when needed
        for jid, spec in session.execute(select(jobs.c.id, jobs.c.spec).where(jobs.c.id.in_(missing))):
            out[jid] = _SPECS[jid] = JobSpec.from_stored(spec)
    return out


# ... and a placement by its stored text: the jobs of a burst share a few (the
# router gives equal specs equal placements), so a pass over the head parses
# each once, not once per job and pass. Shared: read them, never change them.
_PLACEMENTS: dict[str, Placement] = {}
PLACEMENT_CACHE_MAX = 4096

# What admission reads of a queued job: its placement as the stored text (its
# key in _PLACEMENTS; CAST on PostgreSQL too, whose driver would decode JSON),
# not the spec (_specs) nor the columns it never reads.
_QUEUED_COLS = [jobs.c.id, jobs.c.project, jobs.c.status, jobs.c.status_reason, jobs.c.priority,
                cast(jobs.c.placement, Text).label("placement"), jobs.c.attempts, jobs.c.skips, jobs.c.preemptions,
                jobs.c.created_at]


def _placement(text: str | None) -> Placement | None:
    if text is None or text == "null":
        return None
    pl = _PLACEMENTS.get(text)
    if pl is None:
        if len(_PLACEMENTS) >= PLACEMENT_CACHE_MAX:
            _PLACEMENTS.clear()
        pl = _PLACEMENTS[text] = Placement.model_validate(json.loads(text))
    return pl


def queued(session: Session, *, now: datetime, limit: int = CLAIM_BATCH, scope: Scope | None = None) -> list[Queued]:
    """The queue's head in admission order: priority (high first), then id (old first);
    ``scope``: the jobs nominated to one cluster of a fleet. Its specs and
    placements are shared with later passes: never change them."""
    rows = _head(session, _QUEUED_COLS, or_(jobs.c.not_before.is_(None), jobs.c.not_before <= now), *NOT_HELD,
                 *([jobs_on(scope)] if scope is not None else []), limit=limit)
    specs = _specs(session, [r.id for r in rows])
    return [Queued(id=r.id, project=r.project, status=JobStatus(r.status), status_reason=r.status_reason,
                   spec=specs[r.id], placement=_placement(r.placement), attempts=r.attempts, skips=r.skips,
                   preemptions=r.preemptions, created_at=r.created_at)
            for r in rows if r.id in specs]  # (not in specs: a job deleted between the two reads)


def fail_unroutable(session: Session, job: Queued, message: str, *, now: datetime) -> None:
    """The job can never run on this cluster (its profile changed since submit)."""
    transition(session, job.id, JobStatus.FAILED, reason=f"can never run: {message}", actor="scheduler",
               values={"failure_cause": FailureCause.UNSCHEDULABLE.value, "finished_at": now})


def set_waiting(session: Session, waits: list[tuple[Queued, str]], *, now: datetime) -> None:
    """Each job's new waiting reason, with its event: one executemany of the
    updates, the events inserted with the commit (``prepared.defer``). The first
    pass over a queue that grew (a burst of submits that does not fit) writes a
    reason for each of up to ``CLAIM_BATCH`` jobs: as a statement a row, that pass
    took 150-200 ms."""
    if not waits:
        return
    session.execute(_SET_REASON, [{"b_id": job.id, "b_reason": reason} for job, reason in waits])
    _WAIT_EVENT.defer(session, [{"job_id": job.id, "at": now, "from_status": job.status.value,
                                 "to_status": job.status.value, "reason": reason, "actor": "scheduler",
                                 "attempt": None} for job, reason in waits])


def wait_all(session: Session, reason: str, *, now: datetime, limit: int = CLAIM_BATCH,
             scope: Scope | None = None) -> int:
    """Queued jobs (``scope``: nominated to one cluster of a fleet) not already saying
    ``reason`` now say it (with an event each). Returns how many."""
    rows = _head(session, [jobs.c.id, jobs.c.status, jobs.c.priority],
                 or_(jobs.c.not_before.is_(None), jobs.c.not_before <= now),
                 or_(jobs.c.status_reason.is_(None), jobs.c.status_reason != reason), *NOT_HELD,
                 *([jobs_on(scope)] if scope is not None else []), limit=limit)
    if rows:
        session.execute(_SET_REASON_IF, [{"b_id": jid, "b_status": status, "b_reason": reason}
                                         for jid, status, _ in rows])
        _WAIT_EVENT.defer(session, [{"job_id": jid, "at": now, "from_status": status, "to_status": status,
                                     "reason": reason, "actor": "scheduler", "attempt": None}
                                    for jid, status, _ in rows])
    return len(rows)


_SET_REASON = update(jobs).where(jobs.c.id == bindparam("b_id")).values(status_reason=bindparam("b_reason"))
_SET_REASON_IF = update(jobs).where(jobs.c.id == bindparam("b_id"), jobs.c.status == bindparam("b_status")).values(
    status_reason=bindparam("b_reason"))
_WAIT_EVENT = PreparedInsert(events)


# Built once (bound parameters): each admission runs them (store.transitions says why).
_NEW_ATTEMPT = insert(attempts)
_SKIPPED = update(jobs).where(jobs.c.id == bindparam("b_id")).values(skips=jobs.c.skips + 1)


@dataclass
class Admission:
    """One job an admission pass admits (``admission.Admit``, as the store takes it)."""

    job: Queued
    placement: Placement
    passed_over: list[str]
    scale_up: str | None = None
    queued: str | None = None


def admit_many(session: Session, admitted: list[Admission], *, owner: str, now: datetime,
               lease_until: datetime) -> list[Claimed]:
    """``admit`` of each, in a few statements for all of them: the status changes
    (``transition_many``), then one executemany each of the attempts, their usage
    rows and the skips. A pass admitting 12 jobs made ~80 round trips, most of a
    fresh process's first pass on PostgreSQL (docs/benchmarks.md). Their
    DISPATCHING events are written at commit: a caller that moves one of these
    jobs again must do it in a later transaction, or its event would sort first."""
    if len(admitted) <= 1:
        return [admit(session, a.job, a.placement, passed_over=a.passed_over, owner=owner, now=now,
                      lease_until=lease_until, scale_up=a.scale_up, queued=a.queued) for a in admitted]
    moves = []
    for a in admitted:
        n = a.job.attempts + 1
        moves.append({"job_id": a.job.id, "src": a.job.status, "attempt": n, "reason": _admitted(a, n),
                      "values": _admitted_values(a, n, owner, lease_until)})
    created = transition_many(session, moves, JobStatus.DISPATCHING, actor="scheduler", now=now,
                              expected={JobStatus.PENDING, JobStatus.RETRYING})
    session.execute(_NEW_ATTEMPT, [_attempt_row(a, now) for a in admitted])
    usage_rows.admitted_many(session, [_usage(a) for a in admitted])
    for a in admitted:
        tallies.attempt_created(session, node_group=a.placement.node_group, market=a.placement.market,
                                number=a.job.attempts + 1, created_at=now,
                                job_created_at=a.job.created_at or created[a.job.id])
    skipped = [{"b_id": other} for a in admitted for other in a.passed_over]
    if skipped:
        session.execute(_SKIPPED, skipped)
    return [Claimed(a.job.id, a.job.attempts + 1, a.job.spec, a.placement, a.job.project, a.scale_up)
            for a in admitted]


def _admitted(a: Admission, n: int) -> str:
    return f"admitted to {a.placement.node_group}; attempt {n}" + "".join(f"; {x}" for x in (a.scale_up, a.queued) if x)


def _admitted_values(a: Admission, n: int, owner: str, lease_until: datetime) -> dict:
    return {"attempts": n, "lease_owner": owner, "lease_expires_at": lease_until,
            "node_group": a.placement.node_group, "placement": a.placement.model_dump(mode="json"), "not_before": None}


def _attempt_row(a: Admission, now: datetime) -> dict:
    n = a.job.attempts + 1
    return {"job_id": a.job.id, "number": n, "submission_id": submission_id(a.job.id, n),
            "node_group": a.placement.node_group, "market": a.placement.market,
            "status": AttemptStatus.CLAIMED.value, "resources": a.placement.total, "created_at": now,
            "message": a.scale_up, "cluster": a.placement.cluster}


def _usage(a: Admission) -> dict:
    return dict(job_id=a.job.id, number=a.job.attempts + 1, project=a.job.project, kind=a.job.spec.kind,
                entrypoint=a.job.spec.entrypoint, node_group=a.placement.node_group, market=a.placement.market,
                resources=a.placement.total)


def admit(session: Session, job: Queued, placement: Placement, *, passed_over: list[str], owner: str,
          now: datetime, lease_until: datetime, scale_up: str | None = None, queued: str | None = None) -> Claimed:
    """Give the job its next attempt and ``owner``'s lease; the jobs it passed over wait one skip longer.
    ``scale_up``: admitted ahead of a scale-up; the live attempt keeps it as its message
    (``stats.ahead_by_group`` counts those, the reconciler holds them to a deadline)."""
    a = Admission(job, placement, passed_over, scale_up, queued)
    n = job.attempts + 1
    transition(session, job.id, JobStatus.DISPATCHING, reason=_admitted(a, n),
               actor="scheduler", attempt=n,
               expected={JobStatus.PENDING, JobStatus.RETRYING},
               values=_admitted_values(a, n, owner, lease_until))
    session.execute(_NEW_ATTEMPT, _attempt_row(a, now))
    usage_rows.admitted_many(session, [_usage(a)])
    created = job.created_at or session.execute(select(jobs.c.created_at).where(jobs.c.id == job.id)).scalar_one()
    tallies.attempt_created(session, node_group=placement.node_group, market=placement.market, number=n,
                            created_at=now, job_created_at=created)
    for other in passed_over:
        session.execute(_SKIPPED, {"b_id": other})
    return Claimed(job.id, n, job.spec, placement, job.project, scale_up)
