"""Read attempts for accounting (``raylane.orchestrator.domain.costs``).

``load_usage``: every attempt that may have held resources within a window, with
its job's project, kind, spec and result (one job's cost reads its attempts so).

``sums`` and ``reviewed``: a window's attempts summed in SQL over
``attempt_usage`` (``store.usage_rows``): held seconds, attempts and distinct jobs
per key in one GROUP BY (``jobs_by`` adds those up per project, kind or node
group), and only the attempts that could show in the report's cheaper
placements, so nothing is decoded or priced per attempt in Python. A
window's *overlap* with a held span is computed in whole microseconds (exact on
both backends); a running attempt holds until *now*; an attempt counts when its
overlap is positive, as ``costs.costs`` counts one with hours above 0.
"""

from __future__ import annotations

from datetime import datetime
from typing import NamedTuple

from sqlalchemy import BigInteger, and_, case, func, literal, or_, select, true, union_all
from sqlalchemy.orm import Session

from raylane.orchestrator.domain import costs
from raylane.orchestrator.domain.costs import AttemptUsage
from raylane.orchestrator.store.tables import attempt_usage, attempts, jobs, results
from raylane.orchestrator.store import usage_rows
from raylane.orchestrator.store.usage_rows import micros

u = attempt_usage.c
NONE = usage_rows.NO_GROUP  # the key of attempts without a node group (costs._key's)
REVIEWS = (costs.REVIEW_GPU_COMMAND, costs.REVIEW_GPU, costs.REVIEW_SPOT)


def load_usage(session: Session, *, start: datetime, end: datetime, project: str | None = None,
               job_id: str | None = None, with_spec: bool = True) -> list[AttemptUsage]:
    """Attempts dispatched before ``end`` that had not ended before ``start``
    (``with_spec`` False: without the job's spec, which only the report's
    evidence reads; decoding it was half the time of a week's costs).

    Reads attempts through ``ix_attempts_ended_at`` (ended within or after the
    window, or still live), so a window costs what it holds, not what is stored;
    a report over a long window of a busy cluster still reads many rows; the API
    bounds the window (``accounting.MAX_WINDOW``).
    """
    q = (
        select(attempts.c.job_id, attempts.c.number, attempts.c.node_group, attempts.c.market,
               attempts.c.resources, attempts.c.status, attempts.c.cause, attempts.c.created_at,
               attempts.c.started_at, attempts.c.ended_at, jobs.c.project, jobs.c.kind, jobs.c.name,
               (jobs.c.spec if with_spec else literal(None)).label("spec"), results.c.result)
        .join(jobs, jobs.c.id == attempts.c.job_id)
        .outerjoin(results, results.c.job_id == attempts.c.job_id)
        .where(attempts.c.created_at <= end, or_(attempts.c.ended_at.is_(None), attempts.c.ended_at >= start))
    )
    if project is not None:
        q = q.where(jobs.c.project == project)
    if job_id is not None:
        q = q.where(attempts.c.job_id == job_id)
    # Sorted here, not in SQL: an ORDER BY (job_id, number) leads SQLite to walk
    # that unique index over every attempt instead of the window's.
    rows = sorted(session.execute(q), key=lambda r: (r.job_id, r.number))
    return [_usage(r) for r in rows]


def _usage(r) -> AttemptUsage:
    """One attempt's row (attempt, job and result columns) as accounting reads it."""
    return AttemptUsage(job_id=r.job_id, project=r.project, kind=r.kind, name=r.name, number=r.number,
                        node_group=r.node_group, market=r.market,
                        resources={k: float(v) for k, v in (r.resources or {}).items() if isinstance(v, (int, float))},
                        status=r.status, cause=r.cause, created_at=r.created_at, started_at=r.started_at,
                        ended_at=r.ended_at, spec=r.spec or {}, result=r.result)


def _overlap(start: datetime, end: datetime, now: datetime):
    """(overlap in microseconds of the held span with [start, end), the window's WHERE)."""
    s, e, n = (literal(micros(t), BigInteger) for t in (start, end, now))
    lo = case((u.held_from > s, u.held_from), else_=s)
    to = func.coalesce(u.held_to, n)
    hi = case((to < e, to), else_=e)
    ov = hi - lo
    # Held then, and overlapping: ``reviewed`` reads it through ix_attempt_usage_review_held_to.
    where = and_(or_(u.held_to.is_(None), u.held_to > s), u.held_from.is_not(None), u.held_from < e, ov > 0)
    return ov, where


class Sum(NamedTuple):
    """One key's attempts in a window: a stand-in attempt of the key, the seconds they
    held within it, how many did, and how many of them were their job's first in
    the window (``jobs``) and on their node group (``group_jobs``)."""
    usage: AttemptUsage
    seconds: float
    attempts: int
    jobs: int
    group_jobs: int


def _stored_keys(project: str | None = None):
    """SELECT of every key id stored (of ``project``'s keys), one index seek each: a
    loose scan of ``ix_attempt_usage_window``, so no bound list of ids however many
    keys there are. Aliases of its own: nothing in it correlates with an outer query."""
    first, step, one = (attempt_usage.alias(n) for n in ("key_first", "key_step", "key_row"))
    k = select(func.min(first.c.key_id).label("id")).cte("stored_keys", recursive=True)
    nxt = select(func.min(step.c.key_id)).where(step.c.key_id > k.c.id).scalar_subquery()
    k = k.union_all(select(nxt).where(k.c.id.is_not(None)))
    q = select(k.c.id).where(k.c.id.is_not(None))
    if project is not None:  # a key's rows share its project: read one of them
        q = q.where(select(one.c.project).where(one.c.key_id == k.c.id).limit(1).scalar_subquery() == project)
    return q


def key_ids(session: Session, project: str | None = None) -> list[int]:
    """Every key id stored (of ``project``'s keys), ascending."""
    return [i for (i,) in session.execute(_stored_keys(project))]


# key id -> (project, kind, node_group, market, cpu, gpu): fixed by the id, so kept
# across databases; bounded, as ids are made by what people submit.
_KEYS: dict[int, tuple] = {}
MAX_KEYS = 100_000


def _keys(session: Session, ids: list[int]) -> dict[int, tuple]:
    """The keys of ``ids`` that still have a row (a purge may remove a key's last one meanwhile)."""
    out = {}
    for i in ids:
        key = _KEYS.get(i)  # one lookup: another thread may clear the cache meanwhile
        if key is None:
            row = session.execute(select(u.project, u.kind, u.node_group, u.market, u.cpu, u.gpu)
                                  .where(u.key_id == i).limit(1)).first()
            if row is None:
                continue
            if len(_KEYS) >= MAX_KEYS:
                _KEYS.clear()
            key = _KEYS[i] = tuple(row)
        out[i] = key
    return out


def sums(session: Session, *, start: datetime, end: datetime, now: datetime,
         project: str | None = None) -> list[Sum]:
    """Per key (project, kind, node group, market, CPUs, GPUs): held seconds,
    attempts, and distinct jobs as a sum. A job's attempts hold one after the other,
    so the first of them in the window is the one whose earlier attempts all
    stopped before the window starts (``prev_held_to``; per node group
    ``prev_group_held_to``).

    Key by key in ``ix_attempt_usage_window``'s order: a range of the attempts that
    stopped after the window's start, and one of those still holding (an OR of the
    two would read every attempt of the key), so SQLite needs no sort for the
    GROUP BY (at 1M jobs a week's sums 23.5 -> 5.4 ms in SQLite alone); on
    PostgreSQL the same two ranges per key, as LATERAL subqueries."""
    ov, _ = _overlap(start, end, now)
    s, e = literal(micros(start), BigInteger), literal(micros(end), BigInteger)
    first = func.sum(case((or_(u.prev_held_to.is_(None), u.prev_held_to <= s), 1), else_=0))
    first_here = func.sum(case((or_(u.prev_group_held_to.is_(None), u.prev_group_held_to <= s), 1), else_=0))

    stored = _stored_keys(project)
    got: dict[int, list[int]] = {}

    def add(kid, *vals):
        acc = got.setdefault(kid, [0, 0, 0, 0])
        for j, v in enumerate(vals):
            acc[j] += int(v or 0)

    if session.bind.dialect.name == "postgresql":
        # PostgreSQL guesses a hundred keys and a wide range, and would read the whole
        # table for an IN; a LATERAL per key holds it to the key's two index ranges.
        ks = stored.subquery("ks")

        def per_key(held, name):
            return (select(func.sum(ov).label("us"), func.count().label("n"), first.label("j"),
                           first_here.label("g"))
                    .where(u.key_id == ks.c.id, held, u.held_from.is_not(None), u.held_from < e, ov > 0)
                    .lateral(name))

        a, b = per_key(u.held_to > s, "stopped"), per_key(u.held_to.is_(None), "live")
        q = select(ks.c.id, a.c.us, a.c.n, a.c.j, a.c.g, b.c.us, b.c.n, b.c.j, b.c.g).select_from(
            ks.join(a, true()).join(b, true()))
        for kid, *vals in session.execute(q):
            if vals[1] or vals[5]:
                add(kid, *vals[:4])
                add(kid, *vals[4:])
    else:
        def part(held):
            return (select(u.key_id, func.sum(ov), func.count(), first, first_here)
                    .where(u.key_id.in_(stored), held, u.held_from.is_not(None), u.held_from < e, ov > 0)
                    .group_by(u.key_id))

        for kid, *vals in session.execute(union_all(part(u.held_to > s), part(u.held_to.is_(None)))):
            add(kid, *vals)
    keys = _keys(session, sorted(got))
    out = []
    for kid in keys:  # in key order
        us, n, jobs_n, group_n = got[kid]
        p, kind, group, market, cpu, gpu = keys[kid]
        res = {k: v for k, v in (("CPU", cpu), ("GPU", gpu)) if v}
        stand_in = AttemptUsage(job_id="", project=p, kind=kind, name="", number=0, node_group=group,
                                market=market, resources=res, status="", cause=None, created_at=costs.EPOCH_UTC,
                                started_at=None, ended_at=None)
        out.append(Sum(stand_in, us / 1e6, n, jobs_n, group_n))
    return out


def jobs_by(rows: list[Sum], by: str | None) -> dict[str, int]:
    """Distinct jobs with an attempt in the window of ``rows`` (``sums``), per ``by``
    (project, node_group, kind; None: all, under the key ""). A job has one project
    and one kind; per node group a job counts once on each group it held."""
    out: dict[str, int] = {}
    for r in rows:
        u_ = r.usage
        key = {"project": u_.project, "node_group": u_.node_group or NONE, "kind": u_.kind, None: ""}[by]
        out[key] = out.get(key, 0) + (r.group_jobs if by == "node_group" else r.jobs)
    return {k: n for k, n in out.items() if n}


def reviewed(session: Session, *, start: datetime, end: datetime, now: datetime,
             project: str | None = None) -> list[AttemptUsage]:
    """The window's attempts that ``costs.cheaper_placements`` could list (``costs.review``:
    a GPU attempt of a job with a result is one), in (job id, number) order."""
    _, where = _overlap(start, end, now)
    has = results.alias("has_result")
    q = (
        select(attempts.c.job_id, attempts.c.number, attempts.c.node_group, attempts.c.market,
               attempts.c.resources, attempts.c.status, attempts.c.cause, attempts.c.created_at,
               attempts.c.started_at, attempts.c.ended_at, jobs.c.project, jobs.c.kind, jobs.c.name, jobs.c.spec,
               results.c.result)
        .select_from(attempt_usage)
        .join(attempts, and_(attempts.c.job_id == u.job_id, attempts.c.number == u.number))
        .join(jobs, jobs.c.id == u.job_id)
        .outerjoin(results, results.c.job_id == u.job_id)
        # EXISTS on attempt_usage alone: tested before the joins, row by row.
        .where(where, or_(u.review != costs.REVIEW_GPU,
                          select(has.c.job_id).where(has.c.job_id == u.job_id).exists()),
               # Spelled per review and held_to branch, so each reads a range of
               # ix_attempt_usage_review_held_to (an IN over reviews read every GPU
               # attempt ever stored: SQLite ranged on review alone).
               or_(*(and_(u.review == r, branch) for r in REVIEWS
                     for branch in (u.held_to.is_(None), u.held_to > literal(micros(start), BigInteger)))))
    )
    if project is not None:
        q = q.where(u.project == project)
    rows = sorted(session.execute(q), key=lambda r: (r.job_id, r.number))
    return [_usage(r) for r in rows]
