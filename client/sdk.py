"""The Raylane Python SDK: ``Client`` and ``AsyncClient`` over the REST API, typed
errors, and ``job``, a decorator that turns a function into a job.

Words used here:

- *call*: one API operation as the SDK sees it (``_Call``): method, path, body,
  how to read the answer, and whether it is safe to send twice.
- *try*: one HTTP exchange of a call. A call takes up to ``MAX_ATTEMPTS`` tries
  (tenacity runs them, ``_retry_policy`` says when and how far apart) when the
  connection fails or the answer is 429/502/503/504.
- *resendable*: a call the server may receive twice without harm. Reads are; a
  submit is, because it carries an ``Idempotency-Key`` (the server returns the
  job it created the first time); a batch submit is not (the API takes no key
  for it), so it is only retried when the request never left this machine.

This module imports pydantic, yaml and the pure-pydantic ``raylane.orchestrator.domain.specs``,
``states`` and ``resources`` (and ``packages``), and ``raylane.client.packaging``
(the standard library's zip) for working dirs sent from this machine; httpx is
imported when a client is made. Never Ray,
SQLAlchemy or FastAPI: ``pip install raylane`` must stay light.
"""

from __future__ import annotations

import functools
import json
import os
import random
import sys
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import (
    TYPE_CHECKING, Any, AsyncIterator, Callable, Generic, Iterable, Iterator, Literal, Mapping, Sequence, TypeVar, Union,
    overload,
)

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter
from pydantic import ValidationError as _PydanticValidationError

from raylane.client import packaging
from raylane.client.packaging import PackageTooLarge
from raylane.orchestrator.domain import views
from raylane.orchestrator.domain.packages import package_uri
from raylane.orchestrator.domain.views import (
    ArrayAction, Attempt, AuditPage, BatchSubmitResponse, CancelResponse, Job, JobArray, JobEvent, JobPage, NewToken,
    NewWebhook, Placement, Project, ProjectQuota, Schedule, Token, Trial, Webhook, WebhookDelivery, Whoami,
)
from raylane.orchestrator.domain.specs import JobKind, JobSpec, SpecLoadError, load_spec_document
from raylane.orchestrator.domain.states import JobStatus

if TYPE_CHECKING:  # pragma: no cover
    import httpx

__all__ = [
    "Client", "AsyncClient", "job", "JobFunction",
    "RaylaneError", "NotFound", "Conflict", "ValidationFailed", "Unauthorized", "Forbidden", "RateLimited",
    "ServerError", "ConnectionFailed", "WaitTimeout", "AmbiguousJobId",
    "NodeGroupStatus", "ClusterInfo", "ClusterNode", "Health", "Trial", "KindInfo",
    "CostBreakdown", "JobCost", "Report",
    "DEFAULT_URL", "MAX_ATTEMPTS", "PackageTooLarge", "UploadedPackage",
]

DEFAULT_URL = "http://127.0.0.1:8000"
ENV_URL = "RAYLANE_URL"
ENV_TOKEN = "RAYLANE_TOKEN"

# Five tries, 0.25 / 0.5 / 1 / 2 s apart (with jitter; about 4 s in all), ride out
# a control-plane restart or a load balancer swapping replicas. Past that the
# server is down, and the caller should hear so rather than hang in a loop.
MAX_ATTEMPTS = 5
BACKOFF_BASE_S = 0.25
BACKOFF_MAX_S = 4.0
# A server's Retry-After is honoured, but never longer than this: a wrong header
# must not park a client for an hour.
RETRY_AFTER_MAX_S = 30.0
# A proxy with no healthy upstream (502), a server starting or shedding load
# (503), a proxy timing out (504), a rate limit with its Retry-After (429): the
# server did not act on the request. A 500 is a bug: sending it again repeats it.
RETRY_STATUSES = frozenset({429, 502, 503, 504})
# Of those, the ones that say the server did not act, so even a call that is not
# resendable (a batch) may go again; a 502/504 from a proxy may hide a batch stored.
NOT_ACTED_STATUSES = frozenset({429, 503})
DEFAULT_TIMEOUT_S = 30.0
# wait(): first poll after 0.25 s, slowing to one poll every 2 s: a status change
# shows within 2 s, and a thousand waiting clients cost the server 500 requests/s.
WAIT_POLL_MIN_S = 0.25
WAIT_POLL_MAX_S = 2.0
ITER_PAGE_SIZE = 100  # iter_jobs() page size; the API allows up to 500
JOB_ID_LENGTH = 26  # a ULID (orchestrator/domain/ids.py); shorter is a prefix to resolve
# An ambiguous prefix names this many of its jobs: enough to pick one, short enough to read.
AMBIGUOUS_SHOWN = 10
# Written on a job made by resubmit(): the job it was made from.
RESUBMITTED_FROM_LABEL = "raylane.io/resubmitted-from"

T = TypeVar("T")
SpecLike = Union[JobSpec, Mapping[str, Any], str, "os.PathLike[str]"]
StatusLike = Union[JobStatus, str]
KindLike = Union[JobKind, str]


# Errors ------------------------------------------------------------------------


class RaylaneError(Exception):
    """Base of every error the SDK raises.

    Attributes:
        message: what went wrong, ready to show to a user.
        status_code: the HTTP status, when the server answered.
        detail: the ``detail`` of the server's JSON error body, as sent.
    """

    def __init__(self, message: str, *, status_code: int | None = None, detail: Any = None):
        super().__init__(message)
        self.message = message
        self.status_code = status_code
        self.detail = detail

    def __str__(self) -> str:
        return self.message


class NotFound(RaylaneError):
    """404: no such job (or one the caller may not see), or no such endpoint."""


class Conflict(RaylaneError):
    """409: the job's state forbids the request (cancel a finished job), or an
    Idempotency-Key was reused with a different spec."""


class ValidationFailed(RaylaneError):
    """422 (or a spec refused before sending): the input is wrong.

    Attributes:
        errors: the field errors, each ``{"loc": [...], "msg": str, "type": str}``
            as in the server's 422 ``detail``; ``loc`` starts with ``body``,
            ``query`` or ``path``.
    """

    def __init__(self, message: str, *, errors: list[dict[str, Any]] | None = None, status_code: int | None = None,
                 detail: Any = None):
        super().__init__(message, status_code=status_code, detail=detail)
        self.errors: list[dict[str, Any]] = errors or []

    @property
    def fields(self) -> dict[str, str]:
        """``{"resources.gpus_per_worker": "message", ...}``: each error by its field path."""
        return {_loc_str(e.get("loc", [])): str(e.get("msg", "")) for e in self.errors}


class AmbiguousJobId(RaylaneError):
    """A short id (``resolve_job_id``) that starts more than one job's id.

    Attributes:
        prefix: the short id given.
        candidates: the newest jobs it matches (at most ``AMBIGUOUS_SHOWN``).
    """

    def __init__(self, message: str, *, prefix: str, candidates: list[Job]):
        super().__init__(message)
        self.prefix = prefix
        self.candidates = candidates


class Unauthorized(RaylaneError):
    """401: no token, or a token the server does not accept (set RAYLANE_TOKEN).

    Attributes:
        token_sent: whether the request carried a token at all.
    """

    token_sent: bool = False


class Forbidden(RaylaneError):
    """403: the token is valid but may not do this."""


class RateLimited(RaylaneError):
    """429: this token sent more submits than its rate allows, through every retry."""


class ServerError(RaylaneError):
    """5xx: the server failed (its log has the traceback), or stayed unavailable
    through every retry."""


class ConnectionFailed(RaylaneError, ConnectionError):
    """The server could not be reached, or the connection broke, through every retry."""


class WaitTimeout(RaylaneError, TimeoutError):
    """``wait()`` gave up before the job finished. The job keeps running.

    Attributes:
        job_id: the job waited on.
        timeout: the seconds waited.
        status: the last status seen (None if none was seen).
    """

    def __init__(self, message: str, *, job_id: str, timeout: float, status: JobStatus | None):
        super().__init__(message)
        self.job_id = job_id
        self.timeout = timeout
        self.status = status


def _loc_str(loc: Iterable[Any]) -> str:
    parts = [str(p) for p in loc]
    if parts and parts[0] in ("body", "query", "path", "header"):
        parts = parts[1:] or parts
    return ".".join(parts) or "spec"


def _validation_message(errors: list[dict[str, Any]], prefix: str = "invalid request") -> str:
    lines = [f"{_loc_str(e.get('loc', []))}: {e.get('msg', '')}" for e in errors]
    return f"{prefix}: " + "; ".join(lines) if lines else prefix


def _content_type(resp: "httpx.Response") -> str:
    return resp.headers.get("content-type", "").split(";")[0].strip() or "no content type"


def _request_of(resp: "httpx.Response") -> "httpx.Request | None":
    try:
        return resp.request
    except RuntimeError:  # a Response built by hand (tests) has none
        return None


def _where(resp: "httpx.Response") -> str:
    req = _request_of(resp)
    return str(req.url.copy_with(query=None)) if req is not None else "the server"


def _not_raylane(resp: "httpx.Response") -> str:
    """What to say when the answer is not the JSON a Raylane API sends: another web
    server (or a proxy's page) is at the URL. Its HTML is never shown."""
    return f"{_where(resp)} answered {resp.status_code} {_content_type(resp)}: not a Raylane API? Check the URL"


def _error_from(resp: "httpx.Response") -> RaylaneError:
    """The typed error for an HTTP error response; the one place statuses become classes."""
    status = resp.status_code
    try:
        body = resp.json()
    except ValueError:
        body = None
    detail = body.get("detail") if isinstance(body, dict) else None
    if isinstance(detail, str):
        message = detail
    elif detail is not None:
        message = json.dumps(detail)[:500]
    elif body is None and status < 500:
        message = _not_raylane(resp)
    elif body is None:
        message = f"{_where(resp)} answered {_content_type(resp)}"
    else:
        message = (resp.text or resp.reason_phrase or "")[:500].strip() or f"HTTP {status}"
    if status == 422:
        errors = detail if isinstance(detail, list) else [{"loc": [], "msg": message, "type": "value_error"}]
        errors = [e if isinstance(e, dict) else {"loc": [], "msg": str(e), "type": "value_error"} for e in errors]
        return ValidationFailed(_validation_message(errors), errors=errors, status_code=status, detail=detail)
    cls: type[RaylaneError]
    if status == 401:
        err = Unauthorized(f"{message} (set RAYLANE_TOKEN or pass token=)", status_code=status, detail=detail)
        req = _request_of(resp)
        err.token_sent = req is not None and "authorization" in req.headers
        return err
    elif status == 403:
        cls = Forbidden
    elif status == 404:
        cls = NotFound
    elif status == 409:
        cls = Conflict
    elif status == 429:
        cls = RateLimited
    elif status >= 500:
        cls, message = ServerError, f"server error {status}: {message}"
    else:
        cls = RaylaneError
    return cls(message, status_code=status, detail=detail)


def _spec_error(exc: _PydanticValidationError, prefix: str) -> ValidationFailed:
    errors = [{"loc": ["body", *[str(x) for x in e.get("loc", ())]], "msg": str(e.get("msg", "")),
               "type": str(e.get("type", "value_error"))} for e in exc.errors()[:50]]
    return ValidationFailed(_validation_message(errors, prefix), errors=errors)


# Models the API returns that are not in raylane.orchestrator.domain.views ------------------


class _Open(BaseModel):
    # A newer server may add fields; an older client keeps working.
    model_config = ConfigDict(extra="allow")


class NodeGroupStatus(_Open, views.NodeGroupStatus):
    """One node group of the cluster profile with its live capacity (``GET /v1/node-groups``);
    the server's shape (``views.NodeGroupStatus``), keeping fields a newer server adds."""


class ClusterNode(_Open):
    node_id: str | None = None
    state: str
    node_group: str | None = None
    market: str | None = None
    is_head: bool = False
    resources: dict[str, float] = Field(default_factory=dict)
    draining: bool = False
    death_reason: str | None = None


class ClusterInfo(_Open):
    """Ray's nodes, alive and dead, as the control plane sees them (``GET /v1/cluster``)."""

    dashboard_url: str | None = None
    profile: str | None = None
    nodes: list[ClusterNode] = Field(default_factory=list)


class ReadyPart(_Open):
    """One part of ``/readyz``: the database or Ray. ``state`` and ``since`` are Ray's
    (``reachable``, ``unreachable`` since when, ``not attached``)."""

    ok: bool
    reason: str | None = None
    state: str | None = None
    since: datetime | None = None


class Health(_Open):
    """``GET /readyz``: ``ok`` when the server accepts jobs (up, its database reachable
    and migrated); ``ray`` says whether they can run (``status`` ``degraded``: Ray is
    unreachable, jobs are stored and wait)."""

    ok: bool
    status: str
    reason: str | None = None
    database: ReadyPart | None = None
    ray: ReadyPart | None = None


class KindInfo(_Open):
    """A job kind this control plane runs, with its traits (``GET /v1/kinds``)."""

    name: str
    summary: str
    entrypoint: str
    elastic: bool
    spot_first: bool
    checkpoints: bool
    serves: bool
    strategy: str
    section: str | None = None
    section_required: bool = False
    cost_basis: str


class CostRow(_Open):
    key: str
    cost: float
    on_demand_cost: float
    spot_savings: float
    attempts: int
    jobs: int
    hours: float
    cpu_hours: float
    gpu_hours: float


class CostTotal(_Open):
    cost: float
    on_demand_cost: float
    spot_savings: float
    attempts: int
    jobs: int


class CostBreakdown(_Open):
    """``GET /v1/costs``: what attempts in a window cost, per project, node group or kind."""

    start: datetime
    end: datetime
    project: str | None = None
    group_by: str
    rows: list[CostRow]
    total: CostTotal
    unpriced_attempts: int = 0


class AttemptCost(_Open):
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


class JobCost(_Open):
    """``GET /v1/jobs/{id}/cost``: each attempt's cost (a running one: so far)."""

    job_id: str
    cost: float
    on_demand_cost: float
    spot_savings: float
    attempts: list[AttemptCost]


class Report(_Open):
    """``GET /v1/report``: the own-or-rent decision per GPU group, costs, and cheaper
    placements. The server sends it as plain JSON; its parts are kept as sent
    (``docs/sdk.md`` lists their keys)."""

    window: dict[str, Any]
    project: str | None = None
    total: dict[str, Any]
    gpu_groups: list[dict[str, Any]] = Field(default_factory=list)
    cheaper_placements: list[dict[str, Any]] = Field(default_factory=list)
    fleet: dict[str, Any] | None = None  # owned groups against the target, rented spend, all-rented / all-owned


@functools.lru_cache(maxsize=None)
def _list_of(model: type[BaseModel]) -> TypeAdapter:
    # Built on first use: each adapter costs milliseconds that `import raylane` should not pay.
    return TypeAdapter(list[model])  # type: ignore[valid-type]


async def _asleep(seconds: float) -> None:
    import asyncio  # here, not at the top: a sync-only user need not pay its ~20 ms import

    await asyncio.sleep(seconds)


# Calls: what to send and how to read the answer, shared by both clients -------------


@dataclass
class _Call(Generic[T]):
    method: str
    path: str
    parse: Callable[["httpx.Response"], T]
    params: list[tuple[str, str]] = field(default_factory=list)
    json: Any = None
    content: bytes | None = None  # a raw body (a package's zip) instead of JSON
    headers: dict[str, str] = field(default_factory=dict)
    resendable: bool = True
    ok: frozenset[int] = frozenset({200, 201})
    retry_statuses: frozenset[int] = RETRY_STATUSES
    timeout: Any = "default"


def _parsed(call: _Call[T], resp: "httpx.Response") -> T:
    """The answer read as the call expects, or a clear error when it is not what a
    Raylane API sends (a web page from another server at the URL, say)."""
    try:
        return call.parse(resp)
    except ValueError:  # not JSON, or JSON of another shape (pydantic's ValidationError is a ValueError)
        raise RaylaneError(_not_raylane(resp), status_code=resp.status_code) from None


def _model(model: type[BaseModel]) -> Callable[["httpx.Response"], Any]:
    return lambda r: model.model_validate(r.json())


def _adapter(model: type[BaseModel]) -> Callable[["httpx.Response"], Any]:
    return lambda r: _list_of(model).validate_python(r.json())


def _enum_values(value: Any) -> list[str]:
    if value is None:
        return []
    if isinstance(value, (str, JobStatus, JobKind)):
        value = [value]
    return [v.value if hasattr(v, "value") else str(v) for v in value]


def _when(value: datetime | str | None) -> str | None:
    if value is None:
        return None
    return value.isoformat() if isinstance(value, datetime) else str(value)


def _list_params(*, status, kind, node_group, labels, name_prefix, created_after, created_before, project, limit,
                 cursor, id_prefix=None, submitted_by=None) -> list[tuple[str, str]]:
    params: list[tuple[str, str]] = [("status", s) for s in _enum_values(status)]
    params += [("kind", k) for k in _enum_values(kind)]
    for k, v in (labels or {}).items():
        params.append(("label", f"{k}={v}"))
    for name, val in (("node_group", node_group), ("name_prefix", name_prefix), ("project", project),
                      ("created_after", _when(created_after)), ("created_before", _when(created_before)),
                      ("cursor", cursor), ("id_prefix", id_prefix), ("submitted_by", submitted_by)):
        if val is not None:
            params.append((name, str(val)))
    params.append(("limit", str(int(limit))))
    return params


def _schedule_body(name: str, cron: str, spec: SpecLike, timezone: str, overlap: str, missed: str,
                   starting_deadline_s: float, paused: bool) -> dict[str, Any]:
    return {"name": name, "cron": cron, "spec": spec_body(spec), "timezone": timezone, "overlap": overlap,
            "missed": missed, "starting_deadline_s": starting_deadline_s, "paused": paused}


def spec_body(spec: SpecLike) -> dict[str, Any]:
    """The JSON body for a spec given as a ``JobSpec``, a dict, or a YAML/JSON file path.

    A dict is sent as it is, so the server (the one authority on specs) validates
    it and names the field at fault; a file is parsed with the same bomb-proof
    loader the server uses.

    Raises:
        ValidationFailed: the file is not YAML/JSON, too big, or not a mapping.
        FileNotFoundError: no such file.
        TypeError: ``spec`` is none of the accepted types.
    """
    if isinstance(spec, JobSpec):
        # Only what was set: the server fills its own defaults.
        return spec.model_dump(mode="json", exclude_unset=True)
    if isinstance(spec, Mapping):
        return dict(spec)
    if isinstance(spec, (str, os.PathLike)):
        path = Path(spec)
        try:
            return load_spec_document(path.read_text())
        except SpecLoadError as e:
            raise ValidationFailed(f"{path}: {e}", errors=[{"loc": ["file"], "msg": str(e), "type": "spec_load"}]) \
                from None
    raise TypeError(f"a spec is a JobSpec, a dict or a YAML file path, not {type(spec).__name__}")


def _window(start, end, project: str | None) -> list[tuple[str, str]]:
    return [(k, v) for k, v in (("start", _when(start)), ("end", _when(end)), ("project", project)) if v is not None]


def _looks_short(job_id: str) -> bool:
    """A job id shorter than a whole one, in the ids' alphabet: a prefix to resolve."""
    return 0 < len(job_id) < JOB_ID_LENGTH and job_id.isascii() and job_id.isalnum()


def _looks_whole(job_id: str) -> bool:
    # Ids are lower case; one copied from a shouting terminal is the same id.
    return len(job_id) == JOB_ID_LENGTH and job_id.isascii() and job_id.isalnum()


def _resolved(prefix: str, page: JobPage) -> str:
    if len(page.items) == 1:
        return page.items[0].id
    if not page.items:
        raise NotFound(f"job {prefix} not found", status_code=404)
    shown = page.items[:AMBIGUOUS_SHOWN]
    more = " and more" if len(page.items) > AMBIGUOUS_SHOWN else ""
    names = ", ".join(f"{j.id} ({j.name})" for j in shown)
    raise AmbiguousJobId(f"{prefix} is the start of several job ids: {names}{more}; give more of it",
                         prefix=prefix, candidates=shown)


def _last_lines(text: str, n: int) -> str:
    return "".join(text.splitlines(keepends=True)[-n:]) if n > 0 else ""


def _resubmit_body(job: Job, overrides) -> dict[str, Any]:
    from raylane.client.overrides import OverrideError, apply_overrides

    body = job.spec.model_dump(mode="json", exclude_none=True)
    body["labels"] = {**body.get("labels", {}), RESUBMITTED_FROM_LABEL: job.id}
    body["project"] = job.project  # an admin's resubmit stays in the job's project
    try:
        return apply_overrides(body, overrides or {})
    except OverrideError as e:
        raise ValidationFailed(str(e), errors=[{"loc": ["overrides"], "msg": str(e), "type": "override"}]) from None


class _Api:
    """One builder per endpoint. Both clients send these; only the I/O differs."""

    @staticmethod
    def submit(spec: SpecLike, idempotency_key: str | None) -> _Call[Job]:
        # A fresh key per submit() makes the retries of this one call safe: a
        # second arrival returns the job the first one created.
        key = idempotency_key or str(uuid.uuid4())
        return _Call("POST", "/v1/jobs", _model(Job), json=spec_body(spec), headers={"Idempotency-Key": key})

    @staticmethod
    def submit_batch(specs: Iterable[SpecLike]) -> _Call[BatchSubmitResponse]:
        return _Call("POST", "/v1/jobs/batch", _model(BatchSubmitResponse),
                     json={"jobs": [spec_body(s) for s in specs]}, resendable=False)

    @staticmethod
    def package_exists(sha256: str) -> _Call[bool]:
        return _Call("HEAD", f"/v1/packages/{sha256}", lambda r: r.status_code == 200, ok=frozenset({200, 404}))

    @staticmethod
    def upload_package(sha256: str, data: bytes) -> _Call[bool]:
        # Content-addressed: a second PUT of the same bytes stores nothing, so resendable.
        return _Call("PUT", f"/v1/packages/{sha256}", lambda r: r.status_code == 201, content=data,
                     headers={"Content-Type": "application/zip"})

    @staticmethod
    def get_job(job_id: str) -> _Call[Job]:
        return _Call("GET", f"/v1/jobs/{job_id}", _model(Job))

    @staticmethod
    def list_jobs(**filters: Any) -> _Call[JobPage]:
        return _Call("GET", "/v1/jobs", _model(JobPage), params=_list_params(**filters))

    @staticmethod
    def events(job_id: str, after_id: int) -> _Call[list[JobEvent]]:
        return _Call("GET", f"/v1/jobs/{job_id}/events", _adapter(JobEvent), params=[("after_id", str(after_id))])

    @staticmethod
    def attempts(job_id: str) -> _Call[list[Attempt]]:
        return _Call("GET", f"/v1/jobs/{job_id}/attempts", _adapter(Attempt))

    @staticmethod
    def cancel(job_id: str) -> _Call[CancelResponse]:
        # Cancel is idempotent on the server ("job is already CANCELLED"): resendable.
        return _Call("POST", f"/v1/jobs/{job_id}/cancel", _model(CancelResponse))

    @staticmethod
    def logs(job_id: str, attempt: int | None, follow: bool) -> _Call[str]:
        params = [("attempt", str(attempt))] if attempt is not None else []
        if follow:
            params.append(("follow", "true"))
        # A followed stream may be silent for a long time (a server of an older
        # version sends no heartbeat): no read timeout. NDJSON carries heartbeats.
        return _Call("GET", f"/v1/jobs/{job_id}/logs", lambda r: r.text, params=params,
                     headers={"Accept": f"{NDJSON}, text/plain;q=0.5"} if follow else {},
                     timeout=None if follow else "default")

    @staticmethod
    def trials(job_id: str, sort_by: str | None, mode: str | None) -> _Call[list[Trial]]:
        params = [(k, v) for k, v in (("sort_by", sort_by), ("mode", mode)) if v is not None]
        return _Call("GET", f"/v1/jobs/{job_id}/trials", _adapter(Trial), params=params)

    @staticmethod
    def plan(spec: SpecLike) -> _Call[Placement]:
        return _Call("POST", "/v1/plan", _model(Placement), json=spec_body(spec))

    @staticmethod
    def node_groups() -> _Call[list[NodeGroupStatus]]:
        return _Call("GET", "/v1/node-groups", _adapter(NodeGroupStatus))

    @staticmethod
    def cluster() -> _Call[ClusterInfo]:
        return _Call("GET", "/v1/cluster", _model(ClusterInfo))

    @staticmethod
    def kinds() -> _Call[list[KindInfo]]:
        return _Call("GET", "/v1/kinds", _adapter(KindInfo))

    @staticmethod
    def job_cost(job_id: str) -> _Call[JobCost]:
        return _Call("GET", f"/v1/jobs/{job_id}/cost", _model(JobCost))

    @staticmethod
    def costs(group_by: str, start, end, project: str | None) -> _Call[CostBreakdown]:
        return _Call("GET", "/v1/costs", _model(CostBreakdown),
                     params=_window(start, end, project) + [("group_by", group_by)])

    @staticmethod
    def report(start, end, project: str | None) -> _Call[Report]:
        return _Call("GET", "/v1/report", _model(Report), params=_window(start, end, project))

    @staticmethod
    def whoami() -> _Call[Whoami]:
        return _Call("GET", "/v1/me", _model(Whoami))

    @staticmethod
    def create_token(name: str, project: str | None, role: str, expires_in_days: float | None) -> _Call[NewToken]:
        body = {"name": name, "project": project, "role": role, "expires_in_days": expires_in_days}
        # Not resendable: a second arrival would mint a second secret.
        return _Call("POST", "/v1/tokens", _model(NewToken), json={k: v for k, v in body.items() if v is not None},
                     resendable=False)

    @staticmethod
    def list_tokens(include_revoked: bool) -> _Call[list[Token]]:
        return _Call("GET", "/v1/tokens", _adapter(Token), params=[("include_revoked", str(include_revoked).lower())])

    @staticmethod
    def revoke_token(token_id: str) -> _Call[Token]:
        # Revoking twice is a no-op on the server: resendable.
        return _Call("POST", f"/v1/tokens/{token_id}/revoke", _model(Token))

    @staticmethod
    def create_project(name: str, description: str | None) -> _Call[Project]:
        body = {"name": name, **({"description": description} if description is not None else {})}
        # A second arrival is a 409 ("exists"), never a second project.
        return _Call("POST", "/v1/projects", _model(Project), json=body)

    @staticmethod
    def list_projects() -> _Call[list[Project]]:
        return _Call("GET", "/v1/projects", _adapter(Project))

    @staticmethod
    def get_quota(project: str) -> _Call[ProjectQuota]:
        return _Call("GET", f"/v1/projects/{project}/quota", _model(ProjectQuota))

    @staticmethod
    def set_quota(project: str, node_groups: Mapping[str, Mapping[str, Any]]) -> _Call[ProjectQuota]:
        # PUT replaces the whole quota: sending it twice leaves the same quota.
        return _Call("PUT", f"/v1/projects/{project}/quota", _model(ProjectQuota),
                     json={"node_groups": {g: dict(v) for g, v in node_groups.items()}})

    @staticmethod
    def audit(limit: int, cursor: str | None, actor: str | None, action: str | None, since) -> _Call[AuditPage]:
        params = [("limit", str(int(limit)))]
        params += [(k, v) for k, v in (("cursor", cursor), ("actor", actor), ("action", action),
                                       ("since", _when(since))) if v is not None]
        return _Call("GET", "/v1/audit", _model(AuditPage), params=params)

    @staticmethod
    def submit_array(spec: SpecLike) -> _Call[JobArray]:
        # Not resendable: a second arrival would make a second array.
        return _Call("POST", "/v1/arrays", _model(JobArray), json=spec_body(spec), resendable=False)

    @staticmethod
    def get_array(array_id: str) -> _Call[JobArray]:
        return _Call("GET", f"/v1/arrays/{array_id}", _model(JobArray))

    @staticmethod
    def cancel_array(array_id: str) -> _Call[ArrayAction]:
        return _Call("POST", f"/v1/arrays/{array_id}/cancel", _model(ArrayAction))

    @staticmethod
    def retry_array(array_id: str, failed_only: bool) -> _Call[ArrayAction]:
        # Not resendable: a second arrival after the first's members failed again would retry twice.
        return _Call("POST", f"/v1/arrays/{array_id}/retry", _model(ArrayAction),
                     params=[("failed_only", str(failed_only).lower())], resendable=False)

    # Webhooks and schedules ----------------------------------------------------

    @staticmethod
    def create_webhook(url: str, statuses: Sequence[str] | None, project: str | None,
                       description: str | None, events: Sequence[str] | None = None) -> _Call[NewWebhook]:
        body = {"url": url, "statuses": list(statuses) if statuses is not None else None, "project": project,
                "description": description, "events": list(events) if events is not None else None}
        # Not resendable: a second arrival would make a second hook with its own secret.
        return _Call("POST", "/v1/webhooks", _model(NewWebhook), json={k: v for k, v in body.items() if v is not None},
                     resendable=False)

    @staticmethod
    def list_webhooks() -> _Call[list[Webhook]]:
        return _Call("GET", "/v1/webhooks", _adapter(Webhook))

    @staticmethod
    def get_webhook(hook_id: str) -> _Call[Webhook]:
        return _Call("GET", f"/v1/webhooks/{hook_id}", _model(Webhook))

    @staticmethod
    def delete_webhook(hook_id: str) -> _Call[None]:
        return _Call("DELETE", f"/v1/webhooks/{hook_id}", lambda r: None, ok=frozenset({204}))

    @staticmethod
    def webhook_deliveries(hook_id: str, limit: int) -> _Call[list[WebhookDelivery]]:
        return _Call("GET", f"/v1/webhooks/{hook_id}/deliveries", _adapter(WebhookDelivery),
                     params=[("limit", str(int(limit)))])

    @staticmethod
    def create_schedule(body: dict[str, Any]) -> _Call[Schedule]:
        # A second arrival is a 409 (the name is taken), never a second schedule.
        return _Call("POST", "/v1/schedules", _model(Schedule), json=body)

    @staticmethod
    def list_schedules() -> _Call[list[Schedule]]:
        return _Call("GET", "/v1/schedules", _adapter(Schedule))

    @staticmethod
    def get_schedule(schedule_id: str) -> _Call[Schedule]:
        return _Call("GET", f"/v1/schedules/{schedule_id}", _model(Schedule))

    @staticmethod
    def pause_schedule(schedule_id: str, paused: bool) -> _Call[Schedule]:
        return _Call("POST", f"/v1/schedules/{schedule_id}/{'pause' if paused else 'resume'}", _model(Schedule))

    @staticmethod
    def delete_schedule(schedule_id: str) -> _Call[None]:
        return _Call("DELETE", f"/v1/schedules/{schedule_id}", lambda r: None, ok=frozenset({204}))

    @staticmethod
    def health() -> _Call[Health]:
        def parse(r: "httpx.Response") -> Health:
            try:
                body = r.json()
            except ValueError:
                body = {}
            return Health(ok=r.status_code == 200, status=str(body.get("status", r.status_code)),
                          reason=body.get("reason"), database=body.get("database"), ray=body.get("ray"))

        # 503 is an answer here ("not ready, because ..."), not a reason to retry.
        return _Call("GET", "/readyz", parse, ok=frozenset({200, 503}), retry_statuses=frozenset())


def _backoff(attempt: int, resp: "httpx.Response | None" = None) -> float:
    if resp is not None:
        ra = resp.headers.get("Retry-After", "")
        try:
            return min(max(float(ra), 0.0), RETRY_AFTER_MAX_S)
        except ValueError:
            pass
    delay = min(BACKOFF_BASE_S * 2 ** (attempt - 1), BACKOFF_MAX_S)
    # Jitter, so clients cut off together do not all come back together.
    return delay * random.uniform(0.5, 1.0)


def _never_sent(exc: Exception) -> bool:
    """True when the request certainly did not reach the server (safe to resend anything)."""
    import httpx

    return isinstance(exc, (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout))


class _AnswerWorthRetrying(Exception):
    """A 429/502/503/504 the call may be sent again after; the last one is the answer."""

    def __init__(self, resp: "httpx.Response"):
        super().__init__(f"HTTP {resp.status_code}")
        self.resp = resp


def _worth_retrying(call: _Call, resp: "httpx.Response") -> bool:
    return resp.status_code in call.retry_statuses and (call.resendable or resp.status_code in NOT_ACTED_STATUSES)


def _retry_policy(call: _Call, max_attempts: int) -> dict[str, Any]:
    """The tries of one call, for tenacity's ``Retrying`` and ``AsyncRetrying`` alike:
    at most ``max_attempts``, spaced by ``_backoff`` (the server's Retry-After first)."""
    import httpx
    import tenacity  # here: its ~30 ms import is paid by the first call, not by `import raylane`

    def again(exc: BaseException) -> bool:
        if isinstance(exc, httpx.TransportError):
            return call.resendable or _never_sent(exc)
        return isinstance(exc, _AnswerWorthRetrying)

    def wait(state: "tenacity.RetryCallState") -> float:
        exc = state.outcome.exception() if state.outcome else None
        return _backoff(state.attempt_number, exc.resp if isinstance(exc, _AnswerWorthRetrying) else None)

    return {"stop": tenacity.stop_after_attempt(max_attempts), "wait": wait,
            "retry": tenacity.retry_if_exception(again), "reraise": True}


def _connection_failed(base_url: str, exc: Exception, tries: int, call: _Call) -> ConnectionFailed:
    import httpx

    if isinstance(exc, httpx.ConnectError):
        what = f"cannot connect to the Raylane server at {base_url} ({_reason(exc)})"
        hint = "; is `raylane-server serve` running? Set RAYLANE_URL or --url to point elsewhere"
    elif isinstance(exc, httpx.TimeoutException):
        what = f"the Raylane server at {base_url} did not answer in time ({type(exc).__name__})"
        hint = ""
    else:
        what = f"the connection to the Raylane server at {base_url} broke ({type(exc).__name__}: {_reason(exc)})"
        hint = ("; the request may have been stored: check before sending it again"
                if not call.resendable and not _never_sent(exc) else "")
    return ConnectionFailed(f"{what} after {tries} tr{'y' if tries == 1 else 'ies'}{hint}")


def _reason(exc: Exception) -> str:
    text = str(exc) or type(exc).__name__
    # "[Errno 111] Connection refused" -> "Connection refused"
    return text.split("] ", 1)[-1][:200]


def _resolve(url: str | None, token: str | None) -> tuple[str, str | None]:
    url = (url or os.environ.get(ENV_URL) or DEFAULT_URL).strip().rstrip("/")
    if "://" not in url:
        url = "http://" + url  # "localhost:8000", as people type it
    token = token if token is not None else (os.environ.get(ENV_TOKEN) or None)
    return url, token


def _headers(token: str | None, extra: Mapping[str, str] | None) -> dict[str, str]:
    from raylane import __version__

    h = {"User-Agent": f"raylane-sdk/{__version__}", "Accept": "application/json"}
    if token:
        h["Authorization"] = f"Bearer {token}"
    h.update(extra or {})
    return h


NDJSON = "application/x-ndjson"  # a followed log: {"text": ...} per line, blank lines are heartbeats


def _is_ndjson(resp) -> bool:
    return resp.headers.get("content-type", "").startswith(NDJSON)


def _log_text(line: str) -> str:
    """The text of one NDJSON line of a followed log ("" for a heartbeat)."""
    return json.loads(line)["text"] if line.strip() else ""


def _skip_seen(chunk: str, pos: int, received: int) -> tuple[str, int]:
    """A reconnected log stream starts from the beginning again: drop what was
    already handed out. Returns (new text, position after this chunk)."""
    end = pos + len(chunk)
    if end <= received:
        return "", end
    return chunk[max(0, received - pos):], end


# The synchronous client ------------------------------------------------------------


class Client:
    """A synchronous client of the Raylane API.

    Args:
        url: the API's base URL. Default: ``RAYLANE_URL``, else ``http://127.0.0.1:8000``.
        token: sent as ``Authorization: Bearer <token>``. Default: ``RAYLANE_TOKEN``.
        timeout: seconds for each HTTP exchange (connect, read, write).
        max_attempts: tries per call on connection errors and 429/502/503/504
            (default ``MAX_ATTEMPTS``; 1 turns retries off).
        headers: extra headers on every request.
        transport: an ``httpx.BaseTransport`` (tests, proxies, mounts).

    Example::

        from raylane import Client

        with Client() as rl:
            job = rl.submit("examples/hello.yaml")
            done = rl.wait(job.id, timeout=600)
            print(done.status, rl.logs(job.id))
    """

    def __init__(self, url: str | None = None, *, token: str | None = None, timeout: float = DEFAULT_TIMEOUT_S,
                 max_attempts: int = MAX_ATTEMPTS, headers: Mapping[str, str] | None = None,
                 transport: "httpx.BaseTransport | None" = None):
        import httpx

        self.url, self.token = _resolve(url, token)
        self.max_attempts = max(1, int(max_attempts))
        self._http = httpx.Client(base_url=self.url, headers=_headers(self.token, headers), timeout=timeout,
                                  transport=transport)

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        """Close the connection pool."""
        self._http.close()

    def __repr__(self) -> str:
        return f"Client(url={self.url!r}, token={'***' if self.token else None})"

    # Plumbing --------------------------------------------------------------

    def _send(self, call: _Call, *, stream: bool = False) -> "httpx.Response":
        import httpx
        import tenacity

        kwargs: dict[str, Any] = {"params": call.params or None, "json": call.json, "headers": call.headers,
                                  "content": call.content}
        if call.timeout != "default":
            kwargs["timeout"] = call.timeout
        tries = 0
        try:
            for attempt in tenacity.Retrying(**_retry_policy(call, self.max_attempts)):
                tries = attempt.retry_state.attempt_number
                with attempt:
                    resp = self._http.send(self._http.build_request(call.method, call.path, **kwargs), stream=stream)
                    if _worth_retrying(call, resp):
                        resp.read()  # the small error body, so the connection goes back to the pool
                        raise _AnswerWorthRetrying(resp)
                    return resp
        except httpx.TransportError as e:
            raise _connection_failed(self.url, e, tries, call) from None
        except _AnswerWorthRetrying as e:
            return e.resp
        raise AssertionError("unreachable: tenacity returns or raises")  # pragma: no cover

    def _call(self, call: _Call[T]) -> T:
        resp = self._send(call)
        if resp.status_code not in call.ok:
            raise _error_from(resp)
        return _parsed(call, resp)

    # Jobs ----------------------------------------------------------------------

    def upload_package(self, working_dir: str | os.PathLike[str], *, excludes: Iterable[str] = (),
                       max_bytes: int = packaging.DEFAULT_MAX_BYTES) -> UploadedPackage:
        """Zip a local directory here and upload it as a code package, unless the
        server has it already (same tree, same sha256: nothing is sent).

        Args:
            working_dir: the directory; ``.gitignore`` files in it are honoured.
            excludes: more patterns to leave out, in ``.gitignore`` syntax.
            max_bytes: refuse a tree larger than this before zipping or sending.

        Returns:
            ``UploadedPackage``: ``uri`` (``raylane://packages/<sha256>``, for a
            spec's ``runtime_env.working_dir``) and whether it was sent.

        Raises:
            PackageTooLarge: the tree is over ``max_bytes``; names its biggest files.
            Forbidden: the token may not upload (a viewer).
            ConnectionFailed: the server could not be reached.

        Example::

            pkg = client.upload_package(".", excludes=["data/"])
            client.submit({..., "runtime_env": {"working_dir": pkg.uri}})
        """
        pkg = packaging.build(working_dir, excludes=excludes, max_bytes=max_bytes)
        sent = False
        if not self._call(_Api.package_exists(pkg.sha256)):
            self._call(_Api.upload_package(pkg.sha256, pkg.data))
            sent = True
        return UploadedPackage.of(pkg, sent)

    def submit(self, spec: SpecLike, *, idempotency_key: str | None = None,
               working_dir: str | os.PathLike[str] | None = None, excludes: Iterable[str] = ()) -> Job:
        """Submit a job.

        The request carries an ``Idempotency-Key`` (a fresh uuid4 unless given),
        so the retries this call makes after a dropped connection never create a
        second job. Pass your own key to make a whole script re-runnable.

        Args:
            spec: a ``JobSpec``, a dict of the same shape, or the path of a YAML
                (or JSON) spec file.
            idempotency_key: reuse it to get the job a previous submit created.
            working_dir: a local directory to run the job in: zipped here,
                uploaded (``upload_package``) and set as the spec's
                ``runtime_env.working_dir``. No filesystem is shared with the server.
            excludes: with ``working_dir``, patterns to leave out (``.gitignore`` syntax).

        Returns:
            The stored job, ``PENDING`` with its ``status_reason`` and, once
            routed, its ``placement``.

        Raises:
            ValidationFailed: the spec is invalid; ``errors`` names each field.
            Conflict: the key was used before with a different spec.
            ConnectionFailed: the server could not be reached.
            PackageTooLarge: ``working_dir`` is over the size limit (nothing sent).

        Example::

            job = client.submit({"name": "hello", "kind": "command",
                                 "entrypoint": "python -c 'print(42)'"})
        """
        if working_dir is not None:
            spec = _with_working_dir(spec, self.upload_package(working_dir, excludes=excludes).uri)
        return self._call(_Api.submit(spec, idempotency_key))

    def submit_batch(self, specs: Iterable[SpecLike]) -> BatchSubmitResponse:
        """Submit many jobs in one request (one transaction: all or none).

        The batch endpoint takes no Idempotency-Key, so this call is retried only
        when the request never reached the server.

        Args:
            specs: specs as for ``submit``; all in one project.

        Returns:
            The new job ids, in order, and their count.

        Raises:
            ValidationFailed: a spec is invalid (``loc`` holds its index) or the batch is too big.
            ConnectionFailed: unreachable, or the connection broke after sending
                (the batch may then be stored: list jobs before resending).

        Example::

            ids = client.submit_batch([spec_a, spec_b]).ids
        """
        return self._call(_Api.submit_batch(list(specs)))

    def submit_function(self, fn: Callable[..., Any], *, args: Mapping[str, Any] | None = None,
                        idempotency_key: str | None = None, **options: Any) -> Job:
        """Submit a module-level function as a job (see ``raylane.job``).

        Args:
            fn: a function taking one argument, the run context (``ctx.args``,
                ``ctx.rank``, ``ctx.checkpoint_dir``, ``ctx.report()``), or one
                decorated with ``@raylane.job``.
            args: JSON-serialisable arguments, handed over as ``ctx.args``.
            idempotency_key: as for ``submit``.
            **options: options of ``raylane.job`` (``gpus``, ``cpus``, ``name``, ...),
                overriding the decorator's.

        Returns:
            The stored job.

        Raises:
            TypeError: ``fn`` is not importable by name (nested, lambda, REPL).
            ValidationFailed, ConnectionFailed: as for ``submit``.

        Example::

            job = client.submit_function(train, args={"lr": 1e-3}, gpus=1)
        """
        jf = fn.options(**options) if isinstance(fn, JobFunction) else JobFunction(fn, **options)
        spec = jf.spec(**dict(args or {}))
        local = _local_working_dir(spec)
        if local is not None:
            spec = _with_working_dir(spec, self.upload_package(local).uri)
        return self.submit(spec, idempotency_key=idempotency_key)

    def get_job(self, job_id: str) -> Job:
        """One job.

        Args:
            job_id: the job's id.

        Returns:
            The job, with its status, reason, placement, attempts and result.

        Raises:
            NotFound: no such job.

        Example::

            print(client.get_job(job_id).status)
        """
        return self._call(_Api.get_job(job_id))

    def list_jobs(self, *, status: StatusLike | Iterable[StatusLike] | None = None,
                  kind: KindLike | Iterable[KindLike] | None = None, node_group: str | None = None,
                  labels: Mapping[str, str] | None = None, name_prefix: str | None = None,
                  created_after: datetime | str | None = None, created_before: datetime | str | None = None,
                  project: str | None = None, limit: int = 50, cursor: str | None = None,
                  id_prefix: str | None = None, submitted_by: str | None = None) -> JobPage:
        """One page of jobs, newest first, filtered.

        Args:
            status: one status or several (any of them matches).
            kind: one kind or several.
            node_group: the group a job was routed to.
            labels: every pair must match.
            name_prefix: names starting with this.
            created_after: timezone-aware datetime (or ISO string with zone).
            created_before: as ``created_after``.
            project: only this project (admins; others see their own).
            limit: page size, 1..500.
            id_prefix: ids starting with this (``resolve_job_id`` uses it).
            submitted_by: jobs this token owner submitted (``whoami().name`` for your own).
            cursor: ``next_cursor`` of the previous page.

        Returns:
            ``JobPage``: ``items`` and ``next_cursor`` (None on the last page).

        Raises:
            ValidationFailed: a bad filter (e.g. a datetime without a timezone).

        Example::

            page = client.list_jobs(status="PENDING", labels={"team": "nlp"})
            more = client.list_jobs(status="PENDING", cursor=page.next_cursor)
        """
        return self._call(_Api.list_jobs(status=status, kind=kind, node_group=node_group, labels=labels,
                                         name_prefix=name_prefix, created_after=created_after,
                                         created_before=created_before, project=project, limit=limit,
                                         cursor=cursor, id_prefix=id_prefix, submitted_by=submitted_by))

    def iter_jobs(self, *, status: StatusLike | Iterable[StatusLike] | None = None,
                  kind: KindLike | Iterable[KindLike] | None = None, node_group: str | None = None,
                  labels: Mapping[str, str] | None = None, name_prefix: str | None = None,
                  created_after: datetime | str | None = None, created_before: datetime | str | None = None,
                  project: str | None = None, page_size: int = ITER_PAGE_SIZE,
                  max_items: int | None = None, submitted_by: str | None = None) -> Iterator[Job]:
        """Every job matching the filters, newest first, fetched page by page.

        Args:
            (filters): as for ``list_jobs``.
            page_size: jobs per request, 1..500.
            max_items: stop after this many (None: all).

        Returns:
            An iterator of ``Job``; pages are fetched as it is consumed.

        Raises:
            ValidationFailed: a bad filter (raised when iteration starts).

        Example::

            failed = [j.id for j in client.iter_jobs(status="FAILED")]
        """
        cursor, seen = None, 0
        while True:
            want = page_size if max_items is None else min(page_size, max_items - seen)
            if want <= 0:
                return
            page = self.list_jobs(status=status, kind=kind, node_group=node_group, labels=labels,
                                  name_prefix=name_prefix, created_after=created_after,
                                  created_before=created_before, project=project, limit=want, cursor=cursor,
                                  submitted_by=submitted_by)
            for j in page.items:
                yield j
            seen += len(page.items)
            if not page.next_cursor or not page.items:
                return
            cursor = page.next_cursor

    def wait(self, job_id: str, *, timeout: float | None = None, poll_interval: float = WAIT_POLL_MAX_S,
             on_event: Callable[[JobEvent], None] | None = None) -> Job:
        """Block until the job reaches a terminal status (SUCCEEDED, FAILED, CANCELLED).

        Polls the job's events, so every status change is seen even when
        several happen between two polls.

        Args:
            job_id: the job.
            timeout: seconds to wait at most; None waits as long as the job runs.
            poll_interval: the longest pause between polls (they start at 0.25 s).
            on_event: called with each event (status change) in order, including
                those from before the call.

        Returns:
            The finished job. A FAILED or CANCELLED job is returned, not raised:
            look at ``status`` and ``failure_cause``.

        Raises:
            WaitTimeout: still not finished after ``timeout``; the job keeps running.
            NotFound: no such job.

        Example::

            done = client.wait(job.id, timeout=3600, on_event=lambda e: print(e.to_status))
            assert done.status == "SUCCEEDED", done.status_reason
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        after, last, pause = 0, None, WAIT_POLL_MIN_S
        while True:
            for ev in self.events(job_id, after_id=after):
                after, last = ev.id, ev.to_status
                if on_event is not None:
                    on_event(ev)
            if last is not None and last.is_terminal():
                return self.get_job(job_id)
            if deadline is not None and time.monotonic() >= deadline:
                raise _wait_timeout(job_id, timeout, last)
            left = float("inf") if deadline is None else deadline - time.monotonic()
            time.sleep(max(0.0, min(pause, left)))
            pause = min(pause * 2, poll_interval)

    def cancel(self, job_id: str) -> CancelResponse:
        """Cancel a job. Idempotent: cancelling a cancelled job is a no-op.

        A job that has not reached Ray is CANCELLED at once; a running one is
        CANCELLING until Ray has stopped it (``wait`` for the end).

        Args:
            job_id: the job.

        Returns:
            ``CancelResponse``: the job and a message ("cancelled", "job is already CANCELLED").

        Raises:
            NotFound: no such job.
            Conflict: the job already finished (SUCCEEDED or FAILED).

        Example::

            client.cancel(job.id).job.status  # CANCELLED or CANCELLING
        """
        return self._call(_Api.cancel(job_id))

    def events(self, job_id: str, *, after_id: int = 0) -> list[JobEvent]:
        """The job's status changes, oldest first (at most 1000 per call).

        Args:
            job_id: the job.
            after_id: only events after this event id (for polling).

        Returns:
            ``JobEvent`` list: from/to status, reason, actor, attempt, time.

        Raises:
            NotFound: no such job.

        Example::

            for e in client.events(job.id):
                print(e.at, e.to_status, e.reason)
        """
        return self._call(_Api.events(job_id, after_id))

    def attempts(self, job_id: str) -> list[Attempt]:
        """The job's attempts (one Ray job each), oldest first.

        Args:
            job_id: the job.

        Returns:
            ``Attempt`` list: Ray submission id, node group, status, cause, times.

        Raises:
            NotFound: no such job.

        Example::

            last = client.attempts(job.id)[-1]
            print(last.cause, last.message)
        """
        return self._call(_Api.attempts(job_id))

    @overload
    def logs(self, job_id: str, *, attempt: int | None = ..., follow: Literal[False] = ...,
             tail: int | None = ...) -> str: ...

    @overload
    def logs(self, job_id: str, *, attempt: int | None = ..., follow: Literal[True],
             tail: int | None = ...) -> Iterator[str]: ...

    def logs(self, job_id: str, *, attempt: int | None = None, follow: bool = False,
             tail: int | None = None) -> str | Iterator[str]:
        """The driver log of the job's latest (or given) attempt.

        Args:
            job_id: the job.
            attempt: the attempt number (1-based); None: the latest.
            follow: return a generator of text chunks that ends when the job
                does. A dropped stream is reopened (text already seen is not
                repeated).
            tail: only the last ``tail`` lines of what is there now (with
                ``follow``: then everything new). The whole log is fetched and
                cut here: the API sends a log whole.

        Returns:
            The log text ("" before the first attempt), or with ``follow=True``
            an iterator of chunks.

        Raises:
            NotFound: no such job (with ``follow``, when iteration starts).
            ValidationFailed: no such attempt, or no Ray cluster is attached.

        Example::

            for chunk in client.logs(job.id, follow=True):
                print(chunk, end="")
        """
        if follow:
            return self._follow(job_id, attempt, tail)
        text = self._call(_Api.logs(job_id, attempt, False))
        return text if tail is None else _last_lines(text, tail)

    def _follow(self, job_id: str, attempt: int | None, tail: int | None = None) -> Iterator[str]:
        import httpx

        received, breaks = 0, 0
        if tail is not None:
            # The log so far, cut; the stream (which starts from the beginning) then skips it.
            text = self._call(_Api.logs(job_id, attempt, False))
            received = len(text)
            if _last_lines(text, tail):
                yield _last_lines(text, tail)
        while True:
            resp = self._send(_Api.logs(job_id, attempt, True), stream=True)
            try:
                if resp.status_code != 200:
                    resp.read()
                    raise _error_from(resp)
                pos = 0
                chunks = map(_log_text, resp.iter_lines()) if _is_ndjson(resp) else resp.iter_text()
                for chunk in chunks:
                    new, pos = _skip_seen(chunk, pos, received)
                    if new:
                        received += len(new)
                        breaks = 0
                        yield new
            except httpx.TransportError as e:
                breaks += 1
                if breaks >= self.max_attempts:
                    raise _connection_failed(self.url, e, breaks, _Api.logs(job_id, attempt, True)) from None
                time.sleep(_backoff(breaks))
                continue
            finally:
                resp.close()
            # The server ends a stream when the job ends, or after its own time
            # limit; only in the second case is there more to follow.
            if self.get_job(job_id).status.is_terminal():
                return

    def trials(self, job_id: str, *, sort_by: str | None = None, mode: Literal["min", "max"] | None = None
               ) -> list[Trial]:
        """The trials of a sweep job, best first: config, status, last metrics, node, error.

        The server stores a sweep's trials when its runner reports them (at the
        end of the sweep); before that the list is empty. Any other kind of job
        has none.

        Args:
            job_id: a sweep job.
            sort_by: a metric to order by; default the sweep's own ``metric``.
            mode: ``min`` or ``max`` for ``sort_by``; default the sweep's ``mode``.

        Returns:
            ``Trial`` list; trials without the metric come last.

        Raises:
            NotFound: no such job.

        Example::

            best = client.trials(job.id)[0]
            print(best.config, best.metrics["loss"])
        """
        return self._call(_Api.trials(job_id, sort_by, mode))

    def resolve_job_id(self, job_id: str) -> str:
        """The whole id of the one job whose id starts with ``job_id`` (a short id,
        as ``raylane ls`` users type it). A whole id is returned as it is.

        The server matches the prefix within what the token may see, so another
        project's jobs never make a short id ambiguous.

        Args:
            job_id: a job id or its first characters (case does not matter).

        Returns:
            The job's whole id.

        Raises:
            NotFound: no job id starts with it.
            AmbiguousJobId: several do; ``candidates`` holds the newest of them.

        Example::

            job = client.get_job(client.resolve_job_id("01jq3k"))
        """
        short = job_id.strip().lower()
        if not _looks_short(short):
            return short if _looks_whole(short) else job_id
        return _resolved(short, self.list_jobs(id_prefix=short, limit=AMBIGUOUS_SHOWN + 1))

    def resubmit(self, job_id: str, *, overrides: Mapping[str, Any] | Iterable[str] | None = None,
                 idempotency_key: str | None = None) -> Job:
        """Submit a new job from an old job's spec, optionally changed.

        The new job is in the old one's project and carries the label
        ``raylane.io/resubmitted-from: <old id>``.

        Args:
            job_id: the job to copy (any status).
            overrides: ``{"resources.gpus_per_worker": 2}`` or ``["args.lr=1e-4"]``
                (dotted paths into the spec; see ``raylane.client.overrides``).
            idempotency_key: as for ``submit``.

        Returns:
            The new job.

        Raises:
            NotFound: no such job.
            ValidationFailed: an override names no field of the spec, or the
                changed spec is invalid.

        Example::

            again = client.resubmit(job.id, overrides={"resources.gpus_per_worker": 2})
        """
        return self.submit(_resubmit_body(self.get_job(job_id), overrides), idempotency_key=idempotency_key)

    def job_cost(self, job_id: str) -> JobCost:
        """What each attempt of the job cost (a running one: so far), and the on-demand price of the same.

        Raises:
            NotFound: no such job.

        Example::

            print(client.job_cost(job.id).cost)
        """
        return self._call(_Api.job_cost(job_id))

    # Routing and cluster --------------------------------------------------------

    def plan(self, spec: SpecLike) -> Placement:
        """Where the router would place a spec, and why, without submitting it.

        Args:
            spec: as for ``submit``.

        Returns:
            ``Placement``: node group, market, strategy, per-worker resources,
            fallbacks, and ``reasons`` in words.

        Raises:
            ValidationFailed: the spec is invalid, can never fit the cluster, or
                the server has no cluster profile loaded.

        Example::

            p = client.plan("examples/finetune.yaml")
            print(p.node_group, p.strategy, *p.reasons, sep="\\n")
        """
        return self._call(_Api.plan(spec))

    def node_groups(self) -> list[NodeGroupStatus]:
        """The cluster profile's node groups with live capacity and Raylane's usage.

        Returns:
            ``NodeGroupStatus`` list.

        Raises:
            ValidationFailed: the server has no Ray cluster attached.

        Example::

            for g in client.node_groups():
                print(g.name, g.market, g.capacity, g.used_by_raylane)
        """
        return self._call(_Api.node_groups())

    def cluster(self) -> ClusterInfo:
        """Ray's nodes (alive and dead, with node group and market) and the dashboard URL.

        Returns:
            ``ClusterInfo``.

        Raises:
            ValidationFailed: the server has no Ray cluster attached.
            ServerError: Ray did not answer the server.

        Example::

            dead = [n for n in client.cluster().nodes if n.state == "DEAD"]
        """
        return self._call(_Api.cluster())

    def health(self) -> Health:
        """Whether the server is ready to accept jobs (up, database reachable and
        migrated), and whether it can run them (``ray``).

        Returns:
            ``Health``: ``ok``, and ``reason`` when not ready. Not ready is an
            answer, not an exception. ``status`` is ``degraded`` and
            ``ray.state`` ``unreachable`` while the server cannot reach Ray
            (jobs are accepted and wait).

        Raises:
            ConnectionFailed: nothing answers at the URL.

        Example::

            assert client.health().ok
        """
        return self._call(_Api.health())

    def kinds(self) -> list[KindInfo]:
        """The job kinds the server runs, with their traits (gang or elastic, spot first, ...).

        Example::

            print([k.name for k in client.kinds()])
        """
        return self._call(_Api.kinds())

    # Arrays ---------------------------------------------------------------------------

    def submit_array(self, spec: SpecLike) -> JobArray:
        """Submit an array: a spec with ``array: {size: N, max_parallel: K}``; member
        ``i`` is the job ``<name>-<i>`` with ``RAYLANE_ARRAY_INDEX=i``. Its members are
        ``list_jobs(labels={"raylane.array": array.id})``.

        Raises:
            ValidationFailed: no ``array`` section, a size out of range, a bad spec.

        Example::

            arr = client.submit_array({**spec, "array": {"size": 1000, "max_parallel": 50}})
        """
        return self._call(_Api.submit_array(spec))

    def get_array(self, array_id: str) -> JobArray:
        """An array with its members counted per status."""
        return self._call(_Api.get_array(array_id))

    def cancel_array(self, array_id: str) -> ArrayAction:
        """Cancel every unfinished member of an array."""
        return self._call(_Api.cancel_array(array_id))

    def retry_array(self, array_id: str, *, failed_only: bool = False) -> ArrayAction:
        """A new job for each index whose newest job failed (or, unless ``failed_only``, was cancelled)."""
        return self._call(_Api.retry_array(array_id, failed_only))

    # Webhooks -------------------------------------------------------------------------

    def create_webhook(self, url: str, *, statuses: Sequence[str] | None = None, project: str | None = None,
                       description: str | None = None, events: Sequence[str] | None = None) -> NewWebhook:
        """A webhook: a signed POST to ``url`` each time a job of the project changes to one
        of ``statuses`` (default: SUCCEEDED, FAILED, CANCELLED), and for each of its
        schedules' ticks named by ``events`` (``schedule.created``, ``schedule.skipped``).
        Its signing secret is in ``secret``, returned this once only (docs/webhooks.md).

        Raises:
            ValidationFailed: a URL that is not http(s), a host the server does not allow.

        Example::

            hook = client.create_webhook("https://ci.example.com/raylane", statuses=["FAILED"])
        """
        return self._call(_Api.create_webhook(url, statuses, project, description, events))

    def list_webhooks(self) -> list[Webhook]:
        """The webhooks of the caller's projects, never their secrets."""
        return self._call(_Api.list_webhooks())

    def get_webhook(self, hook_id: str) -> Webhook:
        """One webhook (NotFound: missing, or another project's)."""
        return self._call(_Api.get_webhook(hook_id))

    def delete_webhook(self, hook_id: str) -> None:
        """Delete a webhook; deliveries not yet sent are dropped."""
        return self._call(_Api.delete_webhook(hook_id))

    def webhook_deliveries(self, hook_id: str, *, limit: int = 50) -> list[WebhookDelivery]:
        """A webhook's delivery log, newest first: status, tries, the last answer and error."""
        return self._call(_Api.webhook_deliveries(hook_id, limit))

    # Schedules ------------------------------------------------------------------------

    def create_schedule(self, name: str, cron: str, spec: SpecLike, *, timezone: str = "UTC",
                        overlap: Literal["skip", "queue", "replace"] = "skip",
                        missed: Literal["skip", "run_once", "run_all"] = "run_once",
                        starting_deadline_s: float = 60.0, paused: bool = False) -> Schedule:
        """A schedule: ``spec`` submitted at each tick of ``cron`` in ``timezone``
        (docs/schedules.md). The answer lists its next runs.

        Raises:
            ValidationFailed: a cron expression or time zone the server cannot read, a bad spec.
            Conflict: the project has a schedule of that name.

        Example::

            client.create_schedule("nightly", "0 2 * * *", "examples/train.yaml", timezone="Europe/Berlin")
        """
        return self._call(_Api.create_schedule(_schedule_body(name, cron, spec, timezone, overlap, missed,
                                                              starting_deadline_s, paused)))

    def list_schedules(self) -> list[Schedule]:
        """The schedules of the caller's projects."""
        return self._call(_Api.list_schedules())

    def get_schedule(self, schedule_id: str) -> Schedule:
        """A schedule with its next runs and its recent ticks (the job each made, or why none)."""
        return self._call(_Api.get_schedule(schedule_id))

    def pause_schedule(self, schedule_id: str) -> Schedule:
        """Pause a schedule: no job until it is resumed."""
        return self._call(_Api.pause_schedule(schedule_id, True))

    def resume_schedule(self, schedule_id: str) -> Schedule:
        """Resume a schedule from its next tick after now (the pause's ticks are not run)."""
        return self._call(_Api.pause_schedule(schedule_id, False))

    def delete_schedule(self, schedule_id: str) -> None:
        """Delete a schedule; the jobs it made stay."""
        return self._call(_Api.delete_schedule(schedule_id))

    # Costs --------------------------------------------------------------------------

    def costs(self, *, group_by: Literal["project", "node_group", "kind"] = "project",
              start: datetime | str | None = None, end: datetime | str | None = None,
              project: str | None = None) -> CostBreakdown:
        """What the attempts in a window cost, on demand and with spot savings, per group.

        Args:
            group_by: ``project``, ``node_group`` or ``kind``.
            start: window start, timezone-aware (default: 7 days before ``end``).
            end: window end (default now).
            project: admins: one project (others always see their own).

        Raises:
            ValidationFailed: a datetime without a timezone, or start after end.

        Example::

            for row in client.costs(group_by="node_group").rows:
                print(row.key, row.cost)
        """
        return self._call(_Api.costs(group_by, start, end, project))

    def report(self, *, start: datetime | str | None = None, end: datetime | str | None = None,
               project: str | None = None) -> Report:
        """The own-or-rent report: GPU utilisation per group against the break-even,
        costs, and the jobs whose placement could have been cheaper (``raylane report``).

        Args:
            start, end, project: as for ``costs``.

        Example::

            for g in client.report().gpu_groups:
                print(g["node_group"], g["verdict"], g["advice"])
        """
        return self._call(_Api.report(start, end, project))

    # Access: who may do what --------------------------------------------------------

    def whoami(self) -> Whoami:
        """The caller as the server sees the token: name, project, role.

        Raises:
            Unauthorized: no token, or one the server refuses.

        Example::

            me = client.whoami()
            mine = client.list_jobs(submitted_by=me.name)
        """
        return self._call(_Api.whoami())

    def create_token(self, name: str, *, project: str | None = None,
                     role: Literal["admin", "member", "viewer"] = "member",
                     expires_in_days: float | None = None) -> NewToken:
        """A new API token (admins). Its secret is in ``token``, returned this once only.

        Not retried once sent: a lost answer would otherwise mint a second secret.

        Args:
            name: the user or robot it belongs to.
            project: required for members and viewers.
            role: ``admin``, ``member`` or ``viewer``.
            expires_in_days: None: never.

        Raises:
            Forbidden: the caller is not an admin.
            NotFound: no such project.

        Example::

            secret = client.create_token("ci-bot", project="nlp", role="member").token
        """
        return self._call(_Api.create_token(name, project, role, expires_in_days))

    def list_tokens(self, *, include_revoked: bool = False) -> list[Token]:
        """The API tokens (admins), never their secrets."""
        return self._call(_Api.list_tokens(include_revoked))

    def revoke_token(self, token_id: str) -> Token:
        """Revoke a token at once (admins); revoking twice is a no-op.

        Raises:
            NotFound: no such token.
        """
        return self._call(_Api.revoke_token(token_id))

    def create_project(self, name: str, *, description: str | None = None) -> Project:
        """A new project (admins).

        Raises:
            Conflict: the project exists.
        """
        return self._call(_Api.create_project(name, description))

    def list_projects(self) -> list[Project]:
        """Every project for an admin; a member or viewer sees their own."""
        return self._call(_Api.list_projects())

    def get_quota(self, project: str) -> ProjectQuota:
        """The project's limits per node group and what its active jobs hold now.

        Raises:
            NotFound: no such project (or not the caller's).
        """
        return self._call(_Api.get_quota(project))

    def set_quota(self, project: str, node_groups: Mapping[str, Mapping[str, Any]]) -> ProjectQuota:
        """Replace the project's whole quota (admins); groups not named have no limit.

        Args:
            project: the project.
            node_groups: ``{"gpu": {"max_gpus": 8, "max_concurrent_jobs": 4}}``.

        Raises:
            NotFound: no such project.
            ValidationFailed: a node group the profile does not have, or a bad limit.

        Example::

            client.set_quota("nlp", {"a100": {"max_gpus": 16}})
        """
        return self._call(_Api.set_quota(project, node_groups))

    def audit(self, *, limit: int = 100, cursor: str | None = None, actor: str | None = None,
              action: str | None = None, since: datetime | str | None = None) -> AuditPage:
        """Mutating requests, newest first (admins): who, what, on which target, with which status.

        Example::

            page = client.audit(actor="alice")
            older = client.audit(actor="alice", cursor=page.next_cursor)
        """
        return self._call(_Api.audit(limit, cursor, actor, action, since))


@dataclass(frozen=True)
class UploadedPackage:
    """A working dir uploaded as a code package; ``sent`` is False when the server had it."""

    uri: str
    sha256: str
    files: int
    size_bytes: int
    sent: bool

    @classmethod
    def of(cls, pkg: "packaging.Package", sent: bool) -> "UploadedPackage":
        return cls(uri=package_uri(pkg.sha256), sha256=pkg.sha256, files=pkg.files, size_bytes=pkg.size_bytes,
                   sent=sent)


def _local_working_dir(spec: JobSpec) -> str | None:
    """The spec's working_dir if it is a directory on this machine (not a URI)."""
    wd = spec.runtime_env.working_dir
    return wd if wd and "://" not in wd else None


def _with_working_dir(spec: SpecLike, uri: str) -> dict[str, Any]:
    body = spec_body(spec)
    body["runtime_env"] = {**(body.get("runtime_env") or {}), "working_dir": uri}
    return body


def _wait_timeout(job_id: str, timeout: float | None, last: JobStatus | None) -> WaitTimeout:
    state = last.value if last else "unknown"
    return WaitTimeout(f"job {job_id} is still {state} after {timeout:g}s; it keeps running",
                       job_id=job_id, timeout=float(timeout or 0), status=last)


# The asynchronous client ------------------------------------------------------------


class AsyncClient:
    """The asyncio twin of ``Client``: the same methods, awaited.

    ``logs(..., follow=True)`` returns an async iterator and ``iter_jobs`` is an
    async generator.

    Example::

        import asyncio
        from raylane import AsyncClient

        async def main():
            async with AsyncClient() as rl:
                job = await rl.submit("examples/hello.yaml")
                async for chunk in rl.logs(job.id, follow=True):
                    print(chunk, end="")

        asyncio.run(main())
    """

    def __init__(self, url: str | None = None, *, token: str | None = None, timeout: float = DEFAULT_TIMEOUT_S,
                 max_attempts: int = MAX_ATTEMPTS, headers: Mapping[str, str] | None = None,
                 transport: "httpx.AsyncBaseTransport | None" = None):
        import httpx

        self.url, self.token = _resolve(url, token)
        self.max_attempts = max(1, int(max_attempts))
        self._http = httpx.AsyncClient(base_url=self.url, headers=_headers(self.token, headers), timeout=timeout,
                                       transport=transport)

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    def __repr__(self) -> str:
        return f"AsyncClient(url={self.url!r}, token={'***' if self.token else None})"

    async def _send(self, call: _Call, *, stream: bool = False) -> "httpx.Response":
        import httpx
        import tenacity

        kwargs: dict[str, Any] = {"params": call.params or None, "json": call.json, "headers": call.headers,
                                  "content": call.content}
        if call.timeout != "default":
            kwargs["timeout"] = call.timeout
        tries = 0
        try:
            async for attempt in tenacity.AsyncRetrying(**_retry_policy(call, self.max_attempts)):
                tries = attempt.retry_state.attempt_number
                with attempt:
                    req = self._http.build_request(call.method, call.path, **kwargs)
                    resp = await self._http.send(req, stream=stream)
                    if _worth_retrying(call, resp):
                        await resp.aread()  # the small error body, so the connection goes back to the pool
                        raise _AnswerWorthRetrying(resp)
                    return resp
        except httpx.TransportError as e:
            raise _connection_failed(self.url, e, tries, call) from None
        except _AnswerWorthRetrying as e:
            return e.resp
        raise AssertionError("unreachable: tenacity returns or raises")  # pragma: no cover

    async def _call(self, call: _Call[T]) -> T:
        resp = await self._send(call)
        if resp.status_code not in call.ok:
            raise _error_from(resp)
        return _parsed(call, resp)

    async def upload_package(self, working_dir: str | os.PathLike[str], *, excludes: Iterable[str] = (),
                             max_bytes: int = packaging.DEFAULT_MAX_BYTES) -> UploadedPackage:
        import asyncio

        # Zipping is disk and CPU work: off the event loop.
        pkg = await asyncio.to_thread(packaging.build, working_dir, excludes=excludes, max_bytes=max_bytes)
        sent = False
        if not await self._call(_Api.package_exists(pkg.sha256)):
            await self._call(_Api.upload_package(pkg.sha256, pkg.data))
            sent = True
        return UploadedPackage.of(pkg, sent)

    async def submit(self, spec: SpecLike, *, idempotency_key: str | None = None,
                     working_dir: str | os.PathLike[str] | None = None, excludes: Iterable[str] = ()) -> Job:
        if working_dir is not None:
            spec = _with_working_dir(spec, (await self.upload_package(working_dir, excludes=excludes)).uri)
        return await self._call(_Api.submit(spec, idempotency_key))

    async def submit_batch(self, specs: Iterable[SpecLike]) -> BatchSubmitResponse:
        return await self._call(_Api.submit_batch(list(specs)))

    async def submit_function(self, fn: Callable[..., Any], *, args: Mapping[str, Any] | None = None,
                              idempotency_key: str | None = None, **options: Any) -> Job:
        jf = fn.options(**options) if isinstance(fn, JobFunction) else JobFunction(fn, **options)
        spec = jf.spec(**dict(args or {}))
        local = _local_working_dir(spec)
        if local is not None:
            spec = _with_working_dir(spec, (await self.upload_package(local)).uri)
        return await self.submit(spec, idempotency_key=idempotency_key)

    async def get_job(self, job_id: str) -> Job:
        return await self._call(_Api.get_job(job_id))

    async def list_jobs(self, *, status: StatusLike | Iterable[StatusLike] | None = None,
                        kind: KindLike | Iterable[KindLike] | None = None, node_group: str | None = None,
                        labels: Mapping[str, str] | None = None, name_prefix: str | None = None,
                        created_after: datetime | str | None = None, created_before: datetime | str | None = None,
                        project: str | None = None, limit: int = 50, cursor: str | None = None,
                        id_prefix: str | None = None, submitted_by: str | None = None) -> JobPage:
        return await self._call(_Api.list_jobs(status=status, kind=kind, node_group=node_group, labels=labels,
                                               name_prefix=name_prefix, created_after=created_after,
                                               created_before=created_before, project=project, limit=limit,
                                               cursor=cursor, id_prefix=id_prefix, submitted_by=submitted_by))

    async def iter_jobs(self, *, status: StatusLike | Iterable[StatusLike] | None = None,
                        kind: KindLike | Iterable[KindLike] | None = None, node_group: str | None = None,
                        labels: Mapping[str, str] | None = None, name_prefix: str | None = None,
                        created_after: datetime | str | None = None, created_before: datetime | str | None = None,
                        project: str | None = None, page_size: int = ITER_PAGE_SIZE,
                        max_items: int | None = None, submitted_by: str | None = None) -> AsyncIterator[Job]:
        cursor, seen = None, 0
        while True:
            want = page_size if max_items is None else min(page_size, max_items - seen)
            if want <= 0:
                return
            page = await self.list_jobs(status=status, kind=kind, node_group=node_group, labels=labels,
                                        name_prefix=name_prefix, created_after=created_after,
                                        created_before=created_before, project=project, limit=want, cursor=cursor,
                                        submitted_by=submitted_by)
            for j in page.items:
                yield j
            seen += len(page.items)
            if not page.next_cursor or not page.items:
                return
            cursor = page.next_cursor

    async def wait(self, job_id: str, *, timeout: float | None = None, poll_interval: float = WAIT_POLL_MAX_S,
                   on_event: Callable[[JobEvent], None] | None = None) -> Job:
        deadline = None if timeout is None else time.monotonic() + timeout
        after, last, pause = 0, None, WAIT_POLL_MIN_S
        while True:
            for ev in await self.events(job_id, after_id=after):
                after, last = ev.id, ev.to_status
                if on_event is not None:
                    on_event(ev)
            if last is not None and last.is_terminal():
                return await self.get_job(job_id)
            if deadline is not None and time.monotonic() >= deadline:
                raise _wait_timeout(job_id, timeout, last)
            left = float("inf") if deadline is None else deadline - time.monotonic()
            await _asleep(max(0.0, min(pause, left)))
            pause = min(pause * 2, poll_interval)

    async def cancel(self, job_id: str) -> CancelResponse:
        return await self._call(_Api.cancel(job_id))

    async def events(self, job_id: str, *, after_id: int = 0) -> list[JobEvent]:
        return await self._call(_Api.events(job_id, after_id))

    async def attempts(self, job_id: str) -> list[Attempt]:
        return await self._call(_Api.attempts(job_id))

    def logs(self, job_id: str, *, attempt: int | None = None, follow: bool = False, tail: int | None = None):
        # Not ``async def``: with follow=True it returns an async iterator to use
        # in ``async for``; otherwise a coroutine of the text to await.
        if follow:
            return self._follow(job_id, attempt, tail)
        return self._text(job_id, attempt, tail)

    async def _text(self, job_id: str, attempt: int | None, tail: int | None) -> str:
        text = await self._call(_Api.logs(job_id, attempt, False))
        return text if tail is None else _last_lines(text, tail)

    async def _follow(self, job_id: str, attempt: int | None, tail: int | None = None) -> AsyncIterator[str]:
        import httpx

        received, breaks = 0, 0
        if tail is not None:
            text = await self._call(_Api.logs(job_id, attempt, False))
            received = len(text)
            if _last_lines(text, tail):
                yield _last_lines(text, tail)
        while True:
            resp = await self._send(_Api.logs(job_id, attempt, True), stream=True)
            try:
                if resp.status_code != 200:
                    await resp.aread()
                    raise _error_from(resp)
                pos = 0
                ndjson = _is_ndjson(resp)
                async for chunk in (resp.aiter_lines() if ndjson else resp.aiter_text()):
                    if ndjson:
                        chunk = _log_text(chunk)
                    new, pos = _skip_seen(chunk, pos, received)
                    if new:
                        received += len(new)
                        breaks = 0
                        yield new
            except httpx.TransportError as e:
                breaks += 1
                if breaks >= self.max_attempts:
                    raise _connection_failed(self.url, e, breaks, _Api.logs(job_id, attempt, True)) from None
                await _asleep(_backoff(breaks))
                continue
            finally:
                await resp.aclose()
            if (await self.get_job(job_id)).status.is_terminal():
                return

    async def trials(self, job_id: str, *, sort_by: str | None = None, mode: Literal["min", "max"] | None = None
                     ) -> list[Trial]:
        return await self._call(_Api.trials(job_id, sort_by, mode))

    async def plan(self, spec: SpecLike) -> Placement:
        return await self._call(_Api.plan(spec))

    async def node_groups(self) -> list[NodeGroupStatus]:
        return await self._call(_Api.node_groups())

    async def cluster(self) -> ClusterInfo:
        return await self._call(_Api.cluster())

    async def health(self) -> Health:
        return await self._call(_Api.health())

    async def resolve_job_id(self, job_id: str) -> str:
        short = job_id.strip().lower()
        if not _looks_short(short):
            return short if _looks_whole(short) else job_id
        return _resolved(short, await self.list_jobs(id_prefix=short, limit=AMBIGUOUS_SHOWN + 1))

    async def resubmit(self, job_id: str, *, overrides: Mapping[str, Any] | Iterable[str] | None = None,
                       idempotency_key: str | None = None) -> Job:
        body = _resubmit_body(await self.get_job(job_id), overrides)
        return await self.submit(body, idempotency_key=idempotency_key)

    async def job_cost(self, job_id: str) -> JobCost:
        return await self._call(_Api.job_cost(job_id))

    async def kinds(self) -> list[KindInfo]:
        return await self._call(_Api.kinds())

    async def submit_array(self, spec: SpecLike) -> JobArray:
        return await self._call(_Api.submit_array(spec))

    async def get_array(self, array_id: str) -> JobArray:
        return await self._call(_Api.get_array(array_id))

    async def cancel_array(self, array_id: str) -> ArrayAction:
        return await self._call(_Api.cancel_array(array_id))

    async def retry_array(self, array_id: str, *, failed_only: bool = False) -> ArrayAction:
        return await self._call(_Api.retry_array(array_id, failed_only))

    async def create_webhook(self, url: str, *, statuses: Sequence[str] | None = None, project: str | None = None,
                             description: str | None = None, events: Sequence[str] | None = None) -> NewWebhook:
        return await self._call(_Api.create_webhook(url, statuses, project, description, events))

    async def list_webhooks(self) -> list[Webhook]:
        return await self._call(_Api.list_webhooks())

    async def get_webhook(self, hook_id: str) -> Webhook:
        return await self._call(_Api.get_webhook(hook_id))

    async def delete_webhook(self, hook_id: str) -> None:
        return await self._call(_Api.delete_webhook(hook_id))

    async def webhook_deliveries(self, hook_id: str, *, limit: int = 50) -> list[WebhookDelivery]:
        return await self._call(_Api.webhook_deliveries(hook_id, limit))

    async def create_schedule(self, name: str, cron: str, spec: SpecLike, *, timezone: str = "UTC",
                              overlap: Literal["skip", "queue", "replace"] = "skip",
                              missed: Literal["skip", "run_once", "run_all"] = "run_once",
                              starting_deadline_s: float = 60.0, paused: bool = False) -> Schedule:
        return await self._call(_Api.create_schedule(_schedule_body(name, cron, spec, timezone, overlap, missed,
                                                                    starting_deadline_s, paused)))

    async def list_schedules(self) -> list[Schedule]:
        return await self._call(_Api.list_schedules())

    async def get_schedule(self, schedule_id: str) -> Schedule:
        return await self._call(_Api.get_schedule(schedule_id))

    async def pause_schedule(self, schedule_id: str) -> Schedule:
        return await self._call(_Api.pause_schedule(schedule_id, True))

    async def resume_schedule(self, schedule_id: str) -> Schedule:
        return await self._call(_Api.pause_schedule(schedule_id, False))

    async def delete_schedule(self, schedule_id: str) -> None:
        return await self._call(_Api.delete_schedule(schedule_id))

    async def costs(self, *, group_by: Literal["project", "node_group", "kind"] = "project",
                    start: datetime | str | None = None, end: datetime | str | None = None,
                    project: str | None = None) -> CostBreakdown:
        return await self._call(_Api.costs(group_by, start, end, project))

    async def report(self, *, start: datetime | str | None = None, end: datetime | str | None = None,
                     project: str | None = None) -> Report:
        return await self._call(_Api.report(start, end, project))

    async def whoami(self) -> Whoami:
        return await self._call(_Api.whoami())

    async def create_token(self, name: str, *, project: str | None = None,
                           role: Literal["admin", "member", "viewer"] = "member",
                           expires_in_days: float | None = None) -> NewToken:
        return await self._call(_Api.create_token(name, project, role, expires_in_days))

    async def list_tokens(self, *, include_revoked: bool = False) -> list[Token]:
        return await self._call(_Api.list_tokens(include_revoked))

    async def revoke_token(self, token_id: str) -> Token:
        return await self._call(_Api.revoke_token(token_id))

    async def create_project(self, name: str, *, description: str | None = None) -> Project:
        return await self._call(_Api.create_project(name, description))

    async def list_projects(self) -> list[Project]:
        return await self._call(_Api.list_projects())

    async def get_quota(self, project: str) -> ProjectQuota:
        return await self._call(_Api.get_quota(project))

    async def set_quota(self, project: str, node_groups: Mapping[str, Mapping[str, Any]]) -> ProjectQuota:
        return await self._call(_Api.set_quota(project, node_groups))

    async def audit(self, *, limit: int = 100, cursor: str | None = None, actor: str | None = None,
                    action: str | None = None, since: datetime | str | None = None) -> AuditPage:
        return await self._call(_Api.audit(limit, cursor, actor, action, since))


# One set of docs: each AsyncClient method says what its Client twin says.
for _name, _fn in list(vars(AsyncClient).items()):
    _twin = getattr(Client, _name, None)
    if callable(_fn) and not _name.startswith("_") and _fn.__doc__ is None and _twin is not None:
        _fn.__doc__ = f"Async ``Client.{_name}``.\n\n" + (_twin.__doc__ or "")


# Functions as jobs --------------------------------------------------------------------


_JOB_OPTIONS = frozenset({
    "name", "gpus", "cpus", "num_workers", "memory_gb", "accelerator_type", "node_group", "market", "priority",
    "timeout_s", "labels", "pip", "env_vars", "max_attempts", "project", "working_dir",
})


def _import_path(fn: Callable[..., Any]) -> tuple[str, str]:
    """``module:function`` and the directory to ship so that the import works there."""
    qual = getattr(fn, "__qualname__", "") or ""
    if not qual or "<" in qual:
        raise TypeError(f"raylane.job needs a module-level function; {qual or fn!r} is nested or a lambda, "
                        "so the cluster could not import it by name")
    modname = getattr(fn, "__module__", None)
    mod = sys.modules.get(modname or "")
    file = getattr(mod, "__file__", None)
    if not file:
        raise TypeError(f"raylane.job needs a function defined in a .py file; {qual} comes from {modname!r} "
                        "(a notebook or the REPL?), which the cluster cannot import")
    if modname == "__main__":
        spec = getattr(mod, "__spec__", None)
        modname = spec.name if spec is not None and spec.name and spec.name != "__main__" else Path(file).stem
    path = Path(file).resolve()
    # The directory that holds the top-level package: `a.b.c` in /x/a/b/c.py ships /x.
    ups = modname.count(".") + (1 if path.name == "__init__.py" else 0)
    root = path.parent
    for _ in range(ups):
        root = root.parent
    return f"{modname}:{qual}", str(root)


class JobFunction:
    """A function that runs on the cluster as a Raylane ``training`` job.

    Made by ``@raylane.job``. Calling it calls the function (that is what the
    cluster does: the training runner imports ``module:function`` and calls it
    with the run context on each worker). ``submit`` sends it as a job.
    """

    def __init__(self, fn: Callable[..., Any], **options: Any):
        unknown = set(options) - _JOB_OPTIONS
        if unknown:
            raise TypeError(f"unknown raylane.job option(s): {', '.join(sorted(unknown))}")
        self.fn = fn.fn if isinstance(fn, JobFunction) else fn
        self.job_options = options
        functools.update_wrapper(self, self.fn)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<raylane job function {self.fn.__module__}.{self.fn.__qualname__}>"

    def options(self, **overrides: Any) -> "JobFunction":
        """A copy with some options changed: ``train.options(gpus=2).submit(...)``."""
        return JobFunction(self.fn, **{**self.job_options, **overrides})

    def spec(self, **args: Any) -> JobSpec:
        """The ``JobSpec`` this function is submitted as, with ``args`` as ``ctx.args``.

        Raises:
            TypeError: the function is not importable by name, or ``args`` is not JSON.
            ValidationFailed: an option is out of range (e.g. ``gpus=1.5``).
        """
        o = self.job_options
        entrypoint, root = _import_path(self.fn)
        try:
            json.dumps(args)
        except (TypeError, ValueError) as e:
            raise TypeError(f"job arguments must be JSON-serialisable: {e}") from None
        name = o.get("name") or self.fn.__name__.lstrip("_") or "function"
        resources: dict[str, Any] = {"num_workers": o.get("num_workers", 1), "cpus_per_worker": o.get("cpus", 1),
                                     "gpus_per_worker": o.get("gpus", 0)}
        if o.get("memory_gb") is not None:
            resources["memory_gb_per_worker"] = o["memory_gb"]
        if o.get("accelerator_type"):
            resources["accelerator_type"] = o["accelerator_type"]
        body: dict[str, Any] = {
            "name": name, "kind": "training", "entrypoint": entrypoint, "resources": resources, "args": args,
            "runtime_env": {"working_dir": o.get("working_dir") or root, "pip": list(o.get("pip") or []),
                            "env_vars": dict(o.get("env_vars") or {})},
            "placement": {"node_group": o.get("node_group", "auto"), "market": o.get("market", "auto")},
            "labels": {"raylane.io/function": self.fn.__name__[:256], **(o.get("labels") or {})},
        }
        for key in ("priority", "timeout_s", "project"):
            if o.get(key) is not None:
                body[key] = o[key]
        if o.get("max_attempts") is not None:
            body["retry"] = {"max_attempts": o["max_attempts"]}
        try:
            return JobSpec.model_validate(body)
        except _PydanticValidationError as e:
            raise _spec_error(e, f"raylane.job({self.fn.__name__})") from None

    def submit(self, *, client: Client | None = None, idempotency_key: str | None = None, **args: Any) -> Job:
        """Submit the function as a job; keyword arguments become ``ctx.args``.

        Args:
            client: the client to use; default ``Client()`` (RAYLANE_URL, RAYLANE_TOKEN).
            idempotency_key: as for ``Client.submit``.
            **args: JSON-serialisable arguments for the function.

        Returns:
            The stored job.

        Raises:
            TypeError, ValidationFailed, ConnectionFailed: see ``Client.submit_function``.

        Example::

            job = train.submit(lr=1e-3, epochs=3)
        """
        if client is not None:
            return client.submit_function(self, args=args, idempotency_key=idempotency_key)
        with Client() as c:
            return c.submit_function(self, args=args, idempotency_key=idempotency_key)


@overload
def job(fn: Callable[..., Any], /) -> JobFunction: ...


@overload
def job(*, gpus: float = ..., cpus: float = ..., num_workers: int = ..., name: str | None = ...,
        memory_gb: float | None = ..., accelerator_type: str | None = ..., node_group: str = ...,
        market: str = ..., priority: int | None = ..., timeout_s: float | None = ...,
        labels: Mapping[str, str] | None = ..., pip: list[str] | None = ..., env_vars: Mapping[str, str] | None = ...,
        max_attempts: int | None = ..., project: str | None = ...,
        working_dir: str | None = ...) -> Callable[[Callable[..., Any]], JobFunction]: ...


def job(fn: Callable[..., Any] | None = None, /, **options: Any):
    """Turn a module-level function into a job: ``@raylane.job(gpus=1)``.

    The function runs as a ``training`` job with ``num_workers`` workers (one by
    default), each holding ``gpus`` GPUs and ``cpus`` CPUs; with GPUs it is
    routed to a GPU node group, gang-scheduled. Each worker calls
    ``fn(ctx)``: ``ctx.args`` holds the keyword arguments given to ``submit``,
    ``ctx.rank`` / ``ctx.world_size`` the worker's place, ``ctx.checkpoint_dir``
    a directory that survives retries, ``ctx.report(**metrics)`` logs metrics.
    The return values are in ``job.result["workers"][i]["return"]``.

    The job's entrypoint is ``module:function``, and the directory holding the
    function's top-level package is shipped as ``runtime_env.working_dir``:
    zipped on this machine (``.gitignore`` honoured), uploaded to the server as
    a code package unless it has that tree already, and handed to Ray by the
    server; no filesystem is shared. ``working_dir=`` another local directory,
    or a URI Ray can fetch (``s3://...zip``, ``https://...zip``), overrides it.
    Keep the directory small: all of it is uploaded (at most 100 MiB).

    Args:
        gpus: GPUs per worker (fractions share a GPU).
        cpus: CPUs per worker.
        num_workers: workers, all started together (a gang).
        name: the job name; default the function's name.
        memory_gb, accelerator_type, node_group, market, priority, timeout_s,
        labels, pip, env_vars, max_attempts, project, working_dir: as in the
            job spec (``max_attempts`` is ``retry.max_attempts``).

    Returns:
        A ``JobFunction``: call it as the function, or ``.submit(**args)``.

    Example::

        import raylane

        @raylane.job(gpus=1)
        def finetune(ctx):
            lr = ctx.args["lr"]
            ...
            return {"loss": 0.1}

        if __name__ == "__main__":
            job = finetune.submit(lr=1e-4)
            print(raylane.Client().wait(job.id).result)
    """
    if fn is not None:
        return JobFunction(fn, **options)
    return lambda f: JobFunction(f, **options)
