"""An in-memory Ray cluster for tests: ``FakeRay`` is a ``backends.base.RayBackend``
(what the dispatcher, the reconciler, the warm lanes and the control plane use)
and its ``gcs`` a ``backends.base.RayKV`` (Ray's key-value store and node table),
in the spirit of procrastinate's ``InMemoryConnector``: one implementation of
the interface that the fast tests share, instead of a stand-in per test file.

    from raylane.orchestrator.testing import FakeRay

    ray = FakeRay()                         # the default profile's groups, one node per local node
    assembly.attach_backend(plane, ray, ray.profile)  # services.assembly: the loops now use it
    plane.dispatcher.run_once()
    ray.start(sid); ray.finish(sid, result={"loss": 0.1})
    plane.reconciler.run_once()

Nothing here runs a job: an attempt stays where the test puts it (``start``,
``finish``, ``fail``, ``lose``), or where ``autorun`` says (one step per read:
PENDING, RUNNING, then its outcome). Ray's real behaviour (placement, node loss,
logs, runtime envs) is what tests/ray/ checks on a live cluster.

Each instance is one cluster with its own nodes, jobs, key-value store and
reachability: a fleet of clusters in a test is several ``FakeRay(name=...)``.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Any, Callable

from raylane.orchestrator.backends.base import (AlreadySubmitted, GcsUnavailable, PackageMissing, RayJob, RayNode,
                                                RayUnavailable, ResultUnavailable, view_of)
from raylane.orchestrator.backends.reachability import Reachability
from raylane.orchestrator.domain import protocol
from raylane.orchestrator.domain.packages import ray_package_name
from raylane.orchestrator.domain.profile import MARKET_LABEL, NODE_GROUP_LABEL, Profile, default_profile
from raylane.orchestrator.domain.routing import ClusterView

__all__ = ["FakeRay", "MemoryGcs", "Outcome", "Submission", "node_id"]

ENDED = ("SUCCEEDED", "FAILED", "STOPPED")


def node_id(*parts: object) -> str:
    """A node id in Ray's shape (56 hex digits), the same for the same parts."""
    return hashlib.sha224("/".join(map(str, parts)).encode()).hexdigest()


class MemoryGcs:
    """Ray's GCS in memory (``backends.base.RayKV``): the ``raylane`` namespace's
    keys, Ray's job records, the node table and which nodes drain. ``down`` makes
    every call raise ``GcsUnavailable``; ``calls`` counts calls by method."""

    def __init__(self, address: str = "fake-gcs:6379"):
        self.address = address
        self.kv: dict[str, bytes] = {}  # the raylane namespace
        self.records: dict[str, bytes] = {}  # Ray's job records (namespace "job"), by submission id
        self.node_table: list[dict] = []  # raylet entries, as ``RayGcs.all_nodes`` gives them
        self.draining: set[str] = set()  # alive node ids being drained
        self.down = False
        self.calls: Counter[str] = Counter()
        self._lock = threading.RLock()  # a put with overwrite off adds or refuses, atomically

    def _call(self, name: str) -> None:
        self.calls[name] += 1
        if self.down:
            raise GcsUnavailable(f"Ray GCS at {self.address}: UNAVAILABLE: connection refused")

    def close(self) -> None:
        pass

    # Nodes
    def draining_nodes(self) -> dict[str, Any]:
        self._call("draining_nodes")
        alive = {n["nodeId"]: n for n in self.node_table if n.get("state") == "ALIVE"}
        return {nid: alive.get(nid, {}).get("labels", {}) for nid in self.draining
                if nid in alive or not self.node_table}

    def all_nodes(self) -> tuple[list[dict], set[str]]:
        self._call("all_nodes")
        alive = {n["nodeId"] for n in self.node_table if n.get("state") == "ALIVE"}
        return [dict(n) for n in self.node_table], self.draining & alive

    # Messages
    def _get_json(self, name: str, key: str):
        self._call(name)
        value = self.kv.get(key)
        return json.loads(value) if value else None

    def request_checkpoint(self, submission_id: str, *, nodes: list[str], reason: str) -> None:
        self._call("request_checkpoint")
        self.kv[protocol.checkpoint_key(submission_id)] = json.dumps({"nodes": nodes, "reason": reason}).encode()

    def forget_checkpoint_request(self, submission_id: str) -> None:
        self._call("forget_checkpoint_request")
        self.kv.pop(protocol.checkpoint_key(submission_id), None)
        self.kv.pop(protocol.checkpointed_key(submission_id), None)

    def checkpoint_request(self, submission_id: str) -> dict | None:
        return self._get_json("checkpoint_request", protocol.checkpoint_key(submission_id))

    def result(self, submission_id: str) -> dict | None:
        self._call("result")
        value = self.kv.get(protocol.result_key(submission_id))
        return protocol.decode_result(value) if value else None

    def put_result(self, submission_id: str, result: dict[str, Any]) -> None:
        """What an attempt's runner leaves (``raylane.jobs.base.report_result``)."""
        self.kv[protocol.result_key(submission_id)] = protocol.encode_result(result)

    def forget_result(self, submission_id: str) -> None:
        self._call("forget_result")
        self.kv.pop(protocol.result_key(submission_id), None)

    def trials(self, submission_id: str) -> list[dict] | None:
        return self._get_json("trials", protocol.trials_key(submission_id))

    def forget_trials(self, submission_id: str) -> None:
        self._call("forget_trials")
        self.kv.pop(protocol.trials_key(submission_id), None)

    def inputs(self, submission_id: str) -> dict[str, str] | None:
        self._call("inputs")
        value = self.kv.get(protocol.inputs_key(submission_id))
        return protocol.decode_inputs(value) if value else None

    def put_inputs(self, submission_id: str, env: dict[str, str]) -> None:
        self._call("put_inputs")
        self.kv[protocol.inputs_key(submission_id)] = protocol.encode_inputs(env)

    def forget_inputs(self, submission_id: str) -> None:
        self._call("forget_inputs")
        self.kv.pop(protocol.inputs_key(submission_id), None)

    # Plain keys
    def kv_get(self, key: str) -> bytes | None:
        self._call("kv_get")
        return self.kv.get(key)

    def kv_multi_get(self, keys: list[str]) -> dict[str, bytes]:
        self._call("kv_multi_get")
        return {k: self.kv[k] for k in keys if self.kv.get(k)}

    def kv_put(self, key: str, value: bytes, *, overwrite: bool = True) -> bool:
        self._call("kv_put")
        with self._lock:
            added = key not in self.kv
            if added or overwrite:
                self.kv[key] = value
            return added

    def kv_del(self, key: str, *, prefix: bool = False) -> None:
        self._call("kv_del")
        with self._lock:
            for k in [k for k in self.kv if (k.startswith(key) if prefix else k == key)]:
                del self.kv[k]

    # Ray's job records
    def job_records(self, submission_ids: list[str]) -> dict[str, bytes]:
        self._call("job_records")
        return {sid: self.records[sid] for sid in submission_ids if sid in self.records}

    def put_job_record(self, submission_id: str, value: bytes) -> None:
        self._call("put_job_record")
        self.records[submission_id] = value

    def delete_job_record(self, submission_id: str) -> None:
        self._call("delete_job_record")
        self.records.pop(submission_id, None)


@dataclass
class Submission:
    """What a submit handed to Ray."""

    submission_id: str
    entrypoint: str
    runtime_env: dict[str, Any] | None
    metadata: dict[str, str]
    num_cpus: float | None = None
    num_gpus: float | None = None
    resources: dict[str, float] | None = None
    label_selector: dict[str, str] | None = None
    inputs: dict[str, str] | None = None  # the runner's inputs (from the KV store or the command line)

    @property
    def env(self) -> dict[str, str]:
        """The environment its driver would see: the runtime env's variables, then the runner's inputs."""
        return {**((self.runtime_env or {}).get("env_vars") or {}), **(self.inputs or {})}


@dataclass
class Outcome:
    """How an attempt ends under ``autorun``: SUCCEEDED or FAILED (with ``exit_code``)."""

    status: str = "SUCCEEDED"
    exit_code: int | None = None
    message: str | None = None
    error_type: str | None = None
    result: dict[str, Any] | None = None
    logs: str = ""


@dataclass
class _Job:
    job: RayJob
    submission: Submission
    seen_running: bool = False
    logs: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


class FakeRay:
    """One Ray cluster in memory, as ``backends.base.RayBackend``.

    Nodes: one per ``local_nodes`` of each group of ``profile`` (the local
    cluster's shape), with the group's labels and resources. ``down`` makes
    every call raise ``RayUnavailable`` (an outage); ``gcs=False`` is a cluster
    whose GCS address is unknown (inputs ride on the command line, no drains)."""

    def __init__(self, profile: Profile | None = None, *, name: str = "fake", gcs: bool = True,
                 autorun: Callable[[Submission], Outcome | None] | None = None):
        self.name = name
        self.profile = profile or default_profile()
        self.dashboard_url = f"http://{name}.ray.invalid:8265"
        self.gcs: MemoryGcs | None = MemoryGcs(f"{name}.ray.invalid:6379") if gcs else None
        self.reachability = Reachability(self.dashboard_url)
        self.autorun = autorun
        self.down = False
        self.jobs: dict[str, _Job] = {}
        self.submitted: list[Submission] = []  # every accepted submit, in order
        self.refused: list[str] = []  # submits of an id Ray already had (a retried dispatch)
        self.stopped: list[str] = []  # every stop asked, in order
        self.packages: dict[str, bytes] = {}  # Ray's package store, by package name
        self.actors: dict[str, set[str]] = {}  # node id -> Ray job ids with alive actors there
        self.closed = False
        self._lock = threading.RLock()  # the dispatcher, the reconciler and API requests call from their threads
        self._nodes: dict[str, RayNode] = {}
        self._drained: set[str] = set()
        self._clock = 0
        for g in self.profile.groups:
            for i in range(g.local_nodes if g.role != "head" else 1):
                self.add_node(g.name, index=i)

    # The cluster, as a test changes it ---------------------------------------------

    def add_node(self, group: str, *, index: int | None = None, cpus: float | None = None) -> str:
        """A live node of ``group`` (the profile's), its id returned."""
        g = next(x for x in self.profile.groups if x.name == group)
        with self._lock:
            n = index if index is not None else sum(1 for x in self._nodes.values() if x.group == group)
            nid = node_id(self.name, group, n)
            resources = {"CPU": float(g.cpus if cpus is None else cpus), "memory": g.memory_gb * 2 ** 30}
            if g.accelerator:
                resources["GPU"] = float(g.accelerator.count)
            self._nodes[nid] = RayNode(node_id=nid, state="ALIVE",
                                       labels={NODE_GROUP_LABEL: g.name, MARKET_LABEL: g.market},
                                       resources_total=resources, is_head=g.role == "head", death_reason=None,
                                       death_message=None, draining=False)
            self._sync_node_table()
        return nid

    def set_free(self, node: str, resources: dict[str, float] | None) -> None:
        """What Ray has free on ``node`` now, as its GCS would say (``RayNode.resources_available``).
        None, the default: unknown (this fake places no workers on nodes), and admission
        judges a group by its sum alone."""
        with self._lock:
            self._nodes[node] = replace(self._nodes[node],
                                        resources_available=None if resources is None else dict(resources))
            self._sync_node_table()

    def node_ids(self, group: str) -> list[str]:
        with self._lock:
            return [n.node_id for n in self._nodes.values() if n.group == group and n.state == "ALIVE"]

    def drain(self, node: str) -> None:
        """Ray's drain API marked the node (a spot reclaim notice): alive, draining."""
        with self._lock:
            self.gcs.draining.add(node) if self.gcs is not None else None
            self._drained.add(node)

    def kill_node(self, node: str, *, reason: str = "UNEXPECTED_TERMINATION", message: str = "killed") -> None:
        """The node dies; the attempts whose driver ran there end as Ray reports it."""
        with self._lock:
            n = self._nodes[node]
            self._nodes[node] = replace(n, state="DEAD", death_reason=reason, death_message=message, draining=False)
            if self.gcs is not None:
                self.gcs.draining.discard(node)
            self._sync_node_table()
            for j in self.jobs.values():
                if j.job.driver_node_id == node and j.job.status not in ENDED:
                    self._end(j, "FAILED", message=f"Job supervisor actor died: the actor died because its node "
                              f"has died. Node Id: {node}", error_type="JOB_SUPERVISOR_ACTOR_DIED")

    def _sync_node_table(self) -> None:
        if self.gcs is None:
            return
        self.gcs.node_table = [{"nodeId": n.node_id, "state": n.state, "labels": dict(n.labels),
                                "resourcesTotal": dict(n.resources_total), "isHeadNode": n.is_head,
                                "deathInfo": ({"reason": n.death_reason, "reasonMessage": n.death_message}
                                              if n.state == "DEAD" else {}),
                                **({"resourcesAvailable": dict(n.resources_available)}
                                   if n.resources_available is not None and n.state == "ALIVE" else {})}
                               for n in self._nodes.values()]

    # Attempts, as a test moves them ------------------------------------------------

    def submission(self, submission_id: str) -> Submission:
        return self.jobs[submission_id].submission

    def start(self, submission_id: str, *, node: str | None = None) -> RayJob:
        """The attempt's driver started (on ``node``, else the first live node its selector allows)."""
        with self._lock:
            j = self.jobs[submission_id]
            j.job.status = "RUNNING"
            j.job.start_time = j.job.start_time or self._now_ms()
            j.job.driver_node_id = node or j.job.driver_node_id or self._driver_node(j.submission)
            j.job.ray_job_id = j.job.ray_job_id or f"{len(self.jobs):08x}"
            return j.job

    def finish(self, submission_id: str, status: str = "SUCCEEDED", *, exit_code: int | None = None,
               message: str | None = None, error_type: str | None = None, result: dict[str, Any] | None = None,
               logs: str | None = None) -> RayJob:
        """The attempt ended; ``result`` is what its runner left in Ray's store."""
        with self._lock:
            j = self.jobs[submission_id]
            if j.job.status == "PENDING":
                self.start(submission_id)
            if result is not None and self.gcs is not None:
                self.gcs.put_result(submission_id, result)
            if logs is not None:
                j.logs += logs
            if status == "FAILED" and exit_code is not None and error_type is None:
                error_type = "JOB_ENTRYPOINT_COMMAND_ERROR"
                message = message or f"Job entrypoint command failed with exit code {exit_code}"
            self._end(j, status, exit_code=exit_code, message=message, error_type=error_type)
            return j.job

    def fail(self, submission_id: str, exit_code: int = 1, **kw) -> RayJob:
        return self.finish(submission_id, "FAILED", exit_code=exit_code, **kw)

    def record(self, *jobs: RayJob) -> None:
        """Ray's records of these jobs, as given (Ray's answer to ``get`` from now on),
        as if each had been submitted before (a test that starts from Ray's side)."""
        with self._lock:
            for job in jobs:
                known = self.jobs.get(job.submission_id)
                sub = known.submission if known else Submission(job.submission_id, "", None, dict(job.metadata))
                self.jobs[job.submission_id] = _Job(replace(job), sub, logs=known.logs if known else "")

    def lose(self, submission_id: str) -> None:
        """Ray forgets the attempt (a head restarted without GCS fault tolerance)."""
        with self._lock:
            self.jobs.pop(submission_id, None)

    def running(self) -> list[str]:
        """Submission ids Ray has not ended, in submit order."""
        with self._lock:
            return [sid for sid, j in self.jobs.items() if j.job.status not in ENDED]

    def _end(self, j: _Job, status: str, *, exit_code: int | None = None, message: str | None = None,
             error_type: str | None = None) -> None:
        j.job.status, j.job.end_time = status, self._now_ms()
        j.job.driver_exit_code, j.job.message, j.job.error_type = exit_code, message, error_type

    def _now_ms(self) -> int:
        self._clock += 1  # strictly increasing, whatever the machine's clock does
        return int(time.time() * 1000) + self._clock

    def _driver_node(self, sub: Submission) -> str | None:
        want = dict(sub.label_selector or {})
        group = want.get(NODE_GROUP_LABEL) or sub.metadata.get("raylane_node_group")
        for n in self._nodes.values():
            if n.state == "ALIVE" and not n.is_head and (group is None or n.group == group) \
                    and want.get("ray.io/node-id", n.node_id) == n.node_id:
                return n.node_id
        return None

    def _step(self, j: _Job) -> None:
        """``autorun``: one step per read, so the loops see each status once."""
        if self.autorun is None or j.job.status in ENDED:
            return
        if j.job.status == "PENDING":
            self.start(j.job.submission_id)
            return
        outcome = self.autorun(j.submission)
        if outcome is not None:
            self.finish(j.job.submission_id, outcome.status, exit_code=outcome.exit_code, message=outcome.message,
                        error_type=outcome.error_type, result=outcome.result, logs=outcome.logs)

    # RayBackend --------------------------------------------------------------------

    def _call(self) -> None:
        if self.down:
            err = RayUnavailable(f"Ray dashboard at {self.dashboard_url} unreachable: ConnectError: refused")
            self.reachability.down(err)
            raise err

    def ping(self) -> bool:
        if self.down:
            self.reachability.down(f"Ray dashboard at {self.dashboard_url} unreachable")
            return False
        self.reachability.up()
        return True

    def close(self) -> None:
        self.closed = True

    def find_gcs(self) -> MemoryGcs | None:
        return self.gcs

    def submit(self, *, submission_id: str, entrypoint: str, runtime_env: dict[str, Any] | None,
               metadata: dict[str, str], entrypoint_num_cpus: float | None = None,
               entrypoint_num_gpus: float | None = None, entrypoint_resources: dict[str, float] | None = None,
               entrypoint_label_selector: dict[str, str] | None = None) -> None:
        self._call()
        with self._lock:
            if submission_id in self.jobs:
                self.refused.append(submission_id)
                raise AlreadySubmitted(submission_id)
            sub = Submission(submission_id, entrypoint, runtime_env, dict(metadata), entrypoint_num_cpus,
                             entrypoint_num_gpus, entrypoint_resources, entrypoint_label_selector,
                             inputs=self._inputs_of(submission_id, entrypoint))
            self.submitted.append(sub)
            self.jobs[submission_id] = _Job(RayJob(submission_id, "PENDING", None, None, None, None, None, None,
                                                   dict(metadata)), sub)

    def _inputs_of(self, submission_id: str, entrypoint: str) -> dict[str, str] | None:
        if self.gcs is not None and protocol.inputs_key(submission_id) in self.gcs.kv:
            return protocol.decode_inputs(self.gcs.kv[protocol.inputs_key(submission_id)])
        marker = f"{protocol.PAYLOAD_ENV}="
        if marker in entrypoint:
            return protocol.decode_payload(entrypoint.split(marker, 1)[1].split()[0])
        return None

    def get(self, submission_id: str) -> RayJob | None:
        self._call()
        with self._lock:
            j = self.jobs.get(submission_id)
            if j is None:
                return None
            self._step(j)
            return replace(j.job)

    def get_many(self, submission_ids: list[str]) -> dict[str, RayJob | None]:
        self._call()
        return {sid: self.get(sid) for sid in submission_ids}

    def list(self) -> list[RayJob]:
        self._call()
        with self._lock:
            return [replace(j.job) for j in self.jobs.values()]

    def stop(self, submission_id: str) -> bool:
        self._call()
        with self._lock:
            self.stopped.append(submission_id)
            j = self.jobs.get(submission_id)
            if j is None or j.job.status in ENDED:
                return False
            self._end(j, "STOPPED", message="Job was intentionally stopped.")
            return True

    def logs(self, submission_id: str) -> str | None:
        self._call()
        with self._lock:
            j = self.jobs.get(submission_id)
            return None if j is None else j.logs

    def write_logs(self, submission_id: str, text: str) -> None:
        """The attempt's driver printed ``text``."""
        with self._lock:
            self.jobs[submission_id].logs += text

    def ray_job_id(self, submission_id: str) -> str | None:
        self._call()
        with self._lock:
            j = self.jobs.get(submission_id)
            return j.job.ray_job_id if j else None

    def ensure_package(self, sha256: str, load: Callable[[], bytes | None]) -> str:
        self._call()
        name = ray_package_name(sha256)
        with self._lock:
            if name not in self.packages:
                data = load()
                if data is None:
                    raise PackageMissing(f"package {sha256} is no longer stored; upload it again and resubmit")
                self.packages[name] = data
        return f"gcs://{name}"

    # Messages
    def put_inputs(self, submission_id: str, env: dict[str, str]) -> str | None:
        if self.gcs is None:
            return None
        try:
            self.gcs.put_inputs(submission_id, env)
        except GcsUnavailable as e:
            raise RayUnavailable(str(e)) from e
        return protocol.inputs_key(submission_id)

    def forget_inputs(self, submission_id: str) -> None:
        self._forget("inputs", submission_id)

    def result(self, submission_id: str) -> dict[str, Any] | None:
        if self.gcs is None:
            return None
        try:
            return self.gcs.result(submission_id)
        except GcsUnavailable as e:
            raise ResultUnavailable(f"result of {submission_id} unreadable for now: {e}") from e
        except ValueError:  # not JSON: no runner of ours wrote it
            return None

    def forget_result(self, submission_id: str) -> None:
        self._forget("result", submission_id)

    def live_trials(self, submission_id: str) -> list[dict] | None:
        if self.gcs is None:
            return None
        try:
            return self.gcs.trials(submission_id)
        except GcsUnavailable:
            return None

    def forget_trials(self, submission_id: str) -> None:
        self._forget("trials", submission_id)

    def _forget(self, what: str, submission_id: str) -> None:
        if self.gcs is None:
            return
        try:
            getattr(self.gcs, f"forget_{what}")(submission_id)
        except GcsUnavailable:
            pass  # left behind, as Ray's own backend leaves it (with a warning)

    # Nodes
    def nodes(self, draining: set[str] | None = None) -> list[RayNode]:
        self._call()
        if draining is None:
            draining = self.draining()
        with self._lock:
            self._drained |= draining
            return [replace(n, draining=n.node_id in draining and n.state == "ALIVE",
                            drained=n.node_id in self._drained) for n in self._nodes.values()]

    def cluster_view(self) -> ClusterView:
        view, _, _ = view_of(self.nodes())
        self.reachability.up()
        return view

    def group_nodes(self, group: str) -> tuple[list[tuple[str, float]], list[str]]:
        _, live, draining = view_of(self.nodes())
        return list(live.get(group, ())), list(draining.get(group, ()))

    def draining(self) -> set[str]:
        if self.gcs is None:
            return set()
        try:
            return set(self.gcs.draining_nodes())
        except GcsUnavailable:
            return set()

    def actor_jobs_on(self, node_id: str) -> set[str]:
        self._call()
        with self._lock:
            return set(self.actors.get(node_id, ()))
