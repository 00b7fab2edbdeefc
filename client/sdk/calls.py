"""The call table: every API operation as a ``_Call``, shared by ``Client`` and ``AsyncClient``,
and the request bodies and parameters they build."""

from __future__ import annotations

import json
import os
import uuid
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Mapping, Sequence

from raylane.orchestrator.domain.views import (
    ArrayAction, Attempt, AuditPage, BatchSubmitResponse, CancelResponse, Job, JobArray, JobEvent, JobPage, NewToken,
    NewWebhook, Placement, Project, ProjectQuota, Schedule, Token, Trial, Webhook, WebhookDelivery, Whoami,
)
from raylane.orchestrator.domain.specs import JobKind, JobSpec, SpecLoadError, load_spec_document
from raylane.orchestrator.domain.states import JobStatus
from raylane.client.sdk.constants import AMBIGUOUS_SHOWN, JOB_ID_LENGTH, RESUBMITTED_FROM_LABEL, SpecLike
from raylane.client.sdk.errors import AmbiguousJobId, NotFound, ValidationFailed, WaitTimeout
from raylane.client.sdk.models import ClusterInfo, Fleet, CostBreakdown, Health, JobCost, KindInfo, NodeGroupStatus, Report
from raylane.client.sdk.transport import NDJSON, _Call, _adapter, _model

if TYPE_CHECKING:  # pragma: no cover
    import httpx


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
            return load_spec_document(path.read_text(), source=str(path))
        except SpecLoadError as e:
            raise ValidationFailed(str(e) if str(e).startswith(str(path)) else f"{path}: {e}",
                                   errors=[{"loc": ["file"], "msg": str(e), "type": "spec_load"}]) \
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
    def fleet() -> _Call[Fleet]:
        return _Call("GET", "/v1/fleet", _model(Fleet))

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
