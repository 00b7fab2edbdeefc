"""A warm lane attempt's log tail, kept in the database with its outcome
(``tables.lane_logs``): the reconciler writes it in the transaction that records
how the attempt ended, then Ray's KV store forgets the attempt (``domain.lanes``)."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from raylane.orchestrator.store.tables import lane_logs


def save(session: Session, job_id: str, number: int, tail: str) -> None:
    """The attempt's last output; written once (a pass that writes its outcome again finds it there)."""
    if session.execute(select(lane_logs.c.number).where(lane_logs.c.job_id == job_id,
                                                         lane_logs.c.number == number)).first() is None:
        session.execute(lane_logs.insert().values(job_id=job_id, number=number, tail=tail))


def read(session: Session, job_id: str, number: int) -> str | None:
    return session.execute(select(lane_logs.c.tail).where(lane_logs.c.job_id == job_id,
                                                          lane_logs.c.number == number)).scalar_one_or_none()
