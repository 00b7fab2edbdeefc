"""Dependencies between jobs (``spec.depends_on``). Functions take a session and
leave committing to the caller, like ``store.jobs``.

At submit, ``resolve`` checks each parent (same project; a parent that already
ended otherwise than the child needs is refused, naming it) and ``record``
stores one row per parent; the child's ``deps_waiting`` counts the parents not
yet ended, and the queue reads only jobs at 0 (``store.queue.queued``). When a
job ends, ``parent_ended`` runs in the transaction of that end
(``store.transitions.transition``): each waiting child whose condition the end
meets counts one parent less (and says so when none is left); a child whose
condition it breaks is CANCELLED with the reason, which in turn ends *its*
children the same way. Cycles cannot be made: a parent must exist before its
child, except within one batch, where ``order_batch`` refuses them.
"""

from __future__ import annotations

import json
from collections import Counter, deque
from datetime import datetime
from typing import Any, Sequence

from sqlalchemy import bindparam, insert, select, update
from sqlalchemy.orm import Session

from raylane.orchestrator.domain.errors import Invalid
from raylane.orchestrator.domain.specs import JobSpec
from raylane.orchestrator.domain.states import FailureCause, JobStatus
from raylane.orchestrator.store import effects
from raylane.orchestrator.store.tables import events, job_dependencies, jobs, results
from raylane.orchestrator.store.transitions import transition

WAITING, MET, BROKEN = "waiting", "met", "broken"
WORDS = {"succeeded": "succeed", "failed": "fail", "finished": "finish"}
MAX_PARENTS_JSON = 64 * 1024  # what a child's RAYLANE_PARENTS may hold: under one exec string (128 KiB)


def meets(condition: str, status: JobStatus) -> bool:
    if condition == "finished":
        return status.is_terminal()
    return status is (JobStatus.SUCCEEDED if condition == "succeeded" else JobStatus.FAILED)


def waiting_reason(deps: Sequence[tuple[str, str, str]]) -> str:
    waiting = [f"{pid} to {WORDS[cond]}" for pid, cond, state in deps if state == WAITING]
    return "waiting for parents: " + ", ".join(waiting)


def resolve(session: Session, spec: JobSpec, *, project: str, batch: dict[str, str] | None = None,
            field: str = "depends_on") -> list[tuple[str, str, str]]:
    """(parent id, condition, state) per parent. ``batch``: names of the other specs
    of a batch -> their new ids (such a parent is new, so waiting)."""
    out: list[tuple[str, str, str]] = []
    seen: set[str] = set()
    for i, dep in enumerate(spec.depends_on):
        where = f"{field}.{i}.job"
        if batch is not None and dep.job in batch:
            pid = batch[dep.job]
            status = JobStatus.PENDING
        else:
            pid = dep.job
            q = select(jobs.c.status).where(jobs.c.id == pid, jobs.c.project == project)
            if session.bind.dialect.name == "postgresql":
                # Under READ COMMITTED a parent could end in another replica's transaction
                # between this read and our commit, and its parent_ended would not see this
                # child: the lock makes that end wait for our commit (SQLite: one writer).
                q = q.with_for_update(key_share=True)
            found = session.execute(q).scalar_one_or_none()
            if found is None:
                raise Invalid(f"job {pid} not found in project {project}", field=where)
            status = JobStatus(found)
        if pid in seen:
            raise Invalid(f"job {pid} is named twice", field=where)
        seen.add(pid)
        if status.is_terminal():
            if not meets(dep.on, status):
                raise Invalid(f"job {pid} already ended {status.value}; this job needs it to {WORDS[dep.on]}",
                              field=where)
            out.append((pid, dep.on, MET))
        else:
            out.append((pid, dep.on, WAITING))
    return out


def by_id(spec: JobSpec, deps: Sequence[tuple[str, str, str]]) -> JobSpec:
    """The spec with its parents named by id (a batch may name them by spec name)."""
    from raylane.orchestrator.domain.specs import Dependency

    return spec.model_copy(update={"depends_on": [Dependency(job=p, on=c) for p, c, _ in deps]})


def record(session: Session, child_id: str, deps: Sequence[tuple[str, str, str]]) -> None:
    if deps:
        session.execute(insert(job_dependencies), [{"child_id": child_id, "parent_id": p, "condition": c, "state": s}
                                                   for p, c, s in deps])


def order_batch(specs: Sequence[JobSpec]) -> None:
    """Refuse a batch whose specs name each other in a cycle, or a name that two specs
    share. Kahn's algorithm: no recursion, linear in specs and dependencies."""
    counts = Counter(spec.name for spec in specs)
    first = {}
    for i, spec in enumerate(specs):
        first.setdefault(spec.name, i)
    edges: dict[int, list[int]] = {}
    indegree = [0] * len(specs)
    for i, spec in enumerate(specs):
        for k, dep in enumerate(spec.depends_on):
            if dep.job in first:
                if counts[dep.job] > 1:
                    raise Invalid(f"{dep.job!r} names several specs of the batch", field=f"jobs.{i}.depends_on.{k}.job")
                edges.setdefault(first[dep.job], []).append(i)  # parent -> child
                indegree[i] += 1
    ready = deque(i for i, d in enumerate(indegree) if d == 0)
    done = 0
    while ready:
        n = ready.popleft()
        done += 1
        for child in edges.get(n, []):
            indegree[child] -= 1
            if indegree[child] == 0:
                ready.append(child)
    if done < len(specs):
        stuck = [i for i, d in enumerate(indegree) if d > 0]
        names = ", ".join(specs[i].name for i in stuck[:10])
        raise Invalid(f"the batch's depends_on make a cycle among: {names}", field=f"jobs.{stuck[0]}.depends_on")


# Built once (bound parameters): every job's end asks it, most often of a job
# with no children (store.transitions says why).
_WAITING_CHILDREN = (select(job_dependencies.c.child_id, job_dependencies.c.condition)
                     .select_from(job_dependencies.join(jobs, jobs.c.id == job_dependencies.c.child_id))
                     .where(job_dependencies.c.parent_id == bindparam("b_parent"), job_dependencies.c.state == WAITING)
                     .order_by(jobs.c.array_held.desc(), job_dependencies.c.child_id))


def parent_ended(session: Session, parent_id: str, status: JobStatus, *, now: datetime) -> None:
    """The parent ended as ``status``: its waiting children count it, or are cancelled,
    and so on down the chain, as a worklist (no recursion, however long the chain).
    Children in one order (two parents ending together lock rows in one order):
    held array members first, then by id, so cancelling a whole array never has
    its ``arrays.release`` unhold members about to be cancelled (linear, not
    quadratic, in the array's size)."""
    work = deque([(parent_id, status)])
    while work:
        pid, st = work.popleft()
        rows = session.execute(_WAITING_CHILDREN, {"b_parent": pid}).all()
        for child_id, condition in rows:
            ok = meets(condition, st)
            session.execute(update(job_dependencies).where(job_dependencies.c.child_id == child_id,
                                                           job_dependencies.c.parent_id == pid)
                            .values(state=MET if ok else BROKEN))
            if ok:
                session.execute(update(jobs).where(jobs.c.id == child_id)
                                .values(deps_waiting=jobs.c.deps_waiting - 1, updated_at=now))
                left = session.execute(select(jobs.c.deps_waiting, jobs.c.status, jobs.c.array_held)
                                       .where(jobs.c.id == child_id)).first()
                if left is not None and left[0] == 0 and not JobStatus(left[1]).is_terminal():
                    reason = f"parents done (the last: {pid} {st.value}); " + (
                        "held by its array's max_parallel" if left[2] else "queued")
                    session.execute(update(jobs).where(jobs.c.id == child_id).values(status_reason=reason))
                    session.execute(insert(events).values(job_id=child_id, at=now, from_status=left[1],
                                                          to_status=left[1], reason=reason, actor="scheduler"))
                continue
            current = session.execute(select(jobs.c.status).where(jobs.c.id == child_id)).scalar_one_or_none()
            if current is None or JobStatus(current).is_terminal():
                continue
            transition(session, child_id, JobStatus.CANCELLED, actor="scheduler", cascade=False,
                       reason=f"parent {pid} ended {st.value}; this job needed it to {WORDS[condition]}",
                       expected={JobStatus.PENDING, JobStatus.RETRYING},
                       values={"finished_at": now, "failure_cause": FailureCause.CANCELLED.value, "lease_owner": None})
            work.append((child_id, JobStatus.CANCELLED))


def parents_json(session: Session, child_id: str, *, storage: Any) -> str | None:
    """What a child is told of its parents (``RAYLANE_PARENTS``): each one's id, name,
    status and storage URI (its checkpoints, by reference), and its result while the
    whole stays under ``MAX_PARENTS_JSON`` (past it: ``result_omitted``)."""
    rows = session.execute(
        select(jobs.c.id, jobs.c.name, jobs.c.status, jobs.c.project, results.c.result)
        .select_from(job_dependencies.join(jobs, jobs.c.id == job_dependencies.c.parent_id)
                     .outerjoin(results, results.c.job_id == jobs.c.id))
        .where(job_dependencies.c.child_id == child_id).order_by(jobs.c.id)).all()
    if not rows:
        return None
    out: dict[str, Any] = {}
    budget = MAX_PARENTS_JSON
    for pid, name, status, project, result in rows:
        entry: dict[str, Any] = {"name": name, "status": status, "storage": storage(project, pid)}
        size = len(json.dumps(result)) if result is not None else 0
        if result is not None and size <= budget - 1024:
            entry["result"] = result
            budget -= size
        elif result is not None:
            entry["result_omitted"] = f"{size} bytes; read it with GET /v1/jobs/{pid}"
        out[pid] = entry
    return json.dumps(out)


def _parent_ended(m: effects.Moved) -> None:
    if m.cascade:  # its children count it, or are cancelled (parent_ended walks the chain itself)
        parent_ended(m.session, m.job_id, m.to, now=m.now)


effects.register(effects.Effect("dependencies", 40, _parent_ended, to=frozenset(s for s in JobStatus if s.is_terminal())))
