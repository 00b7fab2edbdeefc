"""/v1/schedules: a job spec run at the ticks of a cron expression
(docs/schedules.md). Members and admins manage their projects' schedules;
viewers read them; another project's schedule is 404."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Request, Response

from raylane.api.deps import CP, CallerDep
from raylane.api.routers.jobs import _fits, _project
from raylane.orchestrator.domain.views import Schedule, ScheduleCreate

router = APIRouter(prefix="/v1/schedules", tags=["schedules"])

ScheduleId = Annotated[str, Path(min_length=1, max_length=32, pattern=r"^sch_[0-9a-f]+$")]


@router.post("", status_code=201, response_model=Schedule,
             responses={409: {"description": "The project has a schedule of that name"}})
def create_schedule(body: ScheduleCreate, cp: CP, caller: CallerDep, request: Request) -> Schedule:
    """A new schedule; the answer shows its next runs."""
    _fits(body.spec, "spec")
    sch = cp.schedules.create(body, project=_project(caller, body.spec.project), actor=caller.name)
    request.state.audit_target = sch.id
    return sch


@router.get("", response_model=list[Schedule])
def list_schedules(cp: CP, caller: CallerDep) -> list[Schedule]:
    return cp.schedules.list(project=caller.project)


@router.get("/{schedule_id}", response_model=Schedule)
def get_schedule(schedule_id: ScheduleId, cp: CP, caller: CallerDep) -> Schedule:
    """A schedule with its next runs and its recent ticks (the job each made, or why none)."""
    return cp.schedules.get(schedule_id, project=caller.project)


@router.post("/{schedule_id}/pause", response_model=Schedule)
def pause_schedule(schedule_id: ScheduleId, cp: CP, caller: CallerDep, request: Request) -> Schedule:
    request.state.audit_target = schedule_id
    return cp.schedules.pause(schedule_id, project=caller.project, paused=True)


@router.post("/{schedule_id}/resume", response_model=Schedule)
def resume_schedule(schedule_id: ScheduleId, cp: CP, caller: CallerDep, request: Request) -> Schedule:
    """Resume from the next tick after now: ticks of the pause are not run."""
    request.state.audit_target = schedule_id
    return cp.schedules.pause(schedule_id, project=caller.project, paused=False)


@router.delete("/{schedule_id}", status_code=204)
def delete_schedule(schedule_id: ScheduleId, cp: CP, caller: CallerDep, request: Request) -> Response:
    """Delete a schedule; the jobs it made stay."""
    request.state.audit_target = schedule_id
    cp.schedules.delete(schedule_id, project=caller.project)
    return Response(status_code=204)
