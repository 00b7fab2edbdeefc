"""Answers of the API that are not in ``raylane.orchestrator.domain.views``, read leniently
(``_Open``: a newer server's extra fields are kept, not refused)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from raylane.client import packaging
from raylane.orchestrator.domain import views
from raylane.orchestrator.domain.packages import package_uri


# Models the API returns that are not in raylane.orchestrator.domain.views ------------------


class _Open(BaseModel):
    # A newer server may add fields; an older client keeps working.
    model_config = ConfigDict(extra="allow")


class NodeGroupStatus(_Open, views.NodeGroupStatus):
    """One node group of the cluster profile with its live capacity (``GET /v1/node-groups``);
    the server's shape (``views.NodeGroupStatus``), keeping fields a newer server adds."""


class ClusterNode(_Open):
    node_id: str | None = None
    state: str
    node_group: str | None = None
    market: str | None = None
    is_head: bool = False
    resources: dict[str, float] = Field(default_factory=dict)
    draining: bool = False
    death_reason: str | None = None


class FleetCluster(_Open):
    """One Ray cluster of the fleet (``GET /v1/fleet``; docs/fleet.md)."""

    name: str
    tier: str  # owned | rented
    cost: dict[str, Any]
    dashboard_url: str | None = None
    attached: bool = False  # jobs are dispatched here
    groups: list[dict[str, Any]] = Field(default_factory=list)


class Fleet(_Open):
    name: str
    clusters: list[FleetCluster]


class ClusterInfo(_Open):
    """Ray's nodes, alive and dead, as the control plane sees them (``GET /v1/cluster``)."""

    dashboard_url: str | None = None
    profile: str | None = None
    nodes: list[ClusterNode] = Field(default_factory=list)


class ReadyPart(_Open):
    """One part of ``/readyz``: the database or Ray. ``state`` and ``since`` are Ray's
    (``reachable``, ``unreachable`` since when, ``not attached``)."""

    ok: bool
    reason: str | None = None
    state: str | None = None
    since: datetime | None = None


class Health(_Open):
    """``GET /readyz``: ``ok`` when the server accepts jobs (up, its database reachable
    and migrated); ``ray`` says whether they can run (``status`` ``degraded``: Ray is
    unreachable, jobs are stored and wait)."""

    ok: bool
    status: str
    reason: str | None = None
    database: ReadyPart | None = None
    ray: ReadyPart | None = None


class KindInfo(_Open):
    """A job kind this control plane runs, with its traits (``GET /v1/kinds``)."""

    name: str
    summary: str
    entrypoint: str
    elastic: bool
    spot_first: bool
    checkpoints: bool
    serves: bool
    strategy: str
    section: str | None = None
    section_required: bool = False
    cost_basis: str


class CostRow(_Open, views.CostRow):
    """One row of ``CostBreakdown`` (``views.CostRow``, keeping fields a newer server adds)."""


class CostTotal(_Open, views.CostTotal):
    """The window's total (``views.CostTotal``)."""


class CostBreakdown(_Open, views.CostBreakdown):
    """``GET /v1/costs``: what attempts in a window cost, per project, node group or kind
    (``views.CostBreakdown``)."""

    rows: list[CostRow]
    total: CostTotal


class AttemptCost(_Open, views.AttemptCost):
    """One attempt of ``JobCost`` (``views.AttemptCost``)."""


class JobCost(_Open, views.JobCost):
    """``GET /v1/jobs/{id}/cost``: each attempt's cost (a running one: so far) (``views.JobCost``)."""

    attempts: list[AttemptCost]


class Report(_Open):
    """``GET /v1/report``: the own-or-rent decision per GPU group, costs, and cheaper
    placements. The server sends it as plain JSON; its parts are kept as sent
    (``docs/sdk.md`` lists their keys)."""

    window: dict[str, Any]
    project: str | None = None
    total: dict[str, Any]
    gpu_groups: list[dict[str, Any]] = Field(default_factory=list)
    cheaper_placements: list[dict[str, Any]] = Field(default_factory=list)
    fleet: dict[str, Any] | None = None  # owned groups against the target, rented spend, all-rented / all-owned


@dataclass(frozen=True)
class UploadedPackage:
    """A working dir uploaded as a code package; ``sent`` is False when the server had it."""

    uri: str
    sha256: str
    files: int
    size_bytes: int
    sent: bool

    @classmethod
    def of(cls, pkg: "packaging.Package", sent: bool) -> "UploadedPackage":
        return cls(uri=package_uri(pkg.sha256), sha256=pkg.sha256, files=pkg.files, size_bytes=pkg.size_bytes,
                   sent=sent)
