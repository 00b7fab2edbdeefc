"""``Client``'s methods for the resources beside jobs: arrays, webhooks, schedules, costs,
and access (who may do what)."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Callable, Literal, Mapping, Sequence

from raylane.orchestrator.domain.views import (
    ArrayAction, AuditPage, JobArray, NewToken, NewWebhook, Project, ProjectQuota, Schedule, Token, Webhook,
    WebhookDelivery, Whoami,
)
from raylane.client.sdk.calls import _Api, _schedule_body
from raylane.client.sdk.constants import SpecLike
from raylane.client.sdk.models import CostBreakdown, Report


class _ClientResources:
    """The resources beside jobs (arrays, webhooks, schedules, costs, access), as
    ``Client`` methods; each sends one call of the table through ``Client._call``."""

    _call: Callable[[Any], Any]

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
