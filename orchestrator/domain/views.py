"""The shapes the API returns (and the SDK parses): jobs, events, pages, placements.

Pure pydantic, shared by server and client, so a field added here shows in both.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from raylane.orchestrator.domain.inputs import InputRule
from raylane.orchestrator.domain.specs import JobKind, JobSpec
from raylane.orchestrator.domain.states import FailureCause, JobStatus


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
    driver_market: Literal["SPOT", "ON_DEMAND"] | None = Field(
        None, description="Market of the driver's group: a dead spot driver node means preemption")
    total: dict[str, float] = Field(default_factory=dict, description="What the whole job holds while it runs")
    reasons: list[str]
    lane: str | None = Field(None, description="The node group whose warm lane runs it (docs/fast-lane.md); "
                             "null: a Ray job of its own")
    lane_env: str | None = Field(None, description="Its lane's runtime env (a hash of its working_dir, py_modules "
                                 "and pip): jobs of the same env share hosts; null: the node's own environment")
    cluster: str | None = Field(None, description="The fleet's cluster it is placed on (docs/fleet.md); null: "
                                "the one cluster, not placed across a fleet")
    tier: Literal["owned", "rented"] | None = Field(None, description="That cluster's tier")
    borrowed: bool = Field(False, description="Admitted on borrowed capacity: beyond its project's guaranteed "
                           "share of the group (docs/sharing.md); such a job is the first preempted when the "
                           "share's owner needs it back")
    preempts: list[str] = Field(default_factory=list, description="POST /v1/plan only: the running jobs that a "
                                "job submitted now would preempt (docs/sharing.md)")


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
    ray_job: str | None = Field(None, description="The Ray job it ran in, when not its own: a warm lane's host")
    cluster: str | None = Field(None, description="The fleet's cluster it was placed on; null: the one cluster")
    preempt_for: str | None = Field(None, description="The waiting job this attempt is being (or was) preempted "
                                    "for (docs/sharing.md)")
    preempt_deadline: datetime | None = Field(None, description="When it is stopped at the latest: its grace "
                                              "period's end (sooner once it has checkpointed)")
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


class NodeGroupStatus(BaseModel):
    """One node group of the cluster profile with its live capacity (``GET /v1/node-groups``)."""

    name: str
    role: str
    market: str
    accelerator: dict[str, Any] | None = None
    cpus_per_node: float = 0
    memory_gb_per_node: float = 0
    min_nodes: int = 0
    max_nodes: int = 0
    price_per_hour: float = 0
    alive_nodes: int = 0
    draining_nodes: int = 0
    capacity: dict[str, float] = Field(default_factory=dict, description="Ray resources of its alive nodes")
    used_by_raylane: dict[str, float] = Field(default_factory=dict, description="Held by Raylane's active jobs")
    active_jobs: int = 0
    queued_jobs: int = 0


# Access (raylane.orchestrator.services.access): identities, projects, quotas, the audit trail -------

# Costs (``GET /v1/costs``, ``GET /v1/jobs/{id}/cost``): one definition, the API's
# response models and the SDK's answers (the SDK's subclasses keep fields a newer
# server adds, ``raylane.client.sdk.models``). Defaults where an older server sent
# less, so an SDK reads its answers too.


class CostRow(BaseModel):
    key: str
    cost: float
    on_demand_cost: float
    spot_savings: float
    attempts: int
    jobs: int
    hours: float
    cpu_hours: float
    gpu_hours: float


class CostTotal(BaseModel):
    cost: float
    on_demand_cost: float
    spot_savings: float
    attempts: int
    jobs: int


class CostBreakdown(BaseModel):
    """``GET /v1/costs``: what attempts in a window cost, per project, node group or kind."""

    start: datetime
    end: datetime
    project: str | None = None
    group_by: str
    rows: list[CostRow]
    total: CostTotal
    unpriced_attempts: int = 0


class AttemptCost(BaseModel):
    number: int
    node_group: str | None = None
    market: str | None = None
    resources: dict[str, float] = Field(default_factory=dict)
    hours: float
    node_share: float
    cost: float
    on_demand_cost: float
    cause: str | None = None
    running: bool = False


class JobCost(BaseModel):
    """``GET /v1/jobs/{id}/cost``: each attempt's cost (a running one: so far)."""

    job_id: str
    cost: float
    on_demand_cost: float
    spot_savings: float
    attempts: list[AttemptCost]


Role = Literal["admin", "member", "viewer"]
PROJECT_NAME = r"^[a-z0-9][a-z0-9-]*$"  # the same rule as JobSpec.project


class _Request(InputRule):
    # A typo in a request body must not silently do nothing; what it stores obeys the input rule.
    model_config = ConfigDict(extra="forbid")


class Whoami(BaseModel):
    name: str
    project: str | None = Field(description="The caller's project; null: every project (an admin)")
    role: Role
    token_id: str | None = None
    auth_enabled: bool


class TokenCreate(_Request):
    name: str = Field(..., min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9._@+-]*$",
                      description="The user (or robot) the token belongs to")
    project: str | None = Field(None, min_length=1, max_length=64, pattern=PROJECT_NAME,
                                description="Required for members and viewers; an admin's default project")
    role: Role = "member"
    expires_in_days: float | None = Field(None, gt=0, le=3650)


class Token(BaseModel):
    """An API token as listed: never the secret, which only its creator saw once."""

    id: str
    name: str
    project: str | None = None
    role: Role
    created_at: datetime
    created_by: str
    expires_at: datetime | None = None
    revoked_at: datetime | None = None
    revoked_by: str | None = None
    last_used_at: datetime | None = None


class NewToken(Token):
    token: str = Field(description="The secret, sent as 'Authorization: Bearer <token>'. Shown this once only.")


class ProjectCreate(_Request):
    name: str = Field(..., min_length=1, max_length=64, pattern=PROJECT_NAME)
    description: str | None = Field(None, max_length=1024)


class Project(BaseModel):
    name: str
    description: str | None = None
    created_at: datetime
    created_by: str


class GroupLimits(_Request):
    """A project's limits in one node group; null: no limit on that resource.
    ``max_gpus`` / ``max_cpus`` are its guaranteed share; ``borrow_*`` how much more it
    may use while others leave theirs idle (null: none, a hard cap); ``lend_*`` how
    much of its idle share others may borrow (null: all). docs/sharing.md."""

    max_gpus: float | None = Field(None, ge=0, le=1_000_000)
    max_cpus: float | None = Field(None, ge=0, le=10_000_000)
    max_concurrent_jobs: int | None = Field(None, ge=0, le=1_000_000)
    borrow_gpus: float | None = Field(None, ge=0, le=1_000_000)
    borrow_cpus: float | None = Field(None, ge=0, le=10_000_000)
    lend_gpus: float | None = Field(None, ge=0, le=1_000_000)
    lend_cpus: float | None = Field(None, ge=0, le=10_000_000)

    @model_validator(mode="after")
    def _against_share(self) -> "GroupLimits":
        for res in ("gpus", "cpus"):
            share = getattr(self, f"max_{res}")
            for what in ("borrow", "lend"):
                if getattr(self, f"{what}_{res}") is not None and share is None:
                    raise ValueError(f"{what}_{res} needs max_{res} (the guaranteed share it "
                                     f"{'adds to' if what == 'borrow' else 'lends from'})")
            lend = self.lend_gpus if res == "gpus" else self.lend_cpus
            if lend is not None and share is not None and lend > share:
                raise ValueError(f"lend_{res} ({lend:g}) is more than max_{res} ({share:g}): a project lends "
                                 f"from its own share")
        return self


class QuotaUpdate(_Request):
    """PUT replaces the project's whole quota: groups not named have no limit."""

    node_groups: dict[str, GroupLimits] = Field(..., max_length=256)


class GroupQuota(BaseModel):
    max_gpus: float | None = None
    max_cpus: float | None = None
    max_concurrent_jobs: int | None = None
    borrow_gpus: float | None = None
    borrow_cpus: float | None = None
    lend_gpus: float | None = None
    lend_cpus: float | None = None
    borrowed_gpus: float = Field(0, description="GPUs its active jobs hold beyond its guaranteed share")
    borrowed_cpus: float = Field(0, description="CPUs its active jobs hold beyond its guaranteed share")
    used_gpus: float = Field(0, description="GPUs held by the project's active jobs in the group")
    used_cpus: float = Field(0, description="CPUs held by the project's active jobs in the group")
    active_jobs: int = Field(0, description="The project's active (dispatching, running, cancelling) jobs in the group")
    fair_share_usage: float | None = Field(
        None, description="The project's decayed usage of the group as fair share orders the queue by it: GPU-seconds "
        "(CPU-seconds in a group without GPUs), each weighted by 2^(-age / RAYLANE_FAIR_SHARE_HALF_LIFE_S); "
        "null: fair share is off")


class ProjectQuota(BaseModel):
    project: str
    node_groups: dict[str, GroupQuota]


class AuditEntry(BaseModel):
    id: int
    at: datetime
    actor: str
    token_id: str | None = None
    role: str | None = None
    project: str | None = None
    action: str
    method: str
    path: str
    target: str | None = None
    status_code: int
    client: str | None = None
    count: int = Field(1, description="Requests this row stands for: refusals without a valid token are one row "
                                      "per client, minute and status code")


class AuditPage(BaseModel):
    items: list[AuditEntry]
    next_cursor: str | None = Field(None, description="Pass as ?cursor= for the next (older) page; null on the last")


# Webhooks ----------------------------------------------------------------------

# Events of a schedule a hook may ask for: one per handled tick, by its outcome.
SCHEDULE_EVENTS = ("schedule.created", "schedule.skipped")
ScheduleEvent = Literal["schedule.created", "schedule.skipped"]

# Statuses a hook may ask for: every change a job makes after it is submitted.
HOOK_STATUSES = [s for s in JobStatus if s is not JobStatus.PENDING]
DEFAULT_HOOK_STATUSES = [JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED]


class WebhookCreate(_Request):
    url: str = Field(..., min_length=1, max_length=2048,
                     description="http(s) URL that receives a POST per status change, signed (docs/webhooks.md)")
    statuses: list[JobStatus] = Field(default_factory=lambda: list(DEFAULT_HOOK_STATUSES),
                                      max_length=len(JobStatus),
                                      description="The job statuses that trigger a delivery (not PENDING); [] for "
                                                  "a hook that wants schedule events only")
    events: list[ScheduleEvent] = Field(default_factory=list, max_length=len(SCHEDULE_EVENTS),
                                        description="Schedule events that trigger a delivery: schedule.created (a "
                                                    "tick made a job), schedule.skipped (a tick made none: missed, "
                                                    "overlap skip, or the submit refused)")
    project: str | None = Field(None, min_length=1, max_length=64, pattern=PROJECT_NAME,
                                description="Whose jobs; default: the caller's project")
    description: str | None = Field(None, max_length=256)


class Webhook(BaseModel):
    """A hook as listed: never its secret, which only its creator saw once."""

    id: str
    project: str
    url: str
    statuses: list[JobStatus]
    events: list[ScheduleEvent] = Field(default_factory=list)
    description: str | None = None
    created_at: datetime
    created_by: str


class NewWebhook(Webhook):
    secret: str = Field(description="The HMAC-SHA256 key of the Raylane-Signature header. Shown this once only.")


class WebhookDelivery(BaseModel):
    id: int = Field(description="Sent as the Raylane-Delivery header; the same on every try")
    type: Literal["job.status", "schedule.created", "schedule.skipped"] = "job.status"
    event_id: int | None = Field(None, description="A job's event (job.status)")
    job_id: str | None = None
    to_status: JobStatus | None = None
    schedule_id: str | None = Field(None, description="A schedule's handled tick (schedule.*)")
    tick: datetime | None = None
    status: Literal["PENDING", "DELIVERED", "FAILED"]
    attempts: int
    next_at: datetime | None = Field(None, description="When the next try is due (PENDING)")
    last_status_code: int | None = None
    last_error: str | None = None
    created_at: datetime
    delivered_at: datetime | None = None


# Schedules ---------------------------------------------------------------------


class ScheduleCreate(_Request):
    name: str = Field(..., min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$",
                      description="Unique in the project")
    cron: str = Field(..., min_length=1, max_length=256, examples=["0 2 * * *"],
                      description="5 fields (minute hour day month weekday), a 6th for seconds, or @daily etc.")
    timezone: str = Field("UTC", min_length=1, max_length=64, description="IANA time zone the cron fields are read in")
    spec: JobSpec = Field(..., description="The job each tick submits (its project is the schedule's)")
    overlap: Literal["skip", "queue", "replace"] = Field(
        "skip", description="A tick while the previous run is active: skip it, queue it until that run ends, "
        "or replace (cancel) that run")
    missed: Literal["skip", "run_once", "run_all"] = Field(
        "run_once", description="Ticks missed while no control plane ran (older than starting_deadline_s): "
        "skip them, run once for the latest, or run each (at most 100)")
    starting_deadline_s: float = Field(60.0, ge=1, le=7 * 24 * 3600,
                                       description="A due tick older than this counts as missed")
    paused: bool = False


class ScheduleRun(BaseModel):
    tick: datetime
    job_id: str | None = None
    outcome: Literal["created", "skipped"]
    reason: str | None = None
    at: datetime


class Schedule(BaseModel):
    id: str
    project: str
    name: str
    cron: str
    timezone: str
    spec: JobSpec
    overlap: str
    missed: str
    starting_deadline_s: float
    paused: bool
    next_runs: list[datetime] = Field(default_factory=list, description="The next ticks (none while paused)")
    last_job_id: str | None = None
    recent_runs: list[ScheduleRun] = Field(default_factory=list, description="Handled ticks, newest first")
    created_at: datetime
    created_by: str


# Arrays --------------------------------------------------------------------------


class JobArray(BaseModel):
    """An array: one spec, ``size`` member jobs (``GET /v1/jobs?label=raylane.array=<id>``)."""

    id: str
    project: str
    name: str
    size: int
    max_parallel: int | None = None
    counts: dict[str, int] = Field(default_factory=dict,
                                   description="Members per status, the newest job of each index")
    held: int = Field(0, description="Members held back by max_parallel (PENDING, not queued yet)")
    created_at: datetime
    created_by: str


class ArrayAction(BaseModel):
    array: JobArray
    jobs: list[str] = Field(default_factory=list, description="The member jobs this action created or cancelled")
