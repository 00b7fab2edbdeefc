"""Run the control plane in this process: ``raylane serve``.

With ``--local-cluster`` and no ``RAYLANE_DASHBOARD_URL``, it first starts the
local multi-node Ray cluster of the profile (and leaves it running on exit, so a
restart re-attaches to the same jobs; ``raylane cluster down`` stops it).
"""

from __future__ import annotations

import logging

import uvicorn

from api.app import create_app
from orchestrator.settings import Settings


def serve(settings: Settings, *, local_cluster: bool = False) -> None:
    logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    app = create_app(settings)
    base = settings.public_url or f"http://{settings.host}:{settings.port}"
    if local_cluster and not settings.dashboard_url:
        from orchestrator.localcluster import LocalCluster
        from orchestrator.profile import Profile

        print("Starting the local Ray cluster (head, gpu, spot-cpu, cpu node groups)...", flush=True)
        cluster = LocalCluster(Profile.load(settings.profile), settings.data_dir / "cluster")
        state = cluster.up()
        settings.dashboard_url = state.dashboard_url
        settings.ray_auth_token = state.token
    app.state.startup_hooks.append(lambda cp: _announce(base, cp))
    uvicorn.run(app, host=settings.host, port=settings.port, log_level=settings.log_level.lower(),
                access_log=False, timeout_graceful_shutdown=10)


def _announce(base: str, cp) -> None:
    lines = [f"Raylane API:        {base}", f"API docs:           {base}/docs",
             f"Database:           {cp.engine.url.render_as_string(hide_password=True)}"]
    if cp.dashboard_url:
        lines.append(f"Ray dashboard:      {cp.dashboard_url}  (token auth on)")
    print("\n".join(lines), flush=True)
