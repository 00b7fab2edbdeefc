"""The ASGI application: ``create_app(settings)``; ``raylane.api.app:app`` for uvicorn."""

from __future__ import annotations

import asyncio
import gc
import logging
from contextlib import asynccontextmanager
from typing import Any
from pathlib import Path

from fastapi import FastAPI
from fastapi_offline import FastAPIOffline
from pydantic import BaseModel
from fastapi.staticfiles import StaticFiles

from raylane import __version__
from raylane.api import errors, observability
from raylane.api.auth import AuthMiddleware
from raylane.api.epochs import EpochReads
from raylane.api.headers import SecurityHeaders
from raylane.api.limits import BodySizeLimit
from raylane.api.ratelimit import AddressGate, SubmitLimit, resolve_storage
from raylane.api.refusals import RefusalTally
from raylane.api.rayproxy import PREFIX as RAY_PREFIX, RayProxy
from raylane.api.routers import (
    access, arrays, bench, cluster, costs, health, jobs, packages, schedules, session, webhooks,
)
from raylane.api.session import Sessions
from raylane.orchestrator.services.controlplane import ControlPlane
from raylane.orchestrator.services.logfollow import LogFollowers, LogFollowersCollector
from raylane.orchestrator.services import assembly
from raylane.orchestrator.services.ratelimits import DatabaseWindows
from raylane.orchestrator.settings import Settings, get_settings

log = logging.getLogger(__name__)
UI_DIR = Path(__file__).parent / "ui"  # the web page at /ui: static files, no build step
# Swagger UI's and ReDoc's own files, served from the installed fastapi-offline
# package instead of a CDN (no internet needed, nothing loaded without integrity);
# under /ui, so they are public like the page, and mounted before /ui so they match first.
DOCS_ASSETS_URL = "/ui/docs-assets"


class ErrorBody(BaseModel):
    detail: Any


# Every /v1 route can answer these; documenting them keeps the OpenAPI document
# honest (tests/test_fuzz.py checks each response against it).
ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    400: {"model": ErrorBody, "content": {"application/json": {}}, "description": "Malformed body (not UTF-8, nested too deeply)"},
    401: {"model": ErrorBody, "content": {"application/json": {}}, "description": "No or bad API token"},
    403: {"model": ErrorBody, "content": {"application/json": {}}, "description": "The caller's role or a policy rule forbids it"},
    404: {"model": ErrorBody, "content": {"application/json": {}}, "description": "Unknown, or in another project"},
    409: {"model": ErrorBody, "content": {"application/json": {}}, "description": "The object's state forbids it"},
    413: {"model": ErrorBody, "content": {"application/json": {}}, "description": "Body larger than RAYLANE_MAX_BODY_BYTES"},
    422: {"model": ErrorBody, "content": {"application/json": {}}, "description": "Invalid input; `detail` names each field"},
    429: {"model": ErrorBody, "content": {"application/json": {}}, "description": "Submit rate limit, or too many requests without a valid token from one address; see Retry-After"},
    503: {"model": ErrorBody, "content": {"application/json": {}}, "description": "Ray is unreachable; see Retry-After"},
}


# The apps of this process that froze the collector (``gc_freeze``): the last to stop unfreezes.
_frozen: list = []


def create_app(settings: Settings | None = None, *, cp: ControlPlane | None = None) -> FastAPI:
    settings = settings or get_settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        plane = cp or ControlPlane(settings)
        if settings.auto_migrate:
            plane.migrate()
        app.state.cp = plane
        app.state.submit_limit.bind(DatabaseWindows(plane.sessions))
        app.state.refusals = RefusalTally(plane.access)
        admin_banner = _bootstrap_access(plane, settings)
        if settings.dashboard_url:
            from raylane.orchestrator.services import fleetdispatch, fleetplan

            # A fleet of several reachable clusters: one queue, a placer, each cluster's own loops.
            fleet = fleetdispatch.attach_configured_fleet(plane)
            if fleet is not None:
                fd, tokens = fleet
                for name, m in fd.members.items():  # /ray/<cluster>/: each cluster's dashboard
                    app.state.ray_proxy.bind(m.backend.dashboard_url, tokens[name], cluster=name)
                # /ray/: the attached cluster's, its own URL with its own token (never another's)
                ray_url, ray_token = fd.members[fd.attached].backend.dashboard_url, tokens[fd.attached]
            else:
                ray_url, ray_token = settings.dashboard_url, assembly.attach_configured_ray(plane, settings)
                # A fleet's pins (placement.cluster, placement.tier) are checked before routing; its
                # other clusters' jobs and attempts are left alone, not run again here.
                plane.router = fleetplan.guard(plane, plane.router)
                fleetdispatch.keep_to_attached(plane)
            # Links to a job's page in Ray's dashboard go through Raylane (api.rayproxy).
            plane.dashboard_link = public_base(settings) + RAY_PREFIX
            app.state.ray_proxy.bind(ray_url, ray_token)
            if settings.loops_enabled:
                assembly.start_loops(plane)
        if settings.loops_enabled:
            assembly.start_background(plane)
        hooks = getattr(app.state, "startup_hooks", [])
        for hook in hooks:
            hook(plane)
        flusher = asyncio.create_task(app.state.refusals.run())
        fast_epoch = assembly.fast_epoch_reader(plane)  # opened last, closed first: nothing between can leak it
        app.state.auth_epochs = EpochReads(plane.access.epoch, fast_epoch)
        if settings.gc_freeze:
            # What is alive now (modules, the app, the engine, the loops) lives as
            # long as the server. Out of the collector's sight, a full collection
            # scans what requests make: 100-120 ms pauses -> 5 ms (docs/benchmarks.md).
            _frozen.append(app)
            gc.collect()
            gc.freeze()
        if admin_banner:
            # Last of the start-up, so that no log line pushes it off the screen.
            print(admin_banner, flush=True)
        try:
            yield
        finally:
            if settings.gc_freeze:
                _frozen.remove(app)
                if not _frozen:  # the last app of this process: its cycles can be collected again
                    gc.unfreeze()
            if fast_epoch is not None:
                fast_epoch.close()  # a read after this takes the pooled way
            flusher.cancel()
            await app.state.refusals.flush()
            await app.state.log_followers.close()
            await app.state.ray_proxy.close()
            for hook in getattr(app.state, "shutdown_hooks", []):
                hook(plane)
            assembly.stop_loops(plane)
            if cp is None:
                plane.close()

    app = FastAPIOffline(
        static_url=DOCS_ASSETS_URL,
        title="Raylane",
        version=__version__,
        summary="A job orchestrator in front of Ray: durable queue, routing to GPU gangs or spot workers, recovery.",
        lifespan=lifespan,
    )
    _install_state(app, settings)
    _install_middleware_and_routes(app, settings)
    return app


def _install_state(app: FastAPI, settings: Settings) -> None:
    """What the routers and the middleware read from ``app.state``: the settings,
    the hooks, the limits, the log followers, the sessions and the Ray proxy."""
    app.state.settings = settings
    app.state.startup_hooks = []
    app.state.shutdown_hooks = []
    app.state.submit_limit = SubmitLimit(settings.submit_rate_per_s, settings.submit_burst,
                                         resolve_storage(settings.rate_limit_storage, settings.database_url))
    app.state.address_gate = AddressGate(settings.address_rate_per_s, settings.address_burst)
    app.state.log_followers = LogFollowers(lambda: app.state.cp, poll_s=settings.log_follow_poll_s,
                                           heartbeat_s=settings.log_follow_heartbeat_s,
                                           max_s=settings.log_follow_max_s,
                                           per_token=settings.log_streams_per_token,
                                           max_streams=settings.log_streams_max)
    app.state.sessions = Sessions(settings.session_secret.get_secret_value() if settings.session_secret else None,
                                  settings.session_ttl_s)
    app.state.ray_proxy = RayProxy(timeout_s=settings.ray_proxy_timeout_s, stream_max_s=settings.ray_proxy_stream_max_s,
                                   per_token=settings.ray_proxy_per_token, max_inflight=settings.ray_proxy_max,
                                   audit_every=settings.ray_proxy_audit_every)


def _install_middleware_and_routes(app: FastAPI, settings: Settings) -> None:
    """Errors, middleware and routers, in the order that makes each middleware's
    place (body limit inside auth, observability outermost), then the mounts."""
    errors.install(app)
    app.add_middleware(BodySizeLimit, max_bytes=settings.max_body_bytes,
                       per_prefix={packages.PREFIX: settings.package_max_bytes})
    # Outside the body limit (an unauthenticated request is refused before its
    # body is read), inside observability's request ids (a 401 has one too).
    app.add_middleware(AuthMiddleware)
    app.include_router(health.router)
    app.include_router(jobs.router, responses=ERROR_RESPONSES)
    app.include_router(cluster.router, responses=ERROR_RESPONSES)
    app.include_router(costs.router, responses=ERROR_RESPONSES)
    app.include_router(access.router, responses=ERROR_RESPONSES)
    app.include_router(packages.router, responses=ERROR_RESPONSES)
    app.include_router(webhooks.router, responses=ERROR_RESPONSES)
    app.include_router(schedules.router, responses=ERROR_RESPONSES)
    app.include_router(arrays.router, responses=ERROR_RESPONSES)
    app.include_router(session.router, responses=ERROR_RESPONSES)
    if settings.bench_bare_endpoint:  # the benchmarks' reference (api/routers/bench.py); off in production
        app.include_router(bench.router, responses=ERROR_RESPONSES)
    app.add_middleware(SecurityHeaders)  # nosniff on every answer, no-store on the API's, CSP on /ui
    observability.install(app)  # after every other middleware: outermost, so each response has its X-Request-ID
    app.state.metrics_registry.register(LogFollowersCollector(app.state.log_followers))
    app.mount("/ui", StaticFiles(directory=UI_DIR, html=True), name="ui")
    app.mount(RAY_PREFIX, app.state.ray_proxy, name="ray_dashboard")


def public_base(settings: Settings) -> str:
    """Where clients reach this server: RAYLANE_PUBLIC_URL, or the address it binds."""
    return (settings.public_url or f"http://{settings.host}:{settings.port}").rstrip("/")


def _bootstrap_access(plane: ControlPlane, settings: Settings) -> str | None:
    """The first admin token, made once; the banner that shows it (None: nothing to show)."""
    if not settings.auth_enabled:
        log.warning("RAYLANE_AUTH_ENABLED=false: every caller is an admin of every project; "
                    "never expose this server beyond localhost")
        return None
    secret = plane.access.bootstrap()
    if not secret:
        return None
    # Shown once: the database keeps only its hash.
    return (f"\nRaylane admin token (shown once; also in {plane.access.admin_token_path()}, mode 0600):\n"
            f"  {secret}\nexport RAYLANE_TOKEN={secret}\n")
