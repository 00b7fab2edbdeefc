"""What the loops need from a Ray cluster, as ``typing.Protocol`` classes, and the
shapes its answers come in.

Words used here:

- *attempt backend* (``AttemptBackend``): where an attempt runs and is read back:
  ``get``/``get_many`` (its status as a ``RayJob``), ``stop``, ``logs``. Ray's Jobs
  API (``ray_jobs.RayJobsBackend``) and the warm lanes (``lanes.LaneBackend``) are
  both one, so the reconciler reads either alike;
- *Ray backend* (``RayBackend``): one Ray cluster as the control plane uses it:
  an attempt backend that also submits, lists nodes and node groups, and leaves
  and reads messages in Ray's key-value store (an attempt's inputs, its result, a
  sweep's trials, a checkpoint request). One instance per cluster: nothing here
  is a module-level singleton, so a fleet of clusters is a list of backends;
- *Ray's key-value store* (``RayKV``): the GCS's face (``ray_gcs.RayGcs``): the
  ``raylane`` namespace's keys, Ray's own job records, which nodes drain.

``raylane.orchestrator.testing.FakeRay`` is the in-memory implementation the
fast tests use; the live cluster is kept for what only Ray can show.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Protocol, runtime_checkable

from raylane.orchestrator.backends.reachability import Reachability
from raylane.orchestrator.domain.errors import EngineUnavailable
from raylane.orchestrator.domain.profile import MARKET_LABEL, NODE_GROUP_LABEL
from raylane.orchestrator.domain.routing import ClusterView, GroupState


class RayUnavailable(EngineUnavailable):
    """The dashboard / Jobs API could not be reached."""


class GcsUnavailable(Exception):
    """The GCS could not be reached (or refused the call)."""


class PackageMissing(Exception):
    """An uploaded package a job names is stored neither here nor in Ray."""


class AlreadySubmitted(Exception):
    """Ray already has a job with this submission id (a retried dispatch)."""


class ResultUnavailable(Exception):
    """An attempt's result cannot be read now (the GCS is unreachable); ask again."""


@dataclass
class RayJob:
    submission_id: str
    status: str  # PENDING RUNNING STOPPED SUCCEEDED FAILED
    message: str | None
    error_type: str | None
    start_time: int | None
    end_time: int | None
    driver_node_id: str | None
    driver_exit_code: int | None
    metadata: dict[str, str]
    ray_job_id: str | None = None  # Ray's own job id (hex), once the driver started
    log_tail: str | None = None  # a warm lane's ended attempt: its output's tail (``backends.lanes``)
    # ... and, SUCCEEDED, the result its host left, read with the tail: (found, the result or None)
    result: tuple[bool, dict[str, Any] | None] | None = None

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "RayJob":
        return cls(submission_id=d.get("submission_id") or d.get("job_id"), status=d["status"],
                   message=d.get("message"), error_type=d.get("error_type"), start_time=d.get("start_time"),
                   end_time=d.get("end_time"), driver_node_id=d.get("driver_node_id"),
                   driver_exit_code=d.get("driver_exit_code"), metadata=d.get("metadata") or {},
                   ray_job_id=d.get("job_id"))


@dataclass
class RayNode:
    node_id: str
    state: str  # ALIVE / DEAD
    labels: dict[str, str]
    resources_total: dict[str, float]
    is_head: bool
    death_reason: str | None
    death_message: str | None
    draining: bool
    drained: bool = False  # seen draining while alive: its death is the preemption it was warned of
    # What Ray has free on it now (its GCS's available resources); None: not known.
    resources_available: dict[str, float] | None = None

    @property
    def group(self) -> str | None:
        return self.labels.get(NODE_GROUP_LABEL)

    @property
    def market(self) -> str | None:
        return self.labels.get(MARKET_LABEL)


def view_of(nodes: list[RayNode]) -> tuple[ClusterView, dict[str, list[tuple[str, float]]], dict[str, list[str]]]:
    """The node groups a node list shows (alive nodes; a draining node counts apart
    and adds no capacity), each group's live worker nodes as (node id, CPUs), sorted,
    and each group's draining nodes: what ``RayBackend.cluster_view`` and
    ``group_nodes`` answer, the same for every backend."""
    view: ClusterView = {}
    live: dict[str, list[tuple[str, float]]] = {}
    draining: dict[str, list[str]] = {}
    unknown: set[str] = set()  # groups with a node whose free resources Ray did not say
    for n in nodes:
        if n.group is None or n.state != "ALIVE":
            continue
        st = view.setdefault(n.group, GroupState())
        if n.draining:
            st.draining_nodes += 1
            draining.setdefault(n.group, []).append(n.node_id)
            continue
        st.alive_nodes += 1
        if not n.is_head:
            live.setdefault(n.group, []).append((n.node_id, float(n.resources_total.get("CPU", 0))))
        for k, v in n.resources_total.items():
            if k in ("CPU", "GPU", "memory"):
                st.total[k] = st.total.get(k, 0) + v
        if n.resources_available is None or n.group in unknown:
            unknown.add(n.group)
            st.node_free = None  # one node unknown: the group's is
        else:
            if st.node_free is None:
                st.node_free = []
            # Ray leaves out a resource none of which is free: 0, not unknown.
            st.node_free.append({k: float(n.resources_available.get(k, 0.0))
                                 for k in ("CPU", "GPU", "memory") if k in n.resources_total})
    return view, {g: sorted(ns) for g, ns in live.items()}, draining


@runtime_checkable
class RayKV(Protocol):
    """Ray's GCS as Raylane uses it. Every method raises ``GcsUnavailable`` when
    the GCS cannot be asked."""

    def close(self) -> None: ...

    # Nodes
    def draining_nodes(self) -> dict[str, Any]: ...
    def all_nodes(self) -> tuple[list[dict], set[str]]: ...

    # Messages between the control plane and an attempt (``domain.protocol``'s keys)
    def request_checkpoint(self, submission_id: str, *, nodes: list[str], reason: str) -> None: ...
    def forget_checkpoint_request(self, submission_id: str) -> None: ...
    def checkpoint_request(self, submission_id: str) -> dict | None: ...
    def result(self, submission_id: str) -> dict | None: ...
    def forget_result(self, submission_id: str) -> None: ...
    def trials(self, submission_id: str) -> list[dict] | None: ...
    def forget_trials(self, submission_id: str) -> None: ...
    def inputs(self, submission_id: str) -> dict[str, str] | None: ...
    def put_inputs(self, submission_id: str, env: dict[str, str]) -> None: ...
    def forget_inputs(self, submission_id: str) -> None: ...

    # Plain keys of the ``raylane`` namespace (the warm lanes' records)
    def kv_get(self, key: str) -> bytes | None: ...
    def kv_multi_get(self, keys: list[str]) -> dict[str, bytes]: ...
    def kv_put(self, key: str, value: bytes, *, overwrite: bool = True) -> bool: ...
    def kv_del(self, key: str, *, prefix: bool = False) -> None: ...

    # Ray's own job records (its job manager's ``JobInfo``)
    def job_records(self, submission_ids: list[str]) -> dict[str, bytes]: ...
    def put_job_record(self, submission_id: str, value: bytes) -> None: ...
    def delete_job_record(self, submission_id: str) -> None: ...


@runtime_checkable
class AttemptBackend(Protocol):
    """Where attempts run, as the reconciler reads them. ``RayUnavailable`` when
    the engine cannot be asked."""

    def get(self, submission_id: str) -> RayJob | None: ...
    def get_many(self, submission_ids: list[str]) -> dict[str, RayJob | None]: ...
    def stop(self, submission_id: str) -> bool: ...
    def logs(self, submission_id: str) -> str | None: ...


@runtime_checkable
class RayBackend(AttemptBackend, Protocol):
    """One Ray cluster, as the dispatcher, the reconciler and the control plane use it."""

    gcs: RayKV | None  # what only the GCS knows; None where its address is unknown
    reachability: Reachability  # this cluster's outages (one per backend, not per process)

    def ping(self) -> bool: ...
    def close(self) -> None: ...
    def find_gcs(self) -> RayKV | None: ...

    # Jobs
    def submit(self, *, submission_id: str, entrypoint: str, runtime_env: dict[str, Any] | None,
               metadata: dict[str, str], entrypoint_num_cpus: float | None = None,
               entrypoint_num_gpus: float | None = None, entrypoint_resources: dict[str, float] | None = None,
               entrypoint_label_selector: dict[str, str] | None = None) -> None: ...
    def list(self) -> list[RayJob]: ...
    def ray_job_id(self, submission_id: str) -> str | None: ...
    def ensure_package(self, sha256: str, load: Callable[[], bytes | None]) -> str: ...

    # Messages in Ray's key-value store
    def put_inputs(self, submission_id: str, env: dict[str, str]) -> str | None: ...
    def forget_inputs(self, submission_id: str) -> None: ...
    def result(self, submission_id: str) -> dict[str, Any] | None: ...
    def forget_result(self, submission_id: str) -> None: ...
    def live_trials(self, submission_id: str) -> list[dict] | None: ...
    def forget_trials(self, submission_id: str) -> None: ...

    # Nodes
    def nodes(self, draining: set[str] | None = None) -> list[RayNode]: ...
    def cluster_view(self) -> ClusterView: ...
    def group_nodes(self, group: str) -> tuple[list[tuple[str, float]], list[str]]: ...
    def draining(self) -> set[str]: ...
    def actor_jobs_on(self, node_id: str) -> set[str]: ...
