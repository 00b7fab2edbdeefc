"""Raylane's job metrics (jobs/metrics.py) reach Ray's own Prometheus endpoints,
tagged with the job, so the Prometheus that Ray's Grafana reads shows them.

Prometheus finds Ray's endpoints through the service-discovery file Ray writes
(``<temp_dir>/prom_metrics_service_discovery.json``, one target per node and
agent); this test scrapes exactly those targets, as Prometheus would. Which
target carries a job's series (the driver's node's) is Ray's business, not the
test's.
"""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from tests.helpers import wait_for
from tests.ray.conftest import wait_status

pytestmark = pytest.mark.ray
FUNCS = str(Path(__file__).resolve().parent / "funcs")


def scrape_ray(cluster) -> list[str]:
    """Every sample line of every target in Ray's Prometheus service discovery."""
    sd = json.loads(Path(cluster.state.temp_dir, "prom_metrics_service_discovery.json").read_text())
    targets = [t for group in sd for t in group["targets"]]
    assert targets, sd
    lines: list[str] = []
    for t in targets:
        try:
            lines += [ln for ln in httpx.get(f"http://{t}/metrics", timeout=10).text.splitlines()
                      if not ln.startswith("#")]
        except httpx.HTTPError:
            pass  # a target that is starting or gone; Prometheus would skip it too
    return lines


def test_sweep_metrics_reach_rays_prometheus(rapi, ray_cluster, tmp_path):
    spec = {"name": "metrics-sweep", "kind": "sweep", "entrypoint": "chaos_funcs:slow_trial",
            "runtime_env": {"working_dir": FUNCS},
            "sweep": {"metric": "score", "mode": "max", "num_samples": 1, "max_concurrent_trials": 2,
                      "search_space": {"x": {"grid": list(range(6))}, "log": {"choice": [str(tmp_path / "l")]},
                                       "iters": {"choice": [6]}, "sleep": {"choice": [0.5]}}}}
    job = rapi.post("/v1/jobs", json=spec).json()
    wait_status(rapi, job["id"], {"RUNNING"}, timeout=120)
    tag = f'raylane_job_id="{job["id"]}"'

    def exported():
        lines = [ln for ln in scrape_ray(ray_cluster) if tag in ln]
        running = [ln for ln in lines if ln.startswith("ray_raylane_job_running{")]
        trials = [ln for ln in lines if ln.startswith("ray_raylane_trials_done_total{")]
        assert running and running[0].rstrip().endswith(" 1.0"), lines
        assert trials and float(trials[0].rsplit(" ", 1)[1]) >= 1, lines
        for key, value in (("kind", "sweep"), ("project", job["project"]), ("attempt", "1"),
                           ("node_group", job["placement"]["node_group"])):
            assert f'{key}="{value}"' in running[0], (key, running[0])
        return True

    wait_for(exported, timeout=120, interval=1, what="Raylane metrics on Ray's Prometheus targets")
    assert wait_status(rapi, job["id"], {"SUCCEEDED", "FAILED"}, timeout=300)["status"] == "SUCCEEDED"
