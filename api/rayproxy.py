"""Ray's dashboard under ``/ray/``, for Raylane's callers, with Ray's token kept
server-side: the plumbing. What passes is decided in ``api.rayscope``.

Words:

- *upstream*: Ray's dashboard (``RAYLANE_DASHBOARD_URL``), asked with Ray's
  token, which only this module adds and which never goes back: the caller's
  own ``Authorization`` and cookies are never forwarded, and every body that
  comes back has the token's bytes replaced (``redact``), however it is cut
  into chunks.
- *slot*: one proxied request in flight, from its decision to its last byte.
  Capped per token (``RAYLANE_RAY_PROXY_PER_TOKEN``) and per process
  (``RAYLANE_RAY_PROXY_MAX``): a refusal is a 429 with Retry-After, before Ray
  is asked.

Invariants (the rule of followed logs, ``orchestrator/services/logfollow.py``):
everything here is async on one shared HTTP client and holds no thread, also
while a log streams; Ray must start answering within
``RAYLANE_RAY_PROXY_TIMEOUT_S`` (then 504); an answer is cut after
``RAYLANE_RAY_PROXY_STREAM_MAX_S`` or when the client goes. Refusals and every
``RAYLANE_RAY_PROXY_AUDIT_EVERY``-th allowed read are audit rows (mutating
requests: all, by ``api.auth``, and all refused here).
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from itertools import count
from typing import AsyncIterator
from urllib.parse import parse_qs, quote

import anyio
import httpx

from raylane.api import rayscope
from raylane.api.auth import audit
from raylane.api.rayscope import Kind
from raylane.orchestrator.services.access import Caller

log = logging.getLogger(__name__)

PREFIX = "/ray"
# A refused request is told to come back after this long: slots free as answers end.
CAP_RETRY_AFTER_S = 5
# A job list or job read Raylane filters is held in memory whole: bounded.
MAX_FILTERED_BYTES = 32 * 1024 * 1024
FORWARDED_REQUEST_HEADERS = ("accept", "accept-language", "if-none-match", "if-modified-since", "range")
PASSED_RESPONSE_HEADERS = frozenset({"content-type", "cache-control", "etag", "last-modified", "content-disposition",
                                     "content-range", "accept-ranges"})
PAGE_HEADERS = [(b"x-content-type-options", b"nosniff"), (b"referrer-policy", b"no-referrer"),
                (b"x-frame-options", b"SAMEORIGIN")]


SIGN_IN_PAGE = "/ui/signin.html"  # api/ui/signin.html: trades a token for the /ray session cookie
APP_PAGES = frozenset({"", "index.html"})


def _needs_sign_in(scope, method: str, rel: str) -> bool:
    """A browser opening the dashboard's page without a valid session (nor a token):
    it goes to the sign-in page first. Scripts (no ``text/html`` in Accept) get the 401s."""
    if method != "GET" or rel not in APP_PAGES or "text/html" not in (_header(scope, b"accept") or ""):
        return False
    app = scope.get("app")
    if app is None or not app.state.settings.auth_enabled or _header(scope, b"authorization"):
        return False
    from raylane.api.session import cookie_from

    return app.state.sessions.token_id(cookie_from(scope)) is None


class Redactor:
    """Replaces a secret in a byte stream, also when it straddles two chunks: an
    end of a chunk that could be the secret's beginning waits for the next chunk."""

    MASK = b"[redacted]"

    def __init__(self, secret: str | None):
        self.secret = secret.encode() if secret else b""
        self._held = b""

    def feed(self, chunk: bytes) -> bytes:
        if not self.secret:
            return chunk
        data = (self._held + chunk).replace(self.secret, self.MASK)
        # Hold back only an end that could begin the secret: a followed log whose
        # last line ends in a newline is sent whole at once.
        keep = next((k for k in range(min(len(self.secret) - 1, len(data)), 0, -1)
                     if data.endswith(self.secret[:k])), 0)
        self._held = data[len(data) - keep:] if keep else b""
        return data[:len(data) - keep]

    def flush(self) -> bytes:
        out, self._held = self._held, b""
        return out


def redact(secret: str | None, body: bytes) -> bytes:
    r = Redactor(secret)
    return r.feed(body) + r.flush()


class _Target:
    """One Ray cluster's dashboard behind the proxy: its URL, its token, one client."""

    def __init__(self, url: str, token: str | None):
        self.url, self.token = url.rstrip("/"), token
        self.client: httpx.AsyncClient | None = None


class RayProxy:
    """The ASGI app mounted at ``/ray`` (``app.state.ray_proxy``). Bound to Ray by
    the app's lifespan when a cluster is attached; 503 until then. On a fleet,
    every cluster is bound by name too: ``/ray/<cluster>/...`` is that cluster's
    dashboard, with the same rules; ``/ray/...`` the attached cluster's."""

    def __init__(self, *, timeout_s: float, stream_max_s: float, per_token: int, max_inflight: int,
                 audit_every: int):
        self.timeout_s, self.stream_max_s = timeout_s, stream_max_s
        self.per_token, self.max_inflight, self.audit_every = per_token, max_inflight, audit_every
        self._owners: Counter[str] = Counter()
        self._reads = count()
        self._targets: dict[str | None, _Target] = {}  # None: the attached cluster

    @property
    def inflight(self) -> int:
        return sum(self._owners.values())

    def bind(self, dashboard_url: str, token: str | None, *, cluster: str | None = None) -> None:
        """``cluster``: a fleet's cluster by name (``/ray/<cluster>/``); None: the attached one (``/ray/``)."""
        self._targets[cluster] = _Target(dashboard_url, token)

    def _http(self, t: _Target) -> httpx.AsyncClient:
        if t.client is None:
            headers = {"Authorization": f"Bearer {t.token}"} if t.token else {}
            # One client and pool per cluster for every caller; its connection cap is the slot cap.
            t.client = httpx.AsyncClient(
                base_url=t.url, headers=headers, timeout=httpx.Timeout(self.timeout_s),
                limits=httpx.Limits(max_connections=self.max_inflight, max_keepalive_connections=32),
                follow_redirects=False)
        return t.client

    async def close(self) -> None:
        for t in self._targets.values():
            if t.client is not None:
                await t.client.aclose()
                t.client = None

    def _target(self, rel: str) -> tuple[_Target | None, str, str]:
        """(the cluster's target, the path within its dashboard, the prefix before it)
        for a path under /ray: ``<cluster>/...`` when that names a bound cluster."""
        head, _, rest = rel.partition("/")
        if head and head in self._targets:
            return self._targets[head], rest, f"{head}/"
        return self._targets.get(None), rel, ""

    # ASGI --------------------------------------------------------------------

    async def __call__(self, scope, receive, send):
        if scope["type"] == "websocket":
            # Not proxied (docs/auth.md): the app's log tail falls back to HTTP reads.
            await send({"type": "websocket.close", "code": 1008})
            return
        if scope["type"] != "http":
            return
        # Starlette's mount sends /ray to /ray/ before this: the app's relative URLs need the slash.
        target, rel, where = self._target(scope["path"][len(PREFIX) + 1:])
        method = scope["method"]
        caller: Caller | None = (scope.get("state") or {}).get("caller")
        query = parse_qs(scope.get("query_string", b"").decode("latin-1"), keep_blank_values=True)
        if caller is None and _needs_sign_in(scope, method, rel):
            # A dashboard link opened in a browser that has not signed in: Ray's app
            # would load and show "Job Query Error" behind our 401. The sign-in page
            # sends them back; the link's #/jobs/... is kept by the browser (a
            # Location without a fragment inherits the request's).
            root = scope.get("root_path", "")  # a mount's root_path ends in its own prefix
            root = root[:-len(PREFIX)] if root.endswith(PREFIX) else root
            back = quote(f"{root}{PREFIX}/{where}{rel}", safe="/")
            return await _reply(send, 303, b"", {"location": f"{root}{SIGN_IN_PAGE}?next={back}",
                                                 "cache-control": "private, no-store"})
        if caller is None:  # only the app's shell is public (api.auth); never trust that it was checked
            if not rayscope.is_shell(method, rel):
                return await _reply_json(send, 401, {"detail": "sign in through /ui (a session cookie for /ray), "
                                                               "or send 'Authorization: Bearer <Raylane token>'"})
            decision = rayscope.Decision(Kind.AUTH_MODE) if rel == "api/authentication_mode" else rayscope.PASS
        else:
            decision = rayscope.decide(method, rel, query, caller)
        if decision.refused:
            return await self._refuse(scope, send, caller, decision.status, decision.reason)
        if decision.kind is Kind.AUTH_MODE:
            # Raylane authenticates; the app must never ask for Ray's token.
            return await _reply_json(send, 200, {"authentication_mode": "disabled"})
        if target is None:
            return await self._refuse(scope, send, caller, 503, "no Ray cluster is attached to this server",
                                      {"retry-after": "30"})
        # The public shell (no caller) counts per client address, not in one shared bucket.
        owner = (caller.token_id or caller.name) if caller else f"address:{(scope.get('client') or ('-',))[0]}"
        full = self._reserve(owner)
        if full:
            return await self._refuse(scope, send, caller, 429, full, {"retry-after": str(CAP_RETRY_AFTER_S)})
        try:
            status = await self._serve(target, scope, receive, send, rel, method, decision, caller)
        finally:
            self._release(owner)
        if caller is not None and method in rayscope.READ_METHODS and (
                status >= 400 or next(self._reads) % self.audit_every == 0):
            await audit(scope["app"].state.cp, _audited(scope), caller, status)

    def _reserve(self, owner: str) -> str | None:
        if self.inflight >= self.max_inflight:
            return f"this server has {self.max_inflight} requests to Ray's dashboard in flight, its cap " \
                   f"(RAYLANE_RAY_PROXY_MAX); retry later"
        if self._owners[owner] >= self.per_token:
            return f"this token has {self.per_token} requests to Ray's dashboard in flight, its cap " \
                   f"(RAYLANE_RAY_PROXY_PER_TOKEN); retry when one ends"
        self._owners[owner] += 1
        return None

    def _release(self, owner: str) -> None:
        self._owners[owner] -= 1
        if self._owners[owner] <= 0:
            del self._owners[owner]

    async def _refuse(self, scope, send, caller, status: int, reason: str, headers=None) -> None:
        await _reply_json(send, status, {"detail": reason}, headers)
        # Mutating requests are audited by api.auth already, refusals included.
        if caller is not None and scope["method"] in rayscope.READ_METHODS:
            await audit(scope["app"].state.cp, _audited(scope), caller, status)

    # Serving -----------------------------------------------------------------

    async def _serve(self, t: _Target, scope, receive, send, rel: str, method: str, decision, caller) -> int:
        """Answers the request; returns the status sent."""
        try:
            if decision.kind is Kind.JOB and not await self._visible(t, decision.job, caller):
                return await _sent(_reply_json(send, 404, {"detail": rayscope.NOT_FOUND}), 404)
            if decision.kind is Kind.LIST_JOBS:
                return await self._list_jobs(t, send, caller)
            return await self._forward(t, scope, receive, send, rel, method, decision.stream)
        except httpx.TimeoutException:
            return await _sent(_reply_json(send, 504, {"detail": f"Ray's dashboard did not answer within "
                                                                  f"{self.timeout_s:g}s"}), 504)
        except httpx.TransportError as e:
            return await _sent(_reply_json(send, 502, {"detail": f"Ray's dashboard is unreachable: "
                                                                  f"{type(e).__name__}"}, {"retry-after": "10"}), 502)

    async def _get_json(self, t: _Target, path: str):
        r = await self._http(t).get(path, headers={"accept-encoding": "identity"})
        if r.status_code == 404:
            return None
        if r.status_code != 200 or len(r.content) > MAX_FILTERED_BYTES:
            raise httpx.TransportError(f"Ray answered {r.status_code} for {path}")
        return r.json()

    async def _visible(self, t: _Target, job: str, caller: Caller) -> bool:
        found = await self._get_json(t, f"api/jobs/{quote(job, safe='')}")
        return isinstance(found, dict) and rayscope.job_visible(found, caller)

    async def _list_jobs(self, t: _Target, send, caller: Caller) -> int:
        jobs = await self._get_json(t, "api/jobs/") or []
        mine = [j for j in jobs if isinstance(j, dict) and rayscope.job_visible(j, caller)]
        body = redact(t.token, json.dumps(mine).encode())
        await _reply(send, 200, body, {"content-type": "application/json", "cache-control": "private, no-store"})
        return 200

    async def _forward(self, t: _Target, scope, receive, send, rel: str, method: str, stream: bool) -> int:
        qs = scope.get("query_string", b"").decode("latin-1")
        url = quote(rel, safe="/") + (f"?{qs}" if qs else "")
        hdrs = {k: v for k in FORWARDED_REQUEST_HEADERS
                if (v := _header(scope, k.encode())) is not None}
        hdrs["accept-encoding"] = "identity"  # the redactor reads the bytes as they are
        timeout = httpx.Timeout(self.timeout_s, read=self.stream_max_s if stream else self.timeout_s)
        client = self._http(t)
        req = client.build_request(method, url, headers=hdrs, timeout=timeout)
        resp = await client.send(req, stream=True)
        try:
            headers = [(k.encode(), v.encode("latin-1")) for k, v in resp.headers.items()
                       if k.lower() in PASSED_RESPONSE_HEADERS]
            if not rel.startswith("static/"):
                headers = [h for h in headers if h[0] != b"cache-control"] + [(b"cache-control", b"private, no-store")]
            await send({"type": "http.response.start", "status": resp.status_code, "headers": headers + PAGE_HEADERS})
            redactor = Redactor(t.token)
            async with anyio.create_task_group() as tg:
                tg.start_soon(_cancel_on_disconnect, receive, tg.cancel_scope)
                with anyio.move_on_after(self.stream_max_s):
                    try:
                        async for chunk in _chunks(resp):
                            out = redactor.feed(chunk)
                            if out:
                                await send({"type": "http.response.body", "body": out, "more_body": True})
                    except httpx.TransportError as e:  # timeouts too; the answer has begun: end it short
                        log.warning("Ray's dashboard stopped mid-answer for %s: %s", rel[:120], type(e).__name__)
                tg.cancel_scope.cancel()
            await send({"type": "http.response.body", "body": redactor.flush(), "more_body": False})
            return resp.status_code
        finally:
            await resp.aclose()


async def _chunks(resp: httpx.Response) -> AsyncIterator[bytes]:
    async for chunk in resp.aiter_raw():
        yield chunk


async def _cancel_on_disconnect(receive, scope) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            scope.cancel()
            return


def _header(scope, name: bytes) -> str | None:
    for k, v in scope.get("headers", ()):
        if k == name:
            return v.decode("latin-1")
    return None


def _audited(scope) -> dict:
    """The scope as the audit row names it: action ray_dashboard, the path and query as target."""
    qs = scope.get("query_string", b"").decode("latin-1")
    state = dict(scope.get("state") or {})
    state["audit_target"] = scope["path"] + (f"?{qs}" if qs else "")
    return {**scope, "state": state, "route": _ROUTE}


class _Route:
    name = "ray_dashboard"


_ROUTE = _Route()


async def _sent(coro, status: int) -> int:
    await coro
    return status


async def _reply(send, status: int, body: bytes, headers: dict[str, str] | None = None) -> None:
    hdrs = [(b"content-length", str(len(body)).encode())]
    hdrs += [(k.encode(), v.encode()) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": hdrs + PAGE_HEADERS})
    await send({"type": "http.response.body", "body": body})


async def _reply_json(send, status: int, obj, headers: dict[str, str] | None = None) -> None:
    await _reply(send, status, json.dumps(obj).encode(),
                 {"content-type": "application/json", "cache-control": "private, no-store", **(headers or {})})
