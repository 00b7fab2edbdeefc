"""The synchronous client (``Client``): jobs, logs, routing and cluster; arrays, webhooks,
schedules, costs and access come from ``sync_resources``."""

from __future__ import annotations

import json
import os
import time
from datetime import datetime
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Literal, Mapping, overload

from raylane.client import packaging
from raylane.orchestrator.domain.views import (
    Attempt, BatchSubmitResponse, CancelResponse, Job, JobEvent, JobPage, Placement, Trial,
)
from raylane.client.sdk.calls import (
    _Api, _last_lines, _local_working_dir, _looks_short, _looks_whole, _resolved, _resubmit_body, _wait_timeout,
    _with_working_dir,
)
from raylane.client.sdk.constants import (
    AMBIGUOUS_SHOWN, DEFAULT_TIMEOUT_S, ITER_PAGE_SIZE, KindLike, MAX_ATTEMPTS, SpecLike, StatusLike, T,
    WAIT_POLL_MAX_S, WAIT_POLL_MIN_S,
)
from raylane.client.sdk.errors import _error_from
from raylane.client.sdk.functions import JobFunction
from raylane.client.sdk.models import ClusterInfo, Fleet, Health, JobCost, KindInfo, NodeGroupStatus, UploadedPackage
from raylane.client.sdk.sync_resources import _ClientResources
from raylane.client.sdk.transport import (
    _AnswerWorthRetrying, _Call, _backoff, _connection_failed, _headers, _is_ndjson, _log_text, _parsed, _resolve,
    _retry_policy, _skip_seen, _worth_retrying,
)

if TYPE_CHECKING:  # pragma: no cover
    import httpx


# The synchronous client ------------------------------------------------------------


class Client(_ClientResources):
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

    def fleet(self) -> Fleet:
        """The fleet's Ray clusters: tier (owned or rented), cost model, node groups,
        and which one jobs are dispatched to (docs/fleet.md). One cluster without
        ``RAYLANE_FLEET``.

        Example::

            for c in client.fleet().clusters:
                print(c.name, c.tier, [g["name"] for g in c.groups])
        """
        return self._call(_Api.fleet())

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
