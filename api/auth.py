"""Authentication and the audit trail, for every HTTP request, in one place.

``AuthMiddleware`` runs before routing, so it covers every route, also the ones
mounted later (static files, a metrics app): a path is public only when listed
in ``PUBLIC_PATHS`` / ``PUBLIC_PREFIXES``; under ``ADMIN_PREFIXES`` it needs an
admin token; everywhere else it needs a valid token, and the routers' role
dependencies (``raylane.api.deps``) decide the rest.

Under ``/ray`` (Ray's dashboard, ``api.rayproxy``) a signed session cookie
(``api.session``) stands for the token it was made from; nowhere else does.
The dashboard app's own files there are public, as Ray has them.

It resolves ``Authorization: Bearer <token>`` to a ``Caller`` (one indexed read by
the token's sha256: a revoked token is refused on its next request) and leaves
it in the request state. Every mutating request (POST, PUT, PATCH, DELETE) with
a valid token, also a refused one, writes an audit row: who, which action on
what, from where, and the status code, committed before the response goes out
(by this middleware, or by the route in its own transaction: ``audit_entry``).

The refusal path is cheap: a request without a token this replica has seen
valid first passes the address gate (``api.ratelimit.AddressGate``, memory
only: 429 once its address spent its burst); a refused mutating request without
a valid token (401, or that 429) is counted in an aggregated audit row per
client and minute (``api.refusals``), not written as a row of its own.
"""

from __future__ import annotations

import json
import logging
import math

import anyio

from raylane.api.errors import DATABASE_RETRY_AFTER_S, DATABASE_UNAVAILABLE
from raylane.api.session import cookie_from
from raylane.orchestrator.domain.errors import StoreUnavailable
from raylane.orchestrator.services.access import LOCAL_ADMIN, MAX_TOKEN_LEN, Caller, Role, hash_token

log = logging.getLogger(__name__)

# Public: probes, the API's own description, and the UI's static shell (which
# fetches its data from /v1 with the user's token).
PUBLIC_PATHS = frozenset({"/healthz", "/readyz", "/docs", "/docs/oauth2-redirect", "/redoc", "/openapi.json"})
PUBLIC_PREFIXES = ("/ui",)
# Admin only, whatever serves them: cluster-wide numbers of every project.
ADMIN_PREFIXES = ("/metrics",)
# Ray's dashboard through Raylane (api/rayproxy.py): the only place a session cookie counts.
RAY_PREFIX = "/ray"
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
ANONYMOUS = "anonymous"


def _under(path: str, prefixes: tuple[str, ...]) -> bool:
    return any(path == p or path.startswith(p + "/") for p in prefixes)


def is_public(path: str) -> bool:
    return path in PUBLIC_PATHS or _under(path, PUBLIC_PREFIXES)


def is_public_read(scope) -> bool:
    """Ray's dashboard app itself (its page and static files): public, as Ray has them."""
    from raylane.api.rayscope import is_shell

    path = scope["path"]
    return _under(path, (RAY_PREFIX,)) and is_shell(scope["method"], path[len(RAY_PREFIX) + 1:])


def is_admin_only(path: str) -> bool:
    return _under(path, ADMIN_PREFIXES)


def _bearer(scope) -> str | None:
    for name, value in scope.get("headers", ()):
        if name == b"authorization":
            scheme, _, cred = value.decode("latin-1").partition(" ")
            if scheme.lower() == "bearer" and cred.strip():
                return cred.strip()
            return None
    return None


class AuthMiddleware:
    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        """``_authorize``, with the database's failures answered 503 (its token and
        epoch reads, the audit rows it writes, run outside the routes' exception
        handlers: uncaught, they were a 500)."""
        started = False

        async def tracked(message):
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self._authorize(scope, receive, tracked)
        except StoreUnavailable as e:  # (a broken statement or schema stays the 500, with its traceback)
            log.warning("database unavailable on %s %s: %s", scope.get("method"), scope.get("path"), str(e)[:300])
            if started:  # the answer is on its way (its audit row could not follow): nothing else to say
                return
            await _reply(send, 503, DATABASE_UNAVAILABLE, {"retry-after": str(DATABASE_RETRY_AFTER_S)})

    async def _authorize(self, scope, receive, send):
        if scope["type"] != "http" or is_public(scope["path"]) or is_public_read(scope):
            return await self.app(scope, receive, send)
        app = scope["app"]
        if not app.state.settings.auth_enabled:
            caller: Caller | None = LOCAL_ADMIN
        else:
            caller = await _caller(app, scope, send)
            if caller is _ANSWERED:
                return
        if caller is None:
            return await _refuse_unknown(app, scope, send)
        if is_admin_only(scope["path"]) and caller.role != Role.ADMIN.value:
            return await _refuse_non_admin(app.state.cp, scope, send, caller)
        scope.setdefault("state", {})["caller"] = caller
        if scope["method"] in SAFE_METHODS:
            return await self.app(scope, receive, send)
        await self._audited(scope, receive, send, caller)

    async def _audited(self, scope, receive, send, caller: Caller):
        """Pass a mutating request on, its audit row written before its answer leaves
        (or a 500's, when the route raised before answering)."""
        cp = scope["app"].state.cp
        state = scope["state"]
        # A route may write its own audit row in its own transaction (a submit:
        # one commit for the job and its row, not two): it builds the row with
        # ``audit_entry`` and sets ``audited`` once that transaction committed.
        state["audit_entry"] = lambda status, target=None: _entry(scope, caller, status, target)

        audited = False

        async def send_and_audit(message):
            nonlocal audited
            if message["type"] == "http.response.start" and not audited:
                audited = True
                if not state.get("audited"):
                    # Before the response leaves: whoever sees the answer finds the row.
                    await audit(cp, scope, caller, message["status"])
            await send(message)

        try:
            await self.app(scope, receive, send_and_audit)
        except Exception:
            if not audited and not state.get("audited"):
                await audit(cp, scope, caller, 500)
            raise


# ``_caller``'s answer when it refused the request itself (the address gate's 429).
_ANSWERED = object()


async def _caller(app, scope, send):
    """Who sends the request: the ``Caller`` of its Bearer token (or, under /ray, of
    its session cookie), None when it has no valid one, or ``_ANSWERED`` when the
    address gate refused it (429, sent)."""
    cp = app.state.cp
    token = _bearer(scope)
    # A browser on /ray signs in once (api.session); a Bearer token still wins.
    session = (app.state.sessions.token_id(cookie_from(scope))
               if token is None and _under(scope["path"], (RAY_PREFIX,)) else None)
    if session is not None:
        # A valid signature cannot be guessed: no address gate to pass.
        return await anyio.to_thread.run_sync(cp.access.caller_by_token_id, session)
    digest = hash_token(token) if token and len(token) <= MAX_TOKEN_LEN else None
    gate = app.state.address_gate
    if not gate.knows(digest):
        wait = gate.take(_address(scope))
        if wait > 0:
            await _refuse_too_many(app, scope, send, wait)
            return _ANSWERED
    caller = await _authenticate(app, cp, token, digest) if digest else None
    if caller is not None:
        gate.vouch(digest)
    else:
        gate.forget(digest)
    return caller


async def _refuse_too_many(app, scope, send, wait: float) -> None:
    """429: this address spent its burst of requests without a valid token."""
    gate = app.state.address_gate
    await _reply(send, 429, f"too many requests without a valid API token from this address: at most "
                            f"{gate.rate:g}/s (bursts of {gate.burst}); retry in {wait:.1f}s",
                 {"retry-after": str(math.ceil(wait))})
    if scope["method"] not in SAFE_METHODS:
        await app.state.refusals.refused(_entry(scope, None, 429))


async def _refuse_unknown(app, scope, send) -> None:
    """401: no token, or one that is unknown, expired or revoked."""
    hint = " (a browser: sign in through /ui first)" if _under(scope["path"], (RAY_PREFIX,)) else ""
    await _reply(send, 401, "missing, unknown, expired or revoked API token: send "
                            f"'Authorization: Bearer <token>'{hint}", {"www-authenticate": "Bearer"})
    if scope["method"] not in SAFE_METHODS:
        await app.state.refusals.refused(_entry(scope, None, 401))


async def _refuse_non_admin(cp, scope, send, caller: Caller) -> None:
    """403: an admin-only path with another role's token (a valid token: its own audit row)."""
    await _reply(send, 403, "this needs an admin token")
    if scope["method"] not in SAFE_METHODS:
        await audit(cp, scope, caller, 403)


async def _authenticate(app, cp, token: str, digest: str) -> Caller | None:
    """``Access.authenticate``; for a token verified before, from memory and the
    epoch (``api.epochs``: shared by the requests waiting with it), without a
    worker thread of its own."""
    epochs = getattr(app.state, "auth_epochs", None)
    if epochs is not None and cp.access.knows(digest):
        caller = cp.access.remembered(digest, await epochs.current())
        if caller is not False:
            return caller
    return await anyio.to_thread.run_sync(cp.access.authenticate, token)


async def _reply(send, status: int, detail: str, headers: dict[str, str] | None = None) -> None:
    body = json.dumps({"detail": detail}).encode()
    hdrs = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    hdrs += [(k.encode(), v.encode()) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": hdrs})
    await send({"type": "http.response.body", "body": body})


def _action(scope) -> str:
    route = scope.get("route")
    name = getattr(route, "name", None)
    return name or f"{scope['method']} {scope['path']}"[:128]


def _target(scope) -> str | None:
    state = scope.get("state") or {}
    if state.get("audit_target"):
        return str(state["audit_target"])[:512]
    params = scope.get("path_params") or {}
    if params:
        return ",".join(f"{k}={v}" for k, v in params.items())[:512]
    return None


def _address(scope) -> str:
    client = scope.get("client")
    return client[0] if client else "-"


def _entry(scope, caller: Caller | None, status: int, target: str | None = None) -> dict:
    """The audit row of a request (``target``: the object acted on, when the route names it)."""
    client = scope.get("client")
    return {
        "actor": caller.name if caller else ANONYMOUS,
        "token_id": caller.token_id if caller else None,
        "role": caller.role if caller else None,
        "project": caller.project if caller else None,
        "action": _action(scope),
        "method": scope["method"][:8],
        "path": scope["path"][:512],
        "target": target[:512] if target else _target(scope),
        "status_code": status,
        "client": f"{client[0]}"[:128] if client else None,
    }


async def audit(cp, scope, caller: Caller | None, status: int) -> None:
    """Write the audit row of a request (also ``api.rayproxy``'s sampled reads)."""
    entry = _entry(scope, caller, status)
    try:
        await anyio.to_thread.run_sync(cp.access.record, entry)
    except Exception:  # the request happened; losing its audit row must be loud, not fatal
        log.exception("could not write the audit row for %s %s", scope["method"], scope["path"])
