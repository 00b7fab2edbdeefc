"""What the fleet plan reads of Raylane's own jobs (``services/fleetplan.py``).

``timeout_ends``: per node group, the soonest a running job there must end by
its own ``timeout_s``: an upper bound on when held resources start to free, the
only end Raylane knows for certain. Running jobs are few (bounded by the
cluster's capacity), so their specs are read whole."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from raylane.orchestrator.domain.states import JobStatus
from raylane.orchestrator.store.tables import jobs


def timeout_ends(session: Session, *, now: datetime) -> dict[str, float]:
    """Node group -> seconds from ``now`` until its first running job with a
    ``timeout_s`` reaches it (0 when already past); groups without one are absent."""
    out: dict[str, float] = {}
    rows = session.execute(select(jobs.c.node_group, jobs.c.started_at, jobs.c.spec)
                           .where(jobs.c.status == JobStatus.RUNNING.value, jobs.c.started_at.is_not(None)))
    for group, started, spec in rows:
        timeout = (spec or {}).get("timeout_s")
        if not group or not isinstance(timeout, (int, float)) or timeout <= 0:
            continue
        left = max(0.0, (started - now).total_seconds() + float(timeout))
        out[group] = min(left, out.get(group, left))
    return out
