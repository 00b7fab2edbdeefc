"""Code from a laptop: a client directory outside every policy root (the server
allows no local directory at all) reaches the cluster as an uploaded package
through the CLI, against a real server on the shared cluster; the job imports
its own modules, the tree's .gitignore kept a file out, and the same tree sent
again uploads nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import httpx
import pytest

from tests.conftest import ADMIN_TOKEN, ROOT, ServerProcess

pytestmark = pytest.mark.ray

TRAIN = """\
import argparse, os
import mylib

p = argparse.ArgumentParser()
p.add_argument("--lr", type=float)
print(mylib.describe(p.parse_args().lr))
print("secret shipped:", os.path.exists("secret.env"))
"""


def rl(*args: str, url: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "RAYLANE_URL": url, "RAYLANE_TOKEN": ADMIN_TOKEN, "NO_COLOR": "1", "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-m", "raylane.client.cli", *args], capture_output=True, text=True,
                          cwd=ROOT, env=env, timeout=300)


def uploads(srv: ServerProcess) -> int:
    r = httpx.get(srv.url + "/v1/audit", params={"action": "upload_package"}, headers=srv.headers, timeout=10)
    r.raise_for_status()
    return sum(1 for e in r.json()["items"] if e["status_code"] == 201)


def test_a_laptop_directory_runs_as_an_uploaded_package(ray_cluster, tmp_path, tmp_path_factory):
    st = ray_cluster.state
    data = tmp_path / "server"
    srv = ServerProcess({
        "RAYLANE_DATABASE_URL": f"sqlite:///{tmp_path / 'raylane.db'}", "RAYLANE_DATA_DIR": str(data),
        "RAYLANE_AUTH_ENABLED": "true", "RAYLANE_ADMIN_TOKEN": ADMIN_TOKEN,
        "RAYLANE_POLICY_WORKING_DIR_ROOTS": "[]",  # no directory of the server's disk: code must be uploaded
        "RAYLANE_DASHBOARD_URL": st.dashboard_url, "RAYLANE_RAY_AUTH_TOKEN": st.token,
        "RAYLANE_RAY_ADDRESS": st.gcs_address, "RAYLANE_DISPATCH_INTERVAL_S": "0.5",
        "RAYLANE_RECONCILE_INTERVAL_S": "0.5"}, tmp_path / "server.log").start(timeout=120)
    try:
        laptop = tmp_path_factory.mktemp("laptop")
        (laptop / "mylib").mkdir()
        (laptop / "mylib" / "__init__.py").write_text("def describe(lr):\n    return f'mylib trains at lr={lr}'\n")
        (laptop / "train.py").write_text(TRAIN)
        (laptop / ".gitignore").write_text("secret.env\n")
        (laptop / "secret.env").write_text("TOKEN=not-for-the-cluster\n")

        # A local path in the spec is refused by this server: the upload is the only door.
        spec = tmp_path / "local.yaml"
        spec.write_text(json.dumps({"name": "local", "kind": "command", "entrypoint": "python train.py",
                                    "runtime_env": {"working_dir": str(laptop)}}))
        r = rl("submit", str(spec), url=srv.url)
        assert r.returncode != 0 and "policy.working_dir.roots" in r.stderr + r.stdout

        r = rl("run", "--working-dir", str(laptop), "--follow", "--timeout", "240", "--",
               "python", "train.py", "--lr", "1e-3", url=srv.url)
        assert r.returncode == 0, r.stdout + r.stderr
        assert "mylib trains at lr=0.001" in r.stdout and "secret shipped: False" in r.stdout, r.stdout
        assert "(uploaded)" in r.stderr, r.stderr
        assert uploads(srv) == 1

        spec = tmp_path / "again.yaml"
        spec.write_text("name: again\nkind: command\nentrypoint: python train.py --lr 2\n")
        r = rl("submit", str(spec), "--working-dir", str(laptop), "--follow", "--timeout", "240", url=srv.url)
        assert r.returncode == 0, r.stdout + r.stderr
        assert "mylib trains at lr=2.0" in r.stdout, r.stdout
        assert "already on the server, nothing sent" in r.stderr, r.stderr
        assert uploads(srv) == 1
    finally:
        srv.stop()
