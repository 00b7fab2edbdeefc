"""The control plane's service functions: what the API (and the CLI's local
commands) call. Each opens one unit of work, calls the store, and returns
resource models. Routing happens here at submit, so a job that can never fit is
refused before it is stored.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import threading
import time
from typing import TYPE_CHECKING, Any, Callable, Sequence

from raylane.orchestrator.domain.queries import DEFAULT_PROJECT
from raylane.orchestrator.domain import policy
from raylane.orchestrator.services.access import Access
from raylane.orchestrator.services.packages import Packages
from raylane.orchestrator.services.schedules import Schedules
from raylane.orchestrator.services.webhooks import Webhooks
from raylane.orchestrator.domain.errors import Conflict, Invalid, NotFound
from raylane.orchestrator.domain.queries import JobFilter
from raylane.orchestrator.domain.states import JobStatus
from raylane.orchestrator.domain.views import ArrayAction, Attempt, Job, JobArray, JobEvent, NodeGroupStatus, Placement
from raylane.orchestrator.settings import Settings
from raylane.orchestrator.domain.specs import MAX_NAME_LEN, JobSpec
from raylane.orchestrator.store import arrays as store_arrays, db, job_reads, jobs as store_jobs, lane_logs as store_lane_logs, migrate, stats
from raylane.orchestrator.store import policy as _policy  # noqa: F401 (a transition runs the registered effects)
from raylane.orchestrator.store import tokens as store_tokens
from raylane.orchestrator.store.transitions import utcnow
from raylane.orchestrator.store.groupcommit import GroupCommit

if TYPE_CHECKING:  # the store alone imports SQLAlchemy
    from raylane.orchestrator.store.db import Engine

log = logging.getLogger(__name__)

VIEW_CACHE_S = 2.0  # how stale the node-group view used for routing reasons may be
# submit_async routes on the event loop only with a view this much younger than
# VIEW_CACHE_S, so that the router, a moment later, does not find it stale and
# call Ray from the loop.
PREPARE_MARGIN_S = 0.5
# /readyz asks Ray itself only when nothing has for this long: the dispatcher lists
# Ray's nodes every pass, so with the loops running its answer is always fresher.
RAY_FRESH_S = 10.0
# PostgreSQL's group-commit writers: one batch gathers while another's statement
# and COMMIT are on the wire (1 and 2 measured alike, 4 slower: docs/benchmarks.md).
PG_WRITERS = 2


class ControlPlane:
    """One per process: settings, the database, the router's inputs, and a
    "new work" signal the dispatcher waits on. The facade the routers call;
    ``services.assembly`` wires its Ray cluster and loops."""

    def __init__(self, settings: Settings, *, engine: Engine | None = None):
        self.settings = settings
        self.engine = engine or db.make_engine(settings.resolved_database_url,
                                               sqlite_synchronous=settings.sqlite_synchronous)
        self.sessions = db.make_sessionmaker(self.engine)
        # Single submits many per commit, each answered after it (store.groupcommit):
        # on SQLite every write transaction queues for one lock and pays its own
        # fsync, and audit rows join the same commits; on PostgreSQL a batch's rows
        # go as one statement, on two writers (synchronous callers there, the CLI
        # and the loops' audit rows, write directly). With group commit off,
        # writers with a transaction each, as many as the pool's connections.
        self.writes: GroupCommit | None = None
        grouped = settings.group_commit_max_units > 1
        if grouped and self.engine.dialect.name == "sqlite":
            self.writes = GroupCommit(self.sessions, max_units=settings.group_commit_max_units)
        if self.writes is not None:
            self.async_writes = self.writes
        elif grouped:
            self.async_writes = GroupCommit(self.sessions, max_units=settings.group_commit_max_units,
                                            threads=PG_WRITERS, alone_isolated=True)
        else:
            self.async_writes = GroupCommit(self.sessions, max_units=1, threads=db.pool_size(self.engine))
        # Set on every accepted submission; the dispatcher waits on it so a new
        # job is dispatched at once instead of at the next poll.
        self.new_work = threading.Event()
        # Routing hook: (spec) -> Placement | None; None until Ray/profile are wired.
        self.router: Callable[[JobSpec], Placement | None] | None = None
        self.dashboard_url: str | None = settings.dashboard_url
        # Where a person opens Ray's dashboard: Raylane's /ray (set by the API,
        # api/rayproxy.py), so a job's link works with a Raylane token. Unset: Ray's own URL.
        self.dashboard_link: str | None = None
        self.backend = None
        self.lanes = None  # backends.lanes.LaneBackend, once Ray is attached
        self.profile = None
        self._view_cache = None
        # Identities, projects, quotas, audit (raylane.orchestrator.services.access).
        self.access = Access(settings, self.sessions)
        self.access.writes = self.writes
        # Code uploaded by clients (raylane.orchestrator.services.packages).
        self.packages = Packages(settings, self.sessions)
        # A project's subscriptions to its jobs' status changes (docs/webhooks.md).
        self.webhooks = Webhooks(settings, self.sessions, dashboard_url=lambda: self.dashboard_url)
        self.notifier = None
        # Specs run at the ticks of cron expressions (docs/schedules.md).
        self.schedules = Schedules(self)
        self.scheduler = None

    # Lifecycle -------------------------------------------------------------

    def migrate(self) -> None:
        migrate.upgrade(self.settings.resolved_database_url, quiet=True)

    def ready(self) -> tuple[bool, str]:
        try:
            db.ping(self.engine)
        except Exception as e:  # the database is down or unreachable
            return False, f"database unreachable: {type(e).__name__}"
        try:
            if not migrate.is_at_head(self.engine):
                return False, "database schema is not at the latest migration"
        except Exception as e:
            return False, f"migration check failed: {type(e).__name__}"
        return True, "ok"

    def readiness(self) -> dict[str, Any]:
        """``/readyz``: the database (can jobs be accepted?) and Ray (can they run?), each
        with ``ok`` and a ``reason``; ``status`` is ``unavailable`` without the
        database, ``degraded`` when Ray is unreachable (jobs are accepted and wait),
        else ``ok``."""
        db_ok, db_reason = self.ready()
        ray = self.ray_state()
        if not db_ok:
            status, reason = "unavailable", db_reason
        elif ray["state"] == "unreachable":
            status, reason = "degraded", f"{ray['reason']}: jobs are accepted and wait until it is back"
        else:
            status, reason = "ok", "ok"
        out = {"status": status, "reason": reason, "accepting_jobs": db_ok, "running_jobs": db_ok and ray["ok"],
               "database": {"ok": db_ok, "reason": db_reason}, "ray": ray}
        fd = getattr(self, "fleet_dispatch", None)
        if fd is not None:  # a fleet: each cluster on its own; jobs run while any one answers
            out["clusters"] = {name: {**self._reach(m.backend, m.backend.dashboard_url), "tier": m.tier,
                                      "lost": name in fd.placer.lost}
                               for name, m in fd.members.items()}
            up = [n for n, c in out["clusters"].items() if c["ok"]]
            out["running_jobs"] = db_ok and bool(up)
            down = [n for n in out["clusters"] if n not in up]
            if db_ok and down:
                out["status"] = "degraded"
                out["reason"] = (f"cluster{'s' if len(down) > 1 else ''} {', '.join(down)} unreachable: "
                                 + ("jobs are placed on the others" if up else "jobs are accepted and wait"))
        return out

    def ray_state(self) -> dict[str, Any]:
        """Ray's reachability as the backend last saw it, asked afresh when that is old."""
        from raylane.orchestrator.backends.reachability import REACHABLE, UNREACHABLE, unreachable_reason

        if self.backend is None:
            return {"ok": False, "state": "not attached", "since": None,
                    "reason": "no Ray cluster attached (RAYLANE_DASHBOARD_URL unset): jobs are queued, none run"}
        return self._reach(self.backend, self.dashboard_url)

    @staticmethod
    def _reach(backend, dashboard_url: str | None) -> dict[str, Any]:
        """One cluster's reachability as its backend last saw it, asked afresh when that is old."""
        from raylane.orchestrator.backends.reachability import REACHABLE, UNREACHABLE, unreachable_reason

        tracker = getattr(backend, "reachability", None)  # a stand-in backend may keep none
        if tracker is None:
            return {"ok": True, "state": "unknown", "since": None, "reason": "not tracked by this backend"}
        seen = tracker.now()
        if seen.checked_at is None or time.monotonic() - seen.checked_at > RAY_FRESH_S:
            backend.ping()
            seen = tracker.now()
        since = seen.since.isoformat() if seen.since else None
        if seen.state == UNREACHABLE:
            return {"ok": False, "state": seen.state, "since": since,
                    "reason": unreachable_reason(seen.since), "error": seen.error}
        return {"ok": seen.state == REACHABLE, "state": seen.state, "since": since,
                "reason": f"Ray dashboard at {dashboard_url} answers"}

    def close(self) -> None:
        if self.backend is not None:
            self.backend.close()  # its HTTP client and GCS channel
        from raylane.orchestrator.services import fleetdispatch

        fleetdispatch.close(self)  # a fleet's other clusters' backends
        if self.writes is not None:
            self.writes.close()
        self.async_writes.close()
        self.engine.dispose()

    # Jobs ------------------------------------------------------------------

    def _route(self, spec: JobSpec) -> Placement | None:
        return self.router(spec) if self.router else None

    def _route_many(self, specs: Sequence[JobSpec]) -> list[Placement] | None:
        """A batch's placements, each shape routed once (``routing.route_many``)."""
        from raylane.orchestrator.domain.routing import route_many

        return route_many(specs, self.router) if self.router else None

    def submit(self, spec: JobSpec, *, project: str, actor: str, idempotency_key: str | None = None,
               audit: Callable[[Job, bool], dict[str, Any]] | None = None) -> tuple[Job, bool]:
        """Store the job; ``audit(job, created)``: the request's audit row, written in
        the same transaction (one commit for both, instead of one each)."""
        placement = self._prepare(spec, project)
        job, created = self._write(self._submit_unit(spec, project, actor, idempotency_key, placement, audit),
                                   isolated=_refusable(spec, idempotency_key))
        if created:
            self.new_work.set()
        return job, created

    async def submit_async(self, spec: JobSpec, *, project: str, actor: str, idempotency_key: str | None = None,
                           audit: Callable[[Job, bool], dict[str, Any]] | None = None) -> tuple[Job, bool]:
        """``submit`` from the event loop. Checks and routing run on the loop when
        they need no I/O (no package to claim, Ray's view fresh in the cache),
        else in a worker thread; the unit goes to ``async_writes``."""
        if self._prepares_in_memory(spec):
            placement = self._prepare(spec, project)
        else:
            placement = await asyncio.to_thread(self._prepare, spec, project)
        job, created = await self.async_writes.run_async(
            self._submit_unit(spec, project, actor, idempotency_key, placement, audit),
            isolated=_refusable(spec, idempotency_key), committed=self._wake_if_created)
        return job, created

    def _wake_if_created(self, result: tuple[Job, bool]) -> None:
        if result[1]:
            self.new_work.set()

    def _check_fleet_pins(self, spec: JobSpec, project: str | None) -> None:
        """On a fleet: a job pinned (``placement.cluster`` / ``tier``) where its project
        may not run (a rented cluster, RAYLANE_FLEET_NO_RENT_PROJECTS) is refused at
        submit (403, the field named), not left waiting for ever."""
        if getattr(self, "fleet_dispatch", None) is None or project is None or \
                (spec.placement.cluster == "auto" and spec.placement.tier == "auto"):
            return
        from raylane.orchestrator.domain import placement as fleet_placement
        from raylane.orchestrator.services import fleetplan

        fleet_placement.place(spec, self.fleet_dispatch.fleet, None, rent=fleetplan.rent_policy(self, project))

    def _prepares_in_memory(self, spec: JobSpec) -> bool:
        # A router set without Ray (tests, the CLI's local commands) is a pure function.
        fresh = self.backend is None or (self._view_cache is not None
                                         and time.monotonic() - self._view_cache[0] < VIEW_CACHE_S - PREPARE_MARGIN_S)
        return fresh and not self.packages.names_any(spec)

    def _prepare(self, spec: JobSpec, project: str | None = None) -> Placement | None:
        policy.check(spec, self.settings)
        self._check_fleet_pins(spec, project)
        self.packages.claim_for(spec)
        return self._route(spec)

    def _submit_unit(self, spec, project, actor, idempotency_key, placement, audit):
        def unit(s):
            job, created = store_jobs.submit_view(
                s, spec, project=project, actor=actor, idempotency_key=idempotency_key, placement=placement,
                dashboard_url=self.link)
            if audit is not None:
                store_tokens.append(s, {**audit(job, created), "at": utcnow()})
            return job, created

        return unit

    def _write(self, fn, *, isolated: bool = False):
        """``fn(session)`` committed: in the next group commit (``isolated``: in a
        savepoint of its own there), or in a transaction of its own."""
        if self.writes is not None:
            return self.writes.run(fn, isolated=isolated)
        with db.transaction(self.sessions) as s:
            return fn(s)

    def submit_batch(self, specs: Sequence[JobSpec], *, project: str, actor: str,
                     texts: Sequence[str] | None = None) -> list[str]:
        """``texts``: each spec's ``model_dump_json(exclude_none=True)`` if the caller
        has it (the API, from ``check_exec_size``): stored as it is."""
        if len(specs) > self.settings.max_batch_jobs:
            raise Invalid(f"at most {self.settings.max_batch_jobs} jobs in one batch, got {len(specs)}", field="jobs")
        for i, spec in enumerate(specs):
            policy.check(spec, self.settings, where=f"jobs[{i}]")
            self._check_fleet_pins(spec, project)
            self.packages.claim_for(spec)
        placements = self._route_many(specs)
        with db.transaction(self.sessions) as s:
            ids = store_jobs.submit_batch(s, specs, project=project, actor=actor, placements=placements, texts=texts)
        self.new_work.set()
        return ids

    # Arrays ------------------------------------------------------------------

    def submit_array(self, spec: JobSpec, *, project: str, actor: str) -> JobArray:
        """An array and its members: member ``i`` is the spec named ``<name>-<i>``,
        labelled with the array and its index (``store.arrays``)."""
        if spec.array is None:
            raise Invalid("an array needs an 'array' section with its size", field="array")
        if len(f"{spec.name}-{spec.array.size - 1}") > MAX_NAME_LEN:
            raise Invalid(f"member names '<name>-<index>' must fit {MAX_NAME_LEN} characters", field="name")
        member = store_arrays.member_spec(spec, "arr_" + "0" * 16, spec.array.size - 1)
        policy.check(member, self.settings)
        self._check_fleet_pins(member, project)
        self.packages.claim_for(spec)
        placement = self._route(member)
        array_id = "arr_" + secrets.token_hex(8)
        with db.transaction(self.sessions) as s:
            store_jobs.submit_array(s, spec, array_id=array_id, project=project, actor=actor, placement=placement)
        self.new_work.set()
        return self.get_array(array_id, project=project)

    def get_array(self, array_id: str, *, project: str | None) -> JobArray:
        with db.read(self.sessions) as s:
            row = store_arrays.get(s, array_id, project=project)
            if row is None:
                raise NotFound(f"array {array_id} not found")
            counts, held = store_arrays.counts(s, array_id)
        return JobArray(**{k: row[k] for k in ("id", "project", "name", "size", "max_parallel", "created_at",
                                               "created_by")}, counts=counts, held=held)

    def cancel_array(self, array_id: str, *, project: str | None, actor: str) -> ArrayAction:
        """Cancel every unfinished member (held ones first, so none is released meanwhile)."""
        self.get_array(array_id, project=project)
        done = []
        # Queued members (held ones first, so none is released meanwhile) in one transaction:
        # 10,000 of them must not be 10,000 commits.
        with db.transaction(self.sessions) as s:
            todo = [m for m in store_arrays.members(s, array_id) if not JobStatus(m["status"]).is_terminal()]
            todo.sort(key=lambda m: not m["array_held"])
            for m in todo:
                if m["status"] in (JobStatus.PENDING.value, JobStatus.RETRYING.value):
                    store_jobs.cancel(s, m["id"], project=None, actor=actor)
                    done.append(m["id"])
        for m in todo:  # the ones on Ray: CANCELLING, the reconciler stops them
            if m["status"] not in (JobStatus.PENDING.value, JobStatus.RETRYING.value):
                try:
                    self.cancel(m["id"], project=None, actor=actor)
                    done.append(m["id"])
                except (Conflict, NotFound):
                    pass  # it ended meanwhile
        return ArrayAction(array=self.get_array(array_id, project=project), jobs=done)

    def retry_array(self, array_id: str, *, project: str | None, actor: str, failed_only: bool) -> ArrayAction:
        """New member jobs for the indices whose newest job failed (and, unless
        ``failed_only``, was cancelled)."""
        statuses = {JobStatus.FAILED.value} | (set() if failed_only else {JobStatus.CANCELLED.value})
        with db.transaction(self.sessions) as s:
            row = store_arrays.get(s, array_id, project=project)
            if row is None:
                raise NotFound(f"array {array_id} not found")
            spec = JobSpec.from_stored(row["spec"])
            placement = self._route(store_arrays.member_spec(spec, array_id, 0))
            ids = store_jobs.retry_array(s, row, statuses=statuses, actor=actor, placement=placement)
        if ids:
            self.new_work.set()
        return ArrayAction(array=self.get_array(array_id, project=project), jobs=ids)

    def get(self, job_id: str, *, project: str | None) -> Job:
        with db.read_connection(self.sessions) as conn:
            return job_reads.read_job(conn, job_id, project=project, dashboard_url=self.link)

    def list(self, flt: JobFilter, *, limit: int, cursor: str | None) -> tuple[list[Job], str | None]:
        with db.read(self.sessions) as s:
            return job_reads.list_jobs(s, flt, limit=limit, cursor=cursor, dashboard_url=self.link)

    def events(self, job_id: str, *, project: str | None, after_id: int = 0) -> list[JobEvent]:
        with db.read(self.sessions) as s:
            return job_reads.list_events(s, job_id, project=project, after_id=after_id)

    def attempts(self, job_id: str, *, project: str | None) -> list[Attempt]:
        with db.read(self.sessions) as s:
            return job_reads.list_attempts(s, job_id, project=project, dashboard_url=self.link)

    def trials(self, job_id: str, *, project: str | None, sort_by: str | None = None, mode: str = "min"):
        with db.read(self.sessions) as s:
            return job_reads.list_trials(s, job_id, project=project, sort_by=sort_by, mode=mode)

    def cancel(self, job_id: str, *, project: str | None, actor: str) -> tuple[Job, str]:
        with db.transaction(self.sessions) as s:
            message = store_jobs.cancel(s, job_id, project=project, actor=actor)
            job = job_reads.get_job(s, job_id, project=project, dashboard_url=self.link)
        if getattr(self, "reconciler", None) is not None:
            self.reconciler.wake.set()  # it stops the Ray job
        return job, message

    def plan(self, spec: JobSpec, project: str | None = None) -> Placement:
        policy.check(spec, self.settings)
        placement = self._route(spec)
        if placement is None:
            raise Invalid("no cluster profile is loaded; routing is unavailable")
        return self._preempts(spec, placement, spec.project or project or DEFAULT_PROJECT)

    def _preempts(self, spec: JobSpec, placement: Placement, project: str) -> Placement:
        """The plan, with whether a job submitted now would preempt others
        (docs/sharing.md): admission's own decision on the queue as it is."""
        dispatcher = getattr(self, "dispatcher", None)
        view = self.cluster_view() if self.backend is not None else None
        if dispatcher is None or view is None or not self.settings.preemption:
            return placement
        from raylane.orchestrator.loops.admission import Preempt

        d = dispatcher.preview(view, spec, placement, project)
        if not isinstance(d, Preempt):
            return placement
        return placement.model_copy(update={
            "preempts": [v.holder.job_id for v in d.victims],
            "reasons": [*placement.reasons, "submitting now would preempt " + ", ".join(
                f"{v.holder.job_id} ({v.holder.project}, {v.why})" for v in d.victims)
                + f" after their grace period"]})

    def info(self) -> dict[str, Any]:
        return {"database": self.engine.dialect.name}

    # Ray ---------------------------------------------------------------------

    @property
    def link(self) -> str | None:
        """The dashboard URL users are given (``dashboard_link``, else Ray's own)."""
        return self.dashboard_link or self.dashboard_url

    def cluster_view(self):
        """Ray's node groups now, cached briefly so a burst of submits makes one call."""
        from raylane.orchestrator.backends.base import RayUnavailable

        now = time.monotonic()
        if self._view_cache and now - self._view_cache[0] < VIEW_CACHE_S:
            return self._view_cache[1]
        try:
            view = self.backend.cluster_view()
        except RayUnavailable:
            view = None
        self._view_cache = (now, view)
        return view

    def _require_ray(self):
        if self.backend is None:
            raise Invalid("no Ray cluster is attached (set RAYLANE_DASHBOARD_URL or run `raylane-server serve --local-cluster`)")

    def _member(self, cluster: str | None):
        """(backend, profile, store scope) of a fleet's cluster by name (None: the
        attached one, the only one without a fleet)."""
        fd = getattr(self, "fleet_dispatch", None)
        if fd is None:
            if cluster is not None:
                from raylane.orchestrator.services import fleetplan

                here = fleetplan.attached(self)
                if cluster != here:
                    raise Invalid(f"Raylane reaches one cluster here, {here}; not {cluster!r}", field="cluster")
            return self.backend, self.profile, None
        if cluster is not None and cluster not in fd.members:
            raise Invalid(f"no cluster {cluster!r} in fleet {fd.fleet.name}; its clusters: {', '.join(fd.members)}",
                          field="cluster")
        m = fd.members[cluster or fd.attached]
        return m.backend, m.profile, m.scope

    def node_groups(self, cluster: str | None = None) -> list[NodeGroupStatus]:
        """Each node group of the cluster (a fleet's by name; None: the attached one)
        with its live nodes and what Raylane's jobs there hold."""
        self._require_ray()
        backend, profile, scope = self._member(cluster)
        if backend is self.backend:
            self._view_cache = None
            view = self.cluster_view() or {}
        else:
            from raylane.orchestrator.backends.base import RayUnavailable

            try:
                view = backend.cluster_view()
            except RayUnavailable:
                view = {}
        with db.read(self.sessions) as s:
            used, _ = stats.used_by_active(s, scope)
            counts, queued = stats.jobs_per_group(s, scope)
        out = []
        for g in profile.groups:
            st = view.get(g.name)
            out.append(NodeGroupStatus(
                name=g.name, role=g.role, market=g.market,
                accelerator=g.accelerator.model_dump() if g.accelerator else None,
                cpus_per_node=g.cpus, memory_gb_per_node=g.memory_gb, min_nodes=g.min_nodes,
                max_nodes=g.max_nodes, price_per_hour=g.price_per_hour,
                alive_nodes=st.alive_nodes if st else 0, draining_nodes=st.draining_nodes if st else 0,
                capacity=st.total if st else {}, used_by_raylane=used.get(g.name, {}),
                active_jobs=counts.get(g.name, 0), queued_jobs=queued.get(g.name, 0),
            ))
        return out

    def cluster(self, cluster: str | None = None) -> dict[str, Any]:
        self._require_ray()
        backend, profile, _ = self._member(cluster)
        nodes = backend.nodes()
        return {"dashboard_url": self.link, "profile": profile.name,
                "nodes": [{"node_id": n.node_id, "state": n.state, "node_group": n.group, "market": n.market,
                           "is_head": n.is_head, "resources": n.resources_total, "draining": n.draining,
                           "death_reason": n.death_reason} for n in nodes]}

    def logs(self, job_id: str, *, project: str | None, attempt: int | None = None) -> tuple[str, Job]:
        job = self.get(job_id, project=project)
        n = attempt or job.attempts
        if n == 0:
            return "", job
        if n > job.attempts or n < 1:
            raise Invalid(f"job has {job.attempts} attempts; there is no attempt {n}", field="attempt")
        kept = self._kept_lane_log(job_id, n)  # an ended lane attempt's (any attempt's: placements change)
        if kept is not None:
            return kept, job
        self._require_ray()
        return self._attempt_logs(job_id, n, job.placement) or "", job

    def _kept_lane_log(self, job_id: str, number: int) -> str | None:
        """An ended lane attempt's log tail, kept in the database (``store.lane_logs``)."""
        with db.read(self.sessions) as s:
            return store_lane_logs.read(s, job_id, number)

    def _attempt_logs(self, job_id: str, number: int, placement: Placement | None) -> str | None:
        """An attempt's log: its lane's tail of the output (``domain.lanes``; once
        ended, the database's copy), else Ray's driver log."""
        from raylane.orchestrator.domain.ids import submission_id

        sid = submission_id(job_id, number)
        backend, lanes = self._backends_of(job_id, number)
        if placement is not None and placement.lane and lanes is not None:
            live = lanes.logs(sid)
            return self._kept_lane_log(job_id, number) if live is None else live  # None: ended, moved
        return backend.logs(sid)

    def _backends_of(self, job_id: str, number: int):
        """The backend and the warm lanes of the cluster an attempt ran on: on a
        fleet, the one its attempt records (``services.fleetdispatch``); else the
        one cluster's."""
        fd = getattr(self, "fleet_dispatch", None)
        if fd is None:
            return self.backend, self.lanes
        cluster = next((a.cluster for a in self.attempts(job_id, project=None) if a.number == number), None)
        m = fd.member_of(cluster)
        return m.backend, m.lanes

    def progress(self, job_ids: Sequence[str]) -> dict[str, tuple[Any, int]]:
        """(status, attempts) of each existing job, unscoped: for the log
        followers, whose streams were authorised when they opened."""
        with db.read(self.sessions) as s:
            return job_reads.progress(s, job_ids)

    def attempt_log(self, job_id: str, attempt: int) -> str:
        """Ray's driver log of one attempt ("" when Ray has none), unscoped like ``progress``."""
        self._require_ray()
        placement = None
        if self.lanes is not None:  # which backend holds its log is in its placement
            with db.read(self.sessions) as s:
                placement = job_reads.get_job(s, job_id, project=None, dashboard_url=None).placement
        return self._attempt_logs(job_id, attempt, placement) or ""


def _refusable(spec: JobSpec, idempotency_key: str | None) -> bool:
    """Whether a submit may be refused inside its group-commit unit, in the
    normal course of things: a reused Idempotency-Key (with another spec: a
    conflict; racing its first submit: the unique index), or a parent that is
    gone. Such a unit gets a savepoint of its own (store.groupcommit)."""
    return idempotency_key is not None or bool(spec.depends_on)
