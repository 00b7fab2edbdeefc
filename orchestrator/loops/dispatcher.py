"""The dispatcher: admit queued jobs (the scheduler's rules, ``loops.admission``),
claim them with a lease (``store.queue``), and submit each attempt to Ray's Jobs API.

Claiming is one transaction (``FOR UPDATE SKIP LOCKED`` on PostgreSQL, so several
control planes split the queue); submission happens after commit with
``submission_id = raylane-<job id>-<attempt>``. If the process dies between
Ray accepting the job and our write, the lease expires, a dispatcher re-submits
the same id, Ray answers "already exists", and we adopt it: one Ray job, not two.

While Ray cannot be reached nothing is admitted: the outage is recorded in the
backend's ``reachability`` (one warning when it begins), and every queued job
says "Ray cluster unreachable since <start>", written once per job per outage.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from raylane.orchestrator import logcontext
from raylane.orchestrator.backends.base import AlreadySubmitted, RayBackend, RayUnavailable
from raylane.orchestrator.backends.reachability import unreachable_reason
from raylane.orchestrator.domain import fairshare, protocol
from raylane.orchestrator.domain.errors import StoreFailed
from raylane.orchestrator.domain.ids import submission_id
from raylane.orchestrator.domain.kinds import traits
from raylane.orchestrator.domain.lanes import env_of as lane_env_of
from raylane.orchestrator.domain.packages import package_sha
from raylane.orchestrator.loops import admission
from raylane.orchestrator.loops.base import LoopService
from raylane.orchestrator.domain.profile import Profile
from raylane.orchestrator.domain.views import Placement
from raylane.orchestrator.domain.routing import ClusterView
from raylane.orchestrator.settings import Settings
from raylane.orchestrator.domain.specs import ARRAY_INDEX_LABEL, ARRAY_LABEL, JobSpec
from raylane.orchestrator.domain.states import JobStatus
from raylane.orchestrator.domain.policy import state_excludes
from raylane.orchestrator.store import db, dependencies as store_dependencies, lifecycle, packages as store_packages, queue
from raylane.orchestrator.store import fairshare as store_fairshare, quotas as store_quotas, sharing as store_sharing
from raylane.orchestrator.store import stats
from raylane.orchestrator.store.fleet import Scope
from raylane.orchestrator.store.queue import Claimed
from raylane.orchestrator.store.transitions import utcnow

log = logging.getLogger(__name__)

# How long a dispatcher keeps the fair-share usage it read (``store.fairshare``, a scan of
# the attempts of the last ten half-lives), by the store's clock: usage decays over hours,
# so a reading half a minute old orders the queue as a fresh one would.
FAIR_SHARE_KEPT_S = 30.0


def job_storage(storage_root: str | Path, project: str, job_id: str) -> str:
    """One job's storage under the root: ``<root>/<project>/<job id>``, a URI or a path."""
    root = str(storage_root)
    return f"{root.rstrip('/')}/{project}/{job_id}" if "://" in root else str(Path(root) / project / job_id)


def runner_env(job_id: str, attempt: int, project: str, spec: JobSpec, placement: Placement,
               storage_root: str | Path, *, storage_endpoint: str | None = None,
               serve_json: str | None = None, parents_json: str | None = None) -> dict[str, str]:
    """The attempt's inputs under the runner protocol's names (``protocol.Env``)."""
    return protocol.runner_env(job_id=job_id, attempt=attempt, project=project,
                               spec_json=spec.model_dump_json(exclude_none=True),
                               placement_json=placement.model_dump_json(),
                               storage=job_storage(storage_root, project, job_id),
                               storage_endpoint=storage_endpoint, serve_json=serve_json,
                               array=(spec.labels[ARRAY_LABEL], spec.labels.get(ARRAY_INDEX_LABEL, ""))
                               if ARRAY_LABEL in spec.labels else None, parents_json=parents_json)


def runtime_env_for(spec: JobSpec, env: dict[str, str], *, storage_env: dict[str, str],
                    data_dir: Path) -> tuple[dict[str, Any], str | None, dict[str, str]]:
    """An attempt's Ray runtime env, its entrypoint, and the environment every
    process of the job gets (a warm lane's item carries it with ``env``): pure,
    from the spec, the runner's inputs ``env`` (``runner_env``) and the settings.

    The entrypoint is the spec's own for a kind without a runner (its inputs in
    its env vars), else None: the runner's driver command, built once its inputs
    are in Ray's store (``Dispatcher._submit_ray_job``)."""
    # Storage credentials reach every process of the job (a trial or a training
    # worker writes its own checkpoints); the job's own env_vars win over them.
    job_env = {**storage_env, **spec.runtime_env.env_vars}
    if traits(spec.kind).runner is None:
        runtime_env: dict[str, Any] = {"env_vars": {**job_env, **env}}
        entrypoint: str | None = spec.entrypoint
    else:
        # The runner's inputs go to the driver alone, not into runtime_env (see
        # protocol's docstring: workers keep one runtime env), through Ray's KV
        # store, written once Ray is known to be reachable.
        # ... but for the few its user code reads in every process (its trials, its
        # actors): parents and array index (protocol.WORKER_ENV), only for jobs that
        # have them. Those stay in Ray's job info (its dashboard shows them) while
        # Ray keeps the job, as the spec's own env_vars do.
        job_env = {**job_env, **protocol.worker_env(env)}
        runtime_env = {"env_vars": job_env} if job_env else {}
        entrypoint = None
    if spec.runtime_env.working_dir:
        runtime_env["working_dir"] = spec.runtime_env.working_dir
    if spec.runtime_env.pip:
        runtime_env["pip"] = spec.runtime_env.pip
    if spec.runtime_env.py_modules:
        runtime_env["py_modules"] = spec.runtime_env.py_modules
    excludes = state_excludes(spec, data_dir)
    if excludes:
        runtime_env["excludes"] = excludes  # never ship the control plane's own state
    return runtime_env, entrypoint, job_env


class Dispatcher(LoopService):
    name = "dispatcher"

    def __init__(self, settings: Settings, sessions, backend: RayBackend, profile: Profile, *,
                 wake=None, owner: str | None = None, lanes=None, scope: Scope | None = None,
                 tier: str | None = None, scale_ahead: int | None = None):
        super().__init__(settings.dispatch_interval_s, wake)
        # One cluster of a fleet (store.fleet.Scope): only jobs nominated to it are
        # admitted here, its attempts record it, and attempts given up with it are
        # stopped there before anything new is submitted (``fence``). None: the
        # deployment's one cluster, every job.
        self.scope = scope
        self.tier = tier
        # Jobs submitted ahead of a scale-up per group (None: RAYLANE_AUTOSCALE_AHEAD_JOBS).
        self.scale_ahead = settings.autoscale_ahead_jobs if scale_ahead is None else scale_ahead
        self.settings = settings
        self.sessions = sessions
        self.backend = backend
        # backends.lanes.LaneBackend: attempts whose placement names a lane go there
        self.lanes = lanes
        if lanes is not None and getattr(lanes, "to_ray_env", False) is None:
            lanes.to_ray_env = self._lane_env_to_ray  # a lane env's hosts start in its packages, as a Ray job would
        self._touched: dict[str, float] = {}  # package sha -> when a lane job last marked it used (monotonic)
        self.profile = profile
        self.owner = owner or f"{socket.gethostname()}:{os.getpid()}"
        # Outside data_dir (Settings refuses otherwise): jobs write here, from any node.
        self.storage_root = settings.resolved_storage_uri
        # A test hook: called after Ray accepted an attempt, before our write.
        self.after_submit_hook = None
        self.on_submitted = None
        self._inputs_on_command_line = False  # warned that no GCS takes the inputs
        self._fair: tuple[datetime, fairshare.Standing] | None = None  # (read at, usage): ``fair_share``

    # Admission + claim -----------------------------------------------------

    def rules(self) -> admission.Rules:
        return admission.Rules(self.settings.max_concurrent_drivers, self.settings.starvation_skips,
                               self.scale_ahead,
                               fast_lane=self.settings.fast_lane and self.lanes is not None and self.lanes.usable(),
                               queue_ahead=self.settings.queue_ahead_jobs, driver_scale_ahead=self.scope is not None,
                               preemption=self.settings.preemption, preempt_min_run_s=self.settings.preempt_min_run_s)

    def _decide(self, s, view: ClusterView, rules: admission.Rules, now, queued: list[queue.Queued]):
        """Admission's decisions for ``queued`` (in its order), from what the session reads now."""
        scope = self.scope
        used, drivers = stats.used_by_active(s, scope)
        limits = store_quotas.load_limits(s)  # (project, group) -> quota; most projects have none
        project_used = store_quotas.usage(s, scope=scope) if limits else {}
        ahead = stats.ahead_by_group(s, scope) if rules.scale_ahead else {}
        waiting, waiting_need = stats.waiting_by_group(s, scope) if rules.queue_ahead else ({}, {})
        unplaced = stats.unplaced_gpus(s, now, scope) if any(st.node_free is not None for st in view.values()) else {}
        grace = self.settings.preempt_grace_s
        stopping, cycles, reclaiming = {}, {}, {}
        window = max(self.settings.preempt_cycle_window_s, store_sharing.RECLAIM_HOLD_S)
        if rules.preemption and store_sharing.any_since(s, since=now - timedelta(seconds=window), scope=scope):
            stopping = store_sharing.preempting(s, grace_s=grace, scope=scope)
            cycles = store_sharing.preempted_by(s, since=now - timedelta(seconds=self.settings.preempt_cycle_window_s))
            reclaiming = store_sharing.reclaiming(s, now=now, scope=scope)
        return stopping, admission.decide(
            queued, view, self.profile, rules, used=used, drivers=drivers, limits=limits, project_used=project_used,
            ahead=ahead, waiting=waiting, waiting_need=waiting_need, unplaced=unplaced,
            holders=lambda: store_sharing.holders(s, grace_s=grace, scope=scope),
            preempting=stopping, preempted_by=cycles, reclaiming=reclaiming, now=now)

    def preview(self, view: ClusterView, spec: JobSpec, placement: Placement, project: str):
        """What admission would decide for a job submitted now (``POST /v1/plan``):
        the queue's head as it is, the job after those of its priority or higher.
        Writes nothing."""
        probe = queue.Queued(id="(this job)", project=project, status=JobStatus.PENDING, status_reason=None,
                             spec=spec, placement=placement, attempts=0, skips=0, preemptions=0, created_at=utcnow())
        with db.read(self.sessions) as s:
            now = utcnow()
            head = queue.queued(s, now=now, scope=self.scope)
            order = fairshare.order([j for j in head if j.spec.priority >= spec.priority] + [probe] +
                                    [j for j in head if j.spec.priority < spec.priority], self.fair_share(now))
            _, decisions = self._decide(s, view, self.rules(), now, order)
        return next((d for d in decisions if d.job is probe), None)

    def claim(self, view: ClusterView) -> list[Claimed]:
        """One pass, one transaction: take over stale leases, then admit what fits."""
        rules = self.rules()
        standing = self.fair_share(utcnow())  # before the pass's transaction: it may scan
        with db.transaction(self.sessions) as s:
            # The pass's time once its transaction has begun (SQLite: BEGIN IMMEDIATE, after
            # every write it waited for): taken before, a member an ending member released
            # while this pass waited was stamped DISPATCHING before that member's end.
            s.connection()
            now = utcnow()
            lease_until = now + timedelta(seconds=self.settings.lease_s)
            scope = self.scope
            claimed = queue.take_stale_leases(s, owner=self.owner, now=now, lease_until=lease_until, scope=scope)
            waits: list[tuple[queue.Queued, str]] = []
            admitted: list[queue.Admission] = []
            queued = fairshare.order(queue.queued(s, now=now, scope=scope), standing)
            stopping, decisions = self._decide(s, view, rules, now, queued)
            for d in decisions:
                if isinstance(d, admission.Fail):
                    queue.fail_unroutable(s, d.job, d.message, now=now)
                elif isinstance(d, admission.Wait):
                    waits.append((d.job, d.reason))
                elif isinstance(d, admission.Preempt):
                    store_sharing.request(s, d.job.id, d.victims, now=now)
                    log.info("preempting %s for job %s", ", ".join(f"{v.holder.job_id} ({v.why})" for v in d.victims),
                             d.job.id)
                    waits.append((d.job, d.reason))
                else:
                    pl = d.placement
                    if scope is not None and pl.cluster != scope.name:  # its attempt records where it runs
                        pl = pl.model_copy(update={"cluster": scope.name, "tier": self.tier})
                    admitted.append(queue.Admission(d.job, pl, d.passed_over, d.scale_up, d.queued))
            claimed += queue.admit_many(s, admitted, owner=self.owner, now=now, lease_until=lease_until)
            store_sharing.withdraw(s, [a.job.id for a in admitted if a.job.id in stopping], now=now)
            queue.set_waiting(s, waits, now=now)
        for a in admitted if standing is not None else ():  # (committed: the next passes order by them too)
            standing.admit(a.job.project, a.placement.node_group, a.placement.total)
        return claimed

    def fair_share(self, now: datetime) -> fairshare.Standing | None:
        """Every project's decayed usage per node group (``domain.fairshare``), read
        at most every ``FAIR_SHARE_KEPT_S`` (the store's clock, so a clock that moves
        back reads again), plus what the jobs admitted since will add (``claim`` counts
        them in); None while fair share is off (RAYLANE_FAIR_SHARE_HALF_LIFE_S 0)."""
        half_life = self.settings.fair_share_half_life_s
        if half_life <= 0:
            return None
        if self._fair is None or not 0 <= (now - self._fair[0]).total_seconds() < FAIR_SHARE_KEPT_S:
            with db.read(self.sessions) as s:
                used = store_fairshare.usage(s, now=now, half_life_s=half_life)
            groups = self.profile.groups
            self._fair = (now, fairshare.Standing.of(used, {g.name for g in groups if g.gpus > 0},
                                                     {g.name for g in groups}))
        return self._fair[1]

    # Submit ------------------------------------------------------------------

    def _lane_env_to_ray(self, runtime_env: dict[str, Any]) -> dict[str, Any]:
        """``_packages_to_ray`` for the warm lanes, which know no store: a database
        failure reading a package is ``StoreFailed`` (no fault of the env's)."""
        try:
            return self._packages_to_ray(runtime_env)
        except db.StoreError as e:
            raise StoreFailed(str(e).splitlines()[0] if str(e) else type(e).__name__) from e

    def _packages_to_ray(self, runtime_env: dict[str, Any]) -> dict[str, Any]:
        """Uploaded packages (``raylane://packages/<sha256>``) become Ray URIs,
        handed to Ray's package store on first use, and are marked used so the
        sweep keeps them while a job may still be retried."""
        def to_ray(value: str) -> str:
            sha = package_sha(value)
            if sha is None:
                return value
            with db.transaction(self.sessions) as s:
                store_packages.touch(s, sha, now=utcnow())

            def load() -> bytes | None:
                with db.transaction(self.sessions) as s:
                    return store_packages.read(s, sha)

            return self.backend.ensure_package(sha, load)

        out = dict(runtime_env)
        if out.get("working_dir"):
            out["working_dir"] = to_ray(out["working_dir"])
        if out.get("py_modules"):
            out["py_modules"] = [to_ray(m) for m in out["py_modules"]]
        return out

    def _touch_packages(self, runtime_env: dict[str, Any]) -> None:
        """A lane job's packages are marked used, as a Ray job's are at its submit
        (the sweep keeps them while it may be retried), at most once a minute per
        package: a burst of lane jobs of one package makes one write, not one each.
        Handing them to Ray is its hosts' start's (``LaneBackend.to_ray_env``)."""
        now = time.monotonic()
        values = ([runtime_env["working_dir"]] if runtime_env.get("working_dir") else []) + \
            list(runtime_env.get("py_modules") or [])
        shas = [sha for v in values if (sha := package_sha(v)) and now - self._touched.get(sha, -1e9) > 60.0]
        if not shas:
            return
        with db.transaction(self.sessions) as s:
            for sha in shas:
                store_packages.touch(s, sha, now=utcnow())
        if len(self._touched) > 1024:  # a package per job for months: only the last minute's matter
            self._touched = {k: t for k, t in self._touched.items() if now - t <= 60.0}
        self._touched.update({sha: now for sha in shas})

    def submit(self, c: Claimed, recorded_later: list | None = None) -> None:
        """Hand the attempt to Ray (or its warm lane) and record it as submitted.
        ``recorded_later``: a lane attempt's record is appended there instead, for
        ``record_submitted`` to write with the pass's others in one transaction."""
        sid = submission_id(c.job_id, c.attempt)
        spec, pl = c.spec, c.placement
        metadata = {"raylane_job_id": c.job_id, "raylane_project": c.project, "raylane_kind": spec.kind.value,
                    "raylane_node_group": pl.node_group, "raylane_attempt": str(c.attempt), "raylane_name": spec.name,
                    # The user's own entrypoint, beside the runner's wrapper in Ray's dashboard.
                    "raylane_entrypoint": spec.entrypoint[:protocol.SHOWN_MAX_CHARS]}
        if pl.cluster:  # a fleet's cluster (docs/fleet.md): Ray's dashboard says where the job was placed
            metadata["raylane_cluster"] = pl.cluster
        parents = None
        if spec.depends_on:  # its parents' results and storage, by reference (store.dependencies)
            with db.transaction(self.sessions) as s:
                parents = store_dependencies.parents_json(
                    s, c.job_id, storage=lambda project, pid: job_storage(self.storage_root, project, pid))
        env = runner_env(c.job_id, c.attempt, c.project, spec, pl, self.storage_root,
                         storage_endpoint=self.settings.storage_endpoint_url,
                         serve_json=self.profile.serve.model_dump_json() if spec.kind.value == "service" else None,
                         parents_json=parents)
        runtime_env, entrypoint, job_env = runtime_env_for(spec, env, storage_env=self.settings.storage_env,
                                                           data_dir=self.settings.data_dir)
        try:
            if pl.lane and self.lanes is not None:
                # A warm lane's host runs it: no Ray job, the same inputs (domain.lanes).
                lane_env = lane_env_of(spec) if pl.lane_env else None
                if lane_env:
                    self._touch_packages(lane_env)
                self.lanes.submit(submission_id=sid, group=pl.lane, command=spec.entrypoint, env={**job_env, **env},
                                  args=spec.args if traits(spec.kind).runner else None,
                                  cpus=float(pl.total.get("CPU", 0.0)), lane_env=pl.lane_env, runtime_env=lane_env,
                                  metadata=metadata)
                note = f"queued in the warm lane of group {pl.lane}" + (f", lane env {pl.lane_env}" if pl.lane_env else "")
            else:
                note = self._submit_ray_job(c, sid, env, entrypoint, runtime_env, metadata)
        except AlreadySubmitted:
            where = "the warm lane" if pl.lane and self.lanes is not None else "Ray"
            note = f"{where} already had this attempt (a retried dispatch); adopted it"
        except RayUnavailable as e:
            # Keep the claim: the attempt is submitted again with the same id once Ray
            # answers (``run_once`` says why it waits and lets its lease go at once).
            self.backend.reachability.down(e)  # warns once per outage, not once per attempt
            log.info("submit %s: %s; submitted again when Ray answers", sid, e)
            raise
        except Exception as e:
            if db.is_transient(e):
                # The database was unavailable while reading or marking the job's uploaded
                # package (``_packages_to_ray``): nothing is wrong with the job. As for Ray
                # out of reach, the claim stays and the attempt is submitted again when its
                # lease expires, with the same id (Ray adopts one it already had). Any other
                # error, a database's included, refuses the job: tried again it fails again.
                log.warning("submit %s: the database was unavailable reading its packages (%s: %s); submitted "
                            "again when its lease expires", sid, type(e).__name__, e)
                return
            with db.transaction(self.sessions) as s:
                lifecycle.submit_refused(s, c.job_id, c.attempt, str(e))
            self.backend.forget_inputs(sid)  # no Ray job will read them; the spec's values must not linger
            return
        if self.after_submit_hook:
            self.after_submit_hook(c)
        if recorded_later is not None and pl.lane and self.lanes is not None:
            recorded_later.append((c, note))
        else:
            self.record_submitted([(c, note)])

    def record_submitted(self, submitted: list[tuple[Claimed, str]]) -> None:
        """Record attempts Ray (or a lane) accepted, in one transaction, one
        savepoint each. If the commit fails, their leases expire and the same
        attempts are dispatched again and adopted (their ids are Ray's)."""
        if not submitted:
            return
        outcomes = []
        with db.transaction(self.sessions) as s:
            for c, note in submitted:
                try:
                    with s.begin_nested():
                        outcomes.append((c, lifecycle.attempt_submitted(s, c.job_id, c.attempt, owner=self.owner,
                                                                        note=note)))
                except Exception:
                    log.exception("recording %s as submitted failed; its lease expires and it is adopted",
                                  submission_id(c.job_id, c.attempt))
        for c, recorded in outcomes:
            if recorded:
                continue
            # A cancel stopped the attempt while Ray was accepting it: no one else
            # knows this Ray job exists, so stop it here (in a lane, its keys go too:
            # the reconciler never looks at it again to forget them).
            sid = submission_id(c.job_id, c.attempt)
            log.info("%s was cancelled while being submitted; stopping it in Ray", sid)
            try:
                if c.placement.lane and self.lanes is not None:
                    self.lanes.discard(sid, group=c.placement.lane, lane_env=c.placement.lane_env)
                else:
                    self.backend.stop(sid)
            except RayUnavailable as e:
                log.warning("could not stop %s, cancelled while being submitted: %s", sid, e)
            self.backend.forget_inputs(sid)
        if self.on_submitted and any(recorded for _, recorded in outcomes):
            self.on_submitted()

    def _submit_ray_job(self, c: Claimed, sid: str, env: dict[str, str], entrypoint: str | None,
                        runtime_env: dict[str, Any], metadata: dict[str, str]) -> str:
        """Submit the attempt as a Ray job of its own; the event's note."""
        pl = c.placement
        drv = pl.driver_resources
        runtime_env = self._packages_to_ray(runtime_env)
        if entrypoint is None:
            key = self.backend.put_inputs(sid, env)
            if key is None and not self._inputs_on_command_line:
                self._inputs_on_command_line = True
                log.warning("Ray's GCS address is unknown (set RAYLANE_RAY_ADDRESS): a runner's inputs, "
                            "its spec's env values included, ride on its driver's command line")
            entrypoint = protocol.driver_command(
                env, inputs_key=key, shown=protocol.shown_entrypoint(c.spec.kind.value, c.spec.entrypoint))
        self.backend.submit(submission_id=sid, entrypoint=entrypoint, runtime_env=runtime_env, metadata=metadata,
                            entrypoint_num_cpus=drv.get("CPU", 0), entrypoint_num_gpus=drv.get("GPU", 0),
                            entrypoint_label_selector=pl.driver_label_selector)
        return "submitted to Ray" + (f"; {c.scale_up}" if c.scale_up else "")

    def fence(self) -> None:
        """A fleet's cluster that answers again: the attempts Raylane gave up on when
        it was lost (CLUSTER_LOST, placed again elsewhere since) are stopped there
        before anything new is submitted to it, so a job's effects happen once.
        Raises ``RayUnavailable`` when the cluster stops answering meanwhile."""
        with db.read(self.sessions) as s:
            given_up = lifecycle.unfenced(s, self.scope)
        if not given_up:
            return
        done = []
        for job_id, number, lane, lane_env in given_up:
            sid = submission_id(job_id, number)
            if lane and self.lanes is not None:
                self.lanes.discard(sid, group=lane, lane_env=lane_env)
            else:
                self.backend.stop(sid)  # False when Ray no longer has it: nothing runs either way
            self.backend.forget_inputs(sid)
            done.append((job_id, number))
            log.info("%s was given up when cluster %s was lost; stopped there now that it answers",
                     sid, self.scope.name)
        with db.transaction(self.sessions) as s:
            lifecycle.fenced(s, done, now=utcnow())

    def run_once(self) -> None:
        try:
            view = self.backend.cluster_view()
            if self.scope is not None:
                self.fence()
        except RayUnavailable as e:
            self.ray_unreachable(e)
            return
        lane_submitted: list[tuple[Claimed, str]] = []  # lane attempts: queued in microseconds, recorded together
        try:
            claimed = self.claim(view)
            for i, c in enumerate(claimed):
                logcontext.bind_job(c.job_id, c.attempt)  # every log line of this submit names the job
                try:
                    self.submit(c, lane_submitted)
                except RayUnavailable as e:
                    # Ray went away within this pass: no more submits (each would wait
                    # for its own timeout), and this attempt and those after it say why.
                    self.ray_unreachable(e, unsubmitted=claimed[i:])
                    break
        except BaseException:
            # Those queued before the error are recorded still, but the error raised
            # is the pass's own: a failure to record them must not take its place.
            try:
                self.record_submitted(lane_submitted)
            except Exception:
                log.exception("recording %d lane attempts after a failed pass failed too; their leases expire "
                              "and they are adopted", len(lane_submitted))
            raise
        self.record_submitted(lane_submitted)

    def ray_unreachable(self, e: RayUnavailable, unsubmitted: list[Claimed] = ()) -> None:
        """No admission without Ray's view: the queue says why, once per job per outage.
        ``unsubmitted``: attempts this pass claimed but could not hand to Ray; they
        say so too, and their leases end now, so that the first pass after Ray
        answers again submits them (same ids) instead of one a lease later."""
        reason = unreachable_reason(self.backend.reachability.down(e))
        with db.transaction(self.sessions) as s:
            now = utcnow()
            if unsubmitted:
                queue.release_unsubmitted(s, [c.job_id for c in unsubmitted], owner=self.owner,
                                          reason=f"{reason}; submitted when it answers", now=now)
            queue.wait_all(s, reason, now=now, scope=self.scope)
