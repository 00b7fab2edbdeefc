"""Write jobs: submit (one, a batch, an array's members), retry an array, cancel,
and a run's result and trials. Every function takes a session and leaves
committing to the caller's unit of work (``db.transaction``). The reads (one
job, a page behind a cursor, events, attempts, trials) are ``store.job_reads``."""

from __future__ import annotations

import hashlib
from collections import Counter
from datetime import datetime
from typing import Any, Sequence

from sqlalchemy import insert, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from raylane.orchestrator.domain.errors import Conflict
from raylane.orchestrator.domain.ids import new_job_id, new_job_ids
from raylane.orchestrator.domain.queries import DEFAULT_PROJECT
from raylane.orchestrator.domain.views import Job, Placement
from raylane.orchestrator.domain.specs import JobSpec
from raylane.orchestrator.domain.states import JobStatus, FailureCause
from raylane.orchestrator.store import arrays as store_arrays, dependencies, tallies
from raylane.orchestrator.store import policy  # noqa: F401 (a transition runs the registered effects)
from raylane.orchestrator.store.job_reads import get_job, get_row, view as _view
from raylane.orchestrator.store.prepared import PreparedInsert
from raylane.orchestrator.store.tables import events, job_labels, jobs, results, trials
from raylane.orchestrator.store.transitions import transition, utcnow

WAITING_REASON = "waiting for admission"


def request_hash(spec: JobSpec) -> str:
    return hashlib.sha256(spec.model_dump_json().encode()).hexdigest()


def _job_row(spec: JobSpec, *, project: str, job_id: str, now: datetime, placement: Placement | None,
             idempotency_key: str | None, reason: str | None) -> dict[str, Any]:
    return {
        "id": job_id,
        "project": project,
        "name": spec.name,
        "kind": spec.kind.value,
        "status": JobStatus.PENDING.value,
        "status_reason": reason or WAITING_REASON,
        "priority": spec.priority,
        "spec": spec.model_dump(mode="json", exclude_none=True),
        "node_group": placement.node_group if placement else None,
        "placement": placement.model_dump(mode="json") if placement else None,
        "cluster": placement.cluster if placement else None,  # a fleet's: store.fleet.TO_PLACE at submit
        "attempts": 0,
        "max_attempts": spec.retry.max_attempts,
        "preemptions": 0,
        "idempotency_key": idempotency_key,
        "request_hash": request_hash(spec) if idempotency_key else None,
        "cancel_requested": False,
        "skips": 0,
        "created_at": now,
        "updated_at": now,
    }


def submit(
    session: Session,
    spec: JobSpec,
    *,
    project: str = DEFAULT_PROJECT,
    actor: str = "api",
    idempotency_key: str | None = None,
    placement: Placement | None = None,
    reason: str | None = None,
) -> tuple[str, bool]:
    """Store a new PENDING job. Returns (job id, created).

    With an ``idempotency_key``, a second submit with the same key in the same
    project returns the first job (created=False), also when both race: the
    unique index decides, the loser reads the winner's row. The same key with a
    different spec is a Conflict.
    """
    job_id, created, _ = _submit(session, spec, project=project, actor=actor, idempotency_key=idempotency_key,
                                 placement=placement, reason=reason)
    return job_id, created


def submit_view(session: Session, spec: JobSpec, *, project: str = DEFAULT_PROJECT, actor: str = "api",
                idempotency_key: str | None = None, placement: Placement | None = None,
                dashboard_url: str | None = None) -> tuple[Job, bool]:
    """``submit``, returning the job as GET shows it: a new one built from the row
    just written (no read back, the spec not validated again), an existing one read.
    On PostgreSQL the new job's rows wait for the commit (``PreparedInsert.defer``):
    the caller reads none of them back in this transaction."""
    job_id, created, row = _submit(session, spec, project=project, actor=actor,
                                   idempotency_key=idempotency_key, placement=placement, reason=None, defer=True)
    if not created:
        return get_job(session, job_id, project=project, dashboard_url=dashboard_url), False
    row = {**row, "started_at": None, "finished_at": None, "failure_cause": None}
    return _view(row, dict(spec.labels), None, dashboard_url, spec=spec), True


def _submit(session: Session, spec: JobSpec, *, project: str, actor: str, idempotency_key: str | None,
            placement: Placement | None, reason: str | None,
            defer: bool = False) -> tuple[str, bool, dict[str, Any] | None]:
    if idempotency_key is not None:
        existing = _by_key(session, project, idempotency_key)
        if existing is not None:
            return _check_same(existing, spec), False, None
    now = utcnow()
    job_id = new_job_id()
    deps = dependencies.resolve(session, spec, project=project)  # in this transaction: parents cannot end meanwhile
    row = _job_row(spec, project=project, job_id=job_id, now=now, placement=placement,
                   idempotency_key=idempotency_key, reason=reason)
    _wait_for(row, deps)
    if idempotency_key is None:
        # No unique key to lose a race on: no savepoint (two round trips on
        # PostgreSQL); any error rolls the caller's unit back. With parents, their
        # rows reference it at once: it cannot wait for the commit.
        (PreparedInsert.defer if defer and not deps else PreparedInsert.execute)(_INSERT_JOB, session, row)
    else:
        try:
            with session.begin_nested():
                _INSERT_JOB.execute(session, row)
        except IntegrityError:
            existing = _by_key(session, project, idempotency_key)
            if existing is None:  # pragma: no cover - the unique index said it exists
                raise
            return _check_same(existing, spec), False, None
    dependencies.record(session, job_id, deps)
    _tally_new(session, row)
    write = PreparedInsert.defer if defer else PreparedInsert.execute
    if spec.labels:
        write(_INSERT_LABELS, session, [{"job_id": job_id, "key": k, "value": v} for k, v in spec.labels.items()])
    write(_INSERT_EVENT, session, {
        "job_id": job_id, "at": now, "from_status": None, "to_status": JobStatus.PENDING.value,
        "reason": "submitted" + (f"; routed to {placement.node_group}" if placement else ""), "actor": actor,
        "attempt": None})
    return job_id, True, row


# A single submit's rows (store.prepared: compiled once, sent as the driver's SQL).
_INSERT_JOB = PreparedInsert(jobs)
_INSERT_LABELS = PreparedInsert(job_labels)
_INSERT_EVENT = PreparedInsert(events)


def _tally_new(session: Session, row: dict[str, Any]) -> None:
    tallies.job_moved(session, src=None, src_group=None, to=row["status"], to_group=row["node_group"])
    tallies.add(session, "jobs_created", row["kind"])


def _wait_for(row: dict[str, Any], deps) -> None:
    """A job with parents still to end waits for them, out of the queue, saying which."""
    waiting = sum(1 for _, _, state in deps if state == dependencies.WAITING)
    row["deps_waiting"] = waiting
    if waiting:
        row["status_reason"] = dependencies.waiting_reason(deps)


def submit_array(session: Session, spec: JobSpec, *, array_id: str, project: str = DEFAULT_PROJECT,
                 actor: str = "api", placement: Placement | None = None) -> list[str]:
    """Store an array and its member jobs (``store.arrays``) in the caller's transaction.
    With ``depends_on``, every member waits for the parents (``store.dependencies``)."""
    now = utcnow()
    deps = dependencies.resolve(session, spec, project=project) if spec.depends_on else []
    if deps:  # the stored spec (and its members') names the parents by id
        spec = dependencies.by_id(spec, deps)

    def row(mspec: JobSpec, index: int) -> dict[str, Any]:
        r = _job_row(mspec, project=project, job_id=new_job_id(), now=now, placement=placement,
                     idempotency_key=None, reason=None)
        _wait_for(r, deps)
        return r

    ids = store_arrays.create(session, spec, array_id=array_id, project=project, actor=actor, now=now,
                              placement=placement, job_rows=row)
    for job_id in ids:
        dependencies.record(session, job_id, deps)
    return ids


def retry_array(session: Session, array: dict[str, Any], *, statuses: set[str], actor: str,
                placement: Placement | None) -> list[str]:
    now = utcnow()
    spec = JobSpec.from_stored(array["spec"])
    # The new members wait for parents still running (members cancelled early); a
    # parent that ended the wrong way refuses the retry, naming it.
    deps = dependencies.resolve(session, spec, project=array["project"], field="array.depends_on") \
        if spec.depends_on else []

    def row(mspec: JobSpec, index: int) -> dict[str, Any]:
        r = _job_row(mspec, project=array["project"], job_id=new_job_id(), now=now, placement=placement,
                     idempotency_key=None, reason=None)
        _wait_for(r, deps)
        return r

    ids = store_arrays.retry(session, array, statuses=statuses, actor=actor, now=now, job_rows=row)
    for job_id in ids:
        dependencies.record(session, job_id, deps)
    return ids


def _by_key(session: Session, project: str, key: str):
    return session.execute(
        select(jobs.c.id, jobs.c.request_hash).where(jobs.c.project == project, jobs.c.idempotency_key == key)
    ).first()


def _check_same(existing, spec: JobSpec) -> str:
    if existing.request_hash != request_hash(spec):
        raise Conflict("Idempotency-Key was already used for a different job spec", field="Idempotency-Key")
    return existing.id


def submit_batch(
    session: Session,
    specs: Sequence[JobSpec],
    *,
    project: str = DEFAULT_PROJECT,
    actor: str = "api",
    placements: Sequence[Placement | None] | None = None,
    texts: Sequence[str] | None = None,
) -> list[str]:
    """Store many PENDING jobs in the caller's one transaction: all or none.
    ``texts``: each spec's ``model_dump_json(exclude_none=True)``, if the caller has it."""
    if texts is not None and len(texts) != len(specs):
        raise ValueError(f"{len(texts)} spec texts for {len(specs)} specs")
    now = utcnow()
    rows: list[dict[str, Any]] = []
    label_rows: list[dict[str, Any]] = []
    # One millisecond, many ids: new_job_id's random part keeps them unique;
    # sorting keeps "newest first" meaning "last in the batch first".
    ids = new_job_ids(len(specs))
    linked = any(spec.depends_on for spec in specs)
    if linked:
        dependencies.order_batch(specs)
    names = {spec.name: ids[i] for i, spec in reversed(list(enumerate(specs)))} if linked else {}
    all_deps = []
    moved: Counter[tuple[str, str | None, str]] = Counter()
    placement_texts: dict[int, str] = {id(None): "null"}  # alike jobs share a Placement (routing.route_many)
    for i, spec in enumerate(specs):
        job_id = ids[i]
        placement = placements[i] if placements else None
        if id(placement) not in placement_texts:
            placement_texts[id(placement)] = placement.model_dump_json()
        deps = dependencies.resolve(session, spec, project=project, batch=names, field=f"jobs.{i}.depends_on") \
            if spec.depends_on else []
        text = texts[i] if texts is not None else None
        if deps:  # the stored spec names its parents by id, as a resubmit of it must
            spec, text = dependencies.by_id(spec, deps), None
        row = _batch_row(spec, job_id=job_id, placement=placement, text=text,
                         placement_text=placement_texts[id(placement)])
        if deps:
            _wait_for(row, deps)
            all_deps.append((job_id, deps))
        rows.append(row)
        moved[(row["status"], row["node_group"], row["kind"])] += 1
        if spec.labels:  # a loop, not a generator a job: most specs have one label or none
            for k, v in spec.labels.items():
                label_rows.append({"job_id": job_id, "key": k, "value": v})
    # The values every row shares are bound once, and each spec is encoded once
    # (model_dump_json) instead of dumped to Python and encoded again.
    _INSERT_JOB.execute_many(session, rows, encoded=("spec", "placement"), common={
        "project": project, "created_at": now, "updated_at": now,
        **_BATCH_COMMON})
    for job_id, deps in all_deps:
        dependencies.record(session, job_id, deps)
    for (status_, node_group, kind), n in moved.items():
        tallies.job_moved(session, src=None, src_group=None, to=status_, to_group=node_group, n=n)
        tallies.add(session, "jobs_created", kind, delta=n)
    _INSERT_LABELS.execute_many(session, label_rows)
    _INSERT_EVENT.execute_many(session, [{"job_id": job_id} for job_id in ids], common={
        "at": now, "from_status": None, "to_status": JobStatus.PENDING.value, "reason": "submitted in a batch",
        "actor": actor, "attempt": None})
    return ids


_PENDING = JobStatus.PENDING.value

# What every job of a batch starts with (``_job_row``'s constants).
_BATCH_COMMON = {"attempts": 0, "preemptions": 0, "idempotency_key": None, "request_hash": None,
                 "cancel_requested": False, "skips": 0}


def _batch_row(spec: JobSpec, *, job_id: str, placement: Placement | None, text: str | None,
               placement_text: str) -> dict[str, Any]:
    """``_job_row`` less ``_BATCH_COMMON`` and the batch's project and time, with the
    spec and the placement as their JSON texts (``PreparedInsert.execute_many(encoded=...)``):
    ``text`` if given; ``placement_text`` is ``placement``'s ("null" for none)."""
    return {
        "id": job_id,
        "name": spec.name,
        "kind": spec.kind.value,
        "status": _PENDING,
        "status_reason": WAITING_REASON,
        "priority": spec.priority,
        "spec": spec.model_dump_json(exclude_none=True) if text is None else text,
        "node_group": placement.node_group if placement else None,
        "placement": placement_text,
        "cluster": placement.cluster if placement else None,
        "max_attempts": spec.retry.max_attempts,
        "deps_waiting": 0,  # _wait_for, for a job with parents
    }


def cancel(session: Session, job_id: str, *, project: str | None = DEFAULT_PROJECT, actor: str = "api") -> str:
    """Cancel a job. Idempotent: cancelling a cancelled or cancelling job is a no-op.

    A job that has not reached Ray is CANCELLED at once; one that has is
    CANCELLING until the reconciler has stopped its Ray job. Returns a message.
    """
    row = get_row(session, job_id, project)
    status = JobStatus(row["status"])
    if status in (JobStatus.CANCELLED, JobStatus.CANCELLING):
        return f"job is already {status.value}"
    if status in (JobStatus.SUCCEEDED, JobStatus.FAILED):
        raise Conflict(f"job {job_id} already finished as {status.value}; there is nothing to cancel")
    now = utcnow()
    if status in (JobStatus.PENDING, JobStatus.RETRYING):
        try:
            transition(session, job_id, JobStatus.CANCELLED, reason="cancelled by user", actor=actor,
                       expected={JobStatus.PENDING, JobStatus.RETRYING},
                       values={"cancel_requested": True, "finished_at": now,
                               "failure_cause": FailureCause.CANCELLED.value, "lease_owner": None})
            return "cancelled"
        except Conflict:
            # Lost a race with the dispatcher; the job is now being dispatched: fall through.
            status = JobStatus(get_row(session, job_id, project)["status"])
            if status.is_terminal() or status is JobStatus.CANCELLING:
                return f"job is {status.value}"
    transition(session, job_id, JobStatus.CANCELLING, reason="cancel requested; stopping its Ray job", actor=actor,
               expected={JobStatus.DISPATCHING, JobStatus.RUNNING}, values={"cancel_requested": True})
    return "cancelling: its Ray job is being stopped"


def set_result(session: Session, job_id: str, result: dict[str, Any], *, attempt: int | None = None) -> None:
    now = utcnow()
    upd = session.execute(update(results).where(results.c.job_id == job_id)
                          .values(result=result, attempt=attempt, updated_at=now))
    if upd.rowcount == 0:
        session.execute(insert(results).values(job_id=job_id, result=result, attempt=attempt, updated_at=now))


def save_trials(session: Session, job_id: str, items: list[dict[str, Any]], *, attempt: int | None) -> None:
    """Replace a sweep's stored trials with the runner's final list."""
    from sqlalchemy import delete

    session.execute(delete(trials).where(trials.c.job_id == job_id))
    now = utcnow()
    rows, seen = [], set()
    for t in items:
        tid = str(t.get("trial_id") or len(rows))[:64]
        if tid in seen:
            continue
        seen.add(tid)
        rows.append({"job_id": job_id, "trial_id": tid, "attempt": attempt, "status": str(t.get("status", "TERMINATED"))[:16],
                     "config": t.get("config") or {}, "metrics": t.get("metrics") or {},
                     "node_id": t.get("node_id"), "node_group": t.get("node_group"), "error": t.get("error"),
                     "updated_at": now})
    if rows:
        session.execute(insert(trials), rows)
