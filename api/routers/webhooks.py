"""/v1/webhooks: a project's subscriptions to its jobs' status changes
(docs/webhooks.md). Members and admins create and delete hooks of the projects
they see; viewers list them. Another project's hook is 404, like a missing one."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query, Request, Response

from raylane.api.deps import CP, CallerDep
from raylane.orchestrator.domain.views import NewWebhook, Webhook, WebhookCreate, WebhookDelivery
from raylane.orchestrator.services.access import check_project_visible

router = APIRouter(prefix="/v1/webhooks", tags=["webhooks"])

HookId = Annotated[str, Path(min_length=1, max_length=32, pattern=r"^wh_[0-9a-f]+$")]


@router.post("", status_code=201, response_model=NewWebhook)
def create_webhook(body: WebhookCreate, cp: CP, caller: CallerDep, request: Request, response: Response) -> NewWebhook:
    """A new hook: a signed POST to ``url`` each time a job of the project changes to one of ``statuses``.
    The signing secret is in this response only."""
    project = body.project or caller.project or caller.home_project or "default"
    check_project_visible(caller, project)
    response.headers["Cache-Control"] = "no-store"  # the secret must not be cached anywhere
    hook = cp.webhooks.create(body, project=project, actor=caller.name)
    request.state.audit_target = hook.id
    return hook


@router.get("", response_model=list[Webhook])
def list_webhooks(cp: CP, caller: CallerDep) -> list[Webhook]:
    return cp.webhooks.list(project=caller.project)


@router.get("/{hook_id}", response_model=Webhook)
def get_webhook(hook_id: HookId, cp: CP, caller: CallerDep) -> Webhook:
    return cp.webhooks.get(hook_id, project=caller.project)


@router.delete("/{hook_id}", status_code=204)
def delete_webhook(hook_id: HookId, cp: CP, caller: CallerDep, request: Request) -> Response:
    """Delete a hook; deliveries not yet sent are dropped."""
    request.state.audit_target = hook_id
    cp.webhooks.delete(hook_id, project=caller.project)
    return Response(status_code=204)


@router.get("/{hook_id}/deliveries", response_model=list[WebhookDelivery])
def list_deliveries(hook_id: HookId, cp: CP, caller: CallerDep,
                    limit: Annotated[int, Query(ge=1, le=200)] = 50) -> list[WebhookDelivery]:
    """The delivery log, newest first: each delivery's tries, last answer and error."""
    return cp.webhooks.deliveries(hook_id, project=caller.project, limit=limit)
