"""/v1/plan, /v1/node-groups, /v1/cluster, /v1/kinds: the router's decision, the cluster's
shape and the job kinds it runs."""

from __future__ import annotations

from typing import Any, Literal

from fastapi import APIRouter, Query
from pydantic import BaseModel, Field

from raylane.api.deps import CP, CallerDep, ReaderDep
from raylane.orchestrator.domain import policy
from raylane.orchestrator.domain.fleet import CLUSTER_NAME
from raylane.orchestrator.domain.kinds import KINDS
from raylane.orchestrator.domain.views import NodeGroupStatus, Placement
from raylane.orchestrator.domain.specs import JobSpec
from raylane.orchestrator.services import fleetplan

router = APIRouter(prefix="/v1", tags=["cluster"])


class KindView(BaseModel):
    """A job kind's traits that a user choosing it cares about (``orchestrator/domain/kinds.py``)."""

    name: str
    summary: str
    entrypoint: Literal["import path", "shell command"]
    elastic: bool  # scales into what is free; else all workers start together (a gang)
    spot_first: bool  # without GPUs, runs on spot first
    checkpoints: bool  # asked to checkpoint when its node drains
    serves: bool  # long-running, answers on a route
    strategy: str  # placement-group strategy of its workers
    section: str | None  # the spec section that belongs to this kind
    section_required: bool
    cost_basis: str


@router.post("/plan", response_model=Placement,
             responses={422: {"description": "The job can never run on this cluster; the message says why"}})
def plan(spec: JobSpec, cp: CP, caller: ReaderDep) -> Placement:
    """The routing decision for a spec, with its reasons, without storing anything. On a
    fleet of several clusters (RAYLANE_FLEET): the cluster it would be placed on, its
    tier, and every candidate cluster's reason, in the order they would be tried."""
    if len(fleetplan.fleet(cp).members) > 1:
        policy.check(spec, cp.settings)
        return fleetplan.plan(cp, spec, caller.project)
    return cp.plan(spec, caller.project)


class FleetGroupView(BaseModel):
    name: str
    market: str
    gpus: int
    cpus: float
    min_nodes: int
    max_nodes: int
    price_per_hour: float


class FleetClusterView(BaseModel):
    name: str
    tier: Literal["owned", "rented"]
    cost: dict[str, Any]
    dashboard_url: str | None
    attached: bool = Field(description="The cluster the dashboard proxy (/ray/), node views and warm lanes use; "
                                       "jobs are dispatched to every cluster when each has its reach")
    state: str = Field(description="reachable, unreachable, lost (unreachable past the grace: its jobs were placed "
                                   "elsewhere), or not dispatched to (no reach, or jobs run on the attached cluster "
                                   "alone)")
    active_jobs: int = Field(description="Jobs dispatching or running there")
    queued_jobs: int = Field(description="Queued jobs nominated to it")
    groups: list[FleetGroupView]


class FleetView(BaseModel):
    name: str
    dispatching: bool = Field(description="Jobs are placed across the clusters (each has its reach); else they run "
                                          "on the attached cluster alone")
    placing: int = Field(description="Queued jobs waiting for the placer to nominate a cluster")
    clusters: list[FleetClusterView]


@router.get("/fleet", response_model=FleetView)
def fleet(cp: CP, caller: CallerDep) -> FleetView:
    """The fleet's clusters (RAYLANE_FLEET; one cluster without it): tier, cost model and
    node groups. No token and no GCS address: those are operators' (docs/fleet.md)."""
    f = fleetplan.fleet(cp)
    here = fleetplan.attached(cp)
    live = fleetplan.live(cp, here)
    return FleetView(name=f.name, dispatching=live.dispatching, placing=live.placing, clusters=[
        FleetClusterView(name=c.name, tier=c.tier, cost=c.spec.cost.model_dump(), dashboard_url=c.spec.dashboard_url,
                         attached=c.name == here, state=live.states.get(c.name, "not dispatched to"),
                         active_jobs=live.active.get(c.name, 0), queued_jobs=live.queued.get(c.name, 0),
                         groups=[FleetGroupView(name=g.name, market=g.market, gpus=g.gpus, cpus=g.cpus,
                                                min_nodes=g.min_nodes, max_nodes=g.max_nodes,
                                                price_per_hour=g.price_per_hour) for g in c.profile.workers])
        for c in f.members])


ClusterParam = Query(None, pattern=CLUSTER_NAME, description="A fleet's cluster by name; unset: the attached one")


@router.get("/node-groups", response_model=list[NodeGroupStatus])
def node_groups(cp: CP, caller: CallerDep, cluster: str | None = ClusterParam) -> list[NodeGroupStatus]:
    return cp.node_groups(cluster)


@router.get("/cluster")
def cluster(cp: CP, caller: CallerDep, cluster: str | None = ClusterParam) -> dict[str, Any]:
    """Ray's nodes (alive and dead, with their node-group labels) and the dashboard URL."""
    return cp.cluster(cluster)


@router.get("/kinds", response_model=list[KindView])
def kinds(caller: CallerDep) -> list[KindView]:
    """The job kinds this control plane runs, with their traits."""
    return [KindView(**row.public()) for row in KINDS.values()]
