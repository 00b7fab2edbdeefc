"""Log lines that say which request, job and attempt they belong to.

Three context variables carry the ids: ``request_id`` (set by the API's request
middleware, echoed as ``X-Request-ID``), ``job_id`` and ``attempt`` (set by the
middleware for ``/v1/jobs/{id}/...`` paths and by the dispatcher and reconciler
while they work on one attempt). ``ContextFilter`` copies them onto every
``LogRecord``; ``JsonFormatter`` writes one JSON object per line, and the text
format shows the same fields in brackets. ``configure`` installs either on the
root logger.

Context variables follow the code, not the thread: FastAPI copies the request's
context into the worker thread that runs a sync endpoint, and each loop thread
has its own.
"""

from __future__ import annotations

import contextlib
import json
import logging
import sys
from contextvars import ContextVar
from datetime import datetime, timezone
from typing import Any, Iterator

request_id: ContextVar[str | None] = ContextVar("raylane_request_id", default=None)
job_id: ContextVar[str | None] = ContextVar("raylane_job_id", default=None)
attempt: ContextVar[int | None] = ContextVar("raylane_attempt", default=None)

FIELDS = ("request_id", "job_id", "attempt")
# A LogRecord's own attributes; anything else on a record came in through ``extra=``.
_RECORD_ATTRS = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime", "ctx", *FIELDS}
MAX_MESSAGE_CHARS = 16_000  # one line stays one line a log shipper accepts


def bind_job(job: str | None, n: int | None = None) -> None:
    """Say which job (and attempt) the current thread works on, until the next bind."""
    job_id.set(job)
    attempt.set(n)


@contextlib.contextmanager
def job_context(job: str | None, n: int | None = None) -> Iterator[None]:
    t1, t2 = job_id.set(job), attempt.set(n)
    try:
        yield
    finally:
        job_id.reset(t1)
        attempt.reset(t2)


class ContextFilter(logging.Filter):
    """Copies the context ids onto each record (a handler filter: runs for every line)."""

    def filter(self, record: logging.LogRecord) -> bool:
        for name, var in (("request_id", request_id), ("job_id", job_id), ("attempt", attempt)):
            if getattr(record, name, None) is None:
                setattr(record, name, var.get())
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts, level, logger, msg, request_id, job_id,
    attempt, then any ``extra=`` fields, and ``exc`` with the traceback."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, timezone.utc).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage()[:MAX_MESSAGE_CHARS],
        }
        for name in FIELDS:
            out[name] = getattr(record, name, None)
        for k, v in record.__dict__.items():
            if k not in _RECORD_ATTRS and not k.startswith("_") and k not in out:
                out[k] = v
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        elif record.exc_text:
            out["exc"] = record.exc_text
        if record.stack_info:
            out["stack"] = self.formatStack(record.stack_info)
        return json.dumps(out, default=str, ensure_ascii=False)


class TextFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s%(ctx)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        parts = [f"{k}={getattr(record, k)}" for k in ("request_id", "job_id", "attempt")
                 if getattr(record, k, None) is not None]
        record.ctx = f" [{' '.join(parts)}]" if parts else ""
        return super().format(record)


def configure(level: str = "INFO", fmt: str = "json", stream=None) -> logging.Handler:
    """Replace the root logger's handlers with one that writes ``fmt`` lines to ``stream``."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.addFilter(ContextFilter())
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    for h in list(root.handlers):
        root.removeHandler(h)
    root.addHandler(handler)
    root.setLevel(level.upper())
    return handler
