"""/v1/arrays: one spec, many member jobs (``array: {size, max_parallel}``).
Members are ordinary jobs (``GET /v1/jobs?label=raylane.array=<id>``); an array
belongs to a project like its jobs."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Path, Request

from raylane.api.deps import CP, CallerDep, MemberDep
from raylane.api.ratelimit import submit_limit
from raylane.api.routers.jobs import _fits, _project
from raylane.orchestrator.domain.specs import JobSpec
from raylane.orchestrator.domain.views import ArrayAction, JobArray

router = APIRouter(prefix="/v1/arrays", tags=["arrays"])

ArrayId = Annotated[str, Path(min_length=1, max_length=32, pattern=r"^arr_[0-9a-f]+$")]


@router.post("", status_code=201, response_model=JobArray, dependencies=[Depends(submit_limit)],
             responses={403: {"description": "Another project's spec, or a policy rule refused it (`rule`)"}})
def submit_array(spec: JobSpec, cp: CP, caller: MemberDep, request: Request) -> JobArray:
    """Submit an array: ``size`` members, member ``i`` named ``<name>-<i>`` with
    ``RAYLANE_ARRAY_INDEX=i``; at most ``max_parallel`` of them admitted at once."""
    _fits(spec, "spec", array=True)
    arr = cp.submit_array(spec, project=_project(caller, spec.project), actor=caller.name)
    request.state.audit_target = arr.id
    return arr


@router.get("/{array_id}", response_model=JobArray)
def get_array(array_id: ArrayId, cp: CP, caller: CallerDep) -> JobArray:
    """An array with its members counted per status (the newest job of each index)."""
    return cp.get_array(array_id, project=caller.project)


@router.post("/{array_id}/cancel", response_model=ArrayAction)
def cancel_array(array_id: ArrayId, cp: CP, caller: CallerDep, request: Request) -> ArrayAction:
    """Cancel every unfinished member."""
    request.state.audit_target = array_id
    return cp.cancel_array(array_id, project=caller.project, actor=caller.name)


@router.post("/{array_id}/retry", response_model=ArrayAction)
def retry_array(array_id: ArrayId, cp: CP, caller: CallerDep, request: Request, failed_only: bool = False) -> ArrayAction:
    """A new job for each index whose newest job failed or was cancelled (``failed_only``: failed)."""
    request.state.audit_target = array_id
    return cp.retry_array(array_id, project=caller.project, actor=caller.name, failed_only=failed_only)
