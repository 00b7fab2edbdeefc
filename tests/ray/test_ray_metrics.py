"""Raylane's job metrics (jobs/metrics.py) reach Ray's own Prometheus endpoint of
the node the driver runs on, tagged with the job, so Ray's Grafana shows them."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from tests.helpers import wait_for
from tests.ray.conftest import wait_status

pytestmark = pytest.mark.ray
FUNCS = str(Path(__file__).resolve().parent / "funcs")


def test_sweep_metrics_show_on_the_drivers_node(rapi, ray_cluster, tmp_path):
    spec = {"name": "metrics-sweep", "kind": "sweep", "entrypoint": "chaos_funcs:slow_trial",
            "runtime_env": {"working_dir": FUNCS},
            "sweep": {"metric": "score", "mode": "max", "num_samples": 1, "max_concurrent_trials": 2,
                      "search_space": {"x": {"grid": list(range(6))}, "log": {"choice": [str(tmp_path / "l")]},
                                       "iters": {"choice": [6]}, "sleep": {"choice": [0.5]}}}}
    job = rapi.post("/v1/jobs", json=spec).json()
    wait_status(rapi, job["id"], {"RUNNING"}, timeout=120)
    att = wait_for(lambda: rapi.get(f"/v1/jobs/{job['id']}/attempts").json()[-1]["driver_node_id"] and
                   rapi.get(f"/v1/jobs/{job['id']}/attempts").json()[-1], timeout=60)
    node = next(n for n in ray_cluster.state.nodes if n.ports.get("node_id") == att["driver_node_id"])
    url = f"http://127.0.0.1:{node.ports['metrics-export-port']}/metrics"

    def exported():
        text = httpx.get(url, timeout=10).text
        lines = [ln for ln in text.splitlines() if f'raylane_job_id="{job["id"]}"' in ln]
        running = [ln for ln in lines if ln.startswith("ray_raylane_job_running")]
        trials = [ln for ln in lines if ln.startswith("ray_raylane_trials_done")]
        assert running and running[0].rstrip().endswith(" 1.0"), lines
        assert trials and float(trials[0].rsplit(" ", 1)[1]) >= 1, lines
        assert 'kind="sweep"' in running[0]
        return True

    wait_for(exported, timeout=120, interval=1, what="Raylane metrics on Ray's endpoint")
    assert wait_status(rapi, job["id"], {"SUCCEEDED", "FAILED"}, timeout=300)["status"] == "SUCCEEDED"
