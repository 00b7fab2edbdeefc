"""/v1/costs, /v1/report, /v1/jobs/{id}/cost: what attempts cost, how busy the node
groups were, and where a job could have run cheaper (``raylane.orchestrator.domain.costs``)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Path, Query

from raylane.api.deps import CP, CallerDep
from raylane.api.params import Text, When
from raylane.orchestrator.domain.views import CostBreakdown, JobCost
from raylane.orchestrator.services import accounting

router = APIRouter(prefix="/v1", tags=["costs"])

Start = Annotated[When | None, Query(description="Window start (with a timezone); default end - 7 days")]
End = Annotated[When | None, Query(description="Window end (with a timezone); default now")]
ProjectQ = Annotated[Text | None, Query(max_length=64, description="Admins: one project (default all)")]


def _scope(caller, project: str | None) -> str | None:
    return caller.project if caller.project is not None else project


@router.get("/costs", response_model=CostBreakdown,
            responses={422: {"description": "A bad window (no timezone, start after end, too long)"}})
def costs(cp: CP, caller: CallerDep, group_by: Literal["project", "node_group", "kind"] = "project",
          start: Start = None, end: End = None, project: ProjectQ = None) -> dict[str, Any]:
    """Cost of every attempt that held resources in the window, what it would have cost on
    on-demand nodes, and the spot savings, per project, node group or job kind."""
    return accounting.cost_breakdown(cp, group_by=group_by, start=start, end=end, project=_scope(caller, project))


@router.get("/report")
def report(cp: CP, caller: CallerDep, start: Start = None, end: End = None,
           project: ProjectQ = None) -> dict[str, Any]:
    """The platform team's decision: per GPU group, utilisation against the own-versus-rent
    break-even (RAYLANE_BREAK_EVEN_UTILISATION); utilisation of every group; costs per group;
    and the jobs whose placement could have been cheaper."""
    return accounting.report(cp, start=start, end=end, project=_scope(caller, project))


@router.get("/jobs/{job_id}/cost", response_model=JobCost)
def job_cost(cp: CP, caller: CallerDep,
             job_id: Annotated[str, Path(min_length=1, max_length=64, pattern=r"^[0-9a-z]+$")]) -> dict[str, Any]:
    """What each attempt of the job cost (a running one: so far), and the on-demand price of the same."""
    return accounting.job_cost(cp, job_id, project=caller.project)
