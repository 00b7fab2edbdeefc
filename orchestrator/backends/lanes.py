"""The warm lanes as the loops see them: submit, get, stop and logs of a lane
attempt, in the shapes ``RayJobsBackend`` gives for a Ray job (``RayJob``, its
status words), so the dispatcher and the reconciler treat both paths alike.

A lane attempt lives in Ray's KV store (``domain.lanes``: todo, claim, status,
logs, stop); its host is a Ray job of its own, started on demand
(``ensure_host``) and replaced when it has ended by the host pool
(``backends.lane_hosts.LaneHosts``, which also keeps the lane envs). This
module is the attempt adapter (submit, get_many, stop, logs, forget, discard);
the sweeps of what ended attempts left are ``backends.lane_sweep``. An item
whose host's Ray job ended while the item ran is reported FAILED with
``lanes.HOST_LOST`` and the host's node as its driver's node: ``loops.classify`` makes that node loss (or a
preemption) if the node died, else LOST, and both are retried.

A lane env (``lanes.env_key``: a job's working_dir, py_modules and pip) has
hosts of its own, Ray jobs started in that runtime env: Ray unpacks the code
and installs the packages once per host, not once per job. At most
``max_envs`` envs of a group keep hosts at once; starting another retires the
hosts of the one used longest ago (they finish what they run and exit). A host
that Ray could not start in its runtime env fails the env's waiting items
with Ray's message (``RUNTIME_ENV_SETUP_FAILURE``), as a Ray job in that env
would have failed, and the next start of that env waits (the same backoff).

A status of another protocol version (``lanes.PROTOCOL_VERSION``: a control
plane of another version dispatched it, during a rolling upgrade) is not read:
the attempt is reported PENDING, so nothing here acts on it, and the log says
so once per version; stop leaves it alone too.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from datetime import datetime
from typing import Any, Callable

from raylane.orchestrator.backends.base import AlreadySubmitted, GcsUnavailable, RayBackend, RayJob, RayUnavailable
from raylane.orchestrator.backends.lane_hosts import ENV_SETUP_FAILED, HOST_LIVE, LaneHosts
from raylane.orchestrator.backends.lane_sweep import LaneSweep
from raylane.orchestrator.domain import lanes, protocol
from raylane.orchestrator.domain.errors import StoreFailed
from raylane.orchestrator.domain.lanes import LaneStatus

log = logging.getLogger(__name__)

# Ray's words for a job whose supervisor went with its node (``loops.classify`` reads them as node loss)
SUPERVISOR_GONE = ("JOB_SUPERVISOR_ACTOR_DIED", "JOB_SUPERVISOR_ACTOR_START_FAILURE")
REFUSED = b"refused: no host of its lane could be started"  # the claim of an attempt whose dispatch was refused


class LaneBackend:
    def __init__(self, ray: RayBackend, *, idle_s: float = 60.0, slots: int = 8, max_envs: int = 4,
                 to_ray_env: Callable[[dict[str, Any]], dict[str, Any]] | None = None):
        self.ray = ray
        self._lock = threading.Lock()  # the dispatcher and the reconciler run in threads of their own
        # The host pool and the lane envs' cache (backends.lane_hosts).
        self.hosts = LaneHosts(ray, self._kv, idle_s=idle_s, slots=slots, max_envs=max_envs, to_ray_env=to_ray_env)
        self._foreign_versions: set[int] = set()  # protocol versions of statuses seen and left alone (logged once)
        self.sweeper = LaneSweep(self._kv)  # what ended attempts left in Ray's store (backends.lane_sweep)

    def usable(self) -> bool:
        """Whether a lane can take jobs: Ray's GCS, where the lane's records live,
        is known (configured, or found in the head's command line). Not known (a
        deployment that hides it): small jobs are routed as Ray jobs each, as with
        the fast lane off, rather than wait for a store they cannot reach."""
        return self.ray.find_gcs() is not None

    def _gcs(self):
        gcs = self.ray.find_gcs()
        if gcs is None:
            raise RayUnavailable("the fast lane needs Ray's GCS, and its address is unknown (set RAYLANE_RAY_ADDRESS)")
        return gcs

    def _kv(self, op: str, *args, **kw):
        try:
            return getattr(self._gcs(), op)(*args, **kw)
        except GcsUnavailable as e:
            raise RayUnavailable(str(e)) from e

    def _status(self, sid: str) -> LaneStatus | None:
        value = self._kv("kv_get", lanes.status_key(sid))
        return LaneStatus.decode(value) if value else None

    def _ours(self, sid: str, st: LaneStatus) -> bool:
        """Whether this side may read ``st`` (its protocol version is ours)."""
        if st.v == lanes.PROTOCOL_VERSION:
            return True
        with self._lock:
            first = st.v not in self._foreign_versions
            self._foreign_versions.add(st.v)
        if first:
            log.warning("lane attempt %s has a status of lane protocol version %s; this control plane speaks "
                        "version %d and leaves such attempts alone (a control plane of their version reads them)",
                        sid, st.v, lanes.PROTOCOL_VERSION)
        return False

    # Hosts (backends.lane_hosts) ----------------------------------------------

    def host(self, host_sid: str) -> RayJob | None:
        return self.hosts.host(host_sid)

    def ensure_host(self, group: str, env: str | None = None) -> str:
        return self.hosts.ensure_host(group, env)

    @property
    def to_ray_env(self) -> Callable[[dict[str, Any]], dict[str, Any]] | None:
        """A lane env as a spec says it -> as Ray takes it (``LaneHosts.to_ray_env``)."""
        return self.hosts.to_ray_env

    @to_ray_env.setter
    def to_ray_env(self, fn: Callable[[dict[str, Any]], dict[str, Any]] | None) -> None:
        self.hosts.to_ray_env = fn

    # Attempts ------------------------------------------------------------------

    def submit(self, *, submission_id: str, group: str, command: str, env: dict[str, str],
               args: dict | None = None, cpus: float = 0.0, lane_env: str | None = None,
               runtime_env: dict[str, Any] | None = None, metadata: dict[str, str] | None = None) -> None:
        """Queue the attempt in the group's lane (and make sure its hosts run):
        ``command`` a shell command, or with ``args`` a function's import path;
        ``cpus`` what admission counted it to hold (a host takes it only where its
        node's CPUs have room); ``lane_env`` its lane env's key, ``runtime_env``
        that env (``lanes.env_of``), which its hosts are started in; ``metadata``
        the Ray job metadata of the attempt, on its record in Ray's dashboard.

        Raises:
            AlreadySubmitted: the attempt was queued before (a retried dispatch); it is adopted.
            RayUnavailable: Ray's GCS could not be reached.
        """
        # The item first: a dispatcher that dies between the two writes leaves an
        # item and no status, and the same attempt dispatched again writes both.
        if lane_env is not None:
            if runtime_env is None:
                raise ValueError("a lane env needs its runtime_env")
            self.hosts.record_env(lane_env, runtime_env)
        self._kv("kv_put", lanes.todo_key(group, submission_id, lane_env),
                 lanes.encode_item(submission_id, command, env, args=args, cpus=cpus, metadata=metadata))
        added = self._kv("kv_put", lanes.status_key(submission_id),
                         LaneStatus("PENDING", group=group, env=lane_env).encode(), overwrite=False)
        try:
            self.ensure_host(group, lane_env)
        except RayUnavailable:
            raise  # the item waits: the dispatch is tried again, and adopts it
        except StoreFailed as e:
            # The database failed reading the env's package (busy, failing over): no fault
            # of the env's. The item is queued; the reconciler starts the env's host.
            log.warning("%s: queued; a host of its lane could not be started now (%s); the reconciler starts one",
                        submission_id, e)
        except Exception:
            # Refused (its env's package is gone, Ray refused it): the dispatcher records
            # the attempt FAILED, so nothing may run it later. Taken here, its keys go.
            if self._kv("kv_put", lanes.claim_key(submission_id), REFUSED, overwrite=False):
                self._kv("kv_del", lanes.todo_key(group, submission_id, lane_env))
                self._kv("kv_del", lanes.attempt_prefix(submission_id), prefix=True)
                raise
            # A live host of its env took it meanwhile: it runs, as submitted.
            log.exception("%s: a host of its lane could not be started, but a live one took it", submission_id)
        if not added:
            raise AlreadySubmitted(submission_id)

    def get(self, submission_id: str) -> RayJob | None:
        return self.get_many([submission_id])[submission_id]

    def get_many(self, submission_ids: list[str]) -> dict[str, RayJob | None]:
        """Each attempt as ``get`` sees it, in a few calls whatever their number:
        one read of every status, one of the claims of those still PENDING, and a
        look at each group's host (a host that went idle and exited is replaced)."""
        raw = self._kv("kv_multi_get", [lanes.status_key(sid) for sid in submission_ids])
        statuses = {sid: LaneStatus.decode(v) for sid in submission_ids
                    if (v := raw.get(lanes.status_key(sid)))}
        foreign = {sid for sid, st in statuses.items() if not self._ours(sid, st)}
        pending = [sid for sid, st in statuses.items() if st.status == "PENDING" and sid not in foreign]
        claims = self._kv("kv_multi_get", [lanes.claim_key(sid) for sid in pending]) if pending else {}
        unclaimed_groups: set[tuple[str, str | None]] = set()
        hosts: dict[str, str | None] = {}
        for sid in pending:
            claim = claims.get(lanes.claim_key(sid), b"").decode()
            hosts[sid] = claim if claim.startswith(lanes.HOST_ID_PREFIX) else None
            if hosts[sid] is None and statuses[sid].group:
                unclaimed_groups.add((statuses[sid].group, statuses[sid].env))
        hostless: set[tuple[str, str]] = set()  # lane envs of which no host runs or could be started in the group
        for group, env in sorted(unclaimed_groups, key=lambda ge: (ge[0], ge[1] or "")):
            try:
                self.ensure_host(group, env)
            except RayUnavailable:
                if env is None:
                    raise
                hostless.add((group, env))  # its hosts fail at start: its waiting items may fail below
            except StoreFailed as e:  # the database failed reading its package: its items wait, none fails
                log.warning("lane env %s of group %s: its host could not be started now (%s); the next pass tries "
                            "again", env, group, e)
            except Exception as e:
                if env is None:
                    raise
                # Its hosts cannot be started at all (its package is gone from the store,
                # Ray refused it): its waiting items fail below, as a Ray job in that env
                # would have been refused. The other envs' and the Ray jobs' attempts are
                # followed as ever: this pass goes on.
                log.error("lane env %s of group %s: no host can be started in it: %s", env, group, e)
                self.hosts.refuse_env(group, env, f"it could not be handed to Ray: {e}")
                hostless.add((group, env))
        for sid in pending:
            st = statuses[sid]
            # Only while no host of the env runs anywhere in the group: one node's failed
            # start (a pip index that timed out there) fails nothing another node's host runs.
            if hosts[sid] is None and st.env is not None and (st.group, st.env) in hostless \
                    and self.hosts.env_broken_now(st.group, st.env):
                self._fail_unstartable(sid, st)
        out = {sid: None if sid not in statuses else _left_alone(sid, statuses[sid]) if sid in foreign
               else self._view(sid, statuses[sid], hosts.get(sid, statuses[sid].host)) for sid in submission_ids}
        ended = [sid for sid, rj in out.items() if rj is not None and rj.status not in HOST_LIVE]
        if ended:  # their log tails go to the database with their outcomes (``forget``), and results in the same read
            done = [sid for sid in ended if out[sid].status == "SUCCEEDED"]
            got = self._kv("kv_multi_get", [lanes.logs_key(sid) for sid in ended]
                           + [protocol.result_key(sid) for sid in done])
            for sid in ended:
                out[sid].log_tail = got.get(lanes.logs_key(sid), b"").decode(errors="replace")
            for sid in done:
                value = got.get(protocol.result_key(sid))
                try:
                    out[sid].result = (True, protocol.decode_result(value) if value else None)
                except ValueError as e:  # not JSON: what it left is no result, and stops no other attempt's pass
                    log.warning("%s: its result in Ray's store is not JSON (%s); stored without one", sid, e)
                    out[sid].result = (True, None)
        return out

    def _fail_unstartable(self, sid: str, st: LaneStatus) -> None:
        """A waiting item of a lane env that Ray could not start a host in ends as a
        Ray job in that env would: FAILED, ``RUNTIME_ENV_SETUP_FAILURE``, Ray's
        words. Claimed here first (no host can run it after)."""
        message = self.hosts.broken_message(st.group, st.env)
        if not self._kv("kv_put", lanes.claim_key(sid), b"its lane env could not be set up", overwrite=False):
            return  # a host took it meanwhile: it runs
        st.status, st.error_type, st.end_time = "FAILED", ENV_SETUP_FAILED, int(time.time() * 1000)
        st.message = f"the warm lane's runtime env (lane env {st.env}) could not be set up: {message}"
        self._kv("kv_put", lanes.status_key(sid), st.encode())
        self._kv("kv_del", lanes.todo_key(st.group, sid, st.env))

    def _view(self, submission_id: str, st: LaneStatus, host: str | None) -> RayJob:
        hj = self.host(host) if host else None
        if host and st.status in HOST_LIVE and (hj is None or hj.status not in HOST_LIVE):
            # Its host's Ray job ended under it (the host's node died, or the host did).
            why = f"{hj.status}: {hj.message or ''}".strip() if hj else "Ray has no record of it"
            st.status, st.error_type = "FAILED", lanes.HOST_LOST
            st.message = f"lane host {host} ended ({why})"
        if st.error_type == lanes.HOST_LOST and hj is not None and hj.status in HOST_LIVE:
            # The host gave its items up (its supervisor died, or it was stopped) and
            # Ray has not yet said what became of it: wait for that, it names the cause.
            st.status, st.error_type = "RUNNING", None
        if st.error_type == lanes.HOST_LOST and hj is not None and hj.error_type in SUPERVISOR_GONE:
            # The host went with its node, which Ray may not have declared dead yet:
            # its own words say so, and classify makes that node loss (spot: preemption).
            st.error_type = hj.error_type
            st.message = f"{st.message}; Ray: {hj.message or hj.error_type}"
        return RayJob(submission_id=submission_id, status=st.status, message=st.message, error_type=st.error_type,
                      start_time=st.start_time, end_time=st.end_time,
                      driver_node_id=hj.driver_node_id if hj else None, driver_exit_code=st.exit_code,
                      metadata={"raylane_lane": st.group or "", "raylane_lane_host": host or ""})

    def stop(self, submission_id: str) -> bool:
        st = self._status(submission_id)
        if st is None or st.status not in HOST_LIVE or not self._ours(submission_id, st):
            return False
        if st.status == "PENDING" and self._kv("kv_put", lanes.claim_key(submission_id),
                                               b"stopped before a host took it", overwrite=False):
            # Taken here, so no host will run it.
            st.status, st.message, st.end_time = "STOPPED", "stopped before it started", int(time.time() * 1000)
            self._kv("kv_put", lanes.status_key(submission_id), st.encode())
            self._kv("kv_del", lanes.todo_key(st.group, submission_id, st.env))
            return True
        self._kv("kv_put", lanes.stop_key(submission_id), b"1")
        return True

    def logs(self, submission_id: str) -> str | None:
        value = self._kv("kv_get", lanes.logs_key(submission_id))
        if value is None:
            return None if self._status(submission_id) is None else ""
        return value.decode(errors="replace")

    def forget(self, submission_id: str, *, group: str | None = None, stopped: bool = False,
               lane_env: str | None = None, taken: bool = False) -> None:
        """The outcome and the log tail are stored in the database: the claim is
        marked ``FORGOTTEN`` (a tombstone, kept until ``sweep`` a day later, so nothing re-put can run it
        again), then its status and tail go in one call, a todo item of ``group`` a
        late redispatch may have put back, and with ``stopped`` its stop request.
        The mark comes first: a host that writes after this (one Ray counted lost
        that ran on) reads it after its last write and deletes what it wrote.
        ``group`` (and ``lane_env``): the todo item of an attempt that ended without
        a host taking it (stopped, or failed as unstartable) is deleted too; a
        host's claim took its item already, and one a late redispatch put back
        after that is deleted by the next host that lists it (its claim fails)."""
        self._kv("kv_put", lanes.claim_key(submission_id), lanes.FORGOTTEN)
        self._kv("kv_del", lanes.attempt_prefix(submission_id), prefix=True)
        if group and not taken:
            self._kv("kv_del", lanes.todo_key(group, submission_id, lane_env))
        if stopped:
            self._kv("kv_del", lanes.stop_key(submission_id))
        if not taken:
            try:
                self._end_record(submission_id)
            except RayUnavailable as e:  # a view: the outcome is stored, the sweep deletes the record
                log.debug("%s: its record in Ray's dashboard was not ended: %s", submission_id, e)

    def _end_record(self, submission_id: str) -> None:
        """An attempt that did not succeed may have lost its host mid-run (killed
        with its node): its record in Ray's dashboard still says RUNNING, and no
        host will write its end. It says FAILED from here, as Ray's own job
        manager says of a job whose driver's node died. One read, for the
        attempts that did not succeed only. No compare-and-set (Ray's KV store
        has none): a host Ray counted lost that ran on and writes its end
        between this read and this write has it overwritten, and the record then
        says what Raylane stored of the attempt (lost, and retried), as the job's
        history does; one that writes after this leaves its own end."""
        value = self._kv("job_records", [submission_id]).get(submission_id)
        if value is None or not lanes.is_lane_record(value):
            return
        rec = json.loads(value)
        if rec.get("status") not in HOST_LIVE:
            return
        rec.update(status="FAILED", end_time=int(time.time() * 1000),
                   message=f"Its lane host ({(rec.get('metadata') or {}).get(lanes.LANE_HOST_META)}) was lost "
                           "while it ran; Raylane has its outcome and any retry (/v1/jobs).")
        self._kv("put_job_record", submission_id, json.dumps(rec).encode())

    def discard(self, submission_id: str, *, group: str | None = None, lane_env: str | None = None) -> None:
        """The attempt was cancelled before it was recorded as submitted: nothing
        will look at it again, so it is stopped and forgotten here. Unclaimed, it
        is taken here (no host ever runs it) and its keys go. Claimed by a host,
        that host is asked to stop it and the claim is marked ``FORGOTTEN``; if the
        host is done with it (or gone) its keys go now, else the host deletes them
        itself after its last write, stop request included (``jobs.lane``), since
        deleting that request here could come before the host saw it."""
        sid = submission_id
        holder, st = "", None
        if not self._kv("kv_put", lanes.claim_key(sid), lanes.FORGOTTEN, overwrite=False):
            holder = (self._kv("kv_get", lanes.claim_key(sid)) or b"").decode(errors="replace")
            if holder.startswith(lanes.HOST_ID_PREFIX):
                self._kv("kv_put", lanes.stop_key(sid), b"1")
            self._kv("kv_put", lanes.claim_key(sid), lanes.FORGOTTEN)
            st = self._status(sid)  # read after the mark: a host that writes later sees the mark
        hj = self.host(holder) if holder.startswith(lanes.HOST_ID_PREFIX) else None
        host_busy = st is not None and st.status in HOST_LIVE and hj is not None and hj.status in HOST_LIVE
        lane_env = lane_env or (st.env if st else None)
        group = group or (st.group if st else None)
        self._kv("kv_del", lanes.attempt_prefix(sid), prefix=True)
        if group:
            self._kv("kv_del", lanes.todo_key(group, sid, lane_env))
        if holder.startswith(lanes.HOST_ID_PREFIX) and not host_busy:
            self._kv("kv_del", lanes.stop_key(sid))
        log.info("%s: cancelled before it was recorded; %s", sid,
                 f"its host {holder} asked to stop it" if host_busy else "its lane keys deleted")


    # Tombstones (backends.lane_sweep) ----------------------------------------------

    def store_known(self) -> bool:
        """Whether Ray's store is known (configured, or found for other work): the
        sweep never goes looking for it, so a control plane without Ray logs nothing
        of it."""
        return getattr(self.ray, "gcs", None) is not None

    def sweep_mark(self, key: str = lanes.SWEEP_MARK_KEY) -> tuple[datetime, int] | None:
        return self.sweeper.sweep_mark(key)

    def sweep(self, ended: list[dict[str, Any]]) -> int:
        return self.sweeper.sweep(ended)

    def sweep_records(self, ended: list[dict[str, Any]]) -> int:
        return self.sweeper.sweep_records(ended)


def _left_alone(submission_id: str, st: LaneStatus) -> RayJob:
    """An attempt whose status is of another protocol version, as the loops see it:
    PENDING, the status they act on least (a SUBMITTED attempt is recorded
    PENDING; a stop of it does nothing here)."""
    return RayJob(submission_id=submission_id, status="PENDING", error_type=None, start_time=None, end_time=None,
                  message=f"its lane status is of protocol version {st.v} (this control plane speaks "
                          f"{lanes.PROTOCOL_VERSION}): left to a control plane of its version",
                  driver_node_id=None, driver_exit_code=None, metadata={"raylane_lane": st.group or ""})
