"""The asyncio client (``AsyncClient``): ``Client``'s methods, awaited."""

from __future__ import annotations

import json
import os
import time
from datetime import datetime
from typing import TYPE_CHECKING, Any, AsyncIterator, Callable, Iterable, Literal, Mapping, Sequence

from raylane.client import packaging
from raylane.orchestrator.domain.views import (
    ArrayAction, Attempt, AuditPage, BatchSubmitResponse, CancelResponse, Job, JobArray, JobEvent, JobPage, NewToken,
    NewWebhook, Placement, Project, ProjectQuota, Schedule, Token, Trial, Webhook, WebhookDelivery, Whoami,
)
from raylane.client.sdk.calls import (
    _Api, _last_lines, _local_working_dir, _looks_short, _looks_whole, _resolved, _resubmit_body, _schedule_body,
    _wait_timeout, _with_working_dir,
)
from raylane.client.sdk.constants import (
    AMBIGUOUS_SHOWN, DEFAULT_TIMEOUT_S, ITER_PAGE_SIZE, KindLike, MAX_ATTEMPTS, SpecLike, StatusLike, T,
    WAIT_POLL_MAX_S, WAIT_POLL_MIN_S,
)
from raylane.client.sdk.errors import _error_from
from raylane.client.sdk.functions import JobFunction
from raylane.client.sdk.models import (
    ClusterInfo, Fleet, CostBreakdown, Health, JobCost, KindInfo, NodeGroupStatus, Report, UploadedPackage,
)
from raylane.client.sdk.sync import Client
from raylane.client.sdk.transport import (
    _AnswerWorthRetrying, _Call, _asleep, _backoff, _connection_failed, _headers, _is_ndjson, _log_text, _parsed,
    _resolve, _retry_policy, _skip_seen, _worth_retrying,
)

if TYPE_CHECKING:  # pragma: no cover
    import httpx


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

    async def fleet(self) -> Fleet:
        return await self._call(_Api.fleet())

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
