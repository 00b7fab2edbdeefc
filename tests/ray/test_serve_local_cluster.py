"""``raylane-server serve --local-cluster`` never leaves its nodes behind (issue #14,
point 8): killed with SIGKILL, its cluster's watchdog stops every node; with the
watchdog killed too, the next start finds the stale cluster of its data_dir and
removes it; a SIGTERM stops it cleanly. The cluster is small (a head and one cpu
node) and on explicit free ports and a data_dir of the test's own."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import yaml

from tests.conftest import ROOT, free_port
from tests.helpers import wait_for

pytestmark = [pytest.mark.ray, pytest.mark.slow]

START_TIMEOUT_S = 240  # a server and a 2-node cluster on a loaded 2-core machine
GONE_TIMEOUT_S = 30  # the bound: no node of a dead server's cluster after 30 s


class Serve:
    def __init__(self, tmp_path: Path):
        profile = tmp_path / "profile.yaml"
        profile.write_text(yaml.safe_dump({"name": "t", "groups": [
            {"name": "head", "role": "head", "cpus": 0, "memory_gb": 1},
            {"name": "cpu", "cpus": 1, "memory_gb": 1, "local_nodes": 1}]}))
        self.data_dir = tmp_path / "data"
        self.url = f"http://127.0.0.1:{free_port()}"
        env = {k: v for k, v in os.environ.items() if not k.startswith("RAYLANE_")}
        self.env = {**env, "RAYLANE_DATA_DIR": str(self.data_dir), "RAYLANE_PROFILE": str(profile),
                    "RAYLANE_HOST": "127.0.0.1", "RAYLANE_PORT": self.url.rsplit(":", 1)[1],
                    "RAYLANE_ADMIN_TOKEN": "serve-test-admin-token-0123456789"}
        self.log_path = tmp_path / "serve.log"
        self.proc: subprocess.Popen | None = None

    def start(self) -> dict:
        """Start the server, wait until it answers, and return its cluster's state."""
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen([sys.executable, "-m", "raylane.api.cli", "serve", "--local-cluster"],
                                         env=self.env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                                         start_new_session=True)

        def ready():
            assert self.proc.poll() is None, f"server exited: {self.log_path.read_text()[-3000:]}"
            try:
                return httpx.get(self.url + "/healthz", timeout=2).status_code == 200
            except httpx.HTTPError:
                return False

        wait_for(ready, timeout=START_TIMEOUT_S, what="raylane-server serve --local-cluster answering")
        return json.loads((self.data_dir / "cluster" / "state.json").read_text())

    def signal(self, sig: int) -> None:
        self.proc.send_signal(sig)  # the server alone, not its process group: as an OOM killer would
        self.proc.wait(60)


def cluster_processes(temp_dir: str) -> list[int]:
    """Every process whose command line names the cluster's Ray temp dir."""
    found = []
    for pid in [int(x) for x in os.listdir("/proc") if x.isdigit()]:
        try:
            if temp_dir.encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                found.append(pid)
        except OSError:
            continue
    return found


def test_nodes_die_with_the_server_and_a_stale_cluster_is_removed(tmp_path):
    serve = Serve(tmp_path)
    state = serve.start()
    try:
        assert len(state["nodes"]) == 2 and cluster_processes(state["temp_dir"])
        serve.signal(signal.SIGKILL)
        wait_for(lambda: not cluster_processes(state["temp_dir"]), timeout=GONE_TIMEOUT_S,
                 what="no process of the SIGKILLed server's cluster")
        # The watchdog removes the Ray temp dir, then the state file, after the last
        # node is gone: wait for that too (on a loaded machine the removal takes a while).
        wait_for(lambda: not (serve.data_dir / "cluster" / "state.json").exists(), timeout=GONE_TIMEOUT_S,
                 what="the watchdog removing the dead server's state.json")
        assert not Path(state["temp_dir"]).exists()

        # The next start is clean; then the watchdog dies first (a kill of everything
        # the user owns, say), so the server's death leaves its nodes running ...
        state = serve.start()
        assert cluster_processes(state["temp_dir"])
        os.kill(state["watchdog_pid"], signal.SIGKILL)
        serve.signal(signal.SIGKILL)
        assert all(n["pid"] in cluster_processes(state["temp_dir"]) for n in state["nodes"])

        # ... and the next start stops them before starting a cluster of its own.
        stale = state
        state = serve.start()
        assert state["temp_dir"] != stale["temp_dir"]
        wait_for(lambda: not cluster_processes(stale["temp_dir"]), timeout=GONE_TIMEOUT_S,
                 what="no process of the stale cluster")

        serve.signal(signal.SIGTERM)  # a clean stop takes the cluster down itself, not by its watchdog
        assert serve.proc.returncode == 128 + signal.SIGTERM, serve.log_path.read_text()[-3000:]
        assert "Stopping the local Ray cluster" in serve.log_path.read_text()
        assert not (serve.data_dir / "cluster" / "state.json").exists()
        wait_for(lambda: not cluster_processes(state["temp_dir"]), timeout=GONE_TIMEOUT_S,
                 what="no process of the cleanly stopped server's cluster")
    finally:
        if serve.proc and serve.proc.poll() is None:
            serve.signal(signal.SIGKILL)
        for pid in cluster_processes(state["temp_dir"]):
            os.kill(pid, signal.SIGKILL)
