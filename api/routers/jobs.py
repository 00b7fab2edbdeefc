"""/v1/jobs: submit, list, read, cancel.

Every query parameter and header that is stored or filtered by obeys the input
rule (``params``); a spec too large to exec is refused here, at submit."""

from __future__ import annotations

from typing import Annotated, Literal

import time

from fastapi import APIRouter, Depends, Header, Path, Query, Request, Response, status
from fastapi.responses import PlainTextResponse, StreamingResponse
from pydantic import StringConstraints

from raylane.api.deps import CP, CallerDep, MemberDep
from raylane.api.params import Text, When
from raylane.api.ratelimit import submit_limit
from raylane.orchestrator.domain.errors import Forbidden, Invalid
from raylane.orchestrator.domain.views import (
    Attempt, BatchSubmitRequest, Trial, BatchSubmitResponse, CancelResponse, Job, JobEvent, JobPage,
)
from raylane.orchestrator.domain.specs import (
    MAX_LABEL_KEY_LEN, MAX_LABEL_VALUE_LEN, JobKind, JobSpec, check_exec_size,
)
from raylane.orchestrator.domain.states import JobStatus
from raylane.orchestrator.domain.values import require_timezone
from raylane.orchestrator.store.jobs import DEFAULT_PROJECT, JobFilter

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


def _fits(spec: JobSpec, field: str) -> None:
    try:
        check_exec_size(spec)
    except ValueError as e:
        raise Invalid(str(e), field=field) from None


@router.post("", status_code=201, response_model=Job, dependencies=[Depends(submit_limit)],
             responses={200: {"model": Job, "description": "Same Idempotency-Key: the job created before"},
                        403: {"description": "Another project's spec, or a policy rule refused it (`rule`)"},
                        409: {"description": "Idempotency-Key reused with a different spec"},
                        429: {"description": "Submit rate of this token exceeded; see Retry-After"}})
def submit_job(spec: JobSpec, cp: CP, caller: MemberDep, request: Request, response: Response,
               idempotency_key: IdemKey = None) -> Job:
    _fits(spec, "spec")
    job, created = cp.submit(spec, project=_project(caller, spec.project), actor=caller.name,
                             idempotency_key=idempotency_key)
    request.state.audit_target = job.id
    if not created:
        response.status_code = status.HTTP_200_OK
    return job


@router.post("/batch", status_code=201, response_model=BatchSubmitResponse, dependencies=[Depends(submit_limit)],
             responses={403: {"description": "Another project's spec, or a policy rule refused one (`rule`)"},
                        429: {"description": "Submit rate of this token exceeded; see Retry-After"}})
def submit_batch(body: BatchSubmitRequest, cp: CP, caller: MemberDep) -> BatchSubmitResponse:
    for i, spec in enumerate(body.jobs):
        _fits(spec, f"jobs.{i}")
    projects = {_project(caller, s.project) for s in body.jobs}
    if len(projects) != 1:
        raise Invalid("all jobs in a batch must belong to one project", field="jobs")
    ids = cp.submit_batch(body.jobs, project=projects.pop(), actor=caller.name)
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
                    created_before=created_before)
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


LOG_FOLLOW_POLL_S = 0.5  # how often a followed log is re-read from Ray
LOG_FOLLOW_MAX_S = 3600  # a followed stream ends after an hour; reconnect to go on


@router.get("/{job_id}/logs", response_class=PlainTextResponse,
            responses={200: {"content": {"text/plain": {}}, "description": "The attempt's driver log"}})
def job_logs(job_id: JobId, cp: CP, caller: CallerDep,
             attempt: Annotated[int | None, Query(ge=1, le=10_000)] = None,
             follow: bool = False):
    """Ray's driver log of the job's latest (or given) attempt; ``follow=true`` streams until the job ends."""
    text, job = cp.logs(job_id, project=caller.project, attempt=attempt)
    if not follow:
        return PlainTextResponse(text)

    def stream():
        sent = 0
        deadline = time.monotonic() + LOG_FOLLOW_MAX_S
        current = text
        while True:
            if len(current) > sent:
                yield current[sent:]
                sent = len(current)
            j = cp.get(job_id, project=caller.project)
            if j.status.is_terminal() or time.monotonic() > deadline:
                final, _ = cp.logs(job_id, project=caller.project, attempt=attempt)
                if len(final) > sent:
                    yield final[sent:]
                return
            time.sleep(LOG_FOLLOW_POLL_S)
            current, _ = cp.logs(job_id, project=caller.project, attempt=attempt)

    return StreamingResponse(stream(), media_type="text/plain")
