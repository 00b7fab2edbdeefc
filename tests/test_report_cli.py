"""``raylane report`` against a real server: the own-or-rent table per GPU group
and the jobs whose placement could have been cheaper."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import timedelta

import httpx
from sqlalchemy import insert

from tests.conftest import ROOT

IDLE_GPU = {"name": "idle-gpu", "kind": "command", "entrypoint": "python -c 'print(42)'",
            "resources": {"gpus_per_worker": 1, "cpus_per_worker": 1}}


def _cli(srv, *args: str) -> subprocess.CompletedProcess:
    env = {"RAYLANE_URL": srv.url, "COLUMNS": "200", "PATH": "/usr/bin:/bin"}
    if getattr(srv, "token", None):
        env["RAYLANE_TOKEN"] = srv.token
    return subprocess.run([sys.executable, "-m", "raylane.client.cli", "report", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)


def test_report_shows_the_gpu_decision_and_cheaper_placements(server_factory, tmp_path):
    from raylane.orchestrator.domain.ids import submission_id
    from raylane.orchestrator.services.controlplane import ControlPlane
    from raylane.orchestrator.settings import Settings
    from raylane.orchestrator.store import db, migrate, usage_rows
    from raylane.orchestrator.store.tables import attempts
    from raylane.orchestrator.store.transitions import utcnow

    url = f"sqlite:///{tmp_path / 'r.db'}"
    migrate.upgrade(url)
    srv = server_factory({"RAYLANE_DATABASE_URL": url, "RAYLANE_DATA_DIR": str(tmp_path),
                          "RAYLANE_LOOPS_ENABLED": "false"}).start()
    r = httpx.post(srv.url + "/v1/jobs", json=IDLE_GPU, headers=getattr(srv, "headers", {}), timeout=30)
    assert r.status_code == 201, r.text
    job_id = r.json()["id"]
    # It held 1 of the gpu node's 2 GPUs for 2 hours (what the dispatcher and reconciler record).
    cp = ControlPlane(Settings(database_url=url, data_dir=tmp_path, auto_migrate=False, loops_enabled=False))
    now = utcnow()
    try:
        with db.transaction(cp.sessions) as s:
            s.execute(insert(attempts).values(
                job_id=job_id, number=1, submission_id=submission_id(job_id, 1), node_group="gpu", market="ON_DEMAND",
                status="SUCCEEDED", resources={"CPU": 1, "GPU": 1}, created_at=now - timedelta(hours=3),
                started_at=now - timedelta(hours=3), ended_at=now - timedelta(hours=1)))
            usage_rows.track(s, job_id, 1)  # written around the store's writers
    finally:
        cp.close()

    res = _cli(srv, "--since", "1d")
    assert res.returncode == 0, res.stderr
    text = res.stdout
    assert "GPU groups: own or rent?" in text
    # The shipped profile: gpu is 1 node (min_nodes) x 2 H100 at $6.98; 2 GPU-h of 48 available.
    assert "gpu" in text and "rent" in text and "4.2%" in text
    assert "Placements that could have been cheaper" in text and "idle-gpu" in text
    # 2 h x half a node x $6.98 = $6.98; its 1 CPU on the cpu group: 2 h x 1/4 x $0.17 = $0.085.
    assert "$6.98" in text

    res = _cli(srv, "--since", "1d", "-o", "json")
    rep = json.loads(res.stdout)
    (finding,) = rep["cheaper_placements"]
    assert finding["job_id"] == job_id and finding["finding"] == "gpu_unused"
    assert abs(finding["saving"] - (6.98 - 0.085)) < 1e-9
