"""The shapes the API returns (and the SDK parses): jobs, events, pages, placements.

Pure pydantic, shared by server and client, so a field added here shows in both.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, Field

from orchestrator.specs import JobKind, JobSpec
from orchestrator.states import FailureCause, JobStatus


class Placement(BaseModel):
    """Where a job runs and why: the router's decision."""

    node_group: str
    market: Literal["SPOT", "ON_DEMAND"]
    strategy: Literal["STRICT_PACK", "PACK", "SPREAD", "STRICT_SPREAD"]
    colocate: bool
    num_workers: int
    worker_resources: dict[str, float] = Field(description="Ray resources of one worker (CPU, GPU, memory)")
    label_selector: dict[str, str] = Field(description="Ray label selector for workers (and the driver)")
    fallback_node_groups: list[str] = Field(default_factory=list, description="Soft fallback, in order")
    driver_resources: dict[str, float] = Field(default_factory=dict)
    driver_label_selector: dict[str, str] = Field(default_factory=dict)
    total: dict[str, float] = Field(default_factory=dict, description="What the whole job holds while it runs")
    reasons: list[str]


class Attempt(BaseModel):
    number: int
    submission_id: str
    node_group: str | None = None
    market: str | None = None
    status: str
    driver_node_id: str | None = None
    created_at: datetime
    started_at: datetime | None = None
    ended_at: datetime | None = None
    cause: FailureCause | None = None
    message: str | None = None
    exit_code: int | None = None
    dashboard_url: str | None = None


class Job(BaseModel):
    """A job as the API shows it."""

    id: str
    name: str
    kind: JobKind
    project: str
    status: JobStatus
    status_reason: str | None = None
    priority: int
    labels: dict[str, str] = Field(default_factory=dict)
    created_at: datetime
    updated_at: datetime
    started_at: datetime | None = None
    finished_at: datetime | None = None
    attempts: int = 0
    max_attempts: int
    preemptions: int = 0
    failure_cause: FailureCause | None = None
    cancel_requested: bool = False
    placement: Placement | None = None
    ray_submission_id: str | None = Field(None, description="The current attempt's Ray job submission id")
    dashboard_url: str | None = Field(None, description="The current attempt's page in Ray's dashboard")
    result: dict[str, Any] | None = None
    spec: JobSpec


class JobPage(BaseModel):
    items: list[Job]
    next_cursor: str | None = Field(None, description="Pass as ?cursor= for the next page; null on the last")


class JobEvent(BaseModel):
    id: int
    job_id: str
    at: datetime
    from_status: JobStatus | None = None
    to_status: JobStatus
    reason: str | None = None
    actor: str
    attempt: int | None = None


class BatchSubmitRequest(BaseModel):
    jobs: list[JobSpec] = Field(..., min_length=1)


class BatchSubmitResponse(BaseModel):
    ids: list[str]
    count: int


class CancelResponse(BaseModel):
    job: Job
    message: str


class Trial(BaseModel):
    """One trial of a sweep."""

    trial_id: str
    attempt: int | None = None
    status: str
    config: dict[str, Any]
    metrics: dict[str, Any]
    node_id: str | None = None
    node_group: str | None = None
    error: str | None = None
