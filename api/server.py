"""Run the control plane in this process: ``raylane-server serve``.

With ``--local-cluster`` and no ``RAYLANE_DASHBOARD_URL``, it first starts the
local multi-node Ray cluster of the profile (or attaches to one that
``raylane-server cluster up`` started), and stops it on a clean exit. A cluster it
starts is owned: it dies with the server however the server dies (SIGTERM,
SIGKILL), and a stale one its last run left in data_dir is removed first.
"""

from __future__ import annotations

import logging
import signal
import sys

import uvicorn

from raylane.api.app import create_app
from raylane.orchestrator import logcontext
from raylane.orchestrator.settings import Settings


def serve(settings: Settings, *, local_cluster: bool = False) -> None:
    # JSON lines (or text) with the request, job and attempt ids on every line; uvicorn's
    # own loggers propagate to this handler (log_config=None below keeps it from adding its own).
    logcontext.configure(settings.log_level, settings.log_format)
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per Ray call drowns everything else
    app = create_app(settings)
    base = settings.public_url or f"http://{settings.host}:{settings.port}"
    cluster = None
    if local_cluster and not settings.dashboard_url and settings.fleet:
        cluster = _start_fleet(settings)
    elif local_cluster and not settings.dashboard_url:
        from raylane.orchestrator.tooling.localcluster import LocalCluster
        from raylane.orchestrator.domain.profile import Profile

        print("Starting the local Ray cluster (head, gpu, spot-cpu, cpu node groups)...", flush=True)
        cluster = LocalCluster(Profile.load(settings.profile), settings.data_dir / "cluster")
        state = cluster.up(owned=True)
        settings.dashboard_url = state.dashboard_url
        settings.ray_address = state.gcs_address
        settings.ray_auth_token = state.token
        # uvicorn stops on SIGTERM, then raises it again with the handler it found:
        # the default one would end the process before the `finally` below.
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    app.state.startup_hooks.append(lambda cp: _announce(base, cp))
    try:
        if settings.workers > 1:
            _serve_workers(settings, base)
        else:
            uvicorn.run(app, host=settings.host, port=settings.port, log_level=settings.log_level.lower(),
                        access_log=False, log_config=None, timeout_graceful_shutdown=10)
    finally:
        if cluster is not None:
            # A clean stop (Ctrl-C, SIGTERM) takes the local cluster down here; on a
            # crash or SIGKILL the cluster's watchdog does (localcluster.py).
            print("Stopping the local Ray cluster(s)...", flush=True)
            cluster.down()


def _start_fleet(settings: Settings):
    """Start the local fleet RAYLANE_FLEET names, owned (it dies with this process),
    and point the settings at it: RAYLANE_FLEET at the fleet with each cluster's
    reach, the Ray settings at its first cluster (owned first): the attached one,
    whose dashboard the proxy and node views show. Jobs are placed across every
    cluster (services.fleetdispatch, docs/fleet.md)."""
    import yaml

    from raylane.orchestrator.domain.fleet import Fleet
    from raylane.orchestrator.tooling.localfleet import LocalFleet

    local = LocalFleet(Fleet.load(settings.fleet), settings.data_dir / "fleet", source=settings.fleet)
    names = ", ".join(f"{m.name} ({m.tier})" for m in local.fleet.members)
    print(f"Starting the local fleet {local.fleet.name}: {names}...", flush=True)
    fleet = local.up(owned=True)
    first = next(iter(local.clusters))
    state = local.clusters[first].state
    settings.fleet = str(local.reach_file)
    settings.dashboard_url = state.dashboard_url
    settings.ray_address = state.gcs_address
    settings.ray_auth_token = state.token
    # The server routes and admits by the attached cluster's groups (RAYLANE_PROFILE).
    profile_path = local.clusters[first].dir / "profile.yaml"
    profile_path.write_text(yaml.safe_dump(fleet.cluster(first).profile.model_dump(), sort_keys=False))
    settings.profile = profile_path
    print(f"Jobs are placed across the fleet's clusters; {first} ({fleet.cluster(first).tier}) is the one the "
          "dashboard proxy and node views show.", flush=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    return local


def _serve_workers(settings: Settings, base: str) -> None:
    """``settings.workers`` uvicorn processes on one port, each building its app from
    the environment (``create_app`` as a factory). What this process settled (the local
    cluster's addresses) goes to them through the environment; the schema is
    migrated here, once, not by each worker at the same moment."""
    import os

    from raylane.orchestrator.services.controlplane import ControlPlane

    if settings.auto_migrate:
        plane = ControlPlane(settings)
        try:
            plane.migrate()
        finally:
            plane.close()
    settled = {"RAYLANE_AUTO_MIGRATE": "false", "RAYLANE_DASHBOARD_URL": settings.dashboard_url,
               "RAYLANE_RAY_ADDRESS": settings.ray_address, "RAYLANE_PROFILE": settings.profile,
               "RAYLANE_FLEET": settings.fleet}
    if settings.session_secret is None:
        # A browser's session cookie must verify on whichever worker its next request
        # reaches: one secret for all of them (each would otherwise draw its own).
        import secrets

        settled["RAYLANE_SESSION_SECRET"] = secrets.token_urlsafe(32)
    token = settings.ray_auth_token
    if token is not None:
        settled["RAYLANE_RAY_AUTH_TOKEN"] = token.get_secret_value() if hasattr(token, "get_secret_value") else token
    os.environ.update({k: str(v) for k, v in settled.items() if v is not None})
    print(f"Raylane API:        {base}  ({settings.workers} worker processes)\nAPI docs:           {base}/docs",
          flush=True)
    uvicorn.run("raylane.api.app:create_app", factory=True, workers=settings.workers, host=settings.host,
                port=settings.port, log_level=settings.log_level.lower(), access_log=False, log_config=None,
                timeout_graceful_shutdown=10)


def _announce(base: str, cp) -> None:
    lines = [f"Raylane API:        {base}", f"API docs:           {base}/docs",
             f"Database:           {cp.engine.url.render_as_string(hide_password=True)}"]
    if cp.dashboard_url:
        lines.append(f"Ray dashboard:      {base}/ray/  (read-only, per project; sign in at {base}/ui)")
        lines.append(f"Ray's own:          {cp.dashboard_url}  (Ray's token: operators only)")
    print("\n".join(lines), flush=True)
