"""The dispatcher: admit queued jobs (the scheduler's rules), claim them with a
lease, and submit each attempt to Ray's Jobs API.

Admission (``admit``), per pass, in priority order then age:
- the head-node guard: at most ``max_concurrent_drivers`` jobs hold a driver;
- a job is admitted when its node group has room: the group's live capacity
  (Ray's node list, draining nodes excluded) minus what Raylane's active jobs
  hold there (dispatched or running), for the whole gang (training, commands,
  services) or for one worker (sweeps and batch jobs, which scale into what is free);
- a job whose project would exceed its quota in the group (GPUs, CPUs,
  concurrent jobs; ``store.quotas``) waits with "project quota reached: ...";
  it does not count as passed over, so it never reserves a group;
- a job that does not fit keeps its reason ("waiting for 2 GPUs in group gpu: 0
  free"); lower-priority jobs may backfill past it, but once it has been passed
  over ``starvation_skips`` times its group is reserved for it until it fits.

Claiming is one transaction (``FOR UPDATE SKIP LOCKED`` on PostgreSQL, so several
control planes split the queue); submission happens after commit with
``submission_id = raylane-<job id>-<attempt>``. If the process dies between
Ray accepting the job and our write, the lease expires, a dispatcher re-submits
the same id, Ray answers "already exists", and we adopt it: one Ray job, not two.
"""

from __future__ import annotations

import json
import logging
import os
import socket
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import func, insert, or_, select, update

from raylane.orchestrator import logcontext
from raylane.orchestrator.backends.ray_jobs import AlreadySubmitted, RayJobsBackend, RayUnavailable
from raylane.orchestrator.domain import protocol
from raylane.orchestrator.domain.ids import submission_id
from raylane.orchestrator.loops.base import LoopService
from raylane.orchestrator.domain.profile import Profile
from raylane.orchestrator.domain.views import Placement
from raylane.orchestrator.domain.routing import ClusterView, Unroutable, route
from raylane.orchestrator.settings import Settings
from raylane.orchestrator.domain.specs import JobKind, JobSpec
from raylane.orchestrator.domain.states import ACTIVE, FailureCause, JobStatus
from raylane.orchestrator.domain.policy import state_excludes
from raylane.orchestrator.store import db, quotas as store_quotas
from raylane.orchestrator.store.tables import attempts, jobs
from raylane.orchestrator.store.transitions import record_event, transition, utcnow

log = logging.getLogger(__name__)

CLAIM_BATCH = 200  # queued jobs looked at per pass; the rest wait for the next
ELASTIC_KINDS = frozenset({JobKind.SWEEP, JobKind.BATCH_INFERENCE})
MAX_INFRA_RETRIES = 10  # preemptions etc. beyond max_attempts before we give up


@dataclass
class Claimed:
    job_id: str
    attempt: int
    spec: JobSpec
    placement: Placement
    project: str


def _fmt(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:.2f}".rstrip("0").rstrip(".")


def needed(spec: JobSpec, placement: Placement) -> dict[str, float]:
    """What must be free to admit the job: the whole gang, or one worker of an elastic job."""
    if spec.kind in ELASTIC_KINDS:
        need = dict(placement.worker_resources)
        if placement.driver_label_selector == placement.label_selector:
            need["CPU"] = need.get("CPU", 0) + spec.resources.driver_cpus
        return need
    return dict(placement.total)


def shortfall(need: dict[str, float], free: dict[str, float], group: str) -> str | None:
    for res, label in (("GPU", "GPUs"), ("CPU", "CPUs"), ("memory", "bytes of memory")):
        want = need.get(res, 0)
        have = free.get(res, 0)
        if want > 1e-9 and want > have + 1e-9:
            if res == "memory":
                return f"waiting for {want / 1024**3:.1f} GB memory in group {group}: {max(have, 0) / 1024**3:.1f} GB free"
            return f"waiting for {_fmt(want)} {label} in group {group}: {_fmt(max(have, 0))} free"
    return None


def used_by_active(session) -> tuple[dict[str, dict[str, float]], int]:
    """Resources Raylane's active jobs hold per node group, and how many drivers run."""
    used: dict[str, dict[str, float]] = {}
    n = 0
    for group, placement in session.execute(
        select(jobs.c.node_group, jobs.c.placement).where(jobs.c.status.in_([s.value for s in ACTIVE]))
    ):
        n += 1
        if not placement:
            continue
        g = used.setdefault(group, {})
        for k, v in (placement.get("total") or {}).items():
            g[k] = g.get(k, 0) + v
        drv = placement.get("driver_label_selector", {}).get("ray.io/node-group")
        if drv and drv != group:
            d = used.setdefault(drv, {})
            for k, v in (placement.get("driver_resources") or {}).items():
                d[k] = d.get(k, 0) + v
    return used, n


def runner_env(job_id: str, attempt: int, project: str, spec: JobSpec, placement: Placement,
               storage_root: Path) -> dict[str, str]:
    """The attempt's inputs under the runner protocol's names (``protocol.Env``)."""
    return protocol.runner_env(job_id=job_id, attempt=attempt, project=project,
                               spec_json=spec.model_dump_json(exclude_none=True),
                               placement_json=placement.model_dump_json(),
                               storage=str(storage_root / project / job_id))


class Dispatcher(LoopService):
    name = "dispatcher"

    def __init__(self, settings: Settings, sessions, backend: RayJobsBackend, profile: Profile, *,
                 wake=None, owner: str | None = None):
        super().__init__(settings.dispatch_interval_s, wake)
        self.settings = settings
        self.sessions = sessions
        self.backend = backend
        self.profile = profile
        self.owner = owner or f"{socket.gethostname()}:{os.getpid()}"
        self.storage_root = (settings.data_dir / "storage").resolve()
        # A test hook: called after Ray accepted an attempt, before our write.
        self.after_submit_hook = None
        self.on_submitted = None

    # Admission + claim -----------------------------------------------------

    def claim(self, view: ClusterView) -> list[Claimed]:
        now = utcnow()
        lease_until = now + timedelta(seconds=self.settings.lease_s)
        claimed: list[Claimed] = []
        with db.transaction(self.sessions) as s:
            # 1. Attempts whose dispatcher died mid-submit: same attempt, same id, again.
            stale = select(jobs.c.id, jobs.c.attempts, jobs.c.spec, jobs.c.placement, jobs.c.project).where(
                jobs.c.status == JobStatus.DISPATCHING.value, jobs.c.lease_owner.is_not(None),
                jobs.c.lease_expires_at < now,
            ).limit(CLAIM_BATCH)
            if s.bind.dialect.name == "postgresql":
                stale = stale.with_for_update(skip_locked=True)
            for jid, n, spec, placement, project in s.execute(stale).all():
                s.execute(update(jobs).where(jobs.c.id == jid, jobs.c.status == JobStatus.DISPATCHING.value)
                          .values(lease_owner=self.owner, lease_expires_at=lease_until))
                claimed.append(Claimed(jid, n, JobSpec.model_validate(spec), Placement.model_validate(placement),
                                       project))

            # 2. New admissions.
            used, drivers = used_by_active(s)
            limits = store_quotas.load_limits(s)  # (project, group) -> quota; most projects have none
            project_used = store_quotas.usage(s) if limits else {}
            q = select(jobs).where(
                jobs.c.status.in_([JobStatus.PENDING.value, JobStatus.RETRYING.value]),
                or_(jobs.c.not_before.is_(None), jobs.c.not_before <= now),
            ).order_by(jobs.c.priority.desc(), jobs.c.id).limit(CLAIM_BATCH)
            if s.bind.dialect.name == "postgresql":
                q = q.with_for_update(skip_locked=True)
            reserved: set[str] = set()  # groups held for a starving job this pass
            passed_over: dict[str, list[Any]] = {}
            for row in s.execute(q).mappings().all():
                spec = JobSpec.model_validate(row["spec"])
                placement = Placement.model_validate(row["placement"]) if row["placement"] else None
                try:
                    placement = self._maybe_reroute(spec, row, placement, view)
                except Unroutable as e:
                    transition(s, row["id"], JobStatus.FAILED, reason=f"can never run: {e.message}", actor="scheduler",
                               values={"failure_cause": FailureCause.UNSCHEDULABLE.value, "finished_at": now})
                    continue
                group = placement.node_group
                reason = None
                key = (row["project"], group)
                over_quota = store_quotas.over_quota(limits.get(key), project_used.get(key), placement.total,
                                                     project=row["project"], group=group) if key in limits else None
                if drivers >= self.settings.max_concurrent_drivers:
                    reason = f"head-node guard: {drivers} jobs already hold a driver (max {self.settings.max_concurrent_drivers})"
                elif over_quota is not None:
                    reason = over_quota
                elif group in reserved:
                    reason = f"waiting: group {group} is reserved for an older job that has waited longest"
                else:
                    free = self._free(view, used, group)
                    reason = shortfall(needed(spec, placement), free, group)
                    if reason is None and placement.driver_label_selector.get("ray.io/node-group") != group:
                        dgroup = placement.driver_label_selector["ray.io/node-group"]
                        reason = shortfall(placement.driver_resources, self._free(view, used, dgroup), dgroup)
                        if reason:
                            reason += " (for the driver)"
                if reason is not None:
                    if row["status_reason"] != reason:
                        s.execute(update(jobs).where(jobs.c.id == row["id"]).values(status_reason=reason))
                        record_event(s, row["id"], status=JobStatus(row["status"]), reason=reason, actor="scheduler")
                    if reason is over_quota:
                        # Its own project holds the room: it is not passed over by
                        # others and must not reserve the group against them.
                        continue
                    passed_over.setdefault(group, []).append(row)
                    if row["skips"] >= self.settings.starvation_skips and group not in reserved:
                        reserved.add(group)
                    continue
                # Admit: the job gets a new attempt and a lease.
                n = row["attempts"] + 1
                transition(s, row["id"], JobStatus.DISPATCHING, reason=f"admitted to {group}; attempt {n}",
                           actor="scheduler", attempt=n,
                           expected={JobStatus.PENDING, JobStatus.RETRYING},
                           values={"attempts": n, "lease_owner": self.owner, "lease_expires_at": lease_until,
                                   "node_group": group, "placement": placement.model_dump(mode="json"),
                                   "not_before": None})
                s.execute(insert(attempts).values(
                    job_id=row["id"], number=n, submission_id=submission_id(row["id"], n), node_group=group,
                    market=placement.market, status="CLAIMED", resources=placement.total, created_at=now))
                for k, v in placement.total.items():
                    used.setdefault(group, {})[k] = used.get(group, {}).get(k, 0) + v
                drivers += 1
                if key in limits:
                    project_used.setdefault(key, store_quotas.Usage()).add(placement.total)
                # Everyone of lower priority order that waited in this group was passed over by a later job.
                for other in passed_over.get(group, []):
                    s.execute(update(jobs).where(jobs.c.id == other["id"]).values(skips=jobs.c.skips + 1))
                passed_over[group] = []
                claimed.append(Claimed(row["id"], n, spec, placement, row["project"]))
        return claimed

    def _free(self, view: ClusterView, used, group: str) -> dict[str, float]:
        total = view.get(group).total if view.get(group) else {}
        u = used.get(group, {})
        return {k: total.get(k, 0) - u.get(k, 0) for k in ("CPU", "GPU", "memory")}

    def _maybe_reroute(self, spec: JobSpec, row, placement: Placement | None, view: ClusterView) -> Placement:
        # After repeated preemption the next attempt goes to on-demand nodes.
        avoid_spot = row["preemptions"] >= spec.retry.spot_fallback_after > 0
        if placement is None or (avoid_spot and placement.market == "SPOT"):
            return route(spec, self.profile, view, avoid_spot=avoid_spot)
        return placement

    # Submit ------------------------------------------------------------------

    def submit(self, c: Claimed) -> None:
        sid = submission_id(c.job_id, c.attempt)
        spec, pl = c.spec, c.placement
        metadata = {"raylane_job_id": c.job_id, "raylane_project": c.project, "raylane_kind": spec.kind.value,
                    "raylane_node_group": pl.node_group, "raylane_attempt": str(c.attempt), "raylane_name": spec.name}
        env = runner_env(c.job_id, c.attempt, c.project, spec, pl, self.storage_root)
        if spec.kind is JobKind.COMMAND:
            runtime_env: dict[str, Any] = {"env_vars": {**spec.runtime_env.env_vars, **env}}
            entrypoint = spec.entrypoint
        else:
            # The runner's inputs go to the driver alone, on its command line, not
            # into runtime_env (see protocol's docstring: workers keep one runtime env).
            runtime_env = {"env_vars": dict(spec.runtime_env.env_vars)} if spec.runtime_env.env_vars else {}
            entrypoint = protocol.driver_command(env)
        if spec.runtime_env.working_dir:
            runtime_env["working_dir"] = spec.runtime_env.working_dir
        if spec.runtime_env.pip:
            runtime_env["pip"] = spec.runtime_env.pip
        if spec.runtime_env.py_modules:
            runtime_env["py_modules"] = spec.runtime_env.py_modules
        excludes = state_excludes(spec, self.settings.data_dir)
        if excludes:
            runtime_env["excludes"] = excludes  # never ship the control plane's own state
        drv = pl.driver_resources
        try:
            self.backend.submit(submission_id=sid, entrypoint=entrypoint, runtime_env=runtime_env, metadata=metadata,
                                entrypoint_num_cpus=drv.get("CPU", 0), entrypoint_num_gpus=drv.get("GPU", 0),
                                entrypoint_label_selector=pl.driver_label_selector)
            note = "submitted to Ray"
        except AlreadySubmitted:
            note = "Ray already had this attempt (a retried dispatch); adopted it"
        except RayUnavailable as e:
            # Keep the claim; the lease expires and this attempt is re-submitted with the same id.
            log.warning("submit %s: %s; will retry when the lease expires", sid, e)
            return
        except Exception as e:
            with db.transaction(self.sessions) as s:
                s.execute(update(attempts).where(attempts.c.submission_id == sid).values(
                    status="FAILED", ended_at=utcnow(), cause=FailureCause.SUBMIT_ERROR.value, message=str(e)[-4000:]))
                transition(s, c.job_id, JobStatus.FAILED, reason=f"Ray refused attempt {c.attempt}: {str(e)[:500]}",
                           actor="dispatcher", attempt=c.attempt, expected={JobStatus.DISPATCHING},
                           values={"failure_cause": FailureCause.SUBMIT_ERROR.value, "finished_at": utcnow(),
                                   "lease_owner": None})
            return
        if self.after_submit_hook:
            self.after_submit_hook(c)
        with db.transaction(self.sessions) as s:
            s.execute(update(attempts).where(attempts.c.submission_id == sid, attempts.c.status == "CLAIMED")
                      .values(status="SUBMITTED"))
            s.execute(update(jobs).where(jobs.c.id == c.job_id, jobs.c.lease_owner == self.owner)
                      .values(lease_owner=None, lease_expires_at=None, status_reason=note))
        if self.on_submitted:
            self.on_submitted()

    def run_once(self) -> None:
        try:
            view = self.backend.cluster_view()
        except RayUnavailable as e:
            log.warning("dispatcher: %s", e)
            return
        for c in self.claim(view):
            logcontext.bind_job(c.job_id, c.attempt)  # every log line of this submit names the job
            self.submit(c)


def count_queued(session) -> int:
    return session.execute(select(func.count()).select_from(jobs).where(
        jobs.c.status.in_([JobStatus.PENDING.value, JobStatus.RETRYING.value]))).scalar_one()


def dumps(x) -> str:
    return json.dumps(x, sort_keys=True)
