"""The SDK's errors: one class per answer a caller acts on, and how an HTTP answer becomes one.

An error the server raises (``raylane.orchestrator.domain.errors``) arrives here
as the SDK's class of the same name, a subclass of the domain's: one definition
of what each means, the SDK adding what the HTTP answer said (``status_code``,
``detail``). ``except NotFound`` catches the same error on either side of the wire.
"""

from __future__ import annotations

import json
import math
from typing import TYPE_CHECKING, Any, Iterable

from pydantic import ValidationError as _PydanticValidationError

from raylane.orchestrator.domain import errors as _domain
from raylane.orchestrator.domain.views import Job
from raylane.orchestrator.domain.states import JobStatus

if TYPE_CHECKING:  # pragma: no cover
    import httpx


# Errors ------------------------------------------------------------------------


class RaylaneError(_domain.RaylaneError):
    """Base of every error the SDK raises.

    Attributes:
        message: what went wrong, ready to show to a user.
        status_code: the HTTP status, when the server answered.
        detail: the ``detail`` of the server's JSON error body, as sent.
        field: always None here (a 422's fields are in ``ValidationFailed.errors``).
    """

    def __init__(self, message: str, *, status_code: int | None = None, detail: Any = None):
        # The domain base's own __init__, not the next in the MRO: a domain subclass
        # may want arguments an HTTP answer does not carry (``RateLimited`` sets its own).
        _domain.RaylaneError.__init__(self, message)
        self.status_code = status_code
        self.detail = detail

    def __str__(self) -> str:
        return self.message


class NotFound(RaylaneError, _domain.NotFound):
    """404: no such job (or one the caller may not see), or no such endpoint."""


class Conflict(RaylaneError, _domain.Conflict):
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


class Unauthorized(RaylaneError, _domain.Unauthorized):
    """401: no token, or a token the server does not accept (set RAYLANE_TOKEN).

    Attributes:
        token_sent: whether the request carried a token at all.
    """

    token_sent: bool = False


class Forbidden(RaylaneError, _domain.Forbidden):
    """403: the token is valid but may not do this."""


class RateLimited(RaylaneError, _domain.RateLimited):
    """429: this token sent more submits than its rate allows, through every retry.

    Attributes:
        retry_after_s: the seconds the server's last ``Retry-After`` asked for (None if it sent none).
    """

    def __init__(self, message: str, *, status_code: int | None = None, detail: Any = None,
                 retry_after_s: int | None = None):
        super().__init__(message, status_code=status_code, detail=detail)
        self.retry_after_s = retry_after_s  # type: ignore[assignment]  (an int in the domain's)


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
    server (or a proxy's page) is at the URL. Its HTML is never shown. A URL that
    ends in the UI's or the API's own path (``.../ui``, ``.../v1``) says the root."""
    said = f"{_where(resp)} answered {resp.status_code} {_content_type(resp)}: not a Raylane API? Check the URL"
    req = _request_of(resp)
    path = req.url.path if req is not None else ""
    for extra in ("/ui/v1/", "/v1/v1/"):
        if extra in path:
            root = str(req.url.copy_with(path=path[:path.index(extra)] or "/", query=None)).rstrip("/")
            return f"{said}: give the server's root, {root}, without {extra[:-4]}"
    return said


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
    if status == 404 and detail == "Not Found":  # no such route (ours name what is missing): a wrong URL
        message = _not_raylane(resp)
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
        return RateLimited(message, status_code=status, detail=detail, retry_after_s=_retry_after_s(resp))
    elif status >= 500:
        cls, message = ServerError, f"server error {status}: {message}"
    else:
        cls = RaylaneError
    return cls(message, status_code=status, detail=detail)


def _retry_after_s(resp: "httpx.Response") -> int | None:
    try:
        return max(0, math.ceil(float(resp.headers.get("Retry-After", ""))))
    except (ValueError, OverflowError):  # none, an HTTP date, nan, inf
        return None


def _spec_error(exc: _PydanticValidationError, prefix: str) -> ValidationFailed:
    errors = [{"loc": ["body", *[str(x) for x in e.get("loc", ())]], "msg": str(e.get("msg", "")),
               "type": str(e.get("type", "value_error"))} for e in exc.errors()[:50]]
    return ValidationFailed(_validation_message(errors, prefix), errors=errors)
