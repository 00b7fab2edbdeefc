"""The autoscaling local cluster: a head running Ray's own autoscaler with its
fake multi-node provider, which starts and stops real local raylets per node
type, so groups scale from zero on one machine as they do on a real fleet
(KubeRay, Ray's cluster launcher).

Invariants:
- the node types are the profile's worker groups, with their labels
  (``ray.io/node-group``, ``ray.io/market-type``), resources per node and
  ``min_nodes`` / ``max_nodes`` as the autoscaler's ``min_workers`` /
  ``max_workers``: what admission counts (``loops.admission``) is what the
  autoscaler may start, no more;
- no worker node is started by Raylane: the autoscaler starts ``min_nodes`` of
  each group and adds the rest on demand (``local_nodes`` is not read);
- the provider is told the head's GCS address (explicit free port; Ray's default
  6379 is Redis here), and token authentication stays on: the nodes the
  autoscaler starts inherit the head's environment, token path included;
- the head carries no group label of its own (the labels of the nodes it
  launches come from the node types, and a market label inherited from the
  head's environment would contradict them); it runs no jobs (0 CPUs);
- the autoscaler is Ray's v2 (``RAY_enable_autoscaler_v2``, as KubeRay runs
  it): v1 reports a pending driver's demand without its label selector (a job
  pinned to ``gpu`` asking one CPU reads as ``{'CPU': 1}``, which the ``cpu``
  node already fits), so no ``gpu`` node came; v2 matches a request's label
  selector against the node types' labels;
- ``down`` also stops the raylets the autoscaler started: every process whose
  command line names this cluster's GCS address (a port of this cluster alone).

Words: *node type* is the autoscaler's name for a node group.
"""

from __future__ import annotations

import json
from pathlib import Path

from raylane.orchestrator.domain.profile import MARKET_LABEL, NODE_GROUP_LABEL, Profile
from raylane.orchestrator.tooling import nodeprocs
from raylane.orchestrator.tooling.localcluster import LocalCluster

AUTOSCALE_PROFILE = Path(__file__).resolve().parents[1] / "domain" / "profiles" / "local-autoscale.yaml"
AUTOSCALING_CONFIG = "autoscaling.json"  # in the cluster's dir while it is up: `cluster down` finds the mode there
AUTOSCALER_UPDATE_S = 1  # Ray's default is 5 s; a scale-up shows within a second or two
OBJECT_STORE_BYTES = 200 * 1024**2
# Ray's fake multi-node provider, named as an external module: autoscaler v2 reads
# a provider's defaults file first, and the wheel lacks the one of type
# ``fake_multinode`` (an external provider has built-in defaults).
FAKE_PROVIDER = "ray.autoscaler._private.fake_multi_node.node_provider.FakeMultiNodeProvider"
# The head's node id as the fake provider lists it (its FAKE_HEAD_NODE_ID): autoscaler
# v2 matches the instances it knows to Ray's nodes by id, so the head must run with it.
FAKE_HEAD_NODE_ID = "f" * 51 + "00000"
IDLE_TIMEOUT_MIN = 1.0  # an idle node goes after a minute: a 2-core machine cannot keep many


def autoscaling_config(profile: Profile, gcs_address: str, *, idle_timeout_min: float = IDLE_TIMEOUT_MIN) -> dict:
    """The autoscaler's cluster config for ``profile`` on the fake multi-node provider."""
    types: dict[str, dict] = {"ray.head.default": {"resources": {"CPU": 0}, "node_config": {}, "max_workers": 0}}
    for g in profile.workers:
        # The fake provider cannot set a node's memory (Ray takes it for a custom
        # resource): a node's memory is what Ray detects. Its object store is
        # small, as on the static cluster: every node shares this machine's RAM.
        resources: dict[str, float] = {"CPU": int(g.cpus), "object_store_memory": OBJECT_STORE_BYTES}
        if g.gpus:
            resources["GPU"] = g.gpus
        if g.accelerator:
            resources[f"accelerator_type:{g.accelerator.type}"] = 1  # as Ray advertises on a detected GPU
        types[g.name] = {"resources": resources, "labels": {NODE_GROUP_LABEL: g.name, MARKET_LABEL: g.market},
                         "node_config": {}, "min_workers": g.min_nodes, "max_workers": g.max_nodes}
    return {
        "cluster_name": f"raylane-{profile.name}",
        "max_workers": sum(g.max_nodes for g in profile.workers),
        "upscaling_speed": 1.0,
        "idle_timeout_minutes": idle_timeout_min,
        "provider": {"type": "external", "module": FAKE_PROVIDER, "gcs_address": gcs_address, "use_node_id_as_ip": True,
                     "disable_node_updaters": True, "disable_launch_config_check": True,
                     "launch_multiple": True, "head_node_id": FAKE_HEAD_NODE_ID},
        "auth": {"ssh_user": "ubuntu"},
        "available_node_types": types,
        "head_node_type": "ray.head.default",
        "docker": {}, "file_mounts": {}, "cluster_synced_files": [], "file_mounts_sync_continuously": False,
        "rsync_exclude": [], "rsync_filter": [], "initialization_commands": [], "setup_commands": [],
        "head_setup_commands": [], "worker_setup_commands": [], "head_start_ray_commands": [],
        "worker_start_ray_commands": [],
    }


class AutoscalingCluster(LocalCluster):
    """A ``LocalCluster`` whose worker nodes Ray's autoscaler starts and stops.
    ``idle_timeout_min``: how long an idle node stays (a benchmark that scales one
    group up again and again wants it short)."""

    def __init__(self, profile: Profile, dir: str | Path, *, idle_timeout_min: float = IDLE_TIMEOUT_MIN,
                 first_ip: int = 2):
        super().__init__(profile, dir, first_ip=first_ip)
        self.idle_timeout_min = idle_timeout_min

    def _start_workers(self) -> None:
        """None: the autoscaler starts each group's ``min_nodes`` itself."""

    def _head_args(self, env: dict[str, str]) -> list[str]:
        path = Path(self.dir, AUTOSCALING_CONFIG)  # JSON is YAML: the autoscaler reads it as such
        path.write_text(json.dumps(autoscaling_config(self.profile, self.state.gcs_address,
                                                        idle_timeout_min=self.idle_timeout_min), indent=2))
        env.pop("RAY_NODE_TYPE_NAME", None)
        env.pop("RAY_NODE_MARKET_TYPE", None)
        env.update({"RAY_FAKE_CLUSTER": "1", "AUTOSCALER_UPDATE_INTERVAL_S": str(AUTOSCALER_UPDATE_S),
                    "RAY_enable_autoscaler_v2": "1", "RAY_CLOUD_INSTANCE_ID": FAKE_HEAD_NODE_ID,
                    "RAY_OVERRIDE_NODE_ID_FOR_TESTING": FAKE_HEAD_NODE_ID})
        return [f"--autoscaling-config={path}"]

    def down(self) -> None:
        # Read before the head goes: its raylets are not in a process group of ours.
        launched = launched_by_autoscaler(self.state.gcs_address) if self.state else []
        super().down()
        nodeprocs.stop_pids(launched)
        Path(self.dir, AUTOSCALING_CONFIG).unlink(missing_ok=True)


def launched_by_autoscaler(gcs_address: str) -> list[int]:
    """Pids of processes whose command line names ``gcs_address`` (this cluster's alone)."""
    return nodeprocs.naming(gcs_address)
