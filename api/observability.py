"""Request ids, request logs, and ``GET /metrics``.

``RequestContext`` (pure ASGI middleware, the outermost one) gives every request
an id (the caller's ``X-Request-ID`` when it is a sane token, else a new one),
binds it and the job id of ``/v1/jobs/{id}/...`` paths to the log context
(``raylane.orchestrator.logcontext``), returns it as ``X-Request-ID``, times the request
into ``raylane_http_request_duration_seconds`` and writes one log line per request.

``/metrics`` serves the app's own registry: the database-derived collector
(``raylane.orchestrator.services.metrics``, the same on every replica) plus this process's HTTP
histogram and process metrics (per replica; sum them in PromQL).
"""

from __future__ import annotations

import logging
import re
import time
import uuid

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Histogram, ProcessCollector, generate_latest

from raylane.api.deps import CallerDep
from raylane.orchestrator import logcontext
from raylane.orchestrator.services.metrics import DatabaseCollector, FleetCollector

log = logging.getLogger("raylane.http")

REQUEST_ID_HEADER = b"x-request-id"  # ASGI gives header names lower-cased, as bytes
_SANE_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")  # a caller's id goes into logs: no spaces, no newlines
_JOB_PATH = re.compile(r"^/v1/jobs/([0-9a-z]{1,64})(?:/|$)")
_NOT_JOBS = frozenset({"batch"})
# Probes and scrapes run every few seconds; their lines are DEBUG so they do not drown the log.
QUIET_PATHS = frozenset({"/healthz", "/readyz", "/metrics"})
HTTP_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)


class RequestContext:
    def __init__(self, app, histogram: Histogram):
        self.app = app
        self.histogram = histogram

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        rid = None
        for name, value in scope.get("headers", ()):
            if name == REQUEST_ID_HEADER:
                v = value.decode("latin-1")
                rid = v if _SANE_ID.match(v) else None
                break
        rid = rid or uuid.uuid4().hex
        path = scope.get("path", "")
        m = _JOB_PATH.match(path)
        # Set, not reset: each request runs in its own task (its own context copy).
        logcontext.request_id.set(rid)
        logcontext.bind_job(m.group(1) if m and m.group(1) not in _NOT_JOBS else None)
        status = 500
        t0 = time.perf_counter()

        async def send_with_id(message):
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                message.setdefault("headers", [])
                message["headers"] = list(message["headers"]) + [(REQUEST_ID_HEADER, rid.encode())]
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        finally:
            took = time.perf_counter() - t0
            route = getattr(scope.get("route"), "path", None) or "unmatched"
            method = scope.get("method", "")
            self.histogram.labels(method, route, str(status)).observe(took)
            log.log(logging.DEBUG if path in QUIET_PATHS else logging.INFO, "%s %s %s %.1fms", method, path, status,
                    took * 1000, extra={"method": method, "path": path, "route": route, "status": status,
                                        "duration_ms": round(took * 1000, 2)})


def install(app: FastAPI) -> None:
    """Add the middleware (outermost) and ``GET /metrics`` to ``app``."""
    registry = CollectorRegistry()
    histogram = Histogram("raylane_http_request_duration_seconds",
                          "API request latency in this process, by method, route template and status.",
                          ["method", "route", "status"], registry=registry, buckets=HTTP_BUCKETS)
    registry.register(ProcessCollector(registry=None))
    registry.register(DatabaseCollector(lambda: app.state.cp.sessions, lambda: _profile(app)))
    registry.register(FleetCollector(lambda: getattr(app.state, "cp", None)))
    app.state.metrics_registry = registry
    app.add_middleware(RequestContext, histogram=histogram)

    router = APIRouter(tags=["observability"])

    @router.get("/metrics", response_class=Response,
                responses={200: {"content": {"text/plain": {}}, "description": "Prometheus text format"}})
    def metrics(request: Request, caller: CallerDep) -> Response:
        """Prometheus metrics: queue, jobs, attempts and latencies from the database; HTTP latency of this process."""
        return Response(generate_latest(request.app.state.metrics_registry), media_type=CONTENT_TYPE_LATEST)

    app.include_router(router)


def _profile(app: FastAPI):
    from raylane.orchestrator.services.accounting import profile

    return profile(app.state.cp)
