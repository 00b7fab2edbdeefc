"""One call over HTTP: ``_Call`` (what to send, how to read the answer, whether it may be
sent twice), the retry policy (tenacity), and the wire details (headers, NDJSON logs)."""

from __future__ import annotations

import functools
import json
import os
import random
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Generic, Mapping

from pydantic import BaseModel, TypeAdapter

from raylane.client.sdk.constants import (
    BACKOFF_BASE_S, BACKOFF_MAX_S, DEFAULT_URL, ENV_TOKEN, ENV_URL, NOT_ACTED_STATUSES, RETRY_AFTER_MAX_S,
    RETRY_STATUSES, T,
)
from raylane.client.sdk.errors import ConnectionFailed, RaylaneError, _not_raylane

if TYPE_CHECKING:  # pragma: no cover
    import httpx


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

    if isinstance(exc, httpx.ConnectError) and base_url.startswith("https://") and \
            "wrong version number" in str(exc).lower():
        # The TLS handshake got plain HTTP back: the server is up, the scheme is wrong.
        return ConnectionFailed(f"{base_url} answers plain HTTP, not HTTPS ({_reason(exc)}): use "
                                f"http://{base_url[len('https://'):]} in RAYLANE_URL or --url")
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
