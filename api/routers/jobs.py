"""/v1/jobs: submit, list, read, cancel.

Every query parameter and header that is stored or filtered by obeys the input
rule (``params``); a spec too large to exec is refused here, at submit."""

from __future__ import annotations

import json
from typing import Annotated, Literal

import anyio

from fastapi import APIRouter, Depends, Header, Path, Query, Request, Response, status
from fastapi.responses import PlainTextResponse, StreamingResponse
from pydantic import StringConstraints

from raylane.api.deps import CP, CallerDep, MemberDep, get_caller
from raylane.api.params import Text, When
from raylane.api.ratelimit import submit_limit
from raylane.orchestrator.domain.errors import Forbidden, Invalid
from raylane.orchestrator.services.logfollow import HEARTBEAT
from raylane.orchestrator.domain.views import (
    Attempt, BatchSubmitRequest, Trial, BatchSubmitResponse, CancelResponse, Job, JobEvent, JobPage,
)
from raylane.orchestrator.domain.specs import (
    MAX_LABEL_KEY_LEN, MAX_LABEL_VALUE_LEN, JobKind, JobSpec, check_exec_size,
)
from raylane.orchestrator.domain.states import JobStatus
from raylane.orchestrator.domain.values import require_timezone
from raylane.orchestrator.domain.queries import DEFAULT_PROJECT, JobFilter

router = APIRouter(prefix="/v1/jobs", tags=["jobs"])

JobId = Annotated[str, Path(min_length=1, max_length=64, pattern=r"^[0-9a-z]+$", description="Job id")]
LabelFilter = Annotated[Text, StringConstraints(max_length=MAX_LABEL_KEY_LEN + 1 + MAX_LABEL_VALUE_LEN)]
IdemKey = Annotated[Text | None, Header(alias="Idempotency-Key", min_length=1, max_length=255,
                                       description="Retrying a submit with the same key returns the same job")]


def _project(caller, spec_project: str | None) -> str:
    """The project a submitted job belongs to: the spec's, which must be the caller's own."""
    if spec_project and caller.project is not None and spec_project != caller.project:
        if caller.is_admin:
            raise Invalid(f"the spec says project {spec_project} but the request is for project {caller.project}",
                          field="project")
        raise Forbidden(f"you may submit only to project {caller.project}, not {spec_project}")
    return spec_project or caller.project or caller.home_project or DEFAULT_PROJECT


def _fits(spec: JobSpec, field: str, *, array: bool = False) -> str:
    """Refuse what no job can run; returns the spec's JSON text (``check_exec_size``)."""
    if spec.array is not None and not array:
        raise Invalid("an array goes to POST /v1/arrays (`raylane submit` sends it there)",
                      field=f"{field}.array" if field != "spec" else "array")
    try:
        return check_exec_size(spec)
    except ValueError as e:
        raise Invalid(str(e), field=field) from None


@router.post("", status_code=201, response_model=Job, dependencies=[Depends(submit_limit)],
             responses={200: {"model": Job, "description": "Same Idempotency-Key: the job created before"},
                        403: {"description": "Another project's spec, or a policy rule refused it (`rule`)"},
                        409: {"description": "Idempotency-Key reused with a different spec"},
                        429: {"description": "Submit rate of this token exceeded; see Retry-After"}})
async def submit_job(spec: JobSpec, cp: CP, caller: MemberDep, request: Request,
                     idempotency_key: IdemKey = None) -> Response:
    """Async: the route awaits its commit on the event loop (``cp.submit_async``)
    instead of holding a worker thread of the pool while it waits."""
    _fits(spec, "spec")
    entry = getattr(request.state, "audit_entry", None)  # api.auth: this request's audit row
    job, created = await cp.submit_async(spec, project=_project(caller, spec.project), actor=caller.name,
                                         idempotency_key=idempotency_key,
                                         audit=(lambda j, new: entry(_status(new), j.id)) if entry else None)
    # Committed with the job: the middleware writes no second row. A refusal
    # (raised above) is audited by the middleware, with its status.
    request.state.audited = entry is not None
    request.state.audit_target = job.id
    # The Job is built by the store already: encoded once here, not dumped,
    # validated against response_model and encoded again by FastAPI.
    return Response(job.model_dump_json(), media_type="application/json", status_code=_status(created))


def _status(created: bool) -> int:
    return status.HTTP_201_CREATED if created else status.HTTP_200_OK


@router.post("/batch", status_code=201, response_model=BatchSubmitResponse, dependencies=[Depends(submit_limit)],
             responses={403: {"description": "Another project's spec, or a policy rule refused one (`rule`)"},
                        429: {"description": "Submit rate of this token exceeded; see Retry-After"}})
def submit_batch(body: BatchSubmitRequest, cp: CP, caller: MemberDep) -> BatchSubmitResponse:
    texts = [_fits(spec, f"jobs.{i}") for i, spec in enumerate(body.jobs)]
    projects = {_project(caller, s.project) for s in body.jobs}
    if len(projects) != 1:
        raise Invalid("all jobs in a batch must belong to one project", field="jobs")
    ids = cp.submit_batch(body.jobs, project=projects.pop(), actor=caller.name, texts=texts)
    return BatchSubmitResponse(ids=ids, count=len(ids))


@router.get("", response_model=JobPage)
def list_jobs(
    cp: CP,
    caller: CallerDep,
    status_: Annotated[list[JobStatus] | None, Query(alias="status")] = None,
    kind: Annotated[list[JobKind] | None, Query()] = None,
    node_group: Annotated[Text | None, Query(max_length=64)] = None,
    label: Annotated[list[LabelFilter] | None, Query(description="key=value; repeat to AND", max_length=16)] = None,
    name_prefix: Annotated[Text | None, Query(max_length=128)] = None,
    created_after: When | None = None,
    created_before: When | None = None,
    project: Annotated[Text | None, Query(max_length=64)] = None,
    id_prefix: Annotated[str | None, Query(min_length=1, max_length=26, pattern=r"^[0-9a-z]+$",
                                           description="Ids starting with this (a short id)")] = None,
    submitted_by: Annotated[Text | None, Query(max_length=128, description="Jobs this token owner submitted")] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    cursor: Annotated[Text | None, Query(max_length=512)] = None,
) -> JobPage:
    labels: dict[str, str] = {}
    for item in label or []:
        k, sep, v = item.partition("=")
        if not sep or not k:
            raise Invalid(f"label filter {item[:80]!r} must be key=value", field="label")
        labels[k] = v
    require_timezone("created_after", created_after)
    require_timezone("created_before", created_before)
    scope = caller.project if caller.project is not None else project
    flt = JobFilter(project=scope, status=status_ or [], kind=[k.value for k in kind or []], node_group=node_group,
                    labels=labels, name_prefix=name_prefix, created_after=created_after,
                    created_before=created_before, id_prefix=id_prefix, submitted_by=submitted_by)
    items, next_cursor = cp.list(flt, limit=limit, cursor=cursor)
    return JobPage(items=items, next_cursor=next_cursor)


@router.get("/{job_id}", response_model=Job)
def get_job(job_id: JobId, cp: CP, caller: CallerDep) -> Job:
    return cp.get(job_id, project=caller.project)


@router.get("/{job_id}/events", response_model=list[JobEvent])
def job_events(job_id: JobId, cp: CP, caller: CallerDep,
               after_id: Annotated[int, Query(ge=0, le=2**62)] = 0) -> list[JobEvent]:
    return cp.events(job_id, project=caller.project, after_id=after_id)


@router.get("/{job_id}/attempts", response_model=list[Attempt])
def job_attempts(job_id: JobId, cp: CP, caller: CallerDep) -> list[Attempt]:
    return cp.attempts(job_id, project=caller.project)


@router.get("/{job_id}/trials", response_model=list[Trial])
def job_trials(job_id: JobId, cp: CP, caller: CallerDep,
               sort_by: Annotated[Text | None, Query(max_length=128, description="Metric; default the sweep's")] = None,
               mode: Annotated[Literal["min", "max"], Query()] = "min") -> list[Trial]:
    """A sweep's trials (config, status, metrics, node), best first by the sweep's metric."""
    return cp.trials(job_id, project=caller.project, sort_by=sort_by, mode=mode)


@router.post("/{job_id}/cancel", response_model=CancelResponse,
             responses={409: {"description": "The job already finished"}})
def cancel_job(job_id: JobId, cp: CP, caller: MemberDep) -> CancelResponse:
    job, message = cp.cancel(job_id, project=caller.project, actor=caller.name)
    return CancelResponse(job=job, message=message)


NDJSON = "application/x-ndjson"


@router.get("/{job_id}/logs", response_class=PlainTextResponse,
            responses={200: {"content": {"text/plain": {}, NDJSON: {}},
                             "description": "The attempt's driver log; followed in NDJSON when the request accepts it"},
                       429: {"description": "A cap on followed log streams (per token or per server); see Retry-After"}})
async def job_logs(job_id: JobId, request: Request,
                   attempt: Annotated[int | None, Query(ge=1, le=10_000)] = None,
                   follow: bool = False):
    """Ray's driver log of the job's latest (or given) attempt; ``follow=true`` streams until the job ends.

    A followed stream is plain text, or with ``Accept: application/x-ndjson`` one
    JSON object per line (``{"text": ...}``) and a blank line as a heartbeat.
    Async, and the dependencies are called here rather than declared: a sync
    dependency would take a thread of the pool that sync endpoints share."""
    caller = get_caller(request)
    cp = request.app.state.cp
    if not follow:
        text, _ = await anyio.to_thread.run_sync(lambda: cp.logs(job_id, project=caller.project, attempt=attempt))
        return PlainTextResponse(text)
    followers = request.app.state.log_followers
    stream = await followers.open(job_id, project=caller.project, attempt=attempt,
                                  owner=caller.token_id or caller.name)
    if NDJSON in request.headers.get("accept", ""):
        return StreamingResponse(_ndjson(stream), media_type=NDJSON)
    return StreamingResponse(_plain(stream), media_type="text/plain")


async def _plain(stream):
    # Plain text has no heartbeat that would not change the log; a client that
    # goes is still seen (the server listens for its disconnect).
    async for chunk in stream:
        if chunk is not HEARTBEAT:
            yield chunk


async def _ndjson(stream):
    async for chunk in stream:
        yield "\n" if chunk is HEARTBEAT else json.dumps({"text": chunk}) + "\n"
