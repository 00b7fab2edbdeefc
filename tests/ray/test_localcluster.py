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


def test_a_node_whose_ray_start_gives_up_on_the_gcs_is_started_again(tmp_path, monkeypatch, caplog):
    """`ray start` gives up when the GCS has not listed its node within 30 s (CI
    saw it under load: a second cluster's head starting beside the shared one).
    Each node's first start here gives up so, leaving a process behind as Ray's
    leaves its GCS: the cluster comes up on the next tries, the leftovers killed;
    a node that always gives up fails after ``START_TRIES`` with nothing left."""
    import logging

    from raylane.orchestrator.tooling import localcluster
    from raylane.orchestrator.domain.profile import Profile

    p = tmp_path / "p.yaml"
    p.write_text(yaml.safe_dump({"name": "t", "groups": [{"name": "head", "role": "head", "cpus": 0, "memory_gb": 1},
                                                         {"name": "cpu", "cpus": 1, "memory_gb": 1}]}))
    cluster = localcluster.LocalCluster(Profile.load(p), tmp_path / "cluster")
    marks = tmp_path / "marks"
    marks.mkdir()
    fake = tmp_path / "ray"
    fake.write_text(f"""#!/bin/sh
if [ "$1" = start ]; then
  case "$*" in *--head*) kind=head ;; *) kind=worker ;; esac
  if [ ! -e "{marks}/$kind" ] || [ -e "{marks}/always-$kind" ]; then
    sleep 600 & echo $! >> "{marks}/$kind"
    echo "Exception: The current node {localcluster.RAY_START_TIMED_OUT}. This could happen because ..." >&2
    exit 1
  fi
fi
exec {cluster._ray_bin()} "$@"
""")
    fake.chmod(0o755)
    monkeypatch.setattr(cluster, "_ray_bin", lambda: str(fake))

    def running(pid):  # killed: gone, or a zombie its new parent has yet to reap
        try:
            return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] != "Z"
        except FileNotFoundError:
            return False

    def leftovers():
        pids = [int(x) for kind in ("head", "worker") if (marks / kind).exists()
                for x in (marks / kind).read_text().split()]
        return pids and [pid for pid in pids if running(pid)]

    caplog.set_level(logging.WARNING, logger=localcluster.__name__)
    try:
        state = cluster.up()
        alive = {n["raylet"]["nodeId"] for n in cluster.nodes() if n["raylet"].get("state") == "ALIVE"}
        assert [n.name for n in state.nodes] == ["head-0", "cpu-0"] and len(alive) == 2
        assert state.nodes[1].ports["node_id"] in alive
        assert [r.getMessage().split(": ")[0] for r in caplog.records if "starting it again" in r.getMessage()] == \
            ["Ray head exited", "node cpu-0 exited"]
        # What each failed start left was killed with it (SIGKILLed: gone once the kernel runs it).
        wait_for(lambda: leftovers() == [], timeout=30, what="the failed starts' processes gone")

        (marks / "always-worker").touch()
        with pytest.raises(localcluster.NodeStartTimedOut, match="node cpu-1 exited"):
            cluster.add_node("cpu")
        assert len((marks / "worker").read_text().split()) == 1 + localcluster.START_TRIES
        assert [n.name for n in cluster.state.nodes] == ["head-0", "cpu-0"]
        wait_for(lambda: leftovers() == [], timeout=30, what="the failed starts' processes gone")
    finally:
        cluster.down()


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


def test_the_gcs_lists_the_nodes_the_dashboard_does_drains_and_deaths_included(ray_cluster):
    """The dispatcher lists nodes every pass through the GCS (one call, drains in
    it); the dashboard's list is the fallback, and the path taken during an outage.
    Both must say the same of every field routing and failure classification read,
    of a drained node and a killed one too."""
    from raylane.orchestrator.backends.ray_gcs import RayGcs
    from raylane.orchestrator.backends.ray_jobs import RayJobsBackend
    from raylane.orchestrator.tooling import localcluster

    st = ray_cluster.state
    via_gcs = RayJobsBackend(st.dashboard_url, st.token, gcs=RayGcs(st.gcs_address, st.token))
    assert via_gcs.ping()  # Ray is reachable: nodes come from the GCS
    via_dashboard = RayJobsBackend(st.dashboard_url, st.token, gcs=RayGcs(st.gcs_address, st.token))
    gcs_calls = []
    real = via_gcs.gcs.all_nodes
    via_gcs.gcs.all_nodes = lambda: gcs_calls.append(1) or real()
    via_dashboard.gcs.all_nodes = lambda: pytest.fail("listed through the GCS during an outage")
    via_gcs.draining_ttl_s = via_dashboard.draining_ttl_s = 0

    def seen(backend):
        if backend is via_dashboard:
            backend.reachability.down("an outage: the dashboard is asked")
        else:
            assert backend.ping()  # the dashboard answered just now: the GCS path is taken
            asked = len(gcs_calls)
            listed = backend.nodes()
            assert len(gcs_calls) == asked + 1, "not listed through the GCS"
        # A dead node's resources: the GCS keeps them, the dashboard drops them; only
        # alive nodes' are read (``cluster_view``).
        return {n.node_id: (n.state, n.group, n.market, n.is_head, n.draining,
                            {k: v for k, v in n.resources_total.items() if k in ("CPU", "GPU", "memory")}
                            if n.state == "ALIVE" else None, n.death_reason)
                for n in (listed if backend is via_gcs else backend.nodes())}

    def alive(nodes):
        return {k: v for k, v in nodes.items() if v[0] == "ALIVE"}

    # Nodes dead before this test: the GCS keeps their labels, the dashboard drops
    # them (and this backend never saw them alive); what is compared is the nodes
    # alive now, and those that were alive at the start.
    def alive_agree():
        a = alive(seen(via_gcs))
        return a == alive(seen(via_dashboard)) and a  # a node killed before may be DEAD in one first

    before = wait_for(alive_agree, timeout=60, what="the GCS and the dashboard listing the same alive nodes")
    assert gcs_calls
    assert {"head", "gpu", "cpu", "spot-cpu"} <= {v[1] for v in before.values()}
    assert any(v[5].get("GPU") for v in before.values())
    # Through the GCS each alive node also says what Ray has free on it: a co-located
    # gang must fit one node (admission._one_node). The dashboard's list does not.
    gpu = via_gcs.cluster_view()["gpu"]
    assert gpu.node_free is not None and len(gpu.node_free) == gpu.alive_nodes
    assert all(0 <= n["GPU"] <= gpu.total["GPU"] and n["CPU"] >= 0 for n in gpu.node_free)
    assert via_dashboard.cluster_view()["gpu"].node_free is None

    drained = next(n for n in st.nodes if n.group == "spot-cpu")
    killed = next(n for n in st.nodes if n.group == "spot-cpu" and n.name != drained.name)
    ray_cluster.drain_node(drained.name, deadline_s=60)
    os.killpg(killed.pid, 9)
    wait_for(lambda: not localcluster._alive(killed.pid), timeout=30, what="the killed node's process gone")

    def agree():
        a, b = ({k: v for k, v in seen(x).items() if k in before or v[0] == "ALIVE"} for x in (via_gcs, via_dashboard))
        d = a.get(drained.ports["node_id"])
        # The drained node is draining, or has left once idle (Ray says it was preempted).
        return a == b and a[killed.ports["node_id"]][0] == "DEAD" and d and (
            d[4] or (d[0] == "DEAD" and (d[6] or "").startswith("AUTOSCALER_DRAIN"))) and a

    after = wait_for(agree, timeout=60, what="the GCS and the dashboard listing the same nodes")
    assert after[killed.ports["node_id"]][1:3] == ("spot-cpu", before[killed.ports["node_id"]][2])
    assert after[killed.ports["node_id"]][6]  # why it died: what classify reads
