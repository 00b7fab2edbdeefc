"""The local multi-node Ray cluster: one head and ``local_nodes`` worker nodes per
node group of a profile, all on this machine.

Each node is ``ray start --block`` in its own process group, so one node can be
killed alone (a simulated spot reclaim) without ``ray stop``, which would stop
every Ray process on the machine. Every node gets explicit free ports (Redis has
6379 here, and several nodes on one host must not share agent ports). Token
authentication stays on: the token lives in the cluster's own directory and is
handed to nodes, drivers and the Jobs API client.

Each node has an address of its own on the loopback network (the head
127.0.0.1, workers 127.0.0.2, 127.0.0.3, ...), as separate hosts would, and its
processes see it in ``RAYLANE_NODE_IP``. A driver on a shared host otherwise
registers with the head's raylet whatever node its job supervisor runs on (Ray
prefers the head among local raylets), and then lives and dies with the head;
Raylane's runner (``jobs/run.py``) passes ``RAYLANE_NODE_IP`` to ``ray.init`` so
its driver belongs to its own node, as on a real cluster.

The head can be killed and started again on the same ports (``restart_head``),
in both of Ray's modes: without GCS fault tolerance the new head starts an empty
cluster, so the worker nodes are replaced too (KubeRay restarts their pods);
with ``gcs_ft_redis`` the head keeps its state in Redis under a key namespace of
the cluster's own, and worker nodes, actors and running jobs carry on.

State (pids, ports, addresses) is kept in ``<dir>/state.json`` so ``raylane-server cluster
down|status`` works from another process.

Ports: each node's ports are chosen together, every socket held until all are
chosen, and none of them is one the cluster already handed to another node
(``pick_ports``): two components of one node, or two nodes, never get the same.

An *owned* cluster (``up(owned=True)``, what ``raylane-server serve --local-cluster``
does) dies with its owner however the owner dies: a watchdog process
(``nodeprocs.py``) stops its nodes when the owner is gone. A start that finds a
cluster whose owner is dead, or whose head is gone, stops what is left of it
before starting a new one; a cluster with no owner (``raylane-server cluster up``) is
attached to while it is up.

What a job sees: nodes start with an allowlisted environment (``node_env``), never
the control plane's (``RAYLANE_*`` settings such as the admin token or the
database URL), and run in the cluster's Ray temp dir, outside ``<dir>``: the
token file and the nodes' PYTHONPATH live there too, so neither a node's
environment nor its working directory leads to the control plane's data_dir.
"""

from __future__ import annotations

import json
import logging
import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import httpx

from raylane.orchestrator.domain import protocol
from raylane.orchestrator.domain.profile import NODE_GROUP_LABEL, NodeGroup, Profile
from raylane.orchestrator.tooling import nodeprocs

log = logging.getLogger(__name__)

NODE_START_TIMEOUT_S = 120  # a node on a busy 2-core machine can take a while
# `ray start` itself gives up when the GCS has not listed its node 30 s after its
# processes started (a constant in ray/_private/node.py), which a 2-core machine
# busy with another cluster's jobs can exceed; the next try usually makes it. A
# node that gave up so is stopped and started again, up to this many starts in all.
START_TRIES = 3
RAY_START_TIMED_OUT = "timed out during startup"  # what `ray start` says then
GiB = 1024**3
PORT_TRIES = 100  # the kernel offering only ports the cluster holds, 100 times in a row, is a machine out of ports

# What a node (and so every job on it) gets of this process's environment: what
# Ray, Python and pip need to run, nothing of the control plane's. The cluster
# then adds its own (token path, address, node group). ``RAY_*`` are Ray's own
# settings (an operator's tuning); ``RAYLANE_*`` is never passed.
NODE_ENV_NAMES = frozenset({
    "PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LANGUAGE", "TZ", "TERM", "TMPDIR",
    "PYTHONPATH", "PYTHONHOME", "PYTHONUNBUFFERED", "PYTHONDONTWRITEBYTECODE", "PYTHONHASHSEED", "VIRTUAL_ENV",
    "LD_LIBRARY_PATH", "SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE",
    "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "http_proxy", "https_proxy", "no_proxy",
})
NODE_ENV_PREFIXES = re.compile(r"(LC_|RAY_|PIP_|UV_)")


def node_env(environ: dict[str, str]) -> dict[str, str]:
    """The allowlisted part of ``environ``."""
    return {k: v for k, v in environ.items() if k in NODE_ENV_NAMES or NODE_ENV_PREFIXES.match(k)}


NODE_PORTS = ["node-manager-port", "object-manager-port", "dashboard-agent-listen-port",
              "dashboard-agent-grpc-port", "metrics-export-port", "runtime-env-agent-port"]


def pick_ports(names: list[str], taken: set[int] = frozenset()) -> dict[str, int]:
    """A free port for each name, no two alike and none in ``taken``.

    Every socket stays bound until all ports are chosen, so the kernel cannot hand
    one port out twice (binding port 0 and letting it go, once per port, gave one
    node the same port for two of its components). ``taken`` holds the ports
    already handed to the cluster's other nodes, which a node may not have bound
    yet; a port the kernel offers from it is kept bound and another one asked for."""
    held: list[socket.socket] = []
    chosen: dict[str, int] = {}
    try:
        for name in names:
            for _ in range(PORT_TRIES):
                s = socket.socket()
                held.append(s)
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
                if port not in taken:
                    chosen[name] = port
                    break
            else:
                raise RuntimeError(f"no free port for {name} outside the {len(taken)} the cluster holds")
    finally:
        for s in held:
            s.close()
    return chosen


@dataclass
class NodeProc:
    group: str
    index: int
    pid: int
    ports: dict[str, int]
    log_path: str
    ip: str = "127.0.0.1"
    draining: bool = False  # told to drain (``drain_node``): Ray places nothing new there
    log_from: int = 0  # where this start's lines begin in ``log_path`` (a restarted node appends)

    @property
    def name(self) -> str:
        return f"{self.group}-{self.index}"


@dataclass
class ClusterState:
    dir: str
    gcs_address: str
    dashboard_url: str
    token_path: str
    temp_dir: str
    nodes: list[NodeProc] = field(default_factory=list)
    head_ports: dict[str, int] = field(default_factory=dict)
    next_ip: int = 2  # the last octet of the next worker's loopback address
    redis_address: str | None = None  # GCS fault tolerance: the Redis the head keeps its state in
    storage_namespace: str | None = None  # ... and the key namespace of this cluster there
    owner_pid: int | None = None  # an owned cluster: the process whose death ends it ...
    owner_start: str | None = None  # ... (its start time: a pid alone may be reused) ...
    watchdog_pid: int | None = None  # ... and the watchdog that ends it then (``nodeprocs.watch``)

    def save(self) -> None:
        Path(self.dir, "state.json").write_text(json.dumps(asdict(self), indent=2))

    @classmethod
    def load(cls, dir: str | Path) -> "ClusterState | None":
        p = Path(dir, "state.json")
        if not p.exists():
            return None
        data = json.loads(p.read_text())
        data["nodes"] = [NodeProc(**n) for n in data["nodes"]]
        return cls(**data)

    @property
    def token(self) -> str:
        return Path(self.token_path).read_text().strip()

    def env(self) -> dict[str, str]:
        """What a process needs to talk to this cluster with token auth on."""
        return {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": self.token_path, "RAY_ADDRESS": self.gcs_address}

    def ports_in_use(self) -> set[int]:
        """Every port handed to a node of this cluster (bound or about to be)."""
        return {v for n in self.nodes for k, v in n.ports.items() if k != "node_id"} | set(self.head_ports.values())

    def orphaned(self) -> bool:
        """An owned cluster whose owner is gone."""
        return self.owner_pid is not None and nodeprocs.proc_start(self.owner_pid) != self.owner_start


_alive = nodeprocs.alive


class NodeStartTimedOut(RuntimeError):
    """`ray start` gave up waiting for the GCS to list its node (``START_TRIES``)."""

    def __init__(self, message: str, node: "NodeProc"):
        super().__init__(message)
        self.node = node


def _exited(node: "NodeProc", what: str) -> None:
    """Raise for a node whose `ray start` exited: ``NodeStartTimedOut`` when Ray gave up on the GCS."""
    with open(node.log_path, "rb") as f:
        f.seek(node.log_from)
        tail = f.read().decode(errors="replace")[-3000:]
    if RAY_START_TIMED_OUT in tail:
        raise NodeStartTimedOut(f"{what}: Ray's start timed out waiting for the GCS (see {node.log_path})", node)
    raise RuntimeError(f"{what}; see {node.log_path}:\n{tail}")


class LocalCluster:
    """Start, inspect and stop the local cluster of a profile."""

    def __init__(self, profile: Profile, dir: str | Path, *, gcs_ft_redis: str | None = None, first_ip: int = 2):
        """``gcs_ft_redis`` (``host:port``) turns on Ray's GCS fault tolerance: the
        head keeps the cluster's state there, under a namespace of its own.
        ``first_ip``: the last octet of its first worker's loopback address (the
        clusters of a local fleet take addresses apart, as separate networks would)."""
        self.profile = profile
        self.dir = Path(dir).resolve()
        self.gcs_ft_redis = gcs_ft_redis
        self.first_ip = first_ip
        self.state: ClusterState | None = ClusterState.load(self.dir)

    # Public ----------------------------------------------------------------

    def up(self, *, owned: bool = False) -> ClusterState:
        """Start the cluster, or attach to the one ``<dir>`` names while it is up and
        not orphaned. ``owned``: the cluster dies with this process, however it dies
        (a watchdog stops it); what ``raylane-server serve --local-cluster`` starts."""
        if self.state:
            if self.is_up() and not self.state.orphaned():
                return self.state
            # A cluster whose server died, or whose head is gone: what is left of it
            # would hold memory and ports for nothing (and a new cluster beside it).
            log.warning("stopping what is left of the stale local cluster in %s", self.dir)
            self._stop_watchdog()
            nodeprocs.stop_stale(self.dir)
            self.state = None
        self.dir.mkdir(parents=True, exist_ok=True)
        # Unix socket paths are limited to ~107 bytes: keep the temp dir short. The
        # nodes run in it and find the token there, outside the control plane's tree.
        temp_dir = f"/tmp/rl-{secrets.token_hex(4)}"
        os.makedirs(temp_dir, mode=0o700)
        token_path = Path(temp_dir, "auth_token")
        token_path.touch(mode=0o600)
        token_path.write_text(secrets.token_hex(32))
        head_ports = pick_ports(["port", "dashboard-port", "ray-client-server-port"])
        self.state = ClusterState(
            dir=str(self.dir), gcs_address=f"127.0.0.1:{head_ports['port']}",
            dashboard_url=f"http://127.0.0.1:{head_ports['dashboard-port']}",
            token_path=str(token_path), temp_dir=temp_dir, head_ports=head_ports,
            redis_address=self.gcs_ft_redis, next_ip=self.first_ip,
            storage_namespace=f"raylane-{secrets.token_hex(6)}" if self.gcs_ft_redis else None,
        )
        if owned:
            # Before any node starts: an owner killed during the start leaves nothing either.
            self.state.owner_pid, self.state.owner_start = os.getpid(), nodeprocs.proc_start(os.getpid())
            self.state.save()
            self.state.watchdog_pid = subprocess.Popen(
                [sys.executable, nodeprocs.__file__, str(self.dir), str(os.getpid())], start_new_session=True,
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).pid
        self.state.save()
        try:
            self._start_head()
            self._start_workers()
        except BaseException:
            # A node that did not come up must not leave the others running
            # (a leaked cluster eats a small machine's CPU for the rest of the day).
            self.down()
            raise
        return self.state

    def _start_workers(self) -> None:
        """``local_nodes`` nodes of each worker group, one after another."""
        for group in self.profile.workers:
            for i in range(group.local_nodes):
                self.add_node(group.name, i)

    def _head_args(self, env: dict[str, str]) -> list[str]:
        """More ``ray start --head`` arguments (and changes to its ``env``): none here."""
        return []

    def _examples_path(self) -> str | None:
        """A directory that holds only the checkout's ``examples`` package, for the
        nodes' PYTHONPATH: the examples' specs name ``examples.train:main`` and the
        like, and the installed distribution ships no ``examples`` (only the
        ``raylane`` namespace). The container image does the same (Dockerfile)."""
        src = Path(__file__).resolve().parents[2] / "examples"
        if not (src / "__init__.py").is_file():
            return None
        d = Path(self.state.temp_dir, "pythonpath")
        d.mkdir(parents=True, exist_ok=True)
        link = d / "examples"
        if not link.exists():
            link.symlink_to(src, target_is_directory=True)
        return str(d)

    def add_node(self, group_name: str, index: int | None = None) -> NodeProc:
        """Start one more node of a group (also used to replace a killed spot node)."""
        assert self.state is not None, "cluster is not up"
        group = self.profile.group(group_name)
        if group is None:
            raise ValueError(f"no node group {group_name!r} in profile {self.profile.name}")
        if index is None:
            index = 1 + max((n.index for n in self.state.nodes if n.group == group_name), default=-1)
        def start() -> NodeProc:
            before = self._alive_node_ids()
            node = self._start_node(group, index)
            self._wait_registered(before, node)
            return node

        return self._tries(start)

    def _tries(self, start: Callable[[], NodeProc]) -> NodeProc:
        """``start()`` a node, again after Ray's own start-up timeout (``START_TRIES``)."""
        for n in range(1, START_TRIES + 1):
            try:
                return start()
            except NodeStartTimedOut as e:
                self.kill_node(e.node.name)  # what it started (a GCS, a raylet): a next try binds the same ports
                if n == START_TRIES:
                    raise
                log.warning("%s; starting it again (start %d of %d)", e, n + 1, START_TRIES)
        raise AssertionError("unreachable")

    def kill_head(self) -> NodeProc:
        """SIGKILL the head's processes (GCS, dashboard and Jobs API, head raylet)."""
        assert self.state is not None
        return self.kill_node(self._head_node().name)

    def restart_head(self) -> None:
        """Kill the head and start it again on the same addresses.

        With GCS fault tolerance, the new head reads the cluster back from Redis and
        the worker nodes reconnect. Without it the new head knows nothing, and a
        worker node cannot join it (its raylet belongs to the old cluster): the
        workers are replaced by fresh nodes of the same groups, as KubeRay does."""
        assert self.state is not None
        head = next((n for n in self.state.nodes if n.group == self.profile.head.name), None)
        if head is not None:
            self.kill_node(head.name)
        workers = [] if self.state.redis_address else list(self.state.nodes)
        for n in workers:
            self.kill_node(n.name)
        self._start_head()
        for n in sorted(workers, key=lambda n: (n.group, n.index)):
            self.add_node(n.group, n.index)

    def drain_node(self, name: str, *, reason: str = "DRAIN_NODE_REASON_PREEMPTION",
                   message: str = "spot termination notice", deadline_s: int = 120) -> None:
        """Ray's drain API on one node (``ray drain-node``), as a spot-termination
        watcher or KubeRay calls it before the node goes: Ray stops placing work
        there, and the node leaves once its work is done or the deadline passes."""
        assert self.state is not None
        node = next(n for n in self.state.nodes if n.name == name)
        out = subprocess.run(
            [self._ray_bin(), "drain-node", f"--address={self.state.gcs_address}", f"--node-id={node.ports['node_id']}",
             f"--reason={reason}", f"--reason-message={message}", f"--deadline-remaining-seconds={deadline_s}"],
            env={**os.environ, **self.state.env()}, capture_output=True, text=True, timeout=60)
        if out.returncode != 0:
            raise RuntimeError(f"ray drain-node {name} failed: {out.stderr[-2000:]}")
        node.draining = True
        self.state.save()

    def restore(self) -> list[str]:
        """Bring the worker groups back to the profile's shape: kill nodes that are
        draining, forget nodes whose process is gone, and start fresh nodes until
        each group has its ``local_nodes`` again (what an autoscaler or KubeRay does
        after a preemption). Returns the names of the nodes started; a cluster in
        shape is left alone. Shared test clusters call it after each test, so one
        test's chaos cannot starve the next."""
        assert self.state is not None
        for n in list(self.state.nodes):
            if n.group != self.profile.head.name and (n.draining or not _alive(n.pid)):
                self.kill_node(n.name)
        started = []
        for group in self.profile.workers:
            while sum(n.group == group.name for n in self.state.nodes) < group.local_nodes:
                started.append(self.add_node(group.name).name)
        return started

    def kill_node(self, name: str, sig: int = signal.SIGKILL) -> NodeProc:
        """Kill one node's processes, its process group (raylet, workers, agents) and
        every process started under it in a session of its own (its jobs' drivers):
        a spot reclaim."""
        assert self.state is not None
        node = next(n for n in self.state.nodes if n.name == name)
        nodeprocs.kill_tree(node.pid, sig)
        self.state.nodes = [n for n in self.state.nodes if n.name != name]
        self.state.save()
        return node

    def down(self) -> None:
        if not self.state:
            return
        # Workers first, the head last, so nodes do not log a storm of lost-GCS errors.
        nodes = sorted(self.state.nodes, key=lambda n: n.group == self.profile.head.name)
        nodeprocs.stop_groups([n.pid for n in nodes
                               if nodeprocs.is_ours(n.pid, self.state.temp_dir) or nodeprocs.is_child(n.pid)])
        self._stop_watchdog()
        subprocess.run(["rm", "-rf", self.state.temp_dir], check=False)
        if self.state.redis_address and self.state.storage_namespace:
            self._drop_redis_namespace()
        Path(self.dir, "state.json").unlink(missing_ok=True)
        self.state = None

    def _stop_watchdog(self) -> None:
        """End the watchdog of an owned cluster (only ours: it is a child of the owner)."""
        pid = self.state.watchdog_pid if self.state else None
        if pid is None or self.state.owner_pid != os.getpid():
            return
        try:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        except (ProcessLookupError, ChildProcessError):
            pass

    def _drop_redis_namespace(self) -> None:
        """Delete this cluster's keys from the shared Redis (only its own namespace)."""
        from ray._private.gcs_utils import cleanup_redis_storage

        host, port = self.state.redis_address.rsplit(":", 1)
        try:
            cleanup_redis_storage(host=host, port=int(port), password="", use_ssl=False,
                                  storage_namespace=self.state.storage_namespace)
        except Exception as e:  # pragma: no cover - leave the keys rather than fail a shutdown
            log.warning("could not delete Redis namespace %s: %s", self.state.storage_namespace, e)

    def is_up(self) -> bool:
        if not self.state:
            return False
        head = next((n for n in self.state.nodes if n.group == self.profile.head.name), None)
        if head is None or not _alive(head.pid):
            return False
        try:
            return httpx.get(self.state.dashboard_url + "/api/version", timeout=3,
                             headers=self.auth_headers()).status_code == 200
        except httpx.HTTPError:
            return False

    def auth_headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.state.token}"} if self.state else {}

    def nodes(self) -> list[dict]:
        """Ray's node list from the dashboard (alive and dead), with labels."""
        assert self.state is not None
        r = httpx.get(self.state.dashboard_url + "/nodes?view=summary", headers=self.auth_headers(), timeout=10)
        r.raise_for_status()
        return r.json()["data"]["summary"]

    # Internals -------------------------------------------------------------

    def _head_node(self) -> NodeProc:
        return next(n for n in self.state.nodes if n.group == self.profile.head.name)

    def _start_head(self) -> None:
        """Start the head on the cluster's GCS and dashboard ports (the first time,
        or again after it was killed)."""
        assert self.state is not None
        if not self.state.head_ports:  # a state file written before ``up`` chose all three
            self.state.head_ports = {"port": int(self.state.gcs_address.rsplit(":", 1)[1]),
                                     "dashboard-port": int(self.state.dashboard_url.rsplit(":", 1)[1]),
                                     **pick_ports(["ray-client-server-port"], self.state.ports_in_use())}
        # `ray start --head` refuses to start where its temp dir names a cluster
        # whose GCS address some local raylet still uses (a worker of the killed
        # head, waiting for it to come back): that is exactly a restart.
        def start() -> NodeProc:
            Path(self.state.temp_dir, "ray_current_cluster").unlink(missing_ok=True)
            node = self._start_node(self.profile.head, 0, head_ports=self.state.head_ports)
            self._wait_dashboard()
            return node

        self._tries(start)

    def _ray_bin(self) -> str:
        return str(Path(sys.executable).with_name("ray"))

    def _start_node(self, group: NodeGroup, index: int, head_ports: dict[str, int] | None = None) -> NodeProc:
        assert self.state is not None
        ports = pick_ports(NODE_PORTS, self.state.ports_in_use())
        args = [self._ray_bin(), "start", "--block", f"--temp-dir={self.state.temp_dir}",
                "--min-worker-port=0", "--max-worker-port=0",
                f"--num-cpus={int(group.cpus)}", f"--num-gpus={group.gpus}",
                f"--memory={int(group.memory_gb * GiB)}", "--object-store-memory=" + str(200 * 1024**2),
                "--disable-usage-stats"]
        if head_ports is not None:
            ip = "127.0.0.1"
            ports.update(head_ports)
            args += ["--head", f"--node-ip-address={ip}", "--include-dashboard=true",
                     "--dashboard-host=127.0.0.1"]
        else:
            ip = f"127.0.0.{self.state.next_ip}"
            self.state.next_ip += 1
            args += [f"--address={self.state.gcs_address}", f"--node-ip-address={ip}"]
        args += [f"--{k}={v}" for k, v in ports.items()]
        if group.accelerator:
            # What Ray itself advertises on a node it detects the accelerator on.
            args.append(f"--resources={json.dumps({'accelerator_type:' + group.accelerator.type: 1})}")
        env = {
            **node_env(dict(os.environ)),
            **self.state.env(),
            # KubeRay sets these; Ray turns them into ray.io/node-group and ray.io/market-type labels.
            "RAY_NODE_TYPE_NAME": group.name,
            "RAY_NODE_MARKET_TYPE": group.market,
            # Export metrics every 2 s instead of 10 s, so a short job's Raylane
            # metrics (jobs/metrics.py) reach the node's Prometheus endpoint.
            "RAY_metrics_report_interval_ms": os.environ.get("RAY_metrics_report_interval_ms", "2000"),
            # Drivers run `python ...` from PATH: make it this environment's Python.
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        }
        if (shown := self._examples_path()) is not None:
            env["PYTHONPATH"] = os.pathsep.join(p for p in (shown, os.environ.get("PYTHONPATH")) if p)
        if head_ports is None:
            env[protocol.Env.NODE_IP] = ip  # see the module's doc: drivers attach to their own node
        else:
            # (Ray advertises the head at the host's address, not 127.0.0.1: its
            # drivers find it unaided.)
            env.pop("RAY_ADDRESS", None)
            args += self._head_args(env)
            if self.state.redis_address:
                env["RAY_REDIS_ADDRESS"] = self.state.redis_address
                env["RAY_external_storage_namespace"] = self.state.storage_namespace
        log_path = self.dir / f"node-{group.name}-{index}.log"
        with open(log_path, "ab") as logf:
            log_from = logf.tell()
            proc = subprocess.Popen(args, env=env, stdout=logf, stderr=subprocess.STDOUT, start_new_session=True,
                                    cwd=self.state.temp_dir)
        node = NodeProc(group=group.name, index=index, pid=proc.pid, ports=ports, log_path=str(log_path), ip=ip,
                        log_from=log_from)
        self.state.nodes.append(node)
        self.state.save()
        return node

    def _wait_dashboard(self) -> None:
        deadline = time.monotonic() + NODE_START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.is_up():
                # The head must also be listed as a node before workers join.
                try:
                    if self._alive_node_ids():
                        return
                except httpx.HTTPError:
                    pass
            head = self._head_node()
            if not _alive(head.pid):
                _exited(head, "Ray head exited")
            time.sleep(0.25)
        raise TimeoutError(f"Ray head did not come up in {NODE_START_TIMEOUT_S}s; see {self._head_node().log_path}")

    def _alive_node_ids(self) -> set[str]:
        return {n["raylet"]["nodeId"] for n in self.nodes() if n["raylet"].get("state") == "ALIVE"}

    def _wait_registered(self, before: set[str], node: NodeProc) -> None:
        # Start nodes one after another: two `ray start` at once on 2 cores can
        # time out during start-up.
        deadline = time.monotonic() + NODE_START_TIMEOUT_S
        while time.monotonic() < deadline:
            if not _alive(node.pid):
                _exited(node, f"node {node.name} exited")
            try:
                for n in self.nodes():
                    r = n["raylet"]
                    # Its own address too: a node killed after a try that gave up
                    # (``_tries``) stays ALIVE in the GCS until its health checks fail.
                    if r.get("state") == "ALIVE" and r["nodeId"] not in before and \
                            r.get("labels", {}).get(NODE_GROUP_LABEL) == node.group and \
                            r.get("nodeManagerAddress", node.ip) == node.ip:
                        node.ports["node_id"] = r["nodeId"]  # type: ignore[assignment]
                        self.state.save()
                        return
            except httpx.HTTPError:
                pass
            time.sleep(0.25)
        raise TimeoutError(f"node {node.name} did not register in {NODE_START_TIMEOUT_S}s; see {node.log_path}")
