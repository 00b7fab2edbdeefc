"""/v1/plan, /v1/node-groups, /v1/cluster: the router's decision and the cluster's shape."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from raylane.api.deps import CP, CallerDep, ReaderDep
from raylane.orchestrator.domain.views import NodeGroupStatus, Placement
from raylane.orchestrator.domain.specs import JobSpec

router = APIRouter(prefix="/v1", tags=["cluster"])


@router.post("/plan", response_model=Placement,
             responses={422: {"description": "The job can never run on this cluster; the message says why"}})
def plan(spec: JobSpec, cp: CP, caller: ReaderDep) -> Placement:
    """The routing decision for a spec, with its reasons, without storing anything."""
    return cp.plan(spec)


@router.get("/node-groups", response_model=list[NodeGroupStatus])
def node_groups(cp: CP, caller: CallerDep) -> list[NodeGroupStatus]:
    return cp.node_groups()


@router.get("/cluster")
def cluster(cp: CP, caller: CallerDep) -> dict[str, Any]:
    """Ray's nodes (alive and dead, with their node-group labels) and the dashboard URL."""
    return cp.cluster()
