"""What only Ray's GCS knows, over its gRPC API: which nodes are draining, and
Ray's internal key-value store, where Raylane and its jobs leave each other
messages (``raylane.orchestrator.domain.protocol``'s keys).

Ray's dashboard caches its node list and never shows a drain: a node that Ray's
drain API (``ray drain-node``, a spot-termination watcher, KubeRay) marked for
preemption looks ALIVE and ACTIVE there until it dies. The GCS's own node table
has it as DRAINING (``state_snapshot``), so this asks the GCS, with the cluster's
token in the ``authorization`` metadata exactly as Ray's own clients send it.

Raylane tells a job to checkpoint by writing ``checkpoint/<submission id>`` in the
``raylane`` namespace of that store; the job's runner (``raylane.jobs.base.RunContext.
checkpoint_requested``) reads it from inside the cluster. The runner leaves its
result at ``result/<submission id>``; the reconciler reads it and deletes it once
stored. Both sides go through Ray's own store, so a message survives whatever
the control plane does next.

Without ``RAYLANE_RAY_ADDRESS`` the control plane asks the dashboard's host on
Ray's default GCS port (``Settings.resolved_ray_address``), as every deploy here
starts its head.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass

import grpc
from ray.core.generated import gcs_pb2, gcs_service_pb2, gcs_service_pb2_grpc

from raylane.orchestrator.backends.base import GcsUnavailable
from raylane.orchestrator.domain import protocol

__all__ = ["DrainingNode", "GcsUnavailable", "RayGcs", "checkpoint_key", "inputs_key", "result_key"]

log = logging.getLogger(__name__)

KV_NAMESPACE = protocol.KV_NAMESPACE.encode()
RPC_TIMEOUT_S = 5.0
# After the per-node free resources could not be read, list nodes without them this long
# (each pass would otherwise wait out the timeout again).
AVAILABLE_BACKOFF_S = 30.0


# Where Ray's job manager keeps each job's record (ray.dashboard.modules.job.common.
# JobInfoStorageClient.JOB_DATA_KEY, namespace ray_constants.KV_NAMESPACE_JOB).
JOB_INFO_PREFIX = "_ray_internal_job_info_"
JOB_INFO_NAMESPACE = b"job"


def checkpoint_key(submission_id: str) -> bytes:
    return protocol.checkpoint_key(submission_id).encode()


def result_key(submission_id: str) -> bytes:
    return protocol.result_key(submission_id).encode()


def inputs_key(submission_id: str) -> bytes:
    return protocol.inputs_key(submission_id).encode()


@dataclass(frozen=True)
class DrainingNode:
    node_id: str
    labels: dict[str, str]


class RayGcs:
    _available_after = 0.0  # (monotonic) when to ask for each node's free resources again

    def __init__(self, address: str, token: str | None = None):
        self.address = address
        self._channel = grpc.insecure_channel(address)
        self._nodes = gcs_service_pb2_grpc.NodeInfoGcsServiceStub(self._channel)
        self._kv = gcs_service_pb2_grpc.InternalKVGcsServiceStub(self._channel)
        self._resources = gcs_service_pb2_grpc.NodeResourceInfoGcsServiceStub(self._channel)
        self._metadata = (("authorization", f"Bearer {token}"),) if token else ()

    def close(self) -> None:
        self._channel.close()

    def _call(self, fn, request):
        try:
            reply = fn(request, timeout=RPC_TIMEOUT_S, metadata=self._metadata)
        except grpc.RpcError as e:
            raise GcsUnavailable(f"Ray GCS at {self.address}: {e.code().name}: {e.details()}") from e
        status = getattr(reply, "status", None)
        if status is not None and status.code != 0:
            raise GcsUnavailable(f"Ray GCS at {self.address} answered {status.code}: {status.message}")
        return reply

    def draining_nodes(self) -> dict[str, DrainingNode]:
        """Alive nodes that Ray is draining (about to be preempted or removed)."""
        reply = self._call(self._nodes.GetAllNodeInfo, gcs_service_pb2.GetAllNodeInfoRequest(
            state_filter=gcs_pb2.GcsNodeInfo.GcsNodeState.ALIVE))
        out = {}
        for n in reply.node_info_list:
            if n.state_snapshot.state == gcs_pb2.NodeSnapshot.State.DRAINING:
                nid = n.node_id.hex()
                out[nid] = DrainingNode(node_id=nid, labels=dict(n.labels))
        return out

    def all_nodes(self) -> tuple[list[dict], set[str]]:
        """Every node the GCS lists (alive, and the dead it still keeps), each as the
        ``raylet`` part of an entry of the dashboard's ``/nodes?view=summary``
        (``nodeId``, ``state``, ``labels``, ``resourcesTotal``, ``isHeadNode``,
        ``deathInfo``), and the ids of those draining: one call, where the
        dashboard's list is an HTTP request to a Python process on the head that
        the jobs' own submits keep busy, and knows no drain. An alive node also
        has ``resourcesAvailable`` (what Ray has free on it now: a second call, to
        the GCS's resource manager) unless that call failed: a co-located gang
        must fit one node, and only Ray knows how its nodes are filled."""
        reply = self._call(self._nodes.GetAllNodeInfo, gcs_service_pb2.GetAllNodeInfoRequest())
        avail: dict[str, dict[str, float]] = {}
        if time.monotonic() >= self._available_after:
            try:
                avail = {r.node_id.hex(): dict(r.resources_available) for r in self._call(
                    self._resources.GetAllAvailableResources, gcs_service_pb2.GetAllAvailableResourcesRequest()
                ).resources_list}
            except GcsUnavailable as e:  # the nodes are known; what each has free is not, for a while
                self._available_after = time.monotonic() + AVAILABLE_BACKOFF_S
                log.warning("could not read what each Ray node has free (co-located gangs are judged by their "
                            "group's sum for %.0f s): %s", AVAILABLE_BACKOFF_S, e)
        alive = gcs_pb2.GcsNodeInfo.GcsNodeState.ALIVE
        out, draining = [], set()
        for n in reply.node_info_list:
            nid = n.node_id.hex()
            death = {}
            if n.HasField("death_info"):
                if n.death_info.reason:
                    try:
                        death["reason"] = n.death_info.Reason.Name(n.death_info.reason)
                    except ValueError:  # a reason newer than these protos
                        death["reason"] = str(n.death_info.reason)
                if n.death_info.reason_message:
                    death["reasonMessage"] = n.death_info.reason_message
            out.append({"nodeId": nid, "state": "ALIVE" if n.state == alive else "DEAD", "labels": dict(n.labels),
                        "resourcesTotal": dict(n.resources_total), "isHeadNode": n.is_head_node,
                        "deathInfo": death})
            if n.state == alive and nid in avail:
                out[-1]["resourcesAvailable"] = avail[nid]
            if n.state == alive and n.state_snapshot.state == gcs_pb2.NodeSnapshot.State.DRAINING:
                draining.add(nid)
        return out, draining

    def request_checkpoint(self, submission_id: str, *, nodes: list[str], reason: str) -> None:
        """Leave the attempt a message: checkpoint now, a node of yours is going
        away. ``nodes``: every draining node the attempt was told about so far; a
        changed message is a new request (``raylane.jobs.base.CheckpointSignal``)."""
        value = json.dumps({"nodes": nodes, "reason": reason}).encode()
        self._call(self._kv.InternalKVPut, gcs_service_pb2.InternalKVPutRequest(
            key=checkpoint_key(submission_id), value=value, overwrite=True, namespace=KV_NAMESPACE))

    def forget_checkpoint_request(self, submission_id: str) -> None:
        """The attempt ended: its message goes (it would outlive it in Ray's store), with
        its runner's answer if any (``protocol.checkpointed_key``)."""
        for key in (checkpoint_key(submission_id), protocol.checkpointed_key(submission_id).encode()):
            self._call(self._kv.InternalKVDel, gcs_service_pb2.InternalKVDelRequest(key=key, namespace=KV_NAMESPACE))

    def _get(self, key: bytes) -> bytes | None:
        try:
            reply = self._kv.InternalKVGet(gcs_service_pb2.InternalKVGetRequest(key=key, namespace=KV_NAMESPACE),
                                           timeout=RPC_TIMEOUT_S, metadata=self._metadata)
        except grpc.RpcError as e:
            raise GcsUnavailable(f"Ray GCS at {self.address}: {e.code().name}: {e.details()}") from e
        return reply.value or None  # no key: a NotFound status, no value

    def checkpoint_request(self, submission_id: str) -> dict | None:
        value = self._get(checkpoint_key(submission_id))
        return json.loads(value) if value else None

    def result(self, submission_id: str) -> dict | None:
        """The result the attempt's runner left (``raylane.jobs.base.report_result``); None if none."""
        value = self._get(result_key(submission_id))
        return protocol.decode_result(value) if value else None

    def trials(self, submission_id: str) -> list[dict] | None:
        """A running sweep's finished trials (``raylane.jobs.metrics.trial_finished``); None if none yet."""
        value = self._get(protocol.trials_key(submission_id).encode())
        return json.loads(value) if value else None

    def forget_trials(self, submission_id: str) -> None:
        self._call(self._kv.InternalKVDel, gcs_service_pb2.InternalKVDelRequest(
            key=protocol.trials_key(submission_id).encode(), namespace=KV_NAMESPACE))

    def inputs(self, submission_id: str) -> dict[str, str] | None:
        """The inputs the dispatcher left for the attempt's runner; None once forgotten."""
        value = self._get(inputs_key(submission_id))
        return protocol.decode_inputs(value) if value else None

    def put_inputs(self, submission_id: str, env: dict[str, str]) -> None:
        """Leave an attempt's inputs for its runner (``raylane.jobs.base.RunContext.from_env``)."""
        self._call(self._kv.InternalKVPut, gcs_service_pb2.InternalKVPutRequest(
            key=inputs_key(submission_id), value=protocol.encode_inputs(env), overwrite=True,
            namespace=KV_NAMESPACE))

    def forget_inputs(self, submission_id: str) -> None:
        self._call(self._kv.InternalKVDel, gcs_service_pb2.InternalKVDelRequest(
            key=inputs_key(submission_id), namespace=KV_NAMESPACE))

    def forget_result(self, submission_id: str) -> None:
        """The result is stored in the database: its copy in Ray's store goes."""
        self._call(self._kv.InternalKVDel, gcs_service_pb2.InternalKVDelRequest(
            key=result_key(submission_id), namespace=KV_NAMESPACE))

    # Plain keys (the warm lanes' records, ``domain.lanes``) ----------------------

    def kv_get(self, key: str) -> bytes | None:
        return self._get(key.encode())

    def kv_multi_get(self, keys: list[str]) -> dict[str, bytes]:
        """The values of those ``keys`` that exist, in one call (a pass over many lane attempts)."""
        if not keys:
            return {}
        reply = self._call(self._kv.InternalKVMultiGet, gcs_service_pb2.InternalKVMultiGetRequest(
            keys=[k.encode() for k in keys], namespace=KV_NAMESPACE))
        return {e.key.decode(): e.value for e in reply.results if e.value}

    # Ray's job records, as a lane host writes them for its attempts (``lanes.dashboard_record``).

    def job_records(self, submission_ids: list[str]) -> dict[str, bytes]:
        """Ray's records of those jobs (its job manager's ``JobInfo``, where the
        dashboard's job API reads them too), undecoded, in one call: what a pass
        over many live attempts needs, at the cost of the live ones, not of every
        job Ray ever ran (``GET /api/jobs/`` lists them all). Missing: Ray has no
        such job."""
        if not submission_ids:
            return {}
        keys = {f"{JOB_INFO_PREFIX}{sid}".encode(): sid for sid in submission_ids}
        reply = self._call(self._kv.InternalKVMultiGet, gcs_service_pb2.InternalKVMultiGetRequest(
            keys=list(keys), namespace=JOB_INFO_NAMESPACE))
        return {keys[e.key]: e.value for e in reply.results if e.value and e.key in keys}

    def put_job_record(self, submission_id: str, value: bytes) -> None:
        self._call(self._kv.InternalKVPut, gcs_service_pb2.InternalKVPutRequest(
            key=f"{JOB_INFO_PREFIX}{submission_id}".encode(), value=value, overwrite=True,
            namespace=JOB_INFO_NAMESPACE))

    def delete_job_record(self, submission_id: str) -> None:
        self._call(self._kv.InternalKVDel, gcs_service_pb2.InternalKVDelRequest(
            key=f"{JOB_INFO_PREFIX}{submission_id}".encode(), namespace=JOB_INFO_NAMESPACE))

    def kv_put(self, key: str, value: bytes, *, overwrite: bool = True) -> bool:
        """True if the key was added (with overwrite off: this caller took it)."""
        reply = self._call(self._kv.InternalKVPut, gcs_service_pb2.InternalKVPutRequest(
            key=key.encode(), value=value, overwrite=overwrite, namespace=KV_NAMESPACE))
        return bool(reply.added)

    def kv_del(self, key: str, *, prefix: bool = False) -> None:
        """Delete ``key``, or with ``prefix`` every key that starts with it (one call)."""
        self._call(self._kv.InternalKVDel, gcs_service_pb2.InternalKVDelRequest(
            key=key.encode(), namespace=KV_NAMESPACE, del_by_prefix=prefix))
