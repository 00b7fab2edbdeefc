"""The local cluster cleans up after itself when a node does not come up."""

from __future__ import annotations

import os

import pytest
import yaml

from tests.helpers import wait_for

pytestmark = pytest.mark.ray


def test_a_node_that_does_not_come_up_takes_the_started_ones_down(tmp_path, monkeypatch):
    from raylane.orchestrator.tooling import localcluster
    from raylane.orchestrator.domain.profile import Profile

    p = tmp_path / "p.yaml"
    p.write_text(yaml.safe_dump({"name": "t", "groups": [{"name": "head", "role": "head", "cpus": 0, "memory_gb": 1},
                                                         {"name": "cpu", "cpus": 1, "memory_gb": 1}]}))
    cluster = localcluster.LocalCluster(Profile.load(p), tmp_path / "cluster")
    real_wait = cluster._wait_registered
    temp_dirs = []

    def worker_never_registers(before, node):
        temp_dirs.append(cluster.state.temp_dir)  # every Ray process of the cluster names it
        monkeypatch.setattr(localcluster, "NODE_START_TIMEOUT_S", 0)
        real_wait(before, node)

    monkeypatch.setattr(cluster, "_wait_registered", worker_never_registers)
    with pytest.raises(TimeoutError, match="node cpu-0 did not register"):
        cluster.up()
    assert cluster.state is None and not (tmp_path / "cluster" / "state.json").exists()

    def gone():
        for pid in [int(x) for x in os.listdir("/proc") if x.isdigit()]:
            try:
                cmd = open(f"/proc/{pid}/cmdline", "rb").read()
            except OSError:
                continue
            assert temp_dirs[0].encode() not in cmd, cmd
        return True

    wait_for(gone, timeout=30, what="every process of the failed cluster gone")


def test_restore_replaces_drained_and_dead_nodes(ray_cluster):
    """What the shared test cluster runs after every test: a drained node and a
    killed one are replaced by fresh, registered nodes of the same groups."""
    from raylane.orchestrator.tooling import localcluster

    drained = next(n for n in ray_cluster.state.nodes if n.group == "spot-cpu")
    killed = next(n for n in ray_cluster.state.nodes if n.group == "spot-cpu" and n.name != drained.name)
    ray_cluster.drain_node(drained.name, deadline_s=60)
    os.killpg(killed.pid, 9)  # behind the cluster's back, as a spot reclaim would
    wait_for(lambda: not localcluster._alive(killed.pid), timeout=30, what="the killed node's process gone")
    assert len(ray_cluster.restore()) == 2
    assert ray_cluster.restore() == []  # in shape: left alone
    spot = [n for n in ray_cluster.state.nodes if n.group == "spot-cpu"]
    assert len(spot) == 2 and not {drained.pid, killed.pid} & {n.pid for n in spot}
    alive = {n["raylet"]["nodeId"] for n in ray_cluster.nodes() if n["raylet"].get("state") == "ALIVE"}
    assert {n.ports["node_id"] for n in spot} <= alive
    # The drained node was killed (Ray marks it dead at its own pace, up to its health-check timeout).
    wait_for(lambda: not localcluster._alive(drained.pid), timeout=30, what="the drained node's process gone")
