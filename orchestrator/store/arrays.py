"""Arrays: one spec, ``size`` member jobs (``sbatch --array=0-N%K``). Functions
take a session and leave committing to the caller, like ``store.jobs``.

A member is an ordinary job (``jobs`` row) with ``array_id``, ``array_index``
and the labels ``raylane.array`` and ``raylane.array.index``. ``max_parallel``
holds: members past it are stored *held* (``array_held``), which the queue
never reads (``store.queue.queued``); ``release`` unholds members while fewer
than ``max_parallel`` unheld members are unfinished, and runs in the
transaction of every member's end (``store.transitions.transition``), with the
array's row locked on PostgreSQL so two members ending at once cannot release
past the bound.
"""

from __future__ import annotations

from collections import Counter
from datetime import datetime
from typing import Any, Sequence

from sqlalchemy import func, insert, select, update
from sqlalchemy.orm import Session

from raylane.orchestrator.domain.specs import ARRAY_INDEX_LABEL as INDEX_LABEL, ARRAY_LABEL, JobSpec
from raylane.orchestrator.domain.states import TERMINAL, JobStatus
from raylane.orchestrator.domain.views import Placement
from raylane.orchestrator.store import tallies
from raylane.orchestrator.store import effects
from raylane.orchestrator.store.tables import arrays, events, job_labels, jobs

_DONE = [s.value for s in TERMINAL]


def held_reason(array_id: str, max_parallel: int) -> str:
    return f"held: array {array_id} runs at most {max_parallel} members at once"


def member_spec(spec: JobSpec, array_id: str, index: int) -> JobSpec:
    return spec.model_copy(update={"array": None, "name": f"{spec.name}-{index}",
                                   "labels": {**spec.labels, ARRAY_LABEL: array_id, INDEX_LABEL: str(index)}})


def create(session: Session, spec: JobSpec, *, array_id: str, project: str, actor: str, now: datetime,
           placement: Placement | None, job_rows) -> list[str]:
    """Store the array and its members (``job_rows(spec, index) -> dict``: a member's
    ``jobs`` row, from ``store.jobs``); the first ``max_parallel`` unheld."""
    assert spec.array is not None
    k = spec.array.max_parallel
    session.execute(insert(arrays).values(id=array_id, project=project, name=spec.name, size=spec.array.size,
                                          max_parallel=k, spec=spec.model_dump(mode="json", exclude_none=True),
                                          created_at=now, created_by=actor))
    return _add_members(session, spec, array_id, list(range(spec.array.size)), k, actor=actor, now=now,
                        job_rows=job_rows, free=k)


def _add_members(session, spec, array_id, indices: Sequence[int], k: int | None, *, actor, now, job_rows,
                 free: int | None) -> list[str]:
    rows, labels, evs, ids = [], [], [], []
    for n, i in enumerate(indices):
        mspec = member_spec(spec, array_id, i)
        held = free is not None and n >= free
        row = job_rows(mspec, i)
        row.update(array_id=array_id, array_index=i, array_held=held)
        if held and not row.get("deps_waiting"):  # one waiting for parents says so first
            row["status_reason"] = held_reason(array_id, k)
        rows.append(row)
        ids.append(row["id"])
        labels.extend({"job_id": row["id"], "key": key, "value": v} for key, v in mspec.labels.items())
        evs.append({"job_id": row["id"], "at": now, "from_status": None, "to_status": JobStatus.PENDING.value,
                    "reason": f"submitted as member {i} of array {array_id}" + (" (held)" if held else ""),
                    "actor": actor, "attempt": None})
    session.execute(insert(jobs), rows)
    for row in rows:  # the counts /metrics reads (store.tallies), as store.jobs keeps them for a submit
        tallies.job_moved(session, src=None, src_group=None, to=row["status"], to_group=row["node_group"])
        tallies.add(session, "jobs_created", row["kind"])
    session.execute(insert(job_labels), labels)
    session.execute(insert(events), evs)
    return ids


def get(session: Session, array_id: str, *, project: str | None) -> dict[str, Any] | None:
    q = select(arrays).where(arrays.c.id == array_id)
    if project is not None:
        q = q.where(arrays.c.project == project)
    row = session.execute(q).mappings().first()
    return dict(row) if row else None


def release(session: Session, array_id: str, *, now: datetime) -> int:
    """Unhold members while fewer than ``max_parallel`` unheld ones are unfinished;
    how many were released."""
    q = select(arrays.c.max_parallel).where(arrays.c.id == array_id)
    if session.bind.dialect.name == "postgresql":
        q = q.with_for_update()  # two members ending at once: one release after the other
    k = session.execute(q).scalar_one_or_none()
    if k is None:
        return 0
    running = session.execute(select(func.count()).select_from(jobs).where(
        jobs.c.array_id == array_id, jobs.c.array_held.is_(False), jobs.c.status.not_in(_DONE))).scalar_one()
    if running >= k:
        return 0
    nxt = session.execute(select(jobs.c.id).where(jobs.c.array_id == array_id, jobs.c.array_held.is_(True),
                                                  jobs.c.status.not_in(_DONE))
                          .order_by(jobs.c.array_index, jobs.c.id).limit(k - running)).scalars().all()
    reason = f"released: a member of array {array_id} ended"
    for jid in nxt:
        session.execute(update(jobs).where(jobs.c.id == jid).values(array_held=False, status_reason=reason,
                                                                     updated_at=now))
    if nxt:
        session.execute(insert(events), [{"job_id": jid, "at": now, "from_status": JobStatus.PENDING.value,
                                          "to_status": JobStatus.PENDING.value, "reason": reason,
                                          "actor": "scheduler", "attempt": None} for jid in nxt])
    return len(nxt)


def members(session: Session, array_id: str) -> list[dict[str, Any]]:
    """Every member job, oldest first per index (a retried index has several)."""
    rows = session.execute(select(jobs.c.id, jobs.c.array_index, jobs.c.status, jobs.c.array_held)
                           .where(jobs.c.array_id == array_id).order_by(jobs.c.array_index, jobs.c.id)).mappings()
    return [dict(r) for r in rows]


def latest(session: Session, array_id: str) -> dict[int, dict[str, Any]]:
    """The newest member job of each index."""
    out: dict[int, dict[str, Any]] = {}
    for m in members(session, array_id):
        out[m["array_index"]] = m  # ordered by id within an index: the last one wins
    return out


def counts(session: Session, array_id: str) -> tuple[dict[str, int], int]:
    """Members per status (the newest job of each index), and how many are held (unfinished)."""
    last = latest(session, array_id).values()
    return dict(Counter(m["status"] for m in last)), sum(1 for m in last
                                                        if m["array_held"] and m["status"] not in _DONE)


def retry(session: Session, array: dict[str, Any], *, statuses: set[str], actor: str, now: datetime,
          job_rows) -> list[str]:
    """New member jobs for each index whose newest job ended in ``statuses``; held,
    then released up to ``max_parallel``."""
    indices = sorted(i for i, m in latest(session, array["id"]).items() if m["status"] in statuses)
    if not indices:
        return []
    spec = JobSpec.from_stored(array["spec"])
    ids = _add_members(session, spec, array["id"], indices, array["max_parallel"], actor=actor, now=now,
                       job_rows=job_rows, free=0 if array["max_parallel"] else None)
    if array["max_parallel"]:
        release(session, array["id"], now=now)
    return ids


def _member_ended(m: effects.Moved) -> None:
    if m.array_id is not None:
        release(m.session, m.array_id, now=m.now)  # the next held member may start


effects.register(effects.Effect("arrays", 30, _member_ended, to=frozenset(TERMINAL)))
