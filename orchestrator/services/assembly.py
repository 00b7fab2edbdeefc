"""The assembly: the one place that wires the control plane to what runs beside
it, from settings. ``ControlPlane`` is the facade the routers call; this module
gives it its Ray cluster (a ``backends.base.RayBackend``: Ray's own, or
``raylane.orchestrator.testing.FakeRay``), the warm lanes over it, the
dispatcher and the reconciler that poll it, and the loops that need no Ray (the
webhook notifier, the schedules' scheduler); it also opens what the API needs
of the store (migrations, the auth epoch's fast reader) so ``api/`` imports
neither the store nor the backends.

One backend per cluster, passed in: nothing here is a module-level singleton,
so a second cluster is a second ``attach_backend`` on its own plane (or, for a
fleet, its own loops over its own backend).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from raylane.orchestrator.backends.base import RayBackend
from raylane.orchestrator.settings import Settings

if TYPE_CHECKING:  # pragma: no cover
    from raylane.orchestrator.domain.profile import Profile
    from raylane.orchestrator.services.controlplane import ControlPlane
    from raylane.orchestrator.store.fleet import Scope
    from raylane.orchestrator.store.epoch_reader import SQLiteEpoch

log = logging.getLogger(__name__)


def attach_backend(plane: "ControlPlane", backend: RayBackend, profile: "Profile", *,
                   scope: "Scope | None" = None, tier: str | None = None, elsewhere: bool = False) -> None:
    """Wire routing, the warm lanes, the dispatcher and the reconciler to one Ray
    cluster's backend (``scope``, ``tier``, ``elsewhere``: the attached cluster of a
    fleet, ``services.fleetdispatch``)."""
    from raylane.orchestrator.domain.routing import route
    from raylane.orchestrator.loops.dispatcher import Dispatcher
    from raylane.orchestrator.loops.reconciler import Reconciler

    settings = plane.settings
    plane.profile = profile
    plane.backend = backend
    # Always there, so attempts already in a lane are followed even with the fast lane turned off since.
    plane.lanes = lane_backend(backend, settings)
    fast_lane = settings.fast_lane
    lanes = plane.lanes
    plane.router = lambda spec: route(spec, profile, plane.cluster_view(), fast_lane=fast_lane and lanes.usable())
    plane.dispatcher = Dispatcher(settings, plane.sessions, backend, profile, wake=plane.new_work, lanes=plane.lanes,
                                  scope=scope, tier=tier)
    plane.reconciler = Reconciler(settings, plane.sessions, backend, lanes=plane.lanes, scope=scope,
                                  elsewhere=elsewhere)
    # A submitted attempt wakes the reconciler, which then polls Ray quickly.
    plane.dispatcher.on_submitted = plane.reconciler.wake.set
    # ... and an ended attempt wakes the dispatcher: a queue of short jobs does not wait a poll per batch.
    plane.reconciler.on_ended = plane.new_work.set
    plane._view_cache = None


def lane_backend(backend: RayBackend, settings: Settings):
    """One Ray cluster's warm lanes (``backends.lanes``), as the settings size them."""
    from raylane.orchestrator.backends.lanes import LaneBackend

    return LaneBackend(backend, idle_s=settings.lane_idle_s, slots=settings.lane_slots,
                       max_envs=settings.lane_max_envs)


def attach_ray(plane: "ControlPlane", dashboard_url: str, token: str | None, profile: "Profile", *,
               ray_address: str | None = None) -> None:
    """Wire the plane to a Ray cluster by its dashboard's URL.

    ``ray_address`` (the GCS, host:port) adds what only the GCS knows: which
    nodes are draining (excluded from admission; their jobs are asked to
    checkpoint). Without it Raylane sees a drained node only when it dies."""
    from raylane.orchestrator.backends.ray_jobs import RayJobsBackend

    plane.dashboard_url = dashboard_url
    gcs = None
    if ray_address:
        from raylane.orchestrator.backends.ray_gcs import RayGcs  # imports Ray's protobufs: ~0.5 s, only when used

        gcs = RayGcs(ray_address, token)
    attach_backend(plane, RayJobsBackend(dashboard_url, token, gcs=gcs), profile)


def ray_token(settings: Settings) -> str | None:
    """The Ray cluster's auth token: the setting, else Ray's own places for it."""
    from raylane.orchestrator.backends.ray_jobs import read_token

    return read_token(settings.ray_auth_token)


def attach_configured_ray(plane: "ControlPlane", settings: Settings) -> str | None:
    """The Ray cluster the settings name (``dashboard_url``, ``profile``,
    ``ray_address``), attached; its token returned (the dashboard proxy uses it)."""
    from raylane.orchestrator.domain.profile import Profile

    token = ray_token(settings)
    attach_ray(plane, settings.dashboard_url, token, Profile.load(settings.profile), ray_address=settings.ray_address)
    return token


def start_loops(plane: "ControlPlane") -> None:
    """The dispatcher and the reconciler, once the first reconcile pass has
    re-attached to every attempt Ray may be running (before anything new is dispatched)."""
    try:
        plane.reconciler.run_once()
    except Exception:
        log.exception("first reconcile pass failed; the loop will retry")
    plane.dispatcher.start()
    plane.reconciler.start()
    fd = getattr(plane, "fleet_dispatch", None)
    if fd is not None:  # a fleet's other clusters and its placer (services.fleetdispatch)
        for loop in fd.loops():
            if loop is not plane.dispatcher and loop is not plane.reconciler:
                loop.start()


def start_background(plane: "ControlPlane") -> None:
    """The loops that need no Ray: webhook deliveries and schedules."""
    from raylane.orchestrator.loops.notifier import Notifier
    from raylane.orchestrator.loops.scheduler import Scheduler

    plane.notifier = Notifier(plane.settings, plane.sessions)
    plane.notifier.start()
    plane.scheduler = Scheduler(plane.schedules, plane.settings.schedule_interval_s)
    plane.scheduler.start()


def stop_loops(plane: "ControlPlane") -> None:
    fd = getattr(plane, "fleet_dispatch", None)
    fleet_loops = [] if fd is None else [x for x in fd.loops() if x is not plane.dispatcher and x is not plane.reconciler]
    for loop in (getattr(plane, "dispatcher", None), getattr(plane, "reconciler", None), *fleet_loops,
                 plane.notifier, plane.scheduler):
        if loop is not None:
            loop.stop()


def migrate_database(settings: Settings, revision: str = "head") -> None:
    """Apply the migrations up to ``revision`` to the settings' database."""
    from raylane.orchestrator.store import migrate

    migrate.upgrade(settings.resolved_database_url, revision)


def fast_epoch_reader(plane: "ControlPlane") -> "SQLiteEpoch | None":
    """The auth epoch's reader on the event loop (SQLite only; None otherwise)."""
    from raylane.orchestrator.store.epoch_reader import SQLiteEpoch

    return SQLiteEpoch.of(plane.engine)
