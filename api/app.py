"""The ASGI application: ``create_app(settings)``; ``api.app:app`` for uvicorn."""

from __future__ import annotations

import logging
from contextlib import asynccontextmanager
from pathlib import Path

from fastapi import FastAPI
from fastapi.staticfiles import StaticFiles

from api import errors, observability
from api.limits import BodySizeLimit
from api.routers import cluster, costs, health, jobs
from orchestrator.service import ControlPlane
from orchestrator.settings import Settings, get_settings

log = logging.getLogger(__name__)
UI_DIR = Path(__file__).parent / "ui"  # the web page at /ui: static files, no build step


def create_app(settings: Settings | None = None, *, cp: ControlPlane | None = None) -> FastAPI:
    settings = settings or get_settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        plane = cp or ControlPlane(settings)
        if settings.auto_migrate:
            plane.migrate()
        app.state.cp = plane
        if settings.dashboard_url:
            from orchestrator.backends.ray_jobs import read_token
            from orchestrator.profile import Profile

            plane.attach_ray(settings.dashboard_url, read_token(settings.ray_auth_token), Profile.load(settings.profile))
            if settings.loops_enabled:
                plane.start_loops()
        hooks = getattr(app.state, "startup_hooks", [])
        for hook in hooks:
            hook(plane)
        try:
            yield
        finally:
            for hook in getattr(app.state, "shutdown_hooks", []):
                hook(plane)
            plane.stop_loops()
            if cp is None:
                plane.close()

    app = FastAPI(
        title="Raylane",
        version="0.1.0",
        summary="A job orchestrator in front of Ray: durable queue, routing to GPU gangs or spot workers, recovery.",
        lifespan=lifespan,
    )
    app.state.settings = settings
    app.state.startup_hooks = []
    app.state.shutdown_hooks = []
    errors.install(app)
    app.add_middleware(BodySizeLimit, max_bytes=settings.max_body_bytes)
    app.include_router(health.router)
    app.include_router(jobs.router)
    app.include_router(cluster.router)
    app.include_router(costs.router)
    observability.install(app)  # after every other middleware: outermost, so each response has its X-Request-ID
    app.mount("/ui", StaticFiles(directory=UI_DIR, html=True), name="ui")
    return app
