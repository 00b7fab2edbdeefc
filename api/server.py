"""Run the API (and, when asked, a local Ray cluster) in this process: ``raylane serve``."""

from __future__ import annotations

import logging

import uvicorn

from api.app import create_app
from orchestrator.settings import Settings


def serve(settings: Settings, *, local_cluster: bool = False) -> None:
    logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    app = create_app(settings)
    base = settings.public_url or f"http://{settings.host}:{settings.port}"
    app.state.startup_hooks.append(lambda cp: _announce(base, cp))
    uvicorn.run(app, host=settings.host, port=settings.port, log_level=settings.log_level.lower(),
                access_log=False, timeout_graceful_shutdown=10)


def _announce(base: str, cp) -> None:
    lines = [f"Raylane API:        {base}", f"API docs:           {base}/docs",
             f"Database:           {cp.engine.url.render_as_string(hide_password=True)}"]
    if cp.dashboard_url:
        lines.append(f"Ray dashboard:      {cp.dashboard_url}")
    print("\n".join(lines), flush=True)
