"""The reconciler: fold Ray's view of each live attempt into the database.

Per pass:
- every attempt Ray may be running (SUBMITTED, PENDING, RUNNING) is looked up;
  Ray's status moves the job (DISPATCHING -> RUNNING -> SUCCEEDED / RETRYING /
  FAILED); an attempt Ray no longer knows (its head restarted without GCS fault
  tolerance) is LOST, never left RUNNING;
- a failed attempt's cause is classified (``loops.classify``) from what Ray
  reports: the error type, the driver's exit code, and the death of its driver's
  node with that node's market label (a dead spot node is a preemption);
- what it saw is written by one ``store.lifecycle`` function per observation
  (attempt and job in one transaction); after a failure ``states.decide`` says
  what follows: another attempt after backoff, or FAILED;
- CANCELLING jobs get their Ray job stopped until Ray confirms;
- jobs past ``timeout_s`` are stopped and end FAILED with cause TIMEOUT;
- an attempt admitted ahead of a scale-up (``loops.admission``) whose driver has
  not started within ``scale_up_deadline_s`` is stopped and ends FAILED with
  cause SCALE_UP_TIMEOUT (counted in ``raylane_attempt_failures_total``);
- a node Ray is draining (its drain API: a spot preemption notice) gets its
  running attempts asked to checkpoint now (``_drains``): those whose driver or
  actors are on it. The event says so; the dispatcher already leaves the node's
  capacity out of admission.

On start-up the control plane runs one pass before dispatching anything new
(re-attach before new work, like Ray's own job manager).
"""

from __future__ import annotations

import collections
import logging
import statistics
import time
from datetime import timedelta

from raylane.orchestrator import logcontext
from raylane.orchestrator.backends.base import (GcsUnavailable, RayBackend, RayJob, RayNode, RayUnavailable,
                                                ResultUnavailable)
from raylane.orchestrator.domain import lanes as lanes_domain
from raylane.orchestrator.domain.ids import submission_id
from raylane.orchestrator.domain.errors import InvalidTransition
from raylane.orchestrator.domain.kinds import traits
from raylane.orchestrator.loops.base import LoopService
from raylane.orchestrator.loops.classify import _tail, classify
from raylane.orchestrator.settings import Settings
from raylane.orchestrator.domain.states import AttemptStatus, FailureCause, JobStatus
from raylane.orchestrator.domain import protocol
from raylane.orchestrator.store import db, lane_logs, lifecycle, sharing as store_sharing
from raylane.orchestrator.store.fleet import Scope
from raylane.orchestrator.store.jobs import save_trials, set_result
from raylane.orchestrator.store.transitions import record_event, utcnow

log = logging.getLogger(__name__)

# While attempts are live, Ray is polled this often: completion shows within
# ~25 ms on average: one read of Ray's GCS for all live attempts.
FAST_POLL_S = 0.02
# ... while something changes. Once nothing has (no attempt came or went, Ray's
# status and Raylane's stayed the same) the period grows to this share of the
# quiet time, up to QUIET_POLL_MAX_S: a job running for minutes has its end
# noticed within 0.25 s, and its control plane polls 4 times a second, not 50 (a
# pass costs ~2 ms of CPU, which on a small head node competes with the job's own
# processes: about 10% of a core for as long as anything runs). A short job is
# polled at FAST_POLL_S throughout (its first second of quiet is); a submit or a
# cancel wakes the loop at once, and a change seen restarts the fast period.
QUIET_POLL_SHARE = 0.02
QUIET_POLL_MAX_S = 0.25
# ... and fast polling takes at most this share of a core: when its passes cost 2
# ms of CPU (the median of the last PASS_CPU_KEPT: many live attempts on a busy head
# node, as in a burst of jobs; an occasional pass that also sweeps does not count)
# they start every 40 ms, not 20. Their 50 a second otherwise took CPU from the
# jobs' own processes for as long as the burst ran (docs/benchmarks.md, session 29);
# passes of 1 ms or less (a few jobs, a quiet machine) keep the 20 ms period. (Up to
# QUIET_POLL_MAX_S: a pass dearer than 12.5 ms is bounded by the half-busy rule.)
PASS_CPU_SHARE = 0.05
PASS_CPU_KEPT = 5
LIVE_TRIALS_EVERY_S = 1.0  # a running sweep's finished trials are read from Ray's store at most this often
WRITE_BATCH = 200  # most outcomes written in one transaction (``_flush``)
DRAIN_CHECK_S = 1.0  # how often the GCS is asked for draining nodes while attempts run
# A write refused because the job moved since the pass read it is a race with another
# replica or a cancel, and the next pass sees the new state: a DEBUG line. The same
# attempt refused this many times while it stays live is no race: one WARNING says so.
CONFLICTS_WARN = 5
SWEEP_EVERY_S = 60.0  # how often ended lane attempts' tombstones past their keep are deleted (``_sweep_lanes``)
RECORDS_SWEEP_EVERY_S = 5.0  # how often ended lane attempts' records past the dashboard's tail are deleted
RECORDS_SETTLE_S = 10.0  # the records sweep reads no attempt that ended more recently (``_sweep_records``)
SWEEP_BATCH = 200  # ended attempts read per sweep (a GCS call per lane claim); a full batch sweeps on at the next pass


def reports_result(r) -> bool:
    """Only Raylane's runner leaves a result in Ray's store; a command job (no
    runner) never does, so its end needs no GCS at all."""
    return traits(r["spec"]["kind"]).runner is not None


def _ray_job(rj: RayJob | None) -> str | None:
    """The Ray job an attempt runs in when not its own: the lane host that took it."""
    return (rj.metadata or {}).get("raylane_lane_host") or None if rj is not None else None


def _keep_log(s, r, rj: RayJob | None) -> None:
    """A lane attempt's log tail goes to the database with its outcome (Ray's store forgets it after)."""
    if rj is not None and rj.log_tail is not None:
        lane_logs.save(s, r["job_id"], r["number"], rj.log_tail)


class Reconciler(LoopService):
    name = "reconciler"

    def __init__(self, settings: Settings, sessions, backend: RayBackend, *, wake=None, lanes=None,
                 scope: Scope | None = None, elsewhere: bool = False):
        super().__init__(settings.reconcile_interval_s, wake)
        # One cluster of a fleet: its attempts only (``store.fleet.Scope``); ``elsewhere``:
        # the fleet has other clusters, where a job whose scale-up here did not come moves.
        self.scope = scope
        self.elsewhere = elsewhere
        self.settings = settings
        self.sessions = sessions
        self.backend = backend
        self.lanes = lanes  # backends.lanes.LaneBackend: where attempts whose placement names a lane live
        # Called when an attempt ended (its capacity is free): the dispatcher admits the next at once.
        self.on_ended = None
        self._live = 0
        self._pass_cpus: collections.deque[float] = collections.deque(maxlen=PASS_CPU_KEPT)  # ``next_wait``
        self._known: dict = {}  # (job id, attempt) -> its job's spec and placement (``lifecycle.live_attempts``)
        self._seen: frozenset = frozenset()  # what the last pass saw of each live attempt (``_quiet_since``)
        self._changed_at = time.monotonic()  # when a pass last saw something different
        self._drain_checked_at = 0.0
        self._asked: set[tuple[str, str]] = set()  # (submission id, node id) told to checkpoint
        self._preempt_asked: set[str] = set()  # attempts being preempted, told to checkpoint
        self._trials_seen: dict[str, tuple[float, int]] = {}  # running sweep -> (last read, trials stored)
        self._writes: list = []  # (write(session), after(), job, attempt) of this pass, committed together (``_flush``)
        self._conflicts: dict[tuple[str | None, int | None], int] = {}  # (job, attempt) -> outcomes refused while live
        self._swept_at = 0.0  # monotonic time of the last lane sweep (0: sweep at the first pass)
        self._records_swept_at = 0.0  # the same, of the records sweep (``_sweep_records``)
        self._records_warned_at = -SWEEP_EVERY_S  # when its failure was last said at WARNING

    def next_wait(self) -> float:
        # Poll Ray quickly while attempts are young or live: an end is noticed within
        # ~FAST_POLL_S instead of a full interval. At that rate, not that pause after
        # each pass: a pass of 10 ms followed by 20 ms of waiting made the period 30 ms
        # and an end's average wait 15 ms, not 10. A pass of more than half the period
        # waits as long as it took (busy at most half the time), one longer than the
        # period waits the whole period, as every pass did before.
        if not self._live:
            return self.interval
        quiet = time.monotonic() - self._changed_at
        self._pass_cpus.append(self.last_cpu)
        cpu = statistics.median(self._pass_cpus)
        period = min(max(FAST_POLL_S, QUIET_POLL_SHARE * quiet, cpu / PASS_CPU_SHARE), QUIET_POLL_MAX_S, self.interval)
        return max(period - self.last_took, min(self.last_took, period))

    def _quiet_since(self, live, ray_jobs: dict[str, RayJob | None]) -> None:
        """Note the time when what this pass sees differs from the last pass."""
        seen = frozenset((r["submission_id"], r["status"], r["job_status"],
                          (rj.status if (rj := ray_jobs.get(r["submission_id"])) is not None else None))
                         for r in live)
        if seen != self._seen:
            self._seen, self._changed_at = seen, time.monotonic()

    def run_once(self) -> None:
        # A read (SQLite: no write lock): this runs every 20 ms while attempts live, and
        # a write transaction each time took the lock that submits' commits wait for.
        with db.read(self.sessions) as s:
            live = lifecycle.live_attempts(s, self._known, self.scope)
            cancelling_unsubmitted = lifecycle.cancelling_jobs(s, self.scope)
        self._live = len(live)
        live_ids = {r["job_id"] for r in live}
        self._conflicts = {k: v for k, v in self._conflicts.items() if k[0] in live_ids}
        # A job cancelled before its attempt reached Ray: nothing to stop.
        for jid, n, lane, lane_env in cancelling_unsubmitted:
            if jid not in live_ids:
                self._cancel_unsubmitted(jid, n, lane, lane_env)
        if self.lanes is not None and time.monotonic() - self._swept_at >= SWEEP_EVERY_S and self.lanes.store_known():
            self._sweep_lanes()
        if self.lanes is not None and time.monotonic() - self._records_swept_at >= RECORDS_SWEEP_EVERY_S \
                and self.lanes.store_known():
            self._sweep_records()
        if not live:
            return
        try:
            # One read of Ray's job records for all of them (its GCS), not of every job it ever ran.
            ray_jobs = self.backend.get_many([r["submission_id"] for r in live if self._via(r) is self.backend])
            # Lane attempts: a few reads of Ray's KV store, whatever their number (domain.lanes).
            in_lanes = [r["submission_id"] for r in live if self._via(r) is not self.backend]
            if in_lanes:
                ray_jobs.update(self.lanes.get_many(in_lanes))
        except RayUnavailable as e:
            self.backend.reachability.down(e)  # warns once per outage; this loop polls every 50 ms
            return
        self._quiet_since(live, ray_jobs)
        try:
            self._drains(live, ray_jobs)
        except Exception:
            log.exception("reconciler: checking draining nodes failed; next pass tries again")
        now = utcnow()
        try:
            self._pass(live, ray_jobs, now)
        finally:
            self._flush()

    def _sweep_lanes(self) -> None:
        """Delete the lane claims (tombstones) of attempts that ended more than
        ``lane_tombstone_keep_s`` ago, with any key of theirs left over, in batches
        of ``SWEEP_BATCH`` from where the last sweep (of any replica) stopped. A full
        batch means more are due: the next pass sweeps again."""
        try:
            mark = self.lanes.sweep_mark()
            until = utcnow() - timedelta(seconds=self.settings.lane_tombstone_keep_s)
            with db.read(self.sessions) as s:
                rows = lifecycle.ended_attempts(s, after=mark, until=until, limit=SWEEP_BATCH, scope=self.scope)
            swept = self.lanes.sweep(rows)
            if swept:
                log.debug("lane sweep: what is left of %d attempts that ended by %s deleted", swept,
                          rows[swept - 1]["ended_at"].isoformat())
            # A full batch, or one cut short by its time budget: more are due, swept at the next pass.
            self._swept_at = 0.0 if len(rows) == SWEEP_BATCH or swept < len(rows) else time.monotonic()
        except RayUnavailable as e:  # said once per outage by whoever needs Ray; the claims wait
            log.debug("lane sweep: Ray's store unreachable (%s); tried again in %.0f s", e, SWEEP_EVERY_S)
            self._swept_at = time.monotonic()
        except Exception as e:  # the database busy, an error of Ray's store: the claims wait for the next sweep
            log.warning("lane sweep failed (%s); tried again in %.0f s", e, SWEEP_EVERY_S)
            self._swept_at = time.monotonic()

    def _sweep_records(self) -> None:
        """Delete the records in Ray's dashboard of lane attempts past its tail:
        ended before the newest ``lane_dashboard_keep`` ended attempts, or more
        than ``lanes.RECORD_KEEP_S`` ago (``LaneBackend.sweep_records``), from
        where the last records sweep (of any replica) stopped; the first starts
        where the tombstone sweep got (no record is older: the tombstone sweep
        deleted them), or with neither mark (Ray's store lost them with its head)
        ``lane_tombstone_keep_s`` ago, not at the first attempt ever. Never past
        ``RECORDS_SETTLE_S`` ago: an attempt's end time is taken before its commit,
        and one committed late must not land behind the mark. Every
        ``RECORDS_SWEEP_EVERY_S``, so the tail stays near its size under a lane's
        full throughput; a full batch sweeps on at the next pass."""
        try:
            now = utcnow()
            mark = self.lanes.sweep_mark(lanes_domain.RECORDS_MARK_KEY) or self.lanes.sweep_mark() \
                or (now - timedelta(seconds=self.settings.lane_tombstone_keep_s), 0)
            until = now - timedelta(seconds=lanes_domain.RECORD_KEEP_S)
            with db.read(self.sessions) as s:
                tail = lifecycle.nth_newest_end(s, self.settings.lane_dashboard_keep, self.scope)
                if tail is not None and tail > until:
                    until = min(tail, now - timedelta(seconds=RECORDS_SETTLE_S))
                rows = lifecycle.ended_attempts(s, after=mark, until=until, limit=SWEEP_BATCH, scope=self.scope)
            swept = self.lanes.sweep_records(rows)
            if swept:
                log.debug("lane records sweep: %d attempts that ended by %s are off Ray's dashboard", swept,
                          rows[swept - 1]["ended_at"].isoformat())
            full = len(rows) == SWEEP_BATCH or swept < len(rows)
            self._records_swept_at = 0.0 if full else time.monotonic()
        except RayUnavailable as e:
            log.debug("lane records sweep: Ray's store unreachable (%s); tried again in %.0f s", e,
                      RECORDS_SWEEP_EVERY_S)
            self._records_swept_at = time.monotonic()
        except Exception as e:  # said once a minute at most (the database down fails it every 5 s)
            level = logging.WARNING if time.monotonic() - self._records_warned_at >= SWEEP_EVERY_S else logging.DEBUG
            if level == logging.WARNING:
                self._records_warned_at = time.monotonic()
            log.log(level, "lane records sweep failed (%s); tried again in %.0f s", e, RECORDS_SWEEP_EVERY_S)
            self._records_swept_at = time.monotonic()

    def _pass(self, live, ray_jobs, now) -> None:
        nodes = None
        for r in live:
            logcontext.bind_job(r["job_id"], r["number"])  # every log line about this attempt names it
            rj = ray_jobs[r["submission_id"]]
            # The stored spec as it is: it was validated at its submit (a model of it each
            # pass was most of a pass's CPU while 60 attempts ran).
            timeout_s = r["spec"].get("timeout_s")
            try:
                # Ray's job statuses are spelled as AttemptStatus's (its values are Ray's).
                if JobStatus(r["job_status"]) is JobStatus.CANCELLING and \
                        rj is not None and rj.status in (AttemptStatus.PENDING, AttemptStatus.RUNNING):
                    self._via(r).stop(r["submission_id"])
                    continue
                if rj is not None and rj.status == AttemptStatus.RUNNING and timeout_s and r["started_at"] and \
                        now - r["started_at"] > timedelta(seconds=timeout_s) and \
                        r["cause"] != FailureCause.TIMEOUT.value:
                    with db.transaction(self.sessions) as s:
                        lifecycle.timeout_requested(s, r["job_id"], r["number"])
                    self._via(r).stop(r["submission_id"])
                    continue
                if not r["preempt_for"] and r["submission_id"] in self._preempt_asked:
                    self._withdrawn(r["submission_id"])
                if r["preempt_for"] and rj is not None and rj.status in (AttemptStatus.PENDING, AttemptStatus.RUNNING) \
                        and self._preempting(r, now):
                    continue
                if rj is not None and rj.status == AttemptStatus.PENDING and r["message"] and \
                        now - r["created_at"] > timedelta(seconds=self.settings.scale_up_deadline_s):
                    if r["cause"] != FailureCause.SCALE_UP_TIMEOUT.value:
                        group = (r["placement"] or {}).get("node_group")
                        with db.transaction(self.sessions) as s:
                            lifecycle.scale_up_overdue(s, r["job_id"], r["number"], (
                                f"scale-up of group {group} did not come within "
                                f"{self.settings.scale_up_deadline_s:g} s (scale_up_deadline_s); {r['message']}"))
                    # Asked again each pass until Ray reports it stopped (a stop may not reach Ray).
                    self._via(r).stop(r["submission_id"])
                    continue
                if rj is not None and rj.status == AttemptStatus.PENDING:
                    if r["status"] == AttemptStatus.SUBMITTED.value:
                        self._later(lambda s, r=r: lifecycle.attempt_pending(s, r["job_id"], r["number"]))
                    continue
                if rj is not None and rj.status == AttemptStatus.RUNNING:
                    self._running(r, rj)
                    continue
                if rj is not None and rj.status == AttemptStatus.SUCCEEDED:
                    self._succeeded(r, rj)  # its result is forgotten once the outcome is committed
                    continue
                if nodes is None:
                    nodes = {n.node_id: n for n in self.backend.nodes()}
                self._ended_badly(r, rj, nodes)
                self._forget(r)  # a stopped service's last word, if any
            except RayUnavailable as e:
                self.backend.reachability.down(e)
                return
            except ResultUnavailable:
                pass  # the backend said why; the attempt is looked at again next pass
            except InvalidTransition as e:
                self._conflict(r["job_id"], r["number"], e)
            except Exception:
                log.exception("reconciling %s failed; next pass tries again", r["submission_id"])

    # Preemption (docs/sharing.md) ---------------------------------------------------

    def _preempting(self, r, now) -> bool:
        """An attempt being preempted: asked to checkpoint once; stopped once it
        said its checkpoint is saved or its grace period is over (and again each
        pass until Ray reports it stopped). True when this pass is done with it."""
        sid = r["submission_id"]
        if r["cause"] == FailureCause.PREEMPTED_BY_PRIORITY.value:
            self._via(r).stop(sid)
            return True
        gcs = self.backend.gcs
        if sid not in self._preempt_asked:
            self._preempt_asked.add(sid)
            if gcs is not None:
                try:
                    gcs.request_checkpoint(sid, nodes=[], reason=f"preempted for job {r['preempt_for']}")
                except GcsUnavailable as e:
                    log.warning("could not ask %s to checkpoint before its preemption (%s); it is stopped at "
                                "its grace period's end", sid, e)
        # Read each pass: the few attempts being preempted are stopped within a pass of saying so.
        saved = False
        if gcs is not None:
            try:
                saved = gcs.kv_get(protocol.checkpointed_key(sid)) is not None
            except GcsUnavailable:
                saved = False
        if not saved and r["preempt_deadline"] is not None and now < r["preempt_deadline"]:
            return False
        with db.transaction(self.sessions) as s:
            if not store_sharing.waiting(s, [r["preempt_for"]]):
                # The job it was preempted for started without it, or went: it runs on.
                store_sharing.withdraw(s, [r["preempt_for"]], now=now)
                return False
            lifecycle.preempt_stop(s, r["job_id"], r["number"], (
                f"preempted for job {r['preempt_for']}: "
                + ("stopped once its checkpoint was saved" if saved else "stopped at the end of its grace period")))
        log.info("stopping %s: preempted for job %s (%s)", sid, r["preempt_for"],
                 "checkpoint saved" if saved else "grace period over")
        self._via(r).stop(sid)
        return True

    def _withdrawn(self, sid: str) -> None:
        """An attempt asked to checkpoint for a preemption that was withdrawn (its
        waiting job started without it): the request and any "saved" answer go, so
        that a later preemption asks again and waits for a checkpoint of its own."""
        self._preempt_asked.discard(sid)
        gcs = self.backend.gcs
        if gcs is None:
            return
        try:
            if any(s == sid for s, _ in self._asked):
                gcs.kv_del(protocol.checkpointed_key(sid))  # a draining node's request stays
            else:
                gcs.forget_checkpoint_request(sid)
        except GcsUnavailable as e:  # a stale answer stops it at its next preemption at once: said
            log.warning("could not delete the checkpoint request of %s, no longer preempted: %s", sid, e)

    def _via(self, r):
        """The backend that runs attempt ``r``: its job's warm lane, else Ray's Jobs API."""
        if self.lanes is not None and (r["placement"] or {}).get("lane"):
            return self.lanes
        return self.backend

    # Draining nodes ------------------------------------------------------------

    def _drains(self, live, ray_jobs: dict[str, RayJob | None]) -> None:
        """Ask the running attempts on draining nodes to checkpoint, once per
        attempt and node (each new draining node is a new request)."""
        gcs = self.backend.gcs
        if gcs is None or time.monotonic() - self._drain_checked_at < DRAIN_CHECK_S:
            return
        self._drain_checked_at = time.monotonic()
        live_sids = {r["submission_id"] for r in live}
        for sid in ({sid for sid, _ in self._asked} | self._preempt_asked) - live_sids:
            try:
                gcs.forget_checkpoint_request(sid)  # the attempt ended
            except GcsUnavailable as e:  # a stale message harms no one; the drain check goes on
                log.warning("could not delete the checkpoint request of %s: %s", sid, e)
        self._asked = {(sid, node) for sid, node in self._asked if sid in live_sids}
        self._preempt_asked &= live_sids
        draining = self.backend.draining()
        if not draining:
            return
        # Only kinds whose row says they checkpoint can act on the request (kinds.py says why).
        running = [(r, rj) for r in live if (rj := ray_jobs.get(r["submission_id"])) and rj.status == AttemptStatus.RUNNING
                   and traits(r["spec"]["kind"]).checkpoints]
        # Ray's own job id (whose actors may sit on the node) is in its Jobs API, not
        # in the record a pass reads: asked only while a node drains, once per attempt
        # (the backend keeps it). A lane attempt has none of its own (and no lane kind checkpoints).
        ids = {r["submission_id"]: rj.ray_job_id or (self.backend.ray_job_id(r["submission_id"])
                                                     if self._via(r) is self.backend else None)
               for r, rj in running}
        by_ray_job = {ids[r["submission_id"]]: r for r, _ in running if ids[r["submission_id"]]}
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

    # The common outcomes of a pass (started, succeeded) are written in one
    # transaction, each in a savepoint of its own: a burst of 200 completions is one
    # commit (one fsync), not 200, and one that fails to write does not undo the
    # others. What follows a write (forgetting the result in Ray's store) happens
    # only once it is committed; a pass that cannot commit leaves Ray's side as it
    # was, and the next pass writes the same outcomes again.
    def _later(self, write, after=None) -> None:
        # The job the pass works on now: its write's log lines name it, not the last job of the pass.
        self._writes.append((write, after, logcontext.job_id.get(), logcontext.attempt.get()))
        if len(self._writes) >= WRITE_BATCH:
            self._flush()

    def _flush(self) -> None:
        writes, self._writes = self._writes, []
        if not writes:
            return
        done = []
        try:
            with db.transaction(self.sessions) as s:
                for write, after, job, n in writes:
                    with logcontext.job_context(job, n):
                        try:
                            with s.begin_nested():
                                write(s)
                        except InvalidTransition as e:
                            self._conflict(job, n, e)
                            continue
                        except Exception:
                            log.exception("reconciler: writing an outcome failed; next pass tries again")
                            continue
                    done.append((after, job, n))
        except Exception:
            log.exception("reconciler: committing %d outcomes failed; next pass writes them again", len(writes))
            return
        for after, job, n in done:
            if after is not None:
                with logcontext.job_context(job, n):
                    try:
                        after()
                    except Exception:
                        log.exception("reconciler: cleaning up after an outcome failed")

    def _conflict(self, job: str | None, n: int | None, e: InvalidTransition) -> None:
        """Another replica (or a cancel) moved the job since this pass read it."""
        seen = self._conflicts[(job, n)] = self._conflicts.get((job, n), 0) + 1
        if seen == CONFLICTS_WARN:
            log.warning("reconciler: attempt %s of job %s: its outcome was refused %d times (%s); still trying",
                        n, job, seen, e)
        else:
            log.debug("reconciler: attempt %s of job %s moved since this pass read it (%s); next pass reads it again",
                      n, job, e)

    def _running(self, r, rj: RayJob) -> None:
        if traits(r["spec"]["kind"]).serves:
            self._service_route(r)
        if traits(r["spec"]["kind"]).section == "sweep":
            self._live_trials(r)
        if r["status"] == AttemptStatus.RUNNING.value and r["job_status"] == JobStatus.RUNNING.value:
            return
        self._later(lambda s: lifecycle.attempt_running(s, r["job_id"], r["number"],
                                                        driver_node_id=rj.driver_node_id, ray_job=_ray_job(rj)))

    def _service_route(self, r) -> None:
        """A service reports its route while it runs; read it once it appears."""
        with db.read(self.sessions) as s:
            if lifecycle.has_result(s, r["job_id"]):
                return
        try:
            result = self.backend.result(r["submission_id"])
        except ResultUnavailable:
            return  # read on a later pass; the service runs on meanwhile
        if result is not None:
            with db.transaction(self.sessions) as s:
                set_result(s, r["job_id"], result, attempt=r["number"])
            self.backend.forget_result(r["submission_id"])

    def _live_trials(self, r) -> None:
        """A running sweep's trials as they finish (the runner leaves them in Ray's
        store); stored when their number changed, replaced by the final list at the end."""
        sid, now = r["submission_id"], time.monotonic()
        read_at, stored = self._trials_seen.get(sid, (0.0, 0))
        if now - read_at < LIVE_TRIALS_EVERY_S:
            return
        items = self.backend.live_trials(sid) or []
        self._trials_seen[sid] = (now, stored)
        if len(items) == stored:
            return
        with db.transaction(self.sessions) as s:
            save_trials(s, r["job_id"], items, attempt=r["number"])
        self._trials_seen[sid] = (now, len(items))

    def _forget(self, r, *, ran: bool = False) -> None:
        """The attempt's outcome is stored: what it and the dispatcher left in Ray's
        store goes (its result, its inputs; a command job has neither). ``ran``: it
        succeeded, so a lane host took its todo item (no delete of it needed)."""
        in_lane = self._via(r) is self.lanes
        if in_lane:
            # Its keys go (its log tail is in the database now); a stop request only
            # if one may have been made (a cancel, a timeout).
            self.lanes.forget(r["submission_id"], group=(r["placement"] or {}).get("lane"),
                              lane_env=(r["placement"] or {}).get("lane_env"), taken=ran,
                              stopped=r["job_status"] == JobStatus.CANCELLING.value or bool(r["cause"]))
        if reports_result(r):
            self.backend.forget_result(r["submission_id"])
            if not in_lane:  # a lane's item carried its inputs: none were left in the store
                self.backend.forget_inputs(r["submission_id"])
        if traits(r["spec"]["kind"]).section == "sweep":
            self.backend.forget_trials(r["submission_id"])
            self._trials_seen.pop(r["submission_id"], None)

    def _succeeded(self, r, rj: RayJob) -> None:
        result = (rj.result[1] if rj.result is not None else self.backend.result(r["submission_id"])) \
            if reports_result(r) else None  # a lane's was read with its status (``LaneBackend.get_many``)

        def write(s):
            lifecycle.attempt_succeeded(s, r["job_id"], r["number"], exit_code=rj.driver_exit_code,
                                        driver_node_id=rj.driver_node_id, result=result, ray_job=_ray_job(rj))
            _keep_log(s, r, rj)

        self._later(write, after=lambda: self._after_success(r))

    def _after_success(self, r) -> None:
        self._forget(r, ran=True)
        if self.on_ended:
            self.on_ended()

    def _ended_badly(self, r, rj: RayJob | None, nodes: dict[str, RayNode]) -> None:
        cancelled = r["job_status"] == JobStatus.CANCELLING.value
        timed_out = r["cause"] == FailureCause.TIMEOUT.value
        if r["cause"] == FailureCause.SCALE_UP_TIMEOUT.value and not cancelled:
            cause, msg = FailureCause.SCALE_UP_TIMEOUT, r["message"]
        elif r["cause"] == FailureCause.PREEMPTED_BY_PRIORITY.value and not cancelled:
            cause, msg = FailureCause.PREEMPTED_BY_PRIORITY, r["message"]
        elif rj is not None and rj.status == AttemptStatus.STOPPED and not cancelled and not timed_out:
            cause, msg = FailureCause.CANCELLED, "stopped in Ray outside Raylane"
        else:
            driver_market = (r["placement"] or {}).get("driver_market") or (r["placement"] or {}).get("market") \
                if (r["placement"] or {}).get("driver_label_selector") == (r["placement"] or {}).get("label_selector") \
                else (r["placement"] or {}).get("driver_market")
            cause, msg = classify(rj, nodes, timed_out=timed_out, cancelled=cancelled, driver_market=driver_market)
        with db.transaction(self.sessions) as s:
            lifecycle.attempt_ended(
                s, r["job_id"], r["number"], status=AttemptStatus.LOST if rj is None else AttemptStatus(rj.status),
                cause=cause, message=msg, headline=_tail(msg), exit_code=rj.driver_exit_code if rj else None,
                driver_node_id=rj.driver_node_id if rj else None, ray_job=_ray_job(rj), elsewhere=self.elsewhere)
            _keep_log(s, r, rj)
        self.wake.set()
        if self.on_ended:
            self.on_ended()

    def _cancel_unsubmitted(self, job_id: str, n: int, lane: str | None, lane_env: str | None = None) -> None:
        with db.transaction(self.sessions) as s:
            stopped = lifecycle.cancelled_before_submit(s, job_id, n)
        if stopped and n:
            # A dispatcher that died mid-submit may have left the attempt in Ray;
            # no one would stop it (a live dispatcher stops its own, see submit).
            try:
                if lane and self.lanes is not None:
                    # ... or in its lane: taken there it never runs, and its keys go (none will look again).
                    self.lanes.discard(submission_id(job_id, n), group=lane, lane_env=lane_env)
                else:
                    self.backend.stop(submission_id(job_id, n))
            except RayUnavailable as e:
                log.warning("could not stop attempt %s of cancelled job %s: %s", n, job_id, e)
