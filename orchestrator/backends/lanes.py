"""The warm lanes as the loops see them: submit, get, stop and logs of a lane
attempt, in the shapes ``RayJobsBackend`` gives for a Ray job (``RayJob``, its
status words), so the dispatcher and the reconciler treat both paths alike.

A lane attempt lives in Ray's KV store (``domain.lanes``: todo, claim, status,
logs, stop); its host is a Ray job of its own, started here on demand
(``ensure_host``) and replaced when it has ended. An item whose host's Ray job
ended while the item ran is reported FAILED with ``lanes.HOST_LOST`` and the
host's node as its driver's node: ``loops.classify`` makes that node loss (or a
preemption) if the node died, else LOST, and both are retried.

A status of another protocol version (``lanes.PROTOCOL_VERSION``: a control
plane of another version dispatched it, during a rolling upgrade) is not read:
the attempt is reported PENDING, so nothing here acts on it, and the log says
so once per version; stop leaves it alone too.
"""

from __future__ import annotations

import logging
import shlex
import threading
import time

from raylane.orchestrator.backends.ray_jobs import AlreadySubmitted, RayJob, RayJobsBackend, RayUnavailable
from raylane.orchestrator.domain import lanes
from raylane.orchestrator.domain.lanes import LaneStatus
from raylane.orchestrator.domain.profile import NODE_GROUP_LABEL

NODE_ID_LABEL = "ray.io/node-id"  # Ray's own label on every node: pins a host to its node

log = logging.getLogger(__name__)

HOST_CHECK_S = 1.0  # one answer from Ray about a host's job serves this long
HOST_LIVE = ("PENDING", "RUNNING")
# Ray's words for a job whose supervisor went with its node (``loops.classify`` reads them as node loss)
SUPERVISOR_GONE = ("JOB_SUPERVISOR_ACTOR_DIED", "JOB_SUPERVISOR_ACTOR_START_FAILURE")
MAX_HOST_STARTS = 5  # host ids tried in one ensure_host before giving up until the next call
FAST_FAIL_MS = 30_000  # a host that FAILED sooner than this after its start failed to start
MAX_START_BACKOFF_S = 300.0  # the longest wait before starting a failing (group, node)'s next host


class LaneBackend:
    def __init__(self, ray: RayJobsBackend, *, idle_s: float = 60.0, slots: int = 8):
        self.ray = ray
        self.idle_s = idle_s
        self.slots = slots
        self._lock = threading.Lock()  # the dispatcher and the reconciler run in threads of their own
        self._hosts: dict[str, tuple[float, RayJob | None]] = {}  # host sid -> (asked at, Ray's answer)
        self._live_host: dict[str, tuple[float, str]] = {}  # group -> (found at, its live host's sid)
        # (group, node) -> (hosts that failed at start in a row, no start before this monotonic time)
        self._start_failures: dict[tuple[str, str | None], tuple[int, float]] = {}
        self._counted_failures: set[str] = set()  # host sids whose failed start is counted
        self._foreign_versions: set[int] = set()  # protocol versions of statuses seen and left alone (logged once)

    def _gcs(self):
        from raylane.orchestrator.backends.ray_gcs import GcsUnavailable  # noqa: F401 (Ray's protobufs)

        gcs = self.ray._find_gcs()
        if gcs is None:
            raise RayUnavailable("the fast lane needs Ray's GCS, and its address is unknown (set RAYLANE_RAY_ADDRESS)")
        return gcs

    def _kv(self, op: str, *args, **kw):
        from raylane.orchestrator.backends.ray_gcs import GcsUnavailable

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

    # Hosts -------------------------------------------------------------------

    def host(self, host_sid: str) -> RayJob | None:
        """Ray's view of a host's job, asked at most every ``HOST_CHECK_S`` once
        its driver has started (before that, each time: its node is wanted)."""
        now = time.monotonic()
        with self._lock:
            seen = self._hosts.get(host_sid)
        if seen is not None and now - seen[0] < HOST_CHECK_S and (seen[1] is None or seen[1].driver_node_id):
            return seen[1]
        rj = self.ray.get(host_sid)
        with self._lock:
            self._hosts[host_sid] = (now, rj)
        return rj

    def ensure_host(self, group: str) -> str:
        """The group's live hosts, started (as Ray jobs) where missing: one on each
        live node of the group, pinned to it, counting that node's CPUs; one for the
        whole group while its nodes are unknown. Returns one of them. Hosts found
        live serve ``HOST_CHECK_S`` of calls (a burst's submits) unasked."""
        with self._lock:
            known = self._live_host.get(group)
        if known is not None and time.monotonic() - known[0] < HOST_CHECK_S:
            return known[1]
        sid = self._ensure_hosts(group)[0]
        with self._lock:
            self._live_host[group] = (time.monotonic(), sid)
        return sid

    def _ensure_hosts(self, group: str) -> list[str]:
        nodes, draining = self.ray.group_nodes(group) if hasattr(self.ray, "group_nodes") else ([], [])
        where: list[tuple[str | None, float]] = list(nodes) or [(None, 0.0)]
        keys = [lanes.host_key(group, node) for node, _ in where]
        # Hosts no longer wanted: a draining node's, and the whole group's once its
        # nodes are known. Their key goes, and each (of this release) retires: it
        # takes no more items and exits when what it runs has ended.
        retire = [lanes.host_key(group, n) for n in draining] + ([lanes.host_key(group)] if nodes else [])
        if len(keys) == 1 and not retire:
            one = self._kv("kv_get", keys[0])
            current = {keys[0]: one} if one else {}
        else:
            current = self._kv("kv_multi_get", keys + retire)
        for key in retire:
            if key in current:
                self._kv("kv_del", key)
                log.info("lane host %s retired (%s)", current[key].decode(errors="replace"),
                         "its node drains" if key != lanes.host_key(group) else "the group has a host on each node now")
        sids, failed = [], None
        for node, cpus in where:
            value = current.get(lanes.host_key(group, node))
            try:
                sids.append(self._ensure_one(group, node, cpus, value.decode() if value else None))
            except RayUnavailable as e:  # one node's host: the others still serve the group
                failed = e
        if not sids:
            raise failed or RayUnavailable(f"could not start a lane host for group {group}")
        return sids

    def _failing(self, group: str, node: str | None, rj: RayJob | None) -> bool:
        """Whether the last host of (group, node) ended FAILED soon after it started,
        and the next start must wait (a node whose package cannot run a host would
        otherwise get a new Ray job every second)."""
        where = (group, node)
        now = time.monotonic()
        with self._lock:
            count, until = self._start_failures.get(where, (0, 0.0))
        if rj is not None and rj.status == "FAILED" and rj.start_time and rj.end_time \
                and rj.end_time - rj.start_time < FAST_FAIL_MS and rj.submission_id not in self._counted_failures:
            self._counted_failures.add(rj.submission_id)
            count += 1
            until = now + min(MAX_START_BACKOFF_S, 2.0 ** count)
            with self._lock:
                self._start_failures[where] = (count, until)
            log.error("lane host %s for group %s%s failed %.1f s after it started (%s); the next start waits %.0f s",
                      rj.submission_id, group, f" on node {node}" if node else "",
                      (rj.end_time - rj.start_time) / 1000, rj.message or rj.error_type, until - now)
        elif rj is not None and rj.status in HOST_LIVE:
            with self._lock:
                self._start_failures.pop(where, None)
        return now < until

    def _ensure_one(self, group: str, node: str | None, cpus: float, sid: str | None) -> str:
        for _ in range(MAX_HOST_STARTS):
            if sid is not None:
                rj = self.host(sid)
                if rj is not None and rj.status in HOST_LIVE:
                    self._failing(group, node, rj)
                    return sid
                if self._failing(group, node, rj):
                    raise RayUnavailable(f"lane hosts for group {group} keep failing at start; waiting before the next")
            n = int(sid.rsplit("-", 1)[1]) + 1 if sid else 1
            sid = lanes.host_submission_id(group, n, node)
            selector = {NODE_GROUP_LABEL: group, **({NODE_ID_LABEL: node} if node else {})}
            env = {lanes.HOST_ENV_KEY: lanes.host_key(group, node), **({lanes.HOST_ENV_CPUS: f"{cpus:g}"} if cpus else {})}
            try:
                self.ray.submit(
                    submission_id=sid, runtime_env=None, entrypoint_num_cpus=0,
                    entrypoint=" ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
                               + f" python -m {lanes.HOST_MODULE} --group {shlex.quote(group)} --host {sid} "
                               f"--slots {self.slots} --idle-s {self.idle_s:g}",
                    metadata={"raylane_lane": group, **({"raylane_lane_node": node} if node else {})},
                    entrypoint_label_selector=selector)
                log.info("started lane host %s for group %s%s", sid, group, f" on node {node}" if node else "")
            except AlreadySubmitted:
                with self._lock:
                    self._hosts.pop(sid, None)  # another control plane's: look at it afresh
                continue
            self._kv("kv_put", lanes.host_key(group, node), sid.encode())
            return sid
        raise RayUnavailable(f"could not start a lane host for group {group} (last tried {sid})")

    # Attempts ------------------------------------------------------------------

    def submit(self, *, submission_id: str, group: str, command: str, env: dict[str, str],
               args: dict | None = None, cpus: float = 0.0) -> None:
        """Queue the attempt in the group's lane (and make sure its hosts run):
        ``command`` a shell command, or with ``args`` a function's import path;
        ``cpus`` what admission counted it to hold (a host takes it only where its
        node's CPUs have room).

        Raises:
            AlreadySubmitted: the attempt was queued before (a retried dispatch); it is adopted.
            RayUnavailable: Ray's GCS could not be reached.
        """
        # The item first: a dispatcher that dies between the two writes leaves an
        # item and no status, and the same attempt dispatched again writes both.
        self._kv("kv_put", lanes.todo_key(group, submission_id), lanes.encode_item(submission_id, command, env, args=args,
                                                                                 cpus=cpus))
        added = self._kv("kv_put", lanes.status_key(submission_id), LaneStatus("PENDING", group=group).encode(),
                         overwrite=False)
        self.ensure_host(group)
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
        unclaimed_groups: set[str] = set()
        hosts: dict[str, str | None] = {}
        for sid in pending:
            claim = claims.get(lanes.claim_key(sid), b"").decode()
            hosts[sid] = claim if claim.startswith(lanes.HOST_ID_PREFIX) else None
            if hosts[sid] is None and statuses[sid].group:
                unclaimed_groups.add(statuses[sid].group)
        for group in sorted(unclaimed_groups):
            self.ensure_host(group)
        out = {sid: None if sid not in statuses else _left_alone(sid, statuses[sid]) if sid in foreign
               else self._view(sid, statuses[sid], hosts.get(sid, statuses[sid].host)) for sid in submission_ids}
        ended = [sid for sid, rj in out.items() if rj is not None and rj.status not in HOST_LIVE]
        if ended:  # their log tails go to the database with their outcomes (``forget``)
            tails = self._kv("kv_multi_get", [lanes.logs_key(sid) for sid in ended])
            for sid in ended:
                out[sid].log_tail = tails.get(lanes.logs_key(sid), b"").decode(errors="replace")
        return out

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
            self._kv("kv_del", lanes.todo_key(st.group, submission_id))
            return True
        self._kv("kv_put", lanes.stop_key(submission_id), b"1")
        return True

    def logs(self, submission_id: str) -> str | None:
        value = self._kv("kv_get", lanes.logs_key(submission_id))
        if value is None:
            return None if self._status(submission_id) is None else ""
        return value.decode(errors="replace")

    def forget(self, submission_id: str, *, group: str | None = None, stopped: bool = False) -> None:
        """The outcome and the log tail are stored in the database: the claim is
        marked ``FORGOTTEN`` (a tombstone that stays, so nothing re-put can run it
        again), then its status and tail go in one call, a todo item of ``group`` a
        late redispatch may have put back, and with ``stopped`` its stop request.
        The mark comes first: a host that writes after this (one Ray counted lost
        that ran on) reads it after its last write and deletes what it wrote."""
        self._kv("kv_put", lanes.claim_key(submission_id), lanes.FORGOTTEN)
        self._kv("kv_del", lanes.attempt_prefix(submission_id), prefix=True)
        if group:
            self._kv("kv_del", lanes.todo_key(group, submission_id))
        if stopped:
            self._kv("kv_del", lanes.stop_key(submission_id))

    def discard(self, submission_id: str, *, group: str | None = None) -> None:
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
        group = group or (st.group if st else None)
        self._kv("kv_del", lanes.attempt_prefix(sid), prefix=True)
        if group:
            self._kv("kv_del", lanes.todo_key(group, sid))
        if holder.startswith(lanes.HOST_ID_PREFIX) and not host_busy:
            self._kv("kv_del", lanes.stop_key(sid))
        log.info("%s: cancelled before it was recorded; %s", sid,
                 f"its host {holder} asked to stop it" if host_busy else "its lane keys deleted")


def _left_alone(submission_id: str, st: LaneStatus) -> RayJob:
    """An attempt whose status is of another protocol version, as the loops see it:
    PENDING, the status they act on least (a SUBMITTED attempt is recorded
    PENDING; a stop of it does nothing here)."""
    return RayJob(submission_id=submission_id, status="PENDING", error_type=None, start_time=None, end_time=None,
                  message=f"its lane status is of protocol version {st.v} (this control plane speaks "
                          f"{lanes.PROTOCOL_VERSION}): left to a control plane of its version",
                  driver_node_id=None, driver_exit_code=None, metadata={"raylane_lane": st.group or ""})
