"""The local cluster's nodes without starting Ray: the ports each node is given and
the environment and working directory it starts with (``ray start`` is replaced by
a recorder here; tests/ray/test_localcluster.py and test_job_secrets.py run the
real thing)."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest
import yaml


class LowestFreePortKernel:
    """A kernel that hands out the lowest port nobody holds, the moment it is free
    again: legal, and the worst case for choosing ports one bind at a time."""

    def __init__(self):
        self.bound: set[int] = set()

    def socket(self, *args, **kwargs):
        kernel = self

        class FakeSocket:
            port = None

            def bind(self, addr):
                assert addr[1] == 0
                self.port = min(p for p in range(40000, 41000) if p not in kernel.bound)
                kernel.bound.add(self.port)

            def getsockname(self):
                return ("127.0.0.1", self.port)

            def close(self):
                kernel.bound.discard(self.port)

            def __enter__(self):
                return self

            def __exit__(self, *exc):
                self.close()

        return FakeSocket()


@pytest.fixture
def kernel(monkeypatch):
    from raylane.orchestrator.tooling import localcluster

    k = LowestFreePortKernel()
    monkeypatch.setattr(localcluster.socket, "socket", k.socket)
    return k


def test_the_fake_kernel_repeats_a_port_to_one_bind_at_a_time(kernel):
    """What the cluster did before (bind port 0, let it go, once per port) gets one
    port twice from this kernel: the tests below would catch it."""
    def free_port():
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return s.getsockname()[1]

    assert free_port() == free_port()


def test_ports_of_one_call_are_distinct_and_avoid_the_taken(kernel):
    from raylane.orchestrator.tooling.localcluster import NODE_PORTS, pick_ports

    ports = pick_ports(NODE_PORTS)
    assert len(set(ports.values())) == len(NODE_PORTS) and set(ports) == set(NODE_PORTS)
    more = pick_ports(NODE_PORTS, taken=set(ports.values()))
    assert not set(more.values()) & set(ports.values()) and len(set(more.values())) == len(NODE_PORTS)
    assert not kernel.bound  # every socket was let go once the ports were chosen


def test_no_port_is_used_twice_across_the_cluster(kernel, tmp_path, monkeypatch):
    cluster, started = recording_cluster(tmp_path, monkeypatch)
    cluster._start_node(cluster.profile.head, 0, head_ports=cluster.state.head_ports)
    for i in range(3):
        cluster._start_node(cluster.profile.group("cpu"), i)
    named = [a.split("=", 1) for args, _ in started for a in args if "=" in a]
    ports = [int(v) for k, v in named if k.endswith("-port") and not k.endswith("worker-port")]  # worker ports: 0, Ray's pick
    assert len(ports) == 3 + 6 * 4  # the head's three of its own, six per node
    assert len(set(ports)) == len(ports), sorted(ports)


def test_nodes_start_with_no_secret_of_the_control_plane(tmp_path, monkeypatch):
    for k, v in {"RAYLANE_ADMIN_TOKEN": "fake-admin-token-0123456789", "RAYLANE_DATABASE_URL": "postgresql://u:pw@db/x",
                 "AWS_SECRET_ACCESS_KEY": "fake-aws", "LC_ALL": "C.UTF-8", "RAY_metrics_report_interval_ms": "2000",
                 "PYTHONPATH": "/opt/lib"}.items():
        monkeypatch.setenv(k, v)
    cluster, started = recording_cluster(tmp_path, monkeypatch)
    cluster._start_node(cluster.profile.head, 0, head_ports=cluster.state.head_ports)
    cluster._start_node(cluster.profile.group("cpu"), 0)
    for args, kw in started:
        env = kw["env"]
        assert {k for k in env if k.startswith("RAYLANE_")} <= {"RAYLANE_NODE_IP"}
        assert "AWS_SECRET_ACCESS_KEY" not in env and "postgresql://u:pw@db/x" not in env.values()
        assert env["LC_ALL"] == "C.UTF-8" and env["RAY_metrics_report_interval_ms"] == "2000"
        assert env["PYTHONPATH"].endswith(os.pathsep + "/opt/lib") and env["PATH"] and env["HOME"]
        # Nothing a node is handed (its directory, PYTHONPATH, token path) lies in the cluster's
        # directory, which ``raylane-server serve`` keeps inside its data_dir.
        for where in (kw["cwd"], env["RAY_AUTH_TOKEN_PATH"], *env["PYTHONPATH"].split(os.pathsep)):
            assert not Path(where).resolve().is_relative_to(cluster.dir), where


def recording_cluster(tmp_path, monkeypatch):
    """A LocalCluster whose ``ray start`` only records its arguments."""
    from raylane.orchestrator.domain.profile import Profile
    from raylane.orchestrator.tooling import localcluster

    p = tmp_path / "p.yaml"
    p.write_text(yaml.safe_dump({"name": "t", "groups": [{"name": "head", "role": "head", "cpus": 0, "memory_gb": 1},
                                                         {"name": "cpu", "cpus": 1, "memory_gb": 1}]}))
    cluster = localcluster.LocalCluster(Profile.load(p), tmp_path / "cluster")
    cluster.dir.mkdir()
    temp = tmp_path / "rl-temp"
    temp.mkdir()
    head_ports = localcluster.pick_ports(["port", "dashboard-port", "ray-client-server-port"])
    cluster.state = localcluster.ClusterState(
        dir=str(cluster.dir), gcs_address=f"127.0.0.1:{head_ports['port']}",
        dashboard_url=f"http://127.0.0.1:{head_ports['dashboard-port']}", token_path=str(temp / "auth_token"),
        temp_dir=str(temp), head_ports=head_ports)
    started = []

    class Proc:
        def __init__(self, args, **kw):
            started.append((args, kw))
            self.pid = 10**7 + len(started)  # above any pid_max: never a real process

    monkeypatch.setattr(localcluster.subprocess, "Popen", Proc)
    return cluster, started


OWNER = """
import json, os, subprocess, sys
dir, temp = sys.argv[1], sys.argv[2]
# A stand-in for a node: a process group whose leader names the cluster's temp dir.
node = subprocess.Popen(["sh", "-c", "sleep 600 & wait", temp], start_new_session=True)
json.dump({"temp_dir": temp, "nodes": [{"pid": node.pid, "ports": {}}], "owner_pid": os.getpid()},
          open(os.path.join(dir, "state.json"), "w"))
subprocess.Popen([sys.executable, sys.argv[3], dir, str(os.getpid())], start_new_session=True)
print(node.pid, flush=True)
sys.stdin.read()
"""


def test_the_watchdog_stops_the_nodes_when_their_owner_is_killed(tmp_path):
    """What ``raylane-server serve --local-cluster`` sets up, with ``sleep`` for Ray: its
    SIGKILL leaves no node (tests/ray/test_serve_local_cluster.py does it with Ray)."""
    import signal
    import subprocess
    import sys

    from raylane.orchestrator.tooling import nodeprocs
    from tests.helpers import wait_for

    temp = tmp_path / "rl-temp"
    temp.mkdir()
    owner = subprocess.Popen([sys.executable, "-c", OWNER, str(tmp_path), str(temp), nodeprocs.__file__],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    node = int(owner.stdout.readline())
    try:
        assert nodeprocs.is_ours(node, str(temp))
        owner.send_signal(signal.SIGKILL)
        owner.wait(30)
        wait_for(lambda: not nodeprocs.is_ours(node, str(temp)), timeout=30, what="the dead owner's node stopped")
        wait_for(lambda: not (tmp_path / "state.json").exists() and not temp.exists(), timeout=30,
                 what="its state file and temp dir removed")
    finally:
        if nodeprocs.is_ours(node, str(temp)):  # a failed run leaves no sleeper behind
            os.killpg(node, signal.SIGKILL)


# A "node": a process group whose child starts a grandchild in a session of its
# own, as Ray's job supervisor (in the node's group) starts a job's driver.
NODE_WITH_A_DRIVER = """
import subprocess, sys, time
driver = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"], start_new_session=True)
print(driver.pid, flush=True)
time.sleep(300)
"""


def _gone(pid: int) -> bool:
    """Dead, or a zombie waiting for init to reap it: it runs nothing."""
    try:
        state = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return True
    return state in ("Z", "X")


@pytest.mark.parametrize("how", ["kill_tree", "stop_groups"])
def test_a_killed_node_leaves_no_driver_running_in_a_session_of_its_own(how):
    """Killed with its process group alone, a node's job drivers lived on (re-parented
    to init, still running their job), which no reclaimed machine does: a chaos
    test's node kill left drivers running through the rest of the suite."""
    import signal
    import subprocess
    import sys

    from raylane.orchestrator.tooling import nodeprocs
    from tests.helpers import wait_for

    node = subprocess.Popen([sys.executable, "-c", NODE_WITH_A_DRIVER], stdout=subprocess.PIPE, text=True,
                            start_new_session=True)
    driver = int(node.stdout.readline())
    try:
        assert os.getpgid(driver) != node.pid  # not in the node's group: killpg alone misses it
        if how == "kill_tree":
            nodeprocs.kill_tree(node.pid)
        else:
            nodeprocs.stop_groups([node.pid], grace_s=5)
        node.wait(30)
        wait_for(lambda: _gone(driver), timeout=30, what="the node's driver gone with it")
    finally:
        for pid in (node.pid, driver):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
