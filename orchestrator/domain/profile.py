"""Cluster profiles: the node groups of a cluster, declared once (YAML).

A node group is a set of identical Ray nodes, identified in Ray by the standard
labels ``ray.io/node-group`` and ``ray.io/market-type`` (which KubeRay and the
autoscaler also set). The same profile drives the router, the local dev cluster
and the deploy files.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, model_validator

NODE_GROUP_LABEL = "ray.io/node-group"
MARKET_LABEL = "ray.io/market-type"
DEFAULT_PROFILE = Path(__file__).parent / "profiles" / "local.yaml"


class Accelerator(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: str = Field(..., min_length=1, max_length=64)
    count: int = Field(..., ge=1, le=64)  # per node


class NodeGroup(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(..., min_length=1, max_length=64, pattern=r"^[a-z0-9][a-z0-9-]*$")
    role: Literal["head", "worker"] = "worker"
    market: Literal["SPOT", "ON_DEMAND"] = "ON_DEMAND"
    accelerator: Accelerator | None = None
    cpus: float = Field(..., ge=0)  # per node
    memory_gb: float = Field(..., gt=0)  # per node
    min_nodes: int = Field(0, ge=0)
    max_nodes: int = Field(1, ge=0)  # 0: a group the autoscaler never scales up (no node unless live)
    local_nodes: int = Field(1, ge=0, le=8)  # nodes `raylane-server cluster up` starts here
    price_per_hour: float = Field(0.0, ge=0)  # per node

    @property
    def gpus(self) -> int:
        return self.accelerator.count if self.accelerator else 0

    @property
    def is_spot(self) -> bool:
        return self.market == "SPOT"

    def labels(self) -> dict[str, str]:
        return {NODE_GROUP_LABEL: self.name, MARKET_LABEL: self.market}

    @model_validator(mode="after")
    def _nodes(self) -> "NodeGroup":
        if self.min_nodes > self.max_nodes:
            raise ValueError(f"group {self.name}: min_nodes > max_nodes")
        return self


class ServeIngress(BaseModel):
    """Where Ray Serve's proxies listen on the cluster's nodes, and the URL clients
    are told (a service job reports ``<public_url or http://<driver node>:<port>><route>``).
    The default keeps services on the host, as a laptop wants; a cluster that serves
    others binds 0.0.0.0 behind its own ingress and names that ingress here."""

    model_config = ConfigDict(extra="forbid")
    host: str = Field("127.0.0.1", min_length=1, max_length=255)
    port: int = Field(8100, ge=1, le=65535)  # 8000 is Raylane's API
    public_url: str | None = Field(None, max_length=2048, pattern=r"^https?://[^\s/]+(/[^\s]*)?$")


class Profile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    groups: list[NodeGroup] = Field(..., min_length=1)
    serve: ServeIngress = Field(default_factory=ServeIngress)

    @model_validator(mode="after")
    def _unique(self) -> "Profile":
        names = [g.name for g in self.groups]
        if len(set(names)) != len(names):
            raise ValueError("node group names must be unique")
        if sum(g.role == "head" for g in self.groups) != 1:
            raise ValueError("a profile needs exactly one head group")
        return self

    def group(self, name: str) -> NodeGroup | None:
        return next((g for g in self.groups if g.name == name), None)

    @property
    def head(self) -> NodeGroup:
        return next(g for g in self.groups if g.role == "head")

    @property
    def workers(self) -> list[NodeGroup]:
        return [g for g in self.groups if g.role == "worker"]

    @classmethod
    def load(cls, path: str | Path | None = None) -> "Profile":
        return cls.model_validate(yaml.safe_load(Path(path or DEFAULT_PROFILE).read_text()))


@lru_cache
def default_profile() -> Profile:
    return Profile.load(DEFAULT_PROFILE)
