"""Keeps ``attempt_usage``: one row per attempt with what accounting needs of it,
so ``/v1/costs`` and ``/v1/report`` sum a window in SQL (``store.usage``) instead
of reading, decoding and pricing every attempt in it.

Words (``domain.costs``): the *held span* is ``held_span`` of the attempt's
status, cause and times, stored as microseconds since 1970; *review* is
``review`` of its kind, entrypoint, resources and market (fixed at admission).

Invariant: the row equals ``row_for`` of the attempt and its job as stored. The
writers keep it in their transaction: ``queue.admit`` inserts it
(``admitted``), ``transitions.set_attempt`` and ``set_attempt_cause`` (the only
writers of an attempt's status, cause and times) move its span (``moved``).
A write that bypasses them (a test's or a benchmark's bulk INSERT) calls
``track`` or ``rebuild``. ``recount`` computes every row from the tables: the
tests compare it with what was kept.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import bindparam, delete, insert, select, update
from sqlalchemy.orm import Session

from raylane.orchestrator.domain import costs
from raylane.orchestrator.store.tables import attempt_usage, attempts, jobs

_US = timedelta(microseconds=1)
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


def _resources(raw: Any) -> dict[str, float]:
    return {k: float(v) for k, v in (raw or {}).items() if isinstance(v, (int, float))}


def row_for(*, job_id: str, number: int, project: str, kind: str, spec: dict[str, Any], node_group: str | None,
            market: str | None, resources: Any, status: str, cause: str | None, created_at: datetime,
            started_at: datetime | None, ended_at: datetime | None) -> dict[str, Any]:
    res = _resources(resources)
    held_from, held_to = span_micros(status=status, cause=cause, created_at=created_at, started_at=started_at,
                                     ended_at=ended_at)
    return {"job_id": job_id, "number": number, "project": project, "kind": kind, "node_group": node_group,
            "market": market, "cpu": res.get("CPU", 0.0), "gpu": res.get("GPU", 0.0),
            "review": costs.review(kind, str((spec or {}).get("entrypoint", "")), res, market),
            "held_from": held_from, "held_to": held_to}


_NEW = insert(attempt_usage)  # built once: every admission runs it


def admitted(session: Session, *, job_id: str, number: int, project: str, kind: str, entrypoint: str,
             node_group: str | None, market: str | None, resources: dict[str, Any]) -> None:
    """A new attempt (it holds nothing yet)."""
    res = _resources(resources)
    session.execute(_NEW, {
        "job_id": job_id, "number": number, "project": project, "kind": kind, "node_group": node_group,
        "market": market, "cpu": res.get("CPU", 0.0), "gpu": res.get("GPU", 0.0),
        "review": costs.review(kind, entrypoint, res, market), "held_from": None, "held_to": None})


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


def recount(session: Session) -> dict[Key, dict[str, Any]]:
    """Every attempt's row computed from the tables (a full scan: tests and repairs only)."""
    return {(r.job_id, r.number): _row(r) for r in session.execute(_source())}


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
