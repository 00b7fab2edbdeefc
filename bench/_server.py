"""One way for every benchmark to start a real `raylane-server serve` and stop it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from tests.conftest import free_port
from tests.helpers import wait_for

ROOT = Path(__file__).resolve().parent.parent


def start_server(work: Path, env: dict[str, str], *, timeout: float = 120,
                 tree: Path | None = None, args: tuple[str, ...] = ("serve",),
                 clean_env: bool = False) -> tuple[subprocess.Popen, str]:
    """Start the server with ``env`` on a free port; its log goes to ``work/server.log``.
    ``tree``: run another checkout's code (a before/after comparison in one run).
    Returns (process, base URL) once /readyz answers 200."""
    port = free_port()
    root = Path(tree).resolve() if tree else ROOT
    # clean_env: no RAYLANE_* setting of the caller's shell, the server's defaults (as `make run` ships)
    base = {k: v for k, v in os.environ.items() if not (clean_env and k.startswith("RAYLANE_"))}
    full = {**base, "RAYLANE_DATA_DIR": str(work), "RAYLANE_PORT": str(port), "PYTHONPATH": str(root),
            **({} if clean_env else {"RAYLANE_LOG_LEVEL": "WARNING"}), **env}
    log = Path(work) / "server.log"
    proc = subprocess.Popen([sys.executable, "-m", "raylane.api.cli", *args], env=full, cwd=root,
                            stdout=open(log, "ab"), stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"

    def ready() -> bool:
        assert proc.poll() is None, log.read_text()[-2000:]
        try:
            return httpx.get(url + "/readyz", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        wait_for(ready, timeout=timeout, what="raylane server")
    except BaseException:
        stop_server(proc)
        raise
    return proc, url


def stop_server(proc: subprocess.Popen, timeout: float = 30) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout)


@dataclass
class Bench:
    """A local cluster of the default profile and a server attached to it."""

    work: Path
    cluster: Any  # tooling.localcluster.LocalCluster
    state: Any  # its ClusterState: dashboard_url, token, gcs_address, nodes
    server: subprocess.Popen
    url: str

    @property
    def head_pgid(self) -> int:
        return next(n.pid for n in self.state.nodes if n.group == "head")

    def stop(self) -> None:
        try:
            stop_server(self.server)
        finally:
            self.cluster.down()


def start_cluster_and_server(env: dict[str, str], *, gcs: bool = False, prefix: str = "raylane-bench-",
                             tree: Path | None = None) -> Bench:
    """Start the local cluster, then the server with ``env`` attached to it (``gcs``:
    also Ray's GCS address, as a deployment gives it). The cluster is stopped again
    if the server does not start; call ``stop()`` when done. ``tree``: the server
    and the cluster's nodes (a lane host, a job's runner) run another checkout's code."""
    if tree is not None:
        os.environ["PYTHONPATH"] = str(Path(tree).resolve())  # the nodes' processes inherit it
    from raylane.orchestrator.domain.profile import default_profile
    from raylane.orchestrator.tooling.localcluster import LocalCluster

    work = Path(tempfile.mkdtemp(prefix=prefix))
    cluster = LocalCluster(default_profile(), work / "cluster")
    state = cluster.up()
    ray = {"RAYLANE_DASHBOARD_URL": state.dashboard_url, "RAYLANE_RAY_AUTH_TOKEN": state.token}
    if gcs:
        ray["RAYLANE_RAY_ADDRESS"] = state.gcs_address
    try:
        server, url = start_server(work, {**ray, **env}, tree=tree)
    except BaseException:
        cluster.down()
        raise
    return Bench(work, cluster, state, server, url)
