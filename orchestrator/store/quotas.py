"""Quotas per project and node group, and what each project holds now.

A quota's ``max_gpus`` / ``max_cpus`` are the project's *guaranteed share* of the
group; ``borrow_*`` how much more it may use while other projects leave their
share idle (None: nothing, the hard cap quotas always were), ``lend_*`` how much of
its own idle share others may borrow (None: all of it). ``loops.admission`` and
``domain.sharing`` say what each means when a job is admitted or waits.

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
from raylane.orchestrator.store.fleet import Scope, jobs_on
from raylane.orchestrator.store.tables import jobs, quotas
from raylane.orchestrator.store.transitions import utcnow


@dataclass(frozen=True)
class Limits:
    max_gpus: float | None = None
    max_cpus: float | None = None
    max_concurrent_jobs: int | None = None
    borrow_gpus: float | None = None
    borrow_cpus: float | None = None
    lend_gpus: float | None = None
    lend_cpus: float | None = None

    def cap(self, res: str) -> float | None:
        """The most the project may hold of ``res`` ("GPU" or "CPU"): its share plus what it may borrow."""
        share = self.max_gpus if res == "GPU" else self.max_cpus
        borrow = self.borrow_gpus if res == "GPU" else self.borrow_cpus
        return None if share is None else share + (borrow or 0.0)

    def share(self, res: str) -> float | None:
        """Its guaranteed share of ``res``; None: none (no quota on it)."""
        return self.max_gpus if res == "GPU" else self.max_cpus

    def unlendable(self, res: str) -> float:
        """How much of its share others may never borrow (share minus its lending limit)."""
        share = self.share(res)
        lend = self.lend_gpus if res == "GPU" else self.lend_cpus
        if share is None or lend is None:
            return 0.0
        return max(0.0, share - lend)


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
    return {(r["project"], r["node_group"]): Limits(r["max_gpus"], r["max_cpus"], r["max_concurrent_jobs"],
                                                    r["borrow_gpus"], r["borrow_cpus"], r["lend_gpus"], r["lend_cpus"])
            for r in session.execute(q).mappings()}


def usage(session: Session, *, project: str | None = None, scope: Scope | None = None) -> dict[tuple[str, str], Usage]:
    """(project, node group) -> what the project's active jobs hold there (``scope``:
    on one cluster of a fleet, whose dispatcher applies the quotas to its own groups:
    a share of onprem's ``gpu`` is not spent by jobs on cloud's ``gpu``)."""
    q = select(jobs.c.project, jobs.c.node_group, jobs.c.placement).where(
        jobs.c.status.in_([s.value for s in ACTIVE]), jobs_on(scope))
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
             "max_concurrent_jobs": lim.max_concurrent_jobs, "borrow_gpus": lim.borrow_gpus,
             "borrow_cpus": lim.borrow_cpus, "lend_gpus": lim.lend_gpus, "lend_cpus": lim.lend_cpus,
             "updated_at": now, "updated_by": actor}
            for g, lim in groups.items()]
    if rows:
        session.execute(insert(quotas), rows)

