"""Domain errors -> HTTP, in one place. Validation errors keep FastAPI's shape
(``detail: [{loc, msg, type}]``) without echoing the input back (a 5 MB field
must not come back in the error)."""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from raylane.orchestrator.domain import errors

log = logging.getLogger(__name__)

# The database did not answer (down, restarting, a connection cut, the pool's
# wait run out, a deadlock): the same request may succeed when sent again.
# Whether a write whose COMMIT was cut off took effect is unknown; a retried
# submit with the same Idempotency-Key settles it. Answered here for the routes
# and by api.auth for what it reads and writes before and after them.
DATABASE_UNAVAILABLE = ("the database is unavailable or busy; retry the request (a submit with the same "
                        "Idempotency-Key is stored at most once)")
DATABASE_RETRY_AFTER_S = 1

STATUS = {
    errors.NotFound: 404,
    errors.InvalidTransition: 409,
    errors.Conflict: 409,
    errors.Invalid: 422,
    errors.Forbidden: 403,
    errors.Unauthorized: 401,
    errors.RateLimited: 429,
}


def _status_for(exc: errors.RaylaneError) -> int:
    for cls in type(exc).__mro__:
        if cls in STATUS:
            return STATUS[cls]
    return 400


def _clean(err: dict) -> dict:
    msg = str(err.get("msg", ""))[:500]
    return {"loc": [str(x)[:128] for x in err.get("loc", ())], "msg": msg, "type": err.get("type", "value_error")}


def _with_hint(err: dict) -> dict:
    """An unknown field says which one was meant, when one is near."""
    if err.get("type") != "extra_forbidden":
        return err
    from raylane.orchestrator.domain.suggest import nearest_field

    loc = list(err.get("loc", ()))
    unknown = str(loc[-1]) if loc else "?"
    near = nearest_field(loc)
    hint = f"; did you mean {near}?" if near else ""
    return {**err, "msg": f"unknown field {unknown!r}{hint}"}


def _array_id(raw: dict, err: dict) -> dict:
    """A job route given an array's id (``arr_...``) says where arrays are, not the id pattern."""
    value = raw.get("input")
    if list(err["loc"]) == ["path", "job_id"] and isinstance(value, str) and value.lower().startswith("arr_"):
        return {**err, "msg": f"{value[:64]} is an array's id, not a job's: see /v1/arrays/{value[:64]} "
                              "(raylane arrays status)"}
    return err


JSON_BODY = "application/json"


def _not_json(request: Request, exc: RequestValidationError) -> str | None:
    """Why a body was not read, when the request did not say it is JSON (curl's
    ``-d`` sends ``application/x-www-form-urlencoded``): the header to send."""
    if request.method not in ("POST", "PUT", "PATCH"):
        return None
    ctype = request.headers.get("content-type", "")
    if "json" in ctype.split(";")[0].lower():
        return None
    if not any(list(e.get("loc", ()))[:1] == ["body"] for e in exc.errors()):
        return None
    had = f"it was {ctype.split(';')[0]}" if ctype else "it had none"
    return f"the request body must be JSON with the header Content-Type: {JSON_BODY} ({had})"


def install(app: FastAPI) -> None:
    @app.exception_handler(errors.RaylaneError)
    async def _domain(request: Request, exc: errors.RaylaneError):
        status = _status_for(exc)
        rule = getattr(exc, "rule", None)  # a policy rule (raylane.orchestrator.domain.policy) names itself
        if status == 422:
            loc = ["body", exc.field] if exc.field else ["body"]
            err = {"loc": loc, "msg": exc.message, "type": "value_error", **({"rule": rule} if rule else {})}
            return JSONResponse({"detail": [err]}, status_code=422)
        headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
        if isinstance(exc, errors.RateLimited):
            headers = {"Retry-After": str(exc.retry_after_s)}
        body = {"detail": exc.message, **({"rule": rule} if rule else {})}
        return JSONResponse(body, status_code=status, headers=headers)

    @app.exception_handler(errors.EngineUnavailable)
    async def _ray_down(request: Request, exc: errors.EngineUnavailable):
        # Ray is the engine, not the source of truth: reads of our own data still
        # work; only calls that need Ray now get 503, with a hint to retry.
        return JSONResponse({"detail": str(exc)}, status_code=503, headers={"Retry-After": "5"})

    @app.exception_handler(errors.StoreUnavailable)
    async def _database_down(request: Request, exc: errors.StoreUnavailable):
        # The store said it was the database's availability (store.db.is_transient), not
        # a broken statement or schema (those stay a 500 with their traceback).
        log.warning("database unavailable on %s %s: %s", request.method, request.url.path, str(exc)[:300])
        return JSONResponse({"detail": DATABASE_UNAVAILABLE}, status_code=503,
                            headers={"Retry-After": str(DATABASE_RETRY_AFTER_S)})

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError):
        wrong_type = _not_json(request, exc)
        if wrong_type:
            return JSONResponse({"detail": wrong_type}, status_code=415, headers={"Accept": JSON_BODY})
        return JSONResponse({"detail": [_with_hint(_array_id(e, _clean(e))) for e in exc.errors()[:50]]},
                            status_code=422)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException):
        detail = exc.detail
        cause = exc.__cause__
        # FastAPI says only "error parsing the body"; say which problem it was.
        if isinstance(cause, UnicodeDecodeError):
            detail = f"request body is not valid UTF-8 (byte {cause.start})"
        elif isinstance(cause, RecursionError):
            detail = "request body JSON is nested too deeply"
        return JSONResponse({"detail": detail}, status_code=exc.status_code, headers=getattr(exc, "headers", None))

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception):
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return JSONResponse({"detail": "internal error; the server log has the traceback"}, status_code=500)
