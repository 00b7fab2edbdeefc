"""The reconciler: fold Ray's view of each live attempt into the database.

Per pass:
- every attempt Ray may be running (SUBMITTED, PENDING, RUNNING) is looked up;
  Ray's status moves the job (DISPATCHING -> RUNNING -> SUCCEEDED / RETRYING /
  FAILED); an attempt Ray no longer knows (its head restarted without GCS fault
  tolerance) is LOST, never left RUNNING;
- a failed attempt's cause is classified (``classify``) from what Ray reports:
  the error type, the driver's exit code, and the death of its driver's node
  with that node's market label (a dead spot node is a preemption);
- the retry policy decides: another attempt after backoff, or FAILED;
- CANCELLING jobs get their Ray job stopped until Ray confirms;
- jobs past ``timeout_s`` are stopped and end FAILED with cause TIMEOUT;
- a node Ray is draining (its drain API: a spot preemption notice) gets its
  running attempts asked to checkpoint now (``_drains``): those whose driver or
  actors are on it. The event says so; the dispatcher already leaves the node's
  capacity out of admission.

On start-up the control plane runs one pass before dispatching anything new
(re-attach before new work, like Ray's own job manager).
"""

from __future__ import annotations

import logging
import re
import time
from datetime import timedelta

from sqlalchemy import select, update

from raylane.orchestrator.domain import protocol
from raylane.orchestrator import logcontext
from raylane.orchestrator.backends.ray_jobs import RayJob, RayJobsBackend, RayNode, RayUnavailable, ResultUnavailable
from raylane.orchestrator.loops.dispatcher import MAX_INFRA_RETRIES
from raylane.orchestrator.loops.base import LoopService
from raylane.orchestrator.settings import Settings
from raylane.orchestrator.domain.specs import JobSpec
from raylane.orchestrator.domain.states import INFRASTRUCTURE_CAUSES, FailureCause, JobStatus
from raylane.orchestrator.store import db
from raylane.orchestrator.store.jobs import save_trials, set_result
from raylane.orchestrator.store.tables import attempts, jobs, results
from raylane.orchestrator.store.transitions import record_event, transition, utcnow

log = logging.getLogger(__name__)

LIVE_ATTEMPT_STATES = ("SUBMITTED", "PENDING", "RUNNING")
# While attempts are live, Ray is polled this often: completion shows within
# ~25 ms on average. One GET per live attempt (or one list above LIST_THRESHOLD).
FAST_POLL_S = 0.05
LIST_THRESHOLD = 16  # above this many live attempts, one list call beats many gets
LOG_TAIL_CHARS = 4000
DRAIN_CHECK_S = 1.0  # how often the GCS is asked for draining nodes while attempts run
CHECKPOINTING_KINDS = ("training", "sweep")  # asked to checkpoint when a node of theirs drains


def classify(rj: RayJob | None, nodes: dict[str, RayNode], *, timed_out: bool = False,
             cancelled: bool = False, driver_market: str | None = None) -> tuple[FailureCause, str]:
    """Why an attempt ended badly, from what Ray reports.

    A driver whose node died is PREEMPTED when that node was spot: by its market
    label, or (Ray's node list drops a dead node's labels) by the market of the
    group the driver was placed on."""
    if rj is None:
        return FailureCause.LOST, "Ray has no record of this attempt (its head restarted without GCS fault tolerance?)"
    msg = (rj.message or "").strip()
    if cancelled:
        return FailureCause.CANCELLED, "cancelled"
    if timed_out:
        return FailureCause.TIMEOUT, "ran past timeout_s"
    node = nodes.get(rj.driver_node_id or "")
    # The job supervisor gone with its node: Ray says "died", or, when the named
    # actor is already gone by the time its job manager looks (often seconds
    # before the node itself is declared dead), "failed to get job supervisor".
    supervisor_lost = rj.error_type == "JOB_SUPERVISOR_ACTOR_DIED" or (
        rj.error_type == "JOB_SUPERVISOR_ACTOR_START_FAILURE" and "failed to get job supervisor" in msg)
    if node is not None and node.state == "DEAD" or supervisor_lost:
        market = (node.market if node is not None else None) or driver_market
        drained = node is not None and (node.drained or (node.death_reason or "").startswith("AUTOSCALER_DRAIN")
                                        or "preempt" in (node.death_message or "").lower())
        node_name = f"node {node.node_id[:12]}" if node is not None else "node"
        if market == "SPOT" or drained:
            what = "drained" if drained and market != "SPOT" else "spot"
            return FailureCause.PREEMPTED, f"driver's {what} {node_name} went away: " \
                                           f"{(node.death_message or node.death_reason or msg) if node else msg or 'node died'}"
        where = node_name if node else "its node"
        return FailureCause.NODE_LOST, f"driver's {where} died: {(node.death_message if node else msg) or msg}"[:2000]
    if rj.driver_exit_code == protocol.EXIT_VERSION_MISMATCH and protocol.VERSION_MISMATCH_MARKER in msg:
        # The nodes' Raylane is not the control plane's: the runner's own line says which is which.
        return FailureCause.RUNTIME_ENV, msg[msg.index(protocol.VERSION_MISMATCH_MARKER):].splitlines()[0]
    if rj.error_type == "RUNTIME_ENV_SETUP_FAILURE" or (
            rj.error_type == "JOB_SUPERVISOR_ACTOR_START_FAILURE" and "runtime" in msg.lower()) or \
            "is not a valid URI" in msg:
        return FailureCause.RUNTIME_ENV, msg[-LOG_TAIL_CHARS:]
    if rj.driver_exit_code in (137, -9) or "OutOfMemoryError" in msg or "out of memory" in msg.lower():
        return FailureCause.OOM, msg[-LOG_TAIL_CHARS:]
    # The driver lived, but the job died of a worker whose node died (a framework
    # that did not recover from it, e.g. a Ray Data actor lost before it started):
    # the cluster's fault, not the code's.
    m = protocol.RAY_NODE_DIED.search(msg)
    if m:
        dead = nodes.get(m.group(1))
        if dead is not None and (dead.market == "SPOT" or dead.drained):
            return FailureCause.PREEMPTED, f"a worker's spot node {m.group(1)[:12]} went away: {_tail(msg)}"
        return FailureCause.NODE_LOST, f"a worker's node {m.group(1)[:12]} died: {_tail(msg)}"
    return FailureCause.APP_ERROR, msg[-LOG_TAIL_CHARS:]


_EXC_LINE = re.compile(r"^(\w+\.)*\w*(Error|Exception|Exit|Interrupt)\b.*")


def _tail(msg: str, n: int = 3, limit: int = 400) -> str:
    """What went wrong, in one line: the exception line of the last traceback in
    the log if there is one (workers' chatter often follows it), else the last lines."""
    lines = [ln for ln in msg.strip().splitlines() if ln.strip()]
    tb = max((i for i, ln in enumerate(lines) if ln.startswith("Traceback (most recent call last)")), default=None)
    if tb is not None:
        exc = [ln for ln in lines[tb + 1:] if _EXC_LINE.match(ln)]
        if exc:
            return exc[-1][:limit]
    return " | ".join(lines[-n:])[-limit:]


def next_step(spec: JobSpec, *, cause: FailureCause, attempts_done: int, app_attempts: int) -> tuple[bool, str]:
    """(retry?, why) for a failed attempt under the spec's retry policy."""
    p = spec.retry
    if cause in (FailureCause.CANCELLED, FailureCause.TIMEOUT, FailureCause.UNSCHEDULABLE):
        return False, f"{cause.value} is not retried"
    if cause in INFRASTRUCTURE_CAUSES:
        # The cluster's fault, not the job's: retried without spending the job's attempts,
        # but bounded so a broken cluster cannot loop forever.
        if attempts_done >= p.max_attempts + MAX_INFRA_RETRIES:
            return False, f"{attempts_done} attempts; giving up on infrastructure failures"
        return True, f"{cause.value}: retrying (infrastructure failures do not count against max_attempts)"
    if cause is FailureCause.APP_ERROR and not p.retry_app_errors:
        return False, "application error; retry.retry_app_errors is off"
    if app_attempts >= p.max_attempts:
        return False, f"{app_attempts} of {p.max_attempts} attempts used"
    return True, f"{cause.value}: attempt {app_attempts} of {p.max_attempts} failed; retrying"


def backoff(spec: JobSpec, n: int) -> float:
    return min(spec.retry.backoff_s * (2 ** max(0, n - 1)), spec.retry.max_backoff_s)


class Reconciler(LoopService):
    name = "reconciler"

    def __init__(self, settings: Settings, sessions, backend: RayJobsBackend, *, wake=None):
        super().__init__(settings.reconcile_interval_s, wake)
        self.settings = settings
        self.sessions = sessions
        self.backend = backend
        self._live = 0
        self._drain_checked_at = 0.0
        self._asked: set[tuple[str, str]] = set()  # (submission id, node id) told to checkpoint

    def next_wait(self) -> float:
        # Poll Ray quickly while attempts are young or live: completion is noticed
        # within ~100 ms instead of a full interval.
        return FAST_POLL_S if self._live else self.interval

    def run_once(self) -> None:
        with db.transaction(self.sessions) as s:
            live = s.execute(
                select(attempts.c.job_id, attempts.c.number, attempts.c.submission_id, attempts.c.status,
                       attempts.c.cause, jobs.c.status.label("job_status"), jobs.c.spec, jobs.c.started_at,
                       jobs.c.attempts.label("job_attempts"), jobs.c.cancel_requested, jobs.c.placement)
                .join(jobs, jobs.c.id == attempts.c.job_id)
                .where(attempts.c.status.in_(LIVE_ATTEMPT_STATES), jobs.c.attempts == attempts.c.number)
            ).mappings().all()
            cancelling_unsubmitted = s.execute(
                select(jobs.c.id, jobs.c.attempts).where(jobs.c.status == JobStatus.CANCELLING.value)
            ).all()
        self._live = len(live)
        live_ids = {r["job_id"] for r in live}
        # A job cancelled before its attempt reached Ray: nothing to stop.
        for jid, n in cancelling_unsubmitted:
            if jid not in live_ids:
                self._cancel_unsubmitted(jid, n)
        if not live:
            return
        try:
            if len(live) > LIST_THRESHOLD:
                by_id = {j.submission_id: j for j in self.backend.list()}
                ray_jobs = {r["submission_id"]: by_id.get(r["submission_id"]) for r in live}
            else:
                ray_jobs = {r["submission_id"]: self.backend.get(r["submission_id"]) for r in live}
            nodes = None
        except RayUnavailable as e:
            log.warning("reconciler: %s", e)
            return
        try:
            self._drains(live, ray_jobs)
        except Exception:
            log.exception("reconciler: checking draining nodes failed; next pass tries again")
        now = utcnow()
        for r in live:
            logcontext.bind_job(r["job_id"], r["number"])  # every log line about this attempt names it
            rj = ray_jobs[r["submission_id"]]
            spec = JobSpec.model_validate(r["spec"])
            try:
                if JobStatus(r["job_status"]) is JobStatus.CANCELLING and (rj is None or rj.status in ("PENDING", "RUNNING")):
                    if rj is not None:
                        self.backend.stop(r["submission_id"])
                        continue
                if rj is not None and rj.status == "RUNNING" and spec.timeout_s and r["started_at"] and \
                        now - r["started_at"] > timedelta(seconds=spec.timeout_s) and r["cause"] != "TIMEOUT":
                    with db.transaction(self.sessions) as s:
                        s.execute(update(attempts).where(attempts.c.submission_id == r["submission_id"])
                                  .values(cause=FailureCause.TIMEOUT.value))
                    self.backend.stop(r["submission_id"])
                    continue
                if rj is not None and rj.status in ("PENDING",):
                    self._set_attempt(r["submission_id"], status="PENDING")
                    continue
                if rj is not None and rj.status == "RUNNING":
                    self._running(r, rj)
                    continue
                if rj is not None and rj.status == "SUCCEEDED":
                    self._succeeded(r, rj)
                    self.backend.forget_result(r["submission_id"])  # stored: Ray's copy goes
                    continue
                if nodes is None:
                    nodes = {n.node_id: n for n in self.backend.nodes()}
                self._ended_badly(r, rj, spec, nodes)
                self.backend.forget_result(r["submission_id"])  # a stopped service's last word, if any
            except RayUnavailable as e:
                log.warning("reconciler: %s", e)
                return
            except ResultUnavailable:
                pass  # the backend said why; the attempt is looked at again next pass
            except Exception:
                log.exception("reconciling %s failed; next pass tries again", r["submission_id"])

    # Draining nodes ------------------------------------------------------------

    def _drains(self, live, ray_jobs: dict[str, RayJob | None]) -> None:
        """Ask the running attempts on draining nodes to checkpoint, once per
        attempt and node (each new draining node is a new request)."""
        gcs = self.backend.gcs
        if gcs is None or time.monotonic() - self._drain_checked_at < DRAIN_CHECK_S:
            return
        self._drain_checked_at = time.monotonic()
        from raylane.orchestrator.backends.ray_gcs import GcsUnavailable  # loaded only with a GCS address

        live_sids = {r["submission_id"] for r in live}
        for sid in {sid for sid, _ in self._asked} - live_sids:
            try:
                gcs.forget_checkpoint_request(sid)  # the attempt ended
            except GcsUnavailable as e:  # a stale message harms no one; the drain check goes on
                log.warning("could not delete the checkpoint request of %s: %s", sid, e)
        self._asked = {(sid, node) for sid, node in self._asked if sid in live_sids}
        draining = self.backend.draining()
        if not draining:
            return
        # Training functions and sweep trials can act on the request; a batch run
        # rewrites its output, a command or a service has no checkpoint to save.
        running = [(r, rj) for r in live if (rj := ray_jobs.get(r["submission_id"])) and rj.status == "RUNNING"
                   and r["spec"].get("kind") in CHECKPOINTING_KINDS]
        by_ray_job = {rj.ray_job_id: r for r, rj in running if rj.ray_job_id}
        labels = {n.node_id: n for n in self.backend.nodes(draining=draining)}
        for node_id in sorted(draining):
            affected = {r["submission_id"]: r for r, rj in running if rj.driver_node_id == node_id}
            for ray_job in self.backend.actor_jobs_on(node_id) & by_ray_job.keys():
                affected.setdefault(by_ray_job[ray_job]["submission_id"], by_ray_job[ray_job])
            node = labels.get(node_id)
            where = f"node {node_id[:12]}" + (f" ({node.group}, {(node.market or '').lower()})" if node else "")
            for sid, r in affected.items():
                if (sid, node_id) in self._asked:
                    continue
                # Another replica (or this one before a restart) may have asked already.
                told = (gcs.checkpoint_request(sid) or {}).get("nodes") or []
                if node_id not in told:
                    gcs.request_checkpoint(sid, nodes=[*told, node_id], reason=f"{where} is draining")
                    with db.transaction(self.sessions) as s:
                        record_event(s, r["job_id"], status=JobStatus(r["job_status"]), actor="reconciler",
                                     attempt=r["number"],
                                     reason=f"{where} is draining: asked attempt {r['number']} to checkpoint now")
                    log.info("%s is draining: asked %s to checkpoint", where, sid)
                self._asked.add((sid, node_id))

    # Outcomes ----------------------------------------------------------------

    def _set_attempt(self, sid: str, **values) -> None:
        with db.transaction(self.sessions) as s:
            s.execute(update(attempts).where(attempts.c.submission_id == sid).values(**values))

    def _running(self, r, rj: RayJob) -> None:
        if r["spec"].get("kind") == "service":
            self._service_route(r)
        if r["status"] == "RUNNING" and r["job_status"] == JobStatus.RUNNING.value:
            return
        now = utcnow()
        with db.transaction(self.sessions) as s:
            s.execute(update(attempts).where(attempts.c.submission_id == r["submission_id"]).values(
                status="RUNNING", started_at=now, driver_node_id=rj.driver_node_id))
            if r["job_status"] == JobStatus.DISPATCHING.value:
                transition(s, r["job_id"], JobStatus.RUNNING, reason=f"attempt {r['number']} running on Ray",
                           actor="reconciler", attempt=r["number"], expected={JobStatus.DISPATCHING},
                           values={"started_at": now, "lease_owner": None})

    def _service_route(self, r) -> None:
        """A service reports its route while it runs; read it once it appears."""
        with db.transaction(self.sessions) as s:
            if s.execute(select(results.c.job_id).where(results.c.job_id == r["job_id"])).first():
                return
        try:
            result = self.backend.result(r["submission_id"])
        except ResultUnavailable:
            return  # read on a later pass; the service runs on meanwhile
        if result is not None:
            with db.transaction(self.sessions) as s:
                set_result(s, r["job_id"], result, attempt=r["number"])
            self.backend.forget_result(r["submission_id"])

    def _succeeded(self, r, rj: RayJob) -> None:
        result = self.backend.result(r["submission_id"])
        now = utcnow()
        with db.transaction(self.sessions) as s:
            s.execute(update(attempts).where(attempts.c.submission_id == r["submission_id"]).values(
                status="SUCCEEDED", ended_at=now, exit_code=rj.driver_exit_code if rj.driver_exit_code is not None else 0,
                driver_node_id=rj.driver_node_id))
            if result is not None:
                if isinstance(result.get("trials"), list):
                    # Trials go to their own table (served at /trials); the result keeps the summary.
                    save_trials(s, r["job_id"], result.pop("trials"), attempt=r["number"])
                set_result(s, r["job_id"], result, attempt=r["number"])
            if r["job_status"] == JobStatus.DISPATCHING.value:
                transition(s, r["job_id"], JobStatus.RUNNING, reason=f"attempt {r['number']} ran on Ray",
                           actor="reconciler", attempt=r["number"], values={"started_at": now})
            if r["job_status"] == JobStatus.CANCELLING.value:
                transition(s, r["job_id"], JobStatus.CANCELLED, reason="finished before the stop reached Ray",
                           actor="reconciler", attempt=r["number"], values={"finished_at": now})
                return
            transition(s, r["job_id"], JobStatus.SUCCEEDED, reason=f"attempt {r['number']} succeeded",
                       actor="reconciler", attempt=r["number"], expected={JobStatus.RUNNING, JobStatus.DISPATCHING},
                       values={"finished_at": now, "failure_cause": None})

    def _ended_badly(self, r, rj: RayJob | None, spec: JobSpec, nodes: dict[str, RayNode]) -> None:
        cancelled = r["job_status"] == JobStatus.CANCELLING.value
        timed_out = r["cause"] == FailureCause.TIMEOUT.value
        if rj is not None and rj.status == "STOPPED" and not cancelled and not timed_out:
            cause, msg = FailureCause.CANCELLED, "stopped in Ray outside Raylane"
        else:
            driver_market = (r["placement"] or {}).get("driver_market") or (r["placement"] or {}).get("market") \
                if (r["placement"] or {}).get("driver_label_selector") == (r["placement"] or {}).get("label_selector") \
                else (r["placement"] or {}).get("driver_market")
            cause, msg = classify(rj, nodes, timed_out=timed_out, cancelled=cancelled, driver_market=driver_market)
        now = utcnow()
        with db.transaction(self.sessions) as s:
            s.execute(update(attempts).where(attempts.c.submission_id == r["submission_id"]).values(
                status="LOST" if rj is None else rj.status, ended_at=now, cause=cause.value, message=msg,
                exit_code=rj.driver_exit_code if rj else None, driver_node_id=rj.driver_node_id if rj else None))
            if cancelled:
                transition(s, r["job_id"], JobStatus.CANCELLED, reason="Ray stopped the attempt", actor="reconciler",
                           attempt=r["number"], values={"finished_at": now, "failure_cause": cause.value})
                return
            job = s.execute(select(jobs.c.preemptions, jobs.c.attempts).where(jobs.c.id == r["job_id"])).one()
            preemptions = job.preemptions + (1 if cause is FailureCause.PREEMPTED else 0)
            app_attempts = s.execute(select(attempts.c.cause).where(attempts.c.job_id == r["job_id"])).scalars().all()
            app_n = sum(1 for c in app_attempts if c and FailureCause(c) not in INFRASTRUCTURE_CAUSES)
            retry, why = next_step(spec, cause=cause, attempts_done=job.attempts, app_attempts=app_n)
            if r["job_status"] == JobStatus.DISPATCHING.value:
                transition(s, r["job_id"], JobStatus.RUNNING, reason=f"attempt {r['number']} started on Ray",
                           actor="reconciler", attempt=r["number"], values={"started_at": now})
            summary = f"attempt {r['number']} ended: {cause.value}: {_tail(msg)}"
            if retry:
                delay = backoff(spec, job.attempts)
                transition(s, r["job_id"], JobStatus.RETRYING, reason=f"{summary}; {why}; next in {delay:.0f}s",
                           actor="reconciler", attempt=r["number"],
                           values={"failure_cause": cause.value, "preemptions": preemptions,
                                   "not_before": now + timedelta(seconds=delay)})
            else:
                transition(s, r["job_id"], JobStatus.FAILED, reason=f"{summary}; {why}", actor="reconciler",
                           attempt=r["number"], values={"failure_cause": cause.value, "preemptions": preemptions,
                                                       "finished_at": now})
        self.wake.set()

    def _cancel_unsubmitted(self, job_id: str, n: int) -> None:
        with db.transaction(self.sessions) as s:
            if n:
                s.execute(update(attempts).where(attempts.c.job_id == job_id, attempts.c.number == n,
                                                 attempts.c.status == "CLAIMED")
                          .values(status="STOPPED", ended_at=utcnow(), cause=FailureCause.CANCELLED.value))
            transition(s, job_id, JobStatus.CANCELLED, reason="cancelled before its attempt reached Ray",
                       actor="reconciler", expected={JobStatus.CANCELLING},
                       values={"finished_at": utcnow(), "failure_cause": FailureCause.CANCELLED.value})
