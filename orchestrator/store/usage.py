"""Read attempts for accounting (``raylane.orchestrator.domain.costs``): every attempt that may
have held resources within a window, with its job's project, kind, spec and result."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import literal, or_, select
from sqlalchemy.orm import Session

from raylane.orchestrator.domain.costs import AttemptUsage
from raylane.orchestrator.store.tables import attempts, jobs, results


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
    return [
        AttemptUsage(job_id=r.job_id, project=r.project, kind=r.kind, name=r.name, number=r.number,
                     node_group=r.node_group, market=r.market,
                     resources={k: float(v) for k, v in (r.resources or {}).items() if isinstance(v, (int, float))},
                     status=r.status, cause=r.cause, created_at=r.created_at, started_at=r.started_at,
                     ended_at=r.ended_at, spec=r.spec or {}, result=r.result)
        for r in rows
    ]
