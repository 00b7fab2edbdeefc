"""Read jobs: one job (as a row or as the view GET shows), a page of them behind
a cursor, a job's events, attempts and trials, and the progress the log
followers poll. Every function takes a session (or, for ``read_job``, a
connection) and writes nothing; the writes (submit, cancel, results) are
``store.jobs``."""

from __future__ import annotations

import base64
import json
from datetime import datetime, timedelta
from typing import Sequence

from sqlalchemy import Connection, and_, bindparam, exists, select
from sqlalchemy.orm import Session

from raylane.orchestrator.domain import lanes
from raylane.orchestrator.domain.errors import Invalid, NotFound
from raylane.orchestrator.domain.ids import submission_id
from raylane.orchestrator.domain.queries import DEFAULT_PROJECT, JobFilter
from raylane.orchestrator.domain.views import Attempt, Job, JobEvent, Trial
from raylane.orchestrator.domain.specs import JobSpec
from raylane.orchestrator.domain.states import JobStatus
from raylane.orchestrator.store.tables import attempts, events, job_labels, jobs, results, trials
from raylane.orchestrator.store.transitions import utcnow

MAX_PAGE = 500  # a page of jobs; more is a second request


def encode_cursor(job_id: str) -> str:
    return base64.urlsafe_b64encode(json.dumps({"before": job_id}).encode()).decode().rstrip("=")


def decode_cursor(cursor: str) -> str:
    try:
        padded = cursor + "=" * (-len(cursor) % 4)
        value = json.loads(base64.urlsafe_b64decode(padded.encode()))["before"]
        if not isinstance(value, str) or len(value) > 64:
            raise ValueError
        return value
    except Exception:
        raise Invalid("cursor is not one this API returned", field="cursor") from None


def list_jobs(session: Session, flt: JobFilter, *, limit: int = 50, cursor: str | None = None,
              dashboard_url: str | None = None) -> tuple[list[Job], str | None]:
    """A page of jobs, newest first. The cursor is the last id seen: ids sort by
    creation time, so new submissions never shift or repeat a later page."""
    limit = max(1, min(limit, MAX_PAGE))
    conds = []
    if flt.project is not None:
        conds.append(jobs.c.project == flt.project)
    if flt.status:
        conds.append(jobs.c.status.in_([s.value for s in flt.status]))
    if flt.kind:
        conds.append(jobs.c.kind.in_(flt.kind))
    if flt.node_group:
        conds.append(jobs.c.node_group == flt.node_group)
    if flt.name_prefix:
        # LIKE with the prefix's own % and _ escaped.
        esc = flt.name_prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
        conds.append(jobs.c.name.like(esc + "%", escape="\\"))
    if flt.created_after:
        conds.append(jobs.c.created_at >= flt.created_after)
    if flt.created_before:
        conds.append(jobs.c.created_at < flt.created_before)
    if flt.id_prefix:
        # Ids are [0-9a-z] (the router checks), so no LIKE wildcard can be in the prefix.
        conds.append(jobs.c.id.like(flt.id_prefix + "%"))
    if flt.submitted_by:
        # The submit event holds the submitter (no column on jobs for it); ix_events_job_id_id finds it.
        conds.append(exists().where(events.c.job_id == jobs.c.id, events.c.from_status.is_(None),
                                    events.c.actor == flt.submitted_by))
    for k, v in flt.labels.items():
        conds.append(exists().where(job_labels.c.job_id == jobs.c.id, job_labels.c.key == k, job_labels.c.value == v))
    if cursor:
        conds.append(jobs.c.id < decode_cursor(cursor))
    q = select(jobs).where(and_(*conds)).order_by(jobs.c.id.desc()).limit(limit + 1)
    rows = session.execute(q).mappings().all()
    more = len(rows) > limit
    rows = rows[:limit]
    out = _views(session, rows, dashboard_url)
    return out, (encode_cursor(rows[-1]["id"]) if more and rows else None)


def get_row(session: Session, job_id: str, project: str | None = DEFAULT_PROJECT):
    q = select(jobs).where(jobs.c.id == job_id)
    if project is not None:
        q = q.where(jobs.c.project == project)
    row = session.execute(q).mappings().first()
    if row is None:
        raise NotFound(f"job {job_id} not found", field="id")
    return row


def get_job(session: Session, job_id: str, *, project: str | None = DEFAULT_PROJECT,
            dashboard_url: str | None = None) -> Job:
    return _views(session, [get_row(session, job_id, project)], dashboard_url)[0]


# Built once: GET /v1/jobs/{id}, which every client waiting on a job polls. A job's
# row with its result in one statement, its labels (written once, with the job) in
# another, on a Core connection: the three statements of ``get_job`` in an ORM
# session were a third of the request's CPU.
_ONE = (select(jobs, results.c.result.label("job_result"))
        .select_from(jobs.outerjoin(results, results.c.job_id == jobs.c.id))
        .where(jobs.c.id == bindparam("b_id")))
_ONE_OF_PROJECT = _ONE.where(jobs.c.project == bindparam("b_project"))
_LABELS_OF = select(job_labels.c.key, job_labels.c.value).where(job_labels.c.job_id == bindparam("b_id"))


def read_job(conn: Connection, job_id: str, *, project: str | None = DEFAULT_PROJECT,
             dashboard_url: str | None = None) -> Job:
    """``get_job`` on a connection (``db.read_connection``): the same view, fewer statements."""
    if project is None:
        row = conn.execute(_ONE, {"b_id": job_id}).mappings().first()
    else:
        row = conn.execute(_ONE_OF_PROJECT, {"b_id": job_id, "b_project": project}).mappings().first()
    if row is None:
        raise NotFound(f"job {job_id} not found", field="id")
    labels = dict(conn.execute(_LABELS_OF, {"b_id": job_id}).all())
    return view(row, labels, row["job_result"], dashboard_url)


def list_events(session: Session, job_id: str, *, project: str | None = DEFAULT_PROJECT,
                after_id: int = 0, limit: int = 1000) -> list[JobEvent]:
    get_row(session, job_id, project)
    rows = session.execute(
        select(events).where(events.c.job_id == job_id, events.c.id > after_id).order_by(events.c.id).limit(limit)
    ).mappings().all()
    return [JobEvent(**r) for r in rows]


def list_attempts(session: Session, job_id: str, *, project: str | None = DEFAULT_PROJECT,
                  dashboard_url: str | None = None) -> list[Attempt]:
    lane = (get_row(session, job_id, project)["placement"] or {}).get("lane")  # NotFound for another project's job
    rows = session.execute(select(attempts).where(attempts.c.job_id == job_id).order_by(attempts.c.number)).mappings()
    now = utcnow()

    def link(r) -> str | None:
        hosted = (r["ray_job"] or "").startswith(lanes.HOST_ID_PREFIX)  # a lane host ran it: it has a record
        return job_dashboard_url(dashboard_url, r["submission_id"], now=now,
                                 lane_ended_at=r["ended_at"] if hosted else None,
                                 recorded=hosted or not lane or r["ended_at"] is None)

    return [Attempt(**{k: r[k] for k in Attempt.model_fields if k in r}, dashboard_url=link(r)) for r in rows]


def job_dashboard_url(base: str | None, sid: str | None, *, lane_ended_at: datetime | None = None,
                      now: datetime | None = None, recorded: bool = True) -> str | None:
    """An attempt's page in Ray's dashboard. A warm lane's attempt is no Ray job,
    but its host writes it a record where Ray keeps its jobs' (``domain.lanes.
    dashboard_record``), so its page is at the same place while the record is
    kept: ``lane_ended_at`` (a lane attempt's end) more than ``lanes.RECORD_KEEP_S``
    ago, it is gone, and the link is Ray's job list. (With more than
    ``lane_dashboard_keep`` attempts ended since, a record goes sooner, and Ray's
    page says it does not know the job.) ``recorded`` False: a lane attempt that
    ended before a host took it (stopped, its env could not be set up) has no
    record, and its link is Ray's job list too."""
    if not base or not sid:
        return None
    gone = lane_ended_at is not None and (now or utcnow()) - lane_ended_at > timedelta(seconds=lanes.RECORD_KEEP_S)
    if gone or not recorded:
        return f"{base.rstrip('/')}/#/jobs"
    return f"{base.rstrip('/')}/#/jobs/{sid}"


def _views(session: Session, rows, dashboard_url: str | None) -> list[Job]:
    if not rows:
        return []
    ids = [r["id"] for r in rows]
    labels: dict[str, dict[str, str]] = {i: {} for i in ids}
    for jid, k, v in session.execute(select(job_labels.c.job_id, job_labels.c.key, job_labels.c.value)
                                     .where(job_labels.c.job_id.in_(ids))):
        labels[jid][k] = v
    res = {jid: r for jid, r in session.execute(select(results.c.job_id, results.c.result).where(results.c.job_id.in_(ids)))}
    return [view(r, labels[r["id"]], res.get(r["id"]), dashboard_url) for r in rows]


def view(r, labels: dict[str, str], result, dashboard_url: str | None, *, spec: JobSpec | None = None) -> Job:
    sid = submission_id(r["id"], r["attempts"]) if r["attempts"] else None
    return Job(
        id=r["id"], name=r["name"], kind=r["kind"], project=r["project"], status=r["status"],
        status_reason=r["status_reason"], priority=r["priority"], labels=labels,
        created_at=r["created_at"], updated_at=r["updated_at"], started_at=r["started_at"],
        finished_at=r["finished_at"], attempts=r["attempts"], max_attempts=r["max_attempts"],
        preemptions=r["preemptions"], failure_cause=r["failure_cause"], cancel_requested=r["cancel_requested"],
        placement=r["placement"], ray_submission_id=sid,
        dashboard_url=job_dashboard_url(dashboard_url, sid, lane_ended_at=r["finished_at"]
                                        if (r["placement"] or {}).get("lane") else None),
        result=result, spec=spec if spec is not None else JobSpec.from_stored(r["spec"]),
    )


# Cancel ----------------------------------------------------------------------


def list_trials(session: Session, job_id: str, *, project: str | None = DEFAULT_PROJECT,
                sort_by: str | None = None, mode: str = "min") -> list[Trial]:
    row = get_row(session, job_id, project)
    items = [Trial(**{k: r[k] for k in Trial.model_fields}) for r in
             session.execute(select(trials).where(trials.c.job_id == job_id).order_by(trials.c.trial_id)).mappings()]
    sweep = (row["spec"] or {}).get("sweep") or {}
    metric = sort_by or sweep.get("metric")
    if metric:
        mode = sweep.get("mode", mode) if sort_by is None else mode
        have = [t for t in items if isinstance(t.metrics.get(metric), (int, float))]
        rest = [t for t in items if t not in have]
        have.sort(key=lambda t: t.metrics[metric], reverse=(mode == "max"))
        items = have + rest
    return items


def progress(session: Session, job_ids: Sequence[str]) -> dict[str, tuple[JobStatus, int]]:
    """(status, attempts started) of each job in ``job_ids`` that exists, in one
    indexed read: what the log followers ask for all their jobs at once."""
    if not job_ids:
        return {}
    rows = session.execute(select(jobs.c.id, jobs.c.status, jobs.c.attempts).where(jobs.c.id.in_(list(job_ids))))
    return {r.id: (JobStatus(r.status), r.attempts) for r in rows}
