"""The local fleet: every cluster of a fleet file started on this machine, each a
``LocalCluster`` (static) or an ``AutoscalingCluster`` (Ray's autoscaler with its
fake multi-node provider) as its ``local:`` says. ``local-hybrid`` is the one
issue 45 asks for: ``onprem`` (owned, static) and ``cloud`` (rented, scaling
from zero).

Invariants:
- each cluster is a cluster of its own: its own head, GCS and dashboard ports
  (explicit free ports; 6379 is Redis here), its own token and Ray temp dir, its
  own state in ``<dir>/<cluster name>``; nothing of one is handed to another;
- clusters start one after another (two `ray start` at once on 2 cores time
  out), owned ones first: they run work at once, rented ones wait for demand;
- workers of different clusters get loopback addresses of their own block
  (``IP_BLOCK`` apart), so a node's address names its cluster as on a real
  network;
- a fleet started ``owned`` dies with its owner however the owner dies: each
  cluster has its watchdog (``nodeprocs.watch``), and one cluster that fails to
  start takes the ones already up down with it;
- ``<dir>/fleet.json`` names the fleet file while the fleet is up, so
  ``raylane-server cluster down|status`` finds it from another process.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from raylane.orchestrator.domain.fleet import Cluster, Fleet
from raylane.orchestrator.tooling.autoscaling import AutoscalingCluster
from raylane.orchestrator.tooling.localcluster import LocalCluster

FLEET_STATE = "fleet.json"
FLEET_REACH = "fleet-reach.yaml"  # the fleet with each cluster's reach, for a control plane (RAYLANE_FLEET)
IP_BLOCK = 50  # loopback addresses per cluster: 127.0.0.2-51 for the first, 52-101 for the next, ...


class LocalFleet:
    """Start, inspect and stop every cluster of ``fleet`` on this machine."""

    def __init__(self, fleet: Fleet, dir: str | Path, *, source: str | None = None):
        """``source``: how the fleet was named (a path or a shipped name), written to
        ``fleet.json`` so another process loads the same one."""
        self.fleet = fleet
        self.dir = Path(dir).resolve()
        self.source = source
        self.clusters: dict[str, LocalCluster] = {}
        for i, member in enumerate(self._start_order()):
            kind = AutoscalingCluster if member.spec.local == "autoscale" else LocalCluster
            self.clusters[member.name] = kind(member.profile, self.dir / member.name, first_ip=2 + i * IP_BLOCK)

    @classmethod
    def recorded(cls, dir: str | Path) -> "LocalFleet | None":
        """The fleet ``<dir>/fleet.json`` names (one started and not yet stopped), or None."""
        path = Path(dir, FLEET_STATE)
        if not path.exists():
            return None
        source = json.loads(path.read_text())["source"]
        return cls(Fleet.load(source), dir, source=source)

    def _start_order(self) -> list[Cluster]:
        return sorted(self.fleet.members, key=lambda c: not c.owned)  # stable: the file's order within a tier

    def up(self, *, owned: bool = False) -> Fleet:
        """Start every cluster (or attach to those up); returns the fleet with each
        cluster's reach filled in (``with_reach``)."""
        self.dir.mkdir(parents=True, exist_ok=True)
        Path(self.dir, FLEET_STATE).write_text(json.dumps({"name": self.fleet.name, "source": self.source}))
        try:
            for cluster in self.clusters.values():
                cluster.up(owned=owned)
        except BaseException:
            self.down()  # a fleet half up would hold ports and memory for nothing
            raise
        fleet = self.with_reach()
        Path(self.dir, FLEET_REACH).write_text(yaml.safe_dump(fleet.model_dump(exclude={"base_dir"}, exclude_none=True),
                                                              sort_keys=False))
        return fleet

    @property
    def reach_file(self) -> Path:
        """Where ``up`` wrote the fleet with its reach: what ``RAYLANE_FLEET`` names
        for a control plane on this fleet."""
        return Path(self.dir, FLEET_REACH)

    def down(self) -> None:
        """Stop every cluster, rented first (their jobs are the ones to lose), owned last."""
        for cluster in reversed(list(self.clusters.values())):
            cluster.down()
        Path(self.dir, FLEET_STATE).unlink(missing_ok=True)
        Path(self.dir, FLEET_REACH).unlink(missing_ok=True)

    def is_up(self) -> bool:
        return all(c.is_up() for c in self.clusters.values())

    def reach(self) -> dict[str, dict[str, Any]]:
        """Each cluster's dashboard URL, GCS address and token file (None before ``up``)."""
        out = {}
        for name, c in self.clusters.items():
            st = c.state
            out[name] = {"dashboard_url": st.dashboard_url if st else None, "gcs_address": st.gcs_address if st else None,
                         "token_path": st.token_path if st else None, "temp_dir": st.temp_dir if st else None}
        return out

    def with_reach(self) -> Fleet:
        """The fleet as a control plane reads it: each cluster's dashboard URL, GCS
        address and ``token_file`` those of the cluster started here."""
        reach = self.reach()
        doc = self.fleet.model_dump(exclude={"base_dir"}, exclude_none=True)
        for c in doc["clusters"]:
            if c.get("profile") and not Path(c["profile"]).is_absolute():
                # The reach file is written elsewhere (<dir>): a relative profile must still be found.
                c["profile"] = str(Path(self.fleet.base_dir or ".", c["profile"]).resolve())
            r = reach[c["name"]]
            c.update({"dashboard_url": r["dashboard_url"], "gcs_address": r["gcs_address"],
                      "token_file": r["token_path"]})
            c.pop("token_env", None)
        return Fleet.parse(doc, base_dir=self.fleet.base_dir)
