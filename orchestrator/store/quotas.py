"""Quotas per project and node group, and what each project holds now.

Usage is what a project's *active* jobs (dispatching, running, cancelling) hold
in a group: the sum of their placements' ``total`` (the whole gang, driver
included when it runs in the group) and their count. Admission
(``loops.admission.over_quota``) admits a job only when usage plus the job's total
stays within every limit of its project in its group; GET /v1/projects/{p}/quota
shows the same numbers, computed by the same function.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from sqlalchemy import delete, insert, select
from sqlalchemy.orm import Session

from raylane.orchestrator.domain.states import ACTIVE
from raylane.orchestrator.store.tables import jobs, quotas
from raylane.orchestrator.store.transitions import utcnow


@dataclass(frozen=True)
class Limits:
    max_gpus: float | None = None
    max_cpus: float | None = None
    max_concurrent_jobs: int | None = None


@dataclass
class Usage:
    gpus: float = 0.0
    cpus: float = 0.0
    jobs: int = 0

    def add(self, total: Mapping[str, float]) -> None:
        self.gpus += float(total.get("GPU", 0))
        self.cpus += float(total.get("CPU", 0))
        self.jobs += 1


def load_limits(session: Session, *, project: str | None = None) -> dict[tuple[str, str], Limits]:
    q = select(quotas)
    if project is not None:
        q = q.where(quotas.c.project == project)
    return {(r["project"], r["node_group"]): Limits(r["max_gpus"], r["max_cpus"], r["max_concurrent_jobs"])
            for r in session.execute(q).mappings()}


def usage(session: Session, *, project: str | None = None) -> dict[tuple[str, str], Usage]:
    """(project, node group) -> what the project's active jobs hold there."""
    q = select(jobs.c.project, jobs.c.node_group, jobs.c.placement).where(
        jobs.c.status.in_([s.value for s in ACTIVE]))
    if project is not None:
        q = q.where(jobs.c.project == project)
    out: dict[tuple[str, str], Usage] = {}
    for p, group, placement in session.execute(q):
        out.setdefault((p, group), Usage()).add((placement or {}).get("total") or {})
    return out


def set_limits(session: Session, project: str, groups: Mapping[str, Limits], *, actor: str) -> None:
    """Replace the project's quota: groups not given have no limit."""
    session.execute(delete(quotas).where(quotas.c.project == project))
    now = utcnow()
    rows = [{"project": project, "node_group": g, "max_gpus": lim.max_gpus, "max_cpus": lim.max_cpus,
             "max_concurrent_jobs": lim.max_concurrent_jobs, "updated_at": now, "updated_by": actor}
            for g, lim in groups.items()]
    if rows:
        session.execute(insert(quotas), rows)

