"""The control plane's service functions: what the API (and the CLI's local
commands) call. Each opens one unit of work, calls the store, and returns
resource models. Routing happens here at submit, so a job that can never fit is
refused before it is stored.
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Callable, Sequence

from sqlalchemy import text
from sqlalchemy.engine import Engine

from orchestrator.errors import Invalid
from orchestrator.resources import Attempt, Job, JobEvent, Placement
from orchestrator.settings import Settings
from orchestrator.specs import JobSpec
from orchestrator.store import db, jobs as store_jobs, migrate

log = logging.getLogger(__name__)


class ControlPlane:
    """One per process: settings, the database, the router's inputs, and a
    "new work" signal the dispatcher waits on."""

    def __init__(self, settings: Settings, *, engine: Engine | None = None):
        self.settings = settings
        self.engine = engine or db.make_engine(settings.resolved_database_url,
                                               sqlite_synchronous=settings.sqlite_synchronous)
        self.sessions = db.make_sessionmaker(self.engine)
        # Set on every accepted submission; the dispatcher waits on it so a new
        # job is dispatched at once instead of at the next poll.
        self.new_work = threading.Event()
        # Routing hook: (spec) -> Placement | None; None until Ray/profile are wired.
        self.router: Callable[[JobSpec], Placement | None] | None = None
        self.dashboard_url: str | None = settings.dashboard_url

    # Lifecycle -------------------------------------------------------------

    def migrate(self) -> None:
        migrate.upgrade(self.settings.resolved_database_url)

    def ready(self) -> tuple[bool, str]:
        try:
            with self.engine.connect() as conn:
                conn.execute(text("SELECT 1"))
        except Exception as e:  # the database is down or unreachable
            return False, f"database unreachable: {type(e).__name__}"
        try:
            if not migrate.is_at_head(self.engine):
                return False, "database schema is not at the latest migration"
        except Exception as e:
            return False, f"migration check failed: {type(e).__name__}"
        return True, "ok"

    def close(self) -> None:
        self.engine.dispose()

    # Jobs ------------------------------------------------------------------

    def _route(self, spec: JobSpec) -> Placement | None:
        return self.router(spec) if self.router else None

    def submit(self, spec: JobSpec, *, project: str, actor: str, idempotency_key: str | None = None) -> tuple[Job, bool]:
        placement = self._route(spec)
        with db.transaction(self.sessions) as s:
            job_id, created = store_jobs.submit(s, spec, project=project, actor=actor,
                                                idempotency_key=idempotency_key, placement=placement)
            job = store_jobs.get_job(s, job_id, project=project, dashboard_url=self.dashboard_url)
        if created:
            self.new_work.set()
        return job, created

    def submit_batch(self, specs: Sequence[JobSpec], *, project: str, actor: str) -> list[str]:
        if len(specs) > self.settings.max_batch_jobs:
            raise Invalid(f"at most {self.settings.max_batch_jobs} jobs in one batch, got {len(specs)}", field="jobs")
        placements = [self._route(s) for s in specs] if self.router else None
        with db.transaction(self.sessions) as s:
            ids = store_jobs.submit_batch(s, specs, project=project, actor=actor, placements=placements)
        self.new_work.set()
        return ids

    def get(self, job_id: str, *, project: str | None) -> Job:
        with db.transaction(self.sessions) as s:
            return store_jobs.get_job(s, job_id, project=project, dashboard_url=self.dashboard_url)

    def list(self, flt: store_jobs.JobFilter, *, limit: int, cursor: str | None) -> tuple[list[Job], str | None]:
        with db.transaction(self.sessions) as s:
            return store_jobs.list_jobs(s, flt, limit=limit, cursor=cursor, dashboard_url=self.dashboard_url)

    def events(self, job_id: str, *, project: str | None, after_id: int = 0) -> list[JobEvent]:
        with db.transaction(self.sessions) as s:
            return store_jobs.list_events(s, job_id, project=project, after_id=after_id)

    def attempts(self, job_id: str, *, project: str | None) -> list[Attempt]:
        with db.transaction(self.sessions) as s:
            return store_jobs.list_attempts(s, job_id, project=project, dashboard_url=self.dashboard_url)

    def cancel(self, job_id: str, *, project: str | None, actor: str) -> tuple[Job, str]:
        with db.transaction(self.sessions) as s:
            message = store_jobs.cancel(s, job_id, project=project, actor=actor)
            job = store_jobs.get_job(s, job_id, project=project, dashboard_url=self.dashboard_url)
        self.new_work.set()  # the dispatcher/reconciler acts on cancels too
        return job, message

    def plan(self, spec: JobSpec) -> Placement:
        placement = self._route(spec)
        if placement is None:
            raise Invalid("no cluster profile is loaded; routing is unavailable")
        return placement

    def info(self) -> dict[str, Any]:
        return {"database": self.engine.dialect.name}
