"""Keeps ``attempt_usage``: one row per attempt with what accounting needs of it,
so ``/v1/costs`` and ``/v1/report`` sum a window in SQL (``store.usage``) instead
of reading, decoding and pricing every attempt in it.

Words (``domain.costs``): the *held span* is ``held_span`` of the attempt's
status, cause and times, stored as microseconds since 1970; *review* is
``review`` of its kind, entrypoint, resources and market (fixed at admission).

*prev_held_to* is the latest ``held_to`` of the job's earlier attempts (by
number) and *prev_group_held_to* that of those on the same node group (NULL: none
stopped holding): a window counts a job at the attempt whose earlier ones all
stopped before it (``store.usage``). That holds because a job's attempts hold one
after the other: attempt n+1 is admitted after attempt n ended.

Invariant: the row equals ``row_for`` of the attempt and its job as stored, with
the prev columns of the job's earlier rows. The writers keep it in their
transaction: ``queue.admit`` inserts it (``admitted``), ``transitions.set_attempt``
and ``set_attempt_cause`` (the only writers of an attempt's status, cause and
times) move its span (``moved``; a moved end re-chains the job's later rows). A
write that bypasses them (a test's or a benchmark's bulk INSERT) calls ``track``
or ``rebuild``. ``recount`` computes every row from the tables: the tests compare
it with what was kept.
"""

from __future__ import annotations

import functools
import hashlib
import struct
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import bindparam, case, delete, func, insert, select, update
from sqlalchemy.orm import Session

from raylane.orchestrator.domain import costs
from raylane.orchestrator.store.tables import attempt_usage, attempts, jobs

_US = timedelta(microseconds=1)
# What accounting calls an attempt without a node group (``costs._key``): one group
# with one named "none", for the prev columns as for the jobs counted per group.
NO_GROUP = "none"
Key = tuple[str, int]


def micros(t: datetime | None) -> int | None:
    """``t`` as whole microseconds since 1970 (exact: timestamps carry microseconds)."""
    return None if t is None else (t - costs.EPOCH_UTC) // _US


def span_micros(*, status: str, cause: str | None, created_at: datetime, started_at: datetime | None,
                ended_at: datetime | None) -> tuple[int | None, int | None]:
    """(held_from, held_to) of an attempt with these values."""
    span = costs.held_span(status=status, cause=cause, created_at=created_at, started_at=started_at,
                           ended_at=ended_at)
    return (None, None) if span is None else (micros(span[0]), micros(span[1]))


@functools.lru_cache(maxsize=4096)
def key_id(project: str, kind: str, node_group: str | None, market: str | None, cpu: float, gpu: float) -> int:
    """The key costs are summed by (``store.usage.sums``) as a signed 64-bit integer:
    the first 8 bytes of its BLAKE2b digest, the same in every process and database
    (two keys would share one with odds of about 1 in 10^19 per pair of keys)."""
    text = tuple(None if v is None else str(getattr(v, "value", v)) for v in (project, kind, node_group, market))
    raw = repr((*text, float(cpu), float(gpu))).encode()  # a str enum (JobKind) as its value
    return struct.unpack(">q", hashlib.blake2b(raw, digest_size=8).digest())[0]


def _resources(raw: Any) -> dict[str, float]:
    return {k: float(v) for k, v in (raw or {}).items() if isinstance(v, (int, float))}


def row_for(*, job_id: str, number: int, project: str, kind: str, spec: dict[str, Any], node_group: str | None,
            market: str | None, resources: Any, status: str, cause: str | None, created_at: datetime,
            started_at: datetime | None, ended_at: datetime | None) -> dict[str, Any]:
    res = _resources(resources)
    held_from, held_to = span_micros(status=status, cause=cause, created_at=created_at, started_at=started_at,
                                     ended_at=ended_at)
    cpu, gpu = res.get("CPU", 0.0), res.get("GPU", 0.0)
    return {"job_id": job_id, "number": number, "project": project, "kind": kind, "node_group": node_group,
            "market": market, "cpu": cpu, "gpu": gpu,
            "review": costs.review(kind, str((spec or {}).get("entrypoint", "")), res, market),
            "held_from": held_from, "held_to": held_to, "prev_held_to": None, "prev_group_held_to": None,
            "key_id": key_id(project, kind, node_group, market, cpu, gpu)}


def chained(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One job's rows (``row_for``'s) with their prev columns set, in number order."""
    rows = sorted(rows, key=lambda r: r["number"])
    latest: int | None = None
    by_group: dict[str, int] = {}
    for r in rows:
        group = r["node_group"] or NO_GROUP
        r["prev_held_to"], r["prev_group_held_to"] = latest, by_group.get(group)
        if r["held_to"] is not None:
            latest = r["held_to"] if latest is None else max(latest, r["held_to"])
            g = by_group.get(group)
            by_group[group] = r["held_to"] if g is None else max(g, r["held_to"])
    return rows


_u = attempt_usage.c
_p = attempt_usage.alias("earlier")


def _prev_values():
    """The prev columns of the row being updated, from its job's earlier rows (correlated)."""
    earlier = (_p.c.job_id == _u.job_id, _p.c.number < _u.number)
    same_group = func.coalesce(_p.c.node_group, NO_GROUP) == func.coalesce(_u.node_group, NO_GROUP)
    return {"prev_held_to": select(func.max(_p.c.held_to)).where(*earlier).scalar_subquery(),
            "prev_group_held_to": select(func.max(_p.c.held_to)).where(*earlier, same_group).scalar_subquery()}


def rechain(session: Session, job_id: str | None = None, after: int = 0) -> None:
    """Recompute the prev columns of ``job_id``'s rows numbered above ``after`` (None: every job's)."""
    q = update(attempt_usage).where(_u.number > max(after, 1))
    if job_id is not None:
        q = q.where(_u.job_id == job_id)
    session.execute(q.values(**_prev_values()))
    if not after:  # a first attempt has no earlier one (a row written around the writers may say otherwise)
        first = update(attempt_usage).where(_u.number <= 1, (_u.prev_held_to.is_not(None))
                                            | (_u.prev_group_held_to.is_not(None)))
        if job_id is not None:
            first = first.where(_u.job_id == job_id)
        session.execute(first.values(prev_held_to=None, prev_group_held_to=None))


_PREV = select(func.max(_u.held_to), func.max(case((func.coalesce(_u.node_group, NO_GROUP) == bindparam("b_group"),
                                                     _u.held_to)))) \
    .where(_u.job_id == bindparam("b_job"), _u.number < bindparam("b_number"))


_NEW = insert(attempt_usage)  # built once: every admission runs it


def admitted_many(session: Session, new: list[dict[str, Any]]) -> None:
    """New attempts' rows (each holds nothing yet), one executemany: ``new`` are dicts
    of job_id, number, project, kind, entrypoint, node_group, market and resources.
    A retry reads its job's earlier rows for its prev columns."""
    rows = []
    for a in new:
        res = _resources(a["resources"])
        number, node_group, project, kind, market = a["number"], a["node_group"], a["project"], a["kind"], a["market"]
        prev = (None, None) if number <= 1 else tuple(session.execute(
            _PREV, {"b_job": a["job_id"], "b_number": number, "b_group": node_group or NO_GROUP}).one())
        cpu, gpu = res.get("CPU", 0.0), res.get("GPU", 0.0)
        rows.append({
            "job_id": a["job_id"], "number": number, "project": project, "kind": kind, "node_group": node_group,
            "market": market, "cpu": cpu, "gpu": gpu,
            "review": costs.review(kind, a["entrypoint"], res, market), "held_from": None, "held_to": None,
            "prev_held_to": prev[0], "prev_group_held_to": prev[1],
            "key_id": key_id(project, kind, node_group, market, cpu, gpu)})
    if rows:
        session.execute(_NEW, rows if len(rows) > 1 else rows[0])


# Built once (bound parameters): it runs with every attempt's change (store.transitions says why).
_MOVE = update(attempt_usage).where(attempt_usage.c.job_id == bindparam("b_job"),
                                    attempt_usage.c.number == bindparam("b_number"))


def moved(session: Session, job_id: str, number: int, old: tuple[int | None, int | None],
          new: tuple[int | None, int | None]) -> None:
    """The attempt's held span went from ``old`` to ``new`` (``span_micros``)."""
    if old == new:
        return
    res = session.execute(_MOVE, {"b_job": job_id, "b_number": number, "held_from": new[0], "held_to": new[1]})
    if res.rowcount == 0:  # an attempt inserted around admit (a test's fixture): make its row
        track(session, job_id, number)
    elif old[1] != new[1]:  # its end moved: later attempts' prev columns read it
        rechain(session, job_id, after=number)


def _source():
    return (select(attempts.c.job_id, attempts.c.number, jobs.c.project, jobs.c.kind, jobs.c.spec,
                   attempts.c.node_group, attempts.c.market, attempts.c.resources, attempts.c.status,
                   attempts.c.cause, attempts.c.created_at, attempts.c.started_at, attempts.c.ended_at)
            .join(jobs, jobs.c.id == attempts.c.job_id))


def _row(r) -> dict[str, Any]:
    return row_for(job_id=r.job_id, number=r.number, project=r.project, kind=r.kind, spec=r.spec,
                   node_group=r.node_group, market=r.market, resources=r.resources, status=r.status,
                   cause=r.cause, created_at=r.created_at, started_at=r.started_at, ended_at=r.ended_at)


def track(session: Session, job_id: str, number: int) -> None:
    """(Re)write one attempt's row from the tables."""
    r = session.execute(_source().where(attempts.c.job_id == job_id, attempts.c.number == number)).first()
    session.execute(delete(attempt_usage).where(attempt_usage.c.job_id == job_id, attempt_usage.c.number == number))
    if r is not None:
        session.execute(insert(attempt_usage).values(**_row(r)))
    rechain(session, job_id)


def recount(session: Session) -> dict[Key, dict[str, Any]]:
    """Every attempt's row computed from the tables (a full scan: tests and repairs only)."""
    by_job: dict[str, list[dict[str, Any]]] = {}
    for r in session.execute(_source()):
        by_job.setdefault(r.job_id, []).append(_row(r))
    return {(row["job_id"], row["number"]): row for rows in by_job.values() for row in chained(rows)}


def read(session: Session) -> dict[Key, dict[str, Any]]:
    return {(r.job_id, r.number): dict(r._mapping) for r in session.execute(select(attempt_usage))}


def rebuild(session: Session, chunk: int = 20_000) -> None:
    """Replace every row with ``recount``'s (in the caller's transaction)."""
    session.execute(delete(attempt_usage))
    batch: list[dict[str, Any]] = []
    for r in session.execute(_source()).yield_per(chunk):
        batch.append(_row(r))
        if len(batch) >= chunk:
            session.execute(insert(attempt_usage), batch)
            batch = []
    if batch:
        session.execute(insert(attempt_usage), batch)
    rechain(session)
