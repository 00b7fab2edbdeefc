"""The fleet: the Ray clusters behind Raylane's one queue, owned and rented (YAML).

Words used here:

- *cluster*: one Ray cluster (one head, one GCS, one dashboard, one token), with
  the node groups of a profile (``profile.Profile``). An attempt runs on one
  cluster; a Ray job never spans two.
- *tier*: ``owned`` (machines paid for whether busy or idle: an on-premises
  KubeRay cluster, reserved instances) or ``rented`` (nodes paid per node-hour
  while they exist: a cloud account, on demand or spot).
- *cost model*: an owned cluster costs ``cost.per_hour`` (its amortised price:
  hardware over its life, power, space, staff) every hour of the window; a
  rented one costs each node-hour it uses at its group's ``price_per_hour``, the
  price of that group's market (``SPOT`` or ``ON_DEMAND``).
- *reach*: how Raylane talks to a cluster: its dashboard (Jobs API) URL, its GCS
  address, and its Ray token, read from a file (``token_file``) or an
  environment variable (``token_env``) when Raylane starts. A token is never
  written in the fleet file: a fleet file is configuration, checked in and
  rendered into deploy files, and Ray's token lets whoever holds it run code on
  every node (CVE-2023-48022).

Invariants, checked on load with the field named in the error:

- cluster names are unique, lowercase, usable in a URL path (``/ray/<cluster>/``);
- an owned cluster has a fixed cost and fixed groups (``min_nodes == max_nodes``
  for every worker group: the machines are there whether used or not);
- a rented cluster prices every worker group it may scale (``price_per_hour``
  above 0 where ``max_nodes`` is above 0);
- a literal ``token`` is refused, and so is a ``token_env`` that looks like a
  token rather than a variable's name;
- today's single-cluster settings are a fleet of one (``Fleet.single``): one
  rented cluster named ``default``, priced per node-hour as profiles always were.

Nothing here reads the environment or a token file: ``ClusterSpec.token`` is
the one place that does, and only when the caller asks.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, Union

import yaml
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, field_validator, model_validator

from raylane.orchestrator.domain.errors import Invalid
from raylane.orchestrator.domain.profile import NodeGroup, Profile, ServeIngress

FLEETS_DIR = Path(__file__).parent / "fleets"
Tier = Literal["owned", "rented"]
CLUSTER_NAME = r"^[a-z][a-z0-9-]{0,31}$"
ENV_NAME = r"^[A-Za-z_][A-Za-z0-9_]{0,127}$"
# What a token looks like, as opposed to a variable's name: Ray's own are 64 hex
# digits. 32+ letters and digits without an underscore name no variable anyone writes.
TOKEN_LIKE = re.compile(r"^[0-9A-Za-z]{32,}$")
SINGLE_CLUSTER = "default"


class FixedCost(BaseModel):
    """An owned cluster's cost: the same every hour, busy or idle."""

    model_config = ConfigDict(extra="forbid")
    model: Literal["fixed"]
    per_hour: float = Field(..., gt=0, le=1e6, description="amortised price of the whole cluster, $ an hour")


class NodeHourCost(BaseModel):
    """A rented cluster's cost: each node-hour used at its group's ``price_per_hour``
    (the price of that group's market)."""

    model_config = ConfigDict(extra="forbid")
    model: Literal["per_node_hour"]


Cost = Annotated[Union[FixedCost, NodeHourCost], Field(discriminator="model")]


# /ray/<cluster>/ is a fleet cluster's dashboard (api/rayproxy.py); these are paths
# of Ray's own dashboard under /ray/ and never name a cluster.
RESERVED_NAMES = frozenset({"api", "static", "nodes", "node", "jobs", "job", "logs", "log", "actors", "metrics",
                            "serve", "timezone", "events", "tasks", "task", "train", "data", "cluster", "overview",
                            "new", "grafana", "prometheus", "auth", "login", "favicon"})


class ClusterSpec(BaseModel):
    """One Ray cluster of the fleet."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(..., pattern=CLUSTER_NAME)
    tier: Tier
    # Reach. Unset on a cluster `raylane-server cluster up --fleet` starts here: the
    # local fleet fills them in from the clusters it started.
    dashboard_url: str | None = Field(None, max_length=2048, pattern=r"^https?://[^\s/]+(/[^\s]*)?$")
    gcs_address: str | None = Field(None, max_length=255, pattern=r"^[^\s:/]+:\d{1,5}$")
    token_file: str | None = Field(None, min_length=1, max_length=4096)
    token_env: str | None = Field(None, pattern=ENV_NAME)
    token: Any = Field(None, description="refused: see token_file / token_env")
    cost: Cost
    # The node groups: inline, or a profile YAML (relative to the fleet file).
    profile: str | None = Field(None, min_length=1, max_length=4096)
    groups: list[NodeGroup] | None = None
    serve: ServeIngress = Field(default_factory=ServeIngress)
    # How `raylane-server cluster up --fleet` starts it on this machine: every
    # group's `local_nodes` (static), or Ray's autoscaler from `min_nodes` (autoscale).
    local: Literal["static", "autoscale"] = "static"

    @field_validator("name")
    @classmethod
    def _not_a_dashboard_path(cls, v: str) -> str:
        if v in RESERVED_NAMES:
            raise ValueError(f"{v!r} is a path of Ray's dashboard (/ray/{v}/... is the attached cluster's), not a "
                             f"cluster name: pick another (the reserved: {', '.join(sorted(RESERVED_NAMES))})")
        return v

    @field_validator("token", mode="before")
    @classmethod
    def _no_literal_token(cls, v: Any) -> None:
        if v is not None:
            raise ValueError("a Ray token is never written in the fleet file (whoever reads the file could run code on "
                             "every node): put it in a file and name it in token_file, or in an environment "
                             "variable and name it in token_env")
        return None

    @field_validator("token_env", mode="before")
    @classmethod
    def _env_is_a_name(cls, v: Any) -> Any:
        if isinstance(v, str) and (TOKEN_LIKE.match(v) or not re.match(ENV_NAME, v)) and len(v) >= 32:
            raise ValueError("looks like a token, not an environment variable's name: name the variable that holds "
                             "it (e.g. CLOUD_RAY_TOKEN), never the token")
        return v

    @model_validator(mode="after")
    def _shape(self) -> "ClusterSpec":
        if self.token_file and self.token_env:
            raise ValueError("token_file and token_env: give one")
        if (self.profile is None) == (self.groups is None):
            raise ValueError("give the cluster's node groups as `groups:` or as `profile:` (a profile YAML), one of them")
        if self.groups is not None:
            try:
                Profile(name=self.name, groups=self.groups, serve=self.serve)
            except ValidationError as e:
                raise ValueError(f"groups: {e.errors()[0]['msg'].removeprefix('Value error, ')}") from None
            _check_groups(self, self.groups)
        if self.tier == "owned" and not isinstance(self.cost, FixedCost):
            raise ValueError("cost: an owned cluster costs a fixed amount an hour ({model: fixed, per_hour: ...})")
        if self.tier == "rented" and not isinstance(self.cost, NodeHourCost):
            raise ValueError("cost: a rented cluster is priced per node-hour ({model: per_node_hour}, each group's "
                             "price_per_hour)")
        return self

    def read_token(self, environ: dict[str, str] | None = None) -> str | None:
        """The cluster's Ray token, read now (None: none is configured; the local
        fleet hands its own). Raises ``Invalid`` naming the field when it is missing."""
        if self.token_env:
            value = (os.environ if environ is None else environ).get(self.token_env, "").strip()
            if not value:
                raise Invalid(f"cluster {self.name}: environment variable {self.token_env} (token_env) is not set",
                              field=f"clusters.{self.name}.token_env")
            return value
        if self.token_file:
            path = Path(self.token_file).expanduser()
            try:
                value = path.read_text().strip()
            except OSError as e:
                raise Invalid(f"cluster {self.name}: cannot read token_file {path}: {e.strerror}",
                              field=f"clusters.{self.name}.token_file") from None
            if not value:
                raise Invalid(f"cluster {self.name}: token_file {path} is empty", field=f"clusters.{self.name}.token_file")
            return value
        return None


def _check_groups(c: ClusterSpec, groups: list[NodeGroup]) -> None:
    for g in groups:
        if g.role != "worker":
            continue
        if c.tier == "owned" and g.min_nodes != g.max_nodes:
            raise ValueError(f"group {g.name}: an owned group is a fixed set of machines, paid for whether used or "
                             f"not: min_nodes ({g.min_nodes}) must equal max_nodes ({g.max_nodes})")
        if c.tier == "rented" and g.max_nodes > 0 and g.price_per_hour <= 0:
            raise ValueError(f"group {g.name}: a rented group is paid per node-hour: give its price_per_hour "
                             f"({g.market} price of one node)")


@dataclass(frozen=True)
class Cluster:
    """A cluster of a loaded fleet: its spec and its groups as a ``Profile``."""

    spec: ClusterSpec
    profile: Profile

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def tier(self) -> Tier:
        return self.spec.tier

    @property
    def owned(self) -> bool:
        return self.spec.tier == "owned"

    @property
    def fixed_per_hour(self) -> float:
        return self.spec.cost.per_hour if isinstance(self.spec.cost, FixedCost) else 0.0

    def amortised_node_hour(self, group: NodeGroup) -> float:
        """An owned group's share of the fixed cost, per node-hour: the fixed cost
        split over the worker nodes by their ``price_per_hour`` (their weight;
        equal weights when none is given). 0 for a rented cluster."""
        if not self.owned:
            return 0.0
        workers = self.profile.workers
        weighted = any(g.price_per_hour > 0 for g in workers)
        weight = (lambda g: g.price_per_hour) if weighted else (lambda g: 1.0)
        total = sum(weight(g) * g.max_nodes for g in workers)
        return self.fixed_per_hour * weight(group) / total if total else 0.0


class Fleet(BaseModel):
    """The clusters, in the order the file gives them (the order ties are broken in)."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(..., min_length=1, max_length=64)
    clusters: list[ClusterSpec] = Field(..., min_length=1, max_length=32)
    base_dir: str | None = Field(None, exclude=True)  # where a cluster's `profile:` is found
    _members: list[Cluster] | None = PrivateAttr(None)

    @model_validator(mode="after")
    def _unique(self) -> "Fleet":
        names = [c.name for c in self.clusters]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"cluster names must be unique; repeated: {', '.join(dup)}")
        for c in self.clusters:
            if c.profile is not None:
                _check_groups(c, self._load_profile(c).groups)
        return self

    def _load_profile(self, c: ClusterSpec) -> Profile:
        path = Path(c.profile)
        if not path.is_absolute():
            path = Path(self.base_dir or ".") / path
        try:
            return Profile.load(path)
        except OSError as e:
            raise ValueError(f"cluster {c.name}: cannot read profile {path}: {e.strerror}") from None
        except ValidationError as e:
            raise ValueError(f"cluster {c.name}: profile {path}: {e.errors()[0]['msg']}") from None

    @property
    def members(self) -> list[Cluster]:
        if self._members is None:
            self._members = [Cluster(spec=c, profile=self._load_profile(c) if c.profile is not None else
                                     Profile(name=c.name, groups=c.groups, serve=c.serve)) for c in self.clusters]
        return self._members

    def cluster(self, name: str) -> Cluster | None:
        return next((c for c in self.members if c.name == name), None)

    @property
    def names(self) -> list[str]:
        return [c.name for c in self.clusters]

    @property
    def owned(self) -> list[Cluster]:
        return [c for c in self.members if c.owned]

    @property
    def rented(self) -> list[Cluster]:
        return [c for c in self.members if not c.owned]

    @classmethod
    def single(cls, profile: Profile, *, dashboard_url: str | None = None, gcs_address: str | None = None) -> "Fleet":
        """Today's one cluster as a fleet: rented (its groups' prices are per node-hour,
        as profiles always priced them), named ``default``."""
        # Built, not validated: a fleet file's rules (a rented group names its price) must
        # not refuse a profile that worked before fleets, whose prices may be left at 0.
        spec = ClusterSpec.model_construct(
            name=SINGLE_CLUSTER, tier="rented", dashboard_url=dashboard_url, gcs_address=gcs_address, token_file=None,
            token_env=None, token=None, cost=NodeHourCost(model="per_node_hour"), profile=None,
            groups=list(profile.groups), serve=profile.serve, local="static")
        fleet = cls.model_construct(name=profile.name, clusters=[spec], base_dir=None)
        fleet._members = [Cluster(spec=spec, profile=profile)]  # the very profile, not a copy
        return fleet

    @classmethod
    def parse(cls, doc: Any, *, base_dir: str | Path | None = None) -> "Fleet":
        """A fleet from its YAML document; ``Invalid`` naming the field when it is wrong."""
        if not isinstance(doc, dict):
            raise Invalid("a fleet file is a mapping with `name` and `clusters`", field="fleet")
        try:
            return cls.model_validate({**doc, "base_dir": str(base_dir) if base_dir is not None else None})
        except ValidationError as e:
            raise Invalid(describe(e, doc), field=_field(e.errors()[0], doc)) from None

    @classmethod
    def load(cls, path: str | Path) -> "Fleet":
        """A fleet file, or the name of a shipped one (``local-hybrid``)."""
        p = Path(path)
        if not p.suffix and not p.exists() and (FLEETS_DIR / f"{p}.yaml").exists():
            p = FLEETS_DIR / f"{p}.yaml"
        try:
            doc = yaml.safe_load(p.read_text())
        except OSError as e:
            raise Invalid(f"cannot read fleet file {p}: {e.strerror}", field="fleet") from None
        except yaml.YAMLError as e:
            raise Invalid(f"fleet file {p} is not YAML: {e}", field="fleet") from None
        return cls.parse(doc, base_dir=p.parent)


def _field(err: dict, doc: Any) -> str:
    """The error's location, a cluster named by its name where the file gives one:
    ``clusters.cloud.groups.1.price_per_hour`` rather than ``clusters.1...``."""
    loc = [str(x) for x in err["loc"] if x not in ("FixedCost", "NodeHourCost", "fixed", "per_node_hour")]
    if len(loc) >= 2 and loc[0] == "clusters" and loc[1].isdigit():
        i = int(loc[1])
        items = doc.get("clusters") if isinstance(doc, dict) else None
        if isinstance(items, list) and i < len(items) and isinstance(items[i], dict) and \
                isinstance(items[i].get("name"), str) and re.match(CLUSTER_NAME, items[i]["name"]):
            loc[1] = items[i]["name"]
    return ".".join(loc) or "fleet"


def describe(e: ValidationError, doc: Any) -> str:
    parts = []
    for err in e.errors()[:5]:
        msg = err["msg"].removeprefix("Value error, ")
        parts.append(f"{_field(err, doc)}: {msg}")
    return "; ".join(parts)


def configured(fleet: str | Path | None, profile: Profile, *, dashboard_url: str | None = None,
               gcs_address: str | None = None) -> Fleet:
    """The fleet the settings describe: the fleet file ``fleet`` (RAYLANE_FLEET) when
    set, else today's one cluster (``profile`` at the given reach)."""
    if fleet:
        return Fleet.load(fleet)
    return Fleet.single(profile, dashboard_url=dashboard_url, gcs_address=gcs_address)
