"""The warm lanes' host pool: the long-lived Ray jobs (hosts) that run a group's
lane items, one on each live node of the group (pinned to it), started on
demand and replaced when they have ended; and the lane envs' cache (a job's
working_dir, py_modules and pip, recorded once in Ray's store, each with hosts
of its own, at most ``max_envs`` of a group at once). One of ``LaneBackend``'s
three jobs (beside its attempts and the sweeps of ``backends.lane_sweep``): the
attempt adapter asks it for a live host of an item's (group, env) and whether
an env is broken. A host that fails soon after its start makes the next start
of its (group, node, env) wait (a backoff); one Ray could not start in its
runtime env marks the env broken meanwhile.
"""

from __future__ import annotations

import json
import logging
import shlex
import threading
import time
from typing import Any, Callable

from raylane.orchestrator.backends.base import AlreadySubmitted, RayBackend, RayJob, RayUnavailable
from raylane.orchestrator.domain import lanes
from raylane.orchestrator.domain.profile import NODE_GROUP_LABEL

NODE_ID_LABEL = "ray.io/node-id"  # Ray's own label on every node: pins a host to its node

# The warm lanes' logger, as before the host pool had a module of its own: the
# records (and the JSON logs' "logger" field) name the same source.
log = logging.getLogger("raylane.orchestrator.backends.lanes")

HOST_CHECK_S = 1.0  # one answer from Ray about a host's job serves this long
HOST_LIVE = ("PENDING", "RUNNING")
MAX_HOST_STARTS = 5  # host ids tried in one ensure_host before giving up until the next call
FAST_FAIL_MS = 30_000  # a host that FAILED sooner than this after its start failed to start
MAX_START_BACKOFF_S = 300.0  # the longest wait before starting a failing (group, node)'s next host
RETIRED = b"retired:"  # before a host's id in its key: it was retired (its env gave way to another)
ENV_SETUP_FAILED = "RUNTIME_ENV_SETUP_FAILURE"  # Ray's error type of a job whose runtime env could not be set up
ENV_HOLD_S = 10.0  # an env wanted this recently keeps its hosts, over max_envs if need be (``_want_env``)
ENV_REFUSED_S = 30.0  # an env no host can be started in (not handed to Ray) fails its waiting items this long
# What a control plane remembers of hosts, nodes and envs is pruned this often
# (``_prune``), so one that runs for months holds what its current hosts need,
# not an entry for every host, node and env it ever saw (hosts come and go with
# every idle period, spot nodes with every reclaim, envs with every new package).
PRUNE_EVERY_S = 60.0
MEMO_MAX = 1024  # host sids whose failed start is counted, envs read: at most this many kept


class LaneEnvConflict(ValueError):
    """A lane env's key already names another env's record in Ray's store."""

    def __init__(self, env: str):
        super().__init__(f"lane env {env} is recorded in Ray's store with other contents; this job's runtime env "
                         f"is refused for it (two envs with one key)")


class LaneHosts:
    """The hosts and lane envs of one Ray cluster, over ``ray`` (its Jobs API and
    nodes) and ``kv(op, *args)``: a call of Ray's GCS client by name
    (``LaneBackend._kv``: a GCS failure is ``RayUnavailable``)."""

    def __init__(self, ray: RayBackend, kv: Callable[..., Any], *, idle_s: float = 60.0, slots: int = 8,
                 max_envs: int = 4, to_ray_env: Callable[[dict[str, Any]], dict[str, Any]] | None = None):
        self.ray = ray
        self._kv = kv
        self.idle_s = idle_s
        self.slots = slots
        self.max_envs = max_envs  # lane envs of one group with hosts at once
        # A lane env as a spec says it -> as Ray takes it (uploaded packages handed to
        # Ray's package store: the dispatcher's), called at each start of its hosts.
        self.to_ray_env = to_ray_env
        self._lock = threading.Lock()  # the dispatcher and the reconciler run in threads of their own
        self._hosts: dict[str, tuple[float, RayJob | None]] = {}  # host sid -> (asked at, Ray's answer)
        self._live_host: dict[tuple[str, str | None], tuple[float, str]] = {}  # (group, env) -> (found at, a live host)
        # (group, node, env) -> (hosts that failed at start in a row, no start before this monotonic time)
        self._start_failures: dict[tuple[str, str | None, str | None], tuple[int, float]] = {}
        self._envs: dict[str, dict[str, Any]] = {}  # lane env key -> the env (``lanes.env_of``), recorded in Ray's store
        self._env_used: dict[str, dict[str, float]] = {}  # group -> {env key: last wanted (monotonic)}
        self._env_broken: dict[tuple[str, str], tuple[str, float]] = {}  # (group, env) -> (Ray's message, until)
        self._counted_failures: dict[str, None] = {}  # host sids whose failed start is counted (oldest first)
        self._pruned_at = time.monotonic()

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

    def ensure_host(self, group: str, env: str | None = None) -> str:
        """The live hosts of the group (for lane env ``env``), started (as Ray jobs)
        where missing: one on each live node of the group, pinned to it, counting
        that node's CPUs; one for the whole group while its nodes are unknown.
        Returns one of them. Hosts found live serve ``HOST_CHECK_S`` of calls (a
        burst's submits) unasked."""
        self._prune()
        with self._lock:
            known = self._live_host.get((group, env))
        if known is not None and time.monotonic() - known[0] < HOST_CHECK_S:
            return known[1]
        if env is not None:
            self._want_env(group, env)
        sid = self._ensure_hosts(group, env)[0]
        with self._lock:
            self._live_host[(group, env)] = (time.monotonic(), sid)
        return sid

    def _prune(self) -> None:
        """Forget, at most every ``PRUNE_EVERY_S``, what no call reads again: Ray's
        answers about hosts and the live host of each (group, env) older than
        ``HOST_CHECK_S`` (they are asked afresh anyway), start backoffs that ended
        ``MAX_START_BACKOFF_S`` ago (a node gone, an env no longer wanted: its count
        starts over), broken envs whose wait ended, all but the newest ``MEMO_MAX``
        counted failures (a failed host's id is not looked at again once its key
        names the next) and envs beyond ``MEMO_MAX`` no group wants now (read again
        from Ray's store if they come back)."""
        now = time.monotonic()
        if now - self._pruned_at < PRUNE_EVERY_S:
            return
        with self._lock:
            self._pruned_at = now
            self._hosts = {k: v for k, v in self._hosts.items() if now - v[0] < HOST_CHECK_S}
            self._live_host = {k: v for k, v in self._live_host.items() if now - v[0] < HOST_CHECK_S}
            self._start_failures = {k: v for k, v in self._start_failures.items()
                                    if now < v[1] + MAX_START_BACKOFF_S}
            self._env_broken = {k: v for k, v in self._env_broken.items() if now < v[1]}
            self._counted_failures = dict.fromkeys(list(self._counted_failures)[-MEMO_MAX:])
            if len(self._envs) > MEMO_MAX:
                wanted = {e for used in self._env_used.values() for e in used}
                self._envs = {k: v for k, v in self._envs.items() if k in wanted}

    def _want_env(self, group: str, env: str) -> None:
        """``env`` is wanted in ``group`` now; if that makes more than ``max_envs``
        envs with hosts there, the hosts of the one wanted longest ago retire."""
        now = time.monotonic()
        with self._lock:
            used = self._env_used.setdefault(group, {})
            used[env] = now
            # An env not wanted for longer than a host's idle time has no hosts left.
            for k in [k for k, t in used.items() if now - t > self.idle_s + HOST_CHECK_S]:
                del used[k]
            # Only an env not wanted for ``ENV_HOLD_S`` gives way: while more envs than
            # that bound all have work, each keeps its hosts (over the bound, for a
            # while) rather than retiring another's at each look and starting them
            # again a second later, a host start (and an env set-up) per job.
            idle = [k for k in sorted(used, key=used.get) if k != env and now - used[k] >= ENV_HOLD_S]
            evict = idle[:max(0, len(used) - self.max_envs)]
            for k in evict:
                del used[k]
                self._live_host.pop((group, k), None)
        for k in evict:
            # Each host key of the env names its host as retired: the host sees another
            # value and retires; the next start of the env numbers on from it.
            nodes, draining = self.ray.group_nodes(group) if hasattr(self.ray, "group_nodes") else ([], [])
            keys = [lanes.host_key(group, n, k) for n in [None, *(n for n, _ in nodes), *draining]]
            for key, value in self._kv("kv_multi_get", keys).items():
                if not value.startswith(RETIRED):
                    self._kv("kv_put", key, RETIRED + value)
            log.info("lane env %s of group %s: its hosts retire (%d envs of the group have hosts; at most %d)",
                     k, group, self.max_envs + 1, self.max_envs)

    def _ensure_hosts(self, group: str, env: str | None = None) -> list[str]:
        nodes, draining = self.ray.group_nodes(group) if hasattr(self.ray, "group_nodes") else ([], [])
        where: list[tuple[str | None, float]] = list(nodes) or [(None, 0.0)]
        keys = [lanes.host_key(group, node, env) for node, _ in where]
        # Hosts no longer wanted: a draining node's, and the whole group's once its
        # nodes are known. Their key goes, and each (of this release) retires: it
        # takes no more items and exits when what it runs has ended.
        retire = [lanes.host_key(group, n, env) for n in draining] + ([lanes.host_key(group, env=env)] if nodes else [])
        if len(keys) == 1 and not retire:
            one = self._kv("kv_get", keys[0])
            current = {keys[0]: one} if one else {}
        else:
            current = self._kv("kv_multi_get", keys + retire)
        for key in retire:
            if key in current:
                self._kv("kv_del", key)
                log.info("lane host %s retired (%s)", current[key].decode(errors="replace"),
                         "its node drains" if key != lanes.host_key(group, env=env)
                         else "the group has a host on each node now")
        sids, failed = [], None
        for node, cpus in where:
            value = current.get(lanes.host_key(group, node, env))
            retired = value is not None and value.startswith(RETIRED)
            if retired:
                value = value[len(RETIRED):]
            try:
                sids.append(self._ensure_one(group, node, cpus, value.decode() if value else None, env,
                                             retired=retired))
            except RayUnavailable as e:  # one node's host: the others still serve the group
                failed = e
        if not sids:
            raise failed or RayUnavailable(f"could not start a lane host for group {group}")
        return sids

    def _failing(self, group: str, node: str | None, rj: RayJob | None, env: str | None = None) -> bool:
        """Whether the last host of (group, node, env) ended FAILED soon after it
        started, and the next start must wait (a node whose package cannot run a
        host would otherwise get a new Ray job every second). A host Ray could not
        start in its runtime env marks the env broken meanwhile (``get_many``
        fails its waiting items)."""
        where = (group, node, env)
        now = time.monotonic()
        with self._lock:
            count, until = self._start_failures.get(where, (0, 0.0))
        # A host that failed soon after its start failed to start; one whose runtime env
        # Ray could not set up did too, however long that took (a pip install that
        # gives up after minutes would otherwise get a new host, and a new install,
        # at every look).
        quick = bool(rj and rj.start_time and rj.end_time and rj.end_time - rj.start_time < FAST_FAIL_MS)
        if rj is not None and rj.status == "FAILED" and (quick or rj.error_type == ENV_SETUP_FAILED) \
                and rj.submission_id not in self._counted_failures:
            self._counted_failures[rj.submission_id] = None
            count += 1
            until = now + min(MAX_START_BACKOFF_S, 2.0 ** count)
            with self._lock:
                self._start_failures[where] = (count, until)
                if env is not None and rj.error_type == ENV_SETUP_FAILED:
                    self._env_broken[(group, env)] = (rj.message or ENV_SETUP_FAILED, until)
            log.error("lane host %s for group %s%s failed %.1f s after it started (%s); the next start waits %.0f s",
                      rj.submission_id, group, f" on node {node}" if node else "",
                      ((rj.end_time or 0) - (rj.start_time or 0)) / 1000, rj.message or rj.error_type, until - now)
        elif rj is not None and rj.status in HOST_LIVE:
            with self._lock:
                self._start_failures.pop(where, None)
                if env is not None and rj.status == "RUNNING":
                    self._env_broken.pop((group, env), None)
        return now < until

    def _ensure_one(self, group: str, node: str | None, cpus: float, sid: str | None, env: str | None = None,
                    *, retired: bool = False) -> str:
        for _ in range(MAX_HOST_STARTS):
            if sid is not None and not retired:
                rj = self.host(sid)
                if rj is not None and rj.status in HOST_LIVE:
                    self._failing(group, node, rj, env)
                    return sid
                if self._failing(group, node, rj, env):
                    raise RayUnavailable(f"lane hosts for group {group} keep failing at start; waiting before the next")
            n = int(sid.rsplit("-", 1)[1]) + 1 if sid else 1
            sid, retired = lanes.host_submission_id(group, n, node, env), False
            selector = {NODE_GROUP_LABEL: group, **({NODE_ID_LABEL: node} if node else {})}
            runtime_env = self._ray_env(env)
            opts = {lanes.HOST_ENV_KEY: lanes.host_key(group, node, env),
                    **({lanes.HOST_ENV_CPUS: f"{cpus:g}"} if cpus else {}),
                    **({lanes.HOST_ENV_ENV: env} if env else {}),
                    **({lanes.HOST_ENV_IN_WORKING_DIR: "1"} if runtime_env and runtime_env.get("working_dir") else {})}
            try:
                self.ray.submit(
                    submission_id=sid, runtime_env=runtime_env, entrypoint_num_cpus=0,
                    entrypoint=" ".join(f"{k}={shlex.quote(v)}" for k, v in opts.items())
                               + f" python -m {lanes.ENV_HOST_MODULE if env else lanes.HOST_MODULE}"
                               f" --group {shlex.quote(group)} --host {shlex.quote(sid)} "
                               f"--slots {self.slots} --idle-s {self.idle_s:g}",
                    metadata={"raylane_lane": group, **({"raylane_lane_node": node} if node else {}),
                              **({"raylane_lane_env": env} if env else {})},
                    entrypoint_label_selector=selector)
                log.info("started lane host %s for group %s%s%s", sid, group, f" on node {node}" if node else "",
                         f" in lane env {env}" if env else "")
            except AlreadySubmitted:
                with self._lock:
                    self._hosts.pop(sid, None)  # another control plane's: look at it afresh
                continue
            self._kv("kv_put", lanes.host_key(group, node, env), sid.encode())
            return sid
        raise RayUnavailable(f"could not start a lane host for group {group} (last tried {sid})")

    def _ray_env(self, env: str | None) -> dict[str, Any] | None:
        """The runtime env of a host of lane env ``env``, as Ray takes it (None: the node's own)."""
        if env is None:
            return None
        spec_env = self._envs.get(env)
        if spec_env is None:  # queued by another control plane (or before a restart)
            raw = self._kv("kv_get", lanes.env_record_key(env))
            if raw is None:
                raise RuntimeError(f"lane env {env} is not recorded in Ray's store")
            spec_env = json.loads(raw)
            with self._lock:
                self._envs[env] = spec_env
        return self.to_ray_env(spec_env) if self.to_ray_env else dict(spec_env)

    def record_env(self, env: str, runtime_env: dict[str, Any]) -> None:
        """Keep lane env ``env`` in Ray's store for whoever starts its hosts. A record
        is written once and never replaced: an env whose key names another env's
        record is refused (``LaneEnvConflict``), so no job can make the hosts that
        run another's jobs start in its code."""
        known = self._envs.get(env)
        if known is not None:
            if known != runtime_env:
                raise LaneEnvConflict(env)
            return
        ours = json.dumps(runtime_env, sort_keys=True).encode()
        if not self._kv("kv_put", lanes.env_record_key(env), ours, overwrite=False):
            theirs = self._kv("kv_get", lanes.env_record_key(env))
            if theirs is not None and json.loads(theirs) != json.loads(ours):
                raise LaneEnvConflict(env)
        with self._lock:
            self._envs[env] = dict(runtime_env)

    # Broken envs -------------------------------------------------------------

    def refuse_env(self, group: str, env: str, message: str) -> None:
        """No host of ``env`` can be started in ``group`` at all (its package is
        gone, Ray refused it): its waiting items fail for ``ENV_REFUSED_S``."""
        with self._lock:
            self._env_broken[(group, env)] = (message, time.monotonic() + ENV_REFUSED_S)

    def env_broken_now(self, group: str | None, env: str) -> bool:
        with self._lock:
            broken = self._env_broken.get((group or "", env))
        return broken is not None and time.monotonic() < broken[1]

    def broken_message(self, group: str | None, env: str | None) -> str:
        """Ray's words on why ``env``'s hosts could not start in ``group``."""
        with self._lock:
            return self._env_broken.get((group or "", env), (ENV_SETUP_FAILED, 0.0))[0]
