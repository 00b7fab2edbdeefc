"""``RAYLANE_FLEET=local-hybrid raylane-server serve --local-cluster``: the server
starts both clusters of the fleet as its own, shows the fleet and plans across
it with both clusters read live, runs a job on ``onprem`` and one pinned to
``cloud`` there (in cloud's warm lane, after its scale-up from zero), each attempt and Ray job naming
its cluster; with cloud's processes paused (SIGSTOP) past the grace, a job
running there is placed again on onprem and finishes, and once cloud answers
its given-up attempt is stopped there; with cloud's head killed mid-run, a training job there finishes
on onprem from its checkpoint on a loopback S3 endpoint while onprem's jobs run on undisturbed; and,
SIGKILLed, leaves no process of either cluster behind (each cluster's watchdog)."""

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

from raylane.orchestrator.tooling import nodeprocs
from tests.conftest import ROOT, free_port
from tests.helpers import wait_for
from tests.s3 import CREDENTIALS, moto_s3

pytestmark = [pytest.mark.ray, pytest.mark.slow]
START_TIMEOUT_S = 300  # a server and two clusters (four Ray nodes) on a loaded 2-core machine
ADMIN = "fleet-test-admin-token-0123456789"
GRACE_S = 15  # RAYLANE_FLEET_CLUSTER_GRACE_S: a paused cluster is lost this soon (the default is a minute)
# Sleeps on its first attempt (on cloud, then paused), ends at once on the next (on onprem).
SLEEPER = "python -c 'import os, time; time.sleep(3600 if os.environ[\"RAYLANE_ATTEMPT\"] == \"1\" else 0)'"


def cluster_pids(st: dict) -> list[int]:
    """Every process of one cluster of the local fleet: its nodes' (by temp dir) and its autoscaler's (by GCS)."""
    pids = set(nodeprocs.naming(st["gcs_address"]))
    for p in map(int, filter(str.isdigit, os.listdir("/proc"))):
        try:
            if st["temp_dir"].encode() in Path(f"/proc/{p}/cmdline").read_bytes():
                pids.add(p)
        except OSError:
            pass
    pids.discard(os.getpid())
    return sorted(pids)


def leftovers(states: list[dict]) -> list[int]:
    pids = set()
    for st in states:
        pids.update(nodeprocs.naming(st["gcs_address"]))
        pids.update(p for p in map(int, filter(str.isdigit, os.listdir("/proc")))
                    if nodeprocs.is_ours(p, st["temp_dir"]))
    return sorted(pids)


@pytest.fixture(scope="module")
def s3():
    with moto_s3() as s:
        yield s


def test_serve_with_a_fleet_owns_both_clusters_runs_on_each_and_leaves_nothing(tmp_path, s3):
    data = tmp_path / "data"
    url = f"http://127.0.0.1:{free_port()}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAYLANE_")}
    env.update({"RAYLANE_DATA_DIR": str(data), "RAYLANE_FLEET": "local-hybrid", "RAYLANE_HOST": "127.0.0.1",
                "RAYLANE_PORT": url.rsplit(":", 1)[1], "RAYLANE_ADMIN_TOKEN": ADMIN, "RAYLANE_SUBMIT_RATE_PER_S": "0",
                "RAYLANE_FLEET_CLUSTER_GRACE_S": str(GRACE_S),
                # Jobs' storage on an S3 endpoint on loopback: what both clusters' nodes reach alike.
                "RAYLANE_STORAGE_URI": f"s3://{s3.bucket}/fleet", "RAYLANE_STORAGE_ENDPOINT_URL": s3.endpoint,
                "RAYLANE_STORAGE_ENV": json.dumps(CREDENTIALS)})
    log_path = tmp_path / "serve.log"
    with open(log_path, "ab") as log:
        proc = subprocess.Popen([sys.executable, "-m", "raylane.api.cli", "serve", "--local-cluster"], env=env,
                                cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    states: list[dict] = []
    try:
        def ready():
            assert proc.poll() is None, f"server exited: {log_path.read_text()[-3000:]}"
            try:
                return httpx.get(url + "/healthz", timeout=2).status_code == 200
            except httpx.HTTPError:
                return False

        wait_for(ready, timeout=START_TIMEOUT_S, what="serve --local-cluster with a fleet answering")
        states = [json.loads((data / "fleet" / name / "state.json").read_text()) for name in ("onprem", "cloud")]
        assert all(st["owner_pid"] == proc.pid and st["watchdog_pid"] for st in states)
        reach = yaml.safe_load((data / "fleet" / "fleet-reach.yaml").read_text())
        assert [c["dashboard_url"] for c in reach["clusters"]] == [st["dashboard_url"] for st in states]

        api = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {ADMIN}"}, timeout=30)
        fleet = api.get("/v1/fleet").json()
        assert [(c["name"], c["tier"], c["attached"]) for c in fleet["clusters"]] == \
            [("onprem", "owned", True), ("cloud", "rented", False)]
        train = {"name": "finetune", "kind": "training", "entrypoint": "examples.train:main",
                 "resources": {"num_workers": 2, "gpus_per_worker": 1, "cpus_per_worker": 1}}
        p = api.post("/v1/plan", json=train).json()
        assert (p["cluster"], p["node_group"]) == ("onprem", "gpu"), p
        assert "cloud gpu-spot: scale-up from 0 nodes, $2.10/h spot" in p["reasons"], p["reasons"]

        r = api.post("/v1/jobs", json={"name": "hello", "kind": "command", "entrypoint": "python -c 'print(42)'"})
        assert r.status_code == 201, r.text
        jid = r.json()["id"]
        job = wait_for(lambda: (j := api.get(f"/v1/jobs/{jid}").json())["status"] in ("SUCCEEDED", "FAILED") and j,
                       timeout=180, what="the job to end")
        assert job["status"] == "SUCCEEDED", job
        assert job["placement"]["cluster"] == "onprem"
        attempts = api.get(f"/v1/jobs/{jid}/attempts").json()
        assert [a["cluster"] for a in attempts] == ["onprem"]
        token = Path(states[0]["token_path"]).read_text().strip()
        ray_job = httpx.get(f"{states[0]['dashboard_url']}/api/jobs/{attempts[0]['submission_id']}",
                            headers={"Authorization": f"Bearer {token}"}, timeout=10).json()
        assert ray_job["metadata"]["raylane_cluster"] == "onprem"

        # One queue, two clusters: a job pinned to cloud runs there, after cloud's scale-up from zero.
        r = api.post("/v1/jobs", json={"name": "hello-cloud", "kind": "command", "entrypoint": "python -c 'print(7)'",
                                       "placement": {"cluster": "cloud"}})
        assert r.status_code == 201, r.text
        cid = r.json()["id"]
        job = wait_for(lambda: (j := api.get(f"/v1/jobs/{cid}").json())["status"] in ("SUCCEEDED", "FAILED") and j,
                       timeout=300, what="the job on cloud to end")
        assert job["status"] == "SUCCEEDED", job
        assert (job["placement"]["cluster"], job["placement"]["tier"]) == ("cloud", "rented")
        # ... in cloud's own warm lane (a host Ray job on the node cloud's autoscaler added), not onprem's
        assert job["placement"]["lane"] == job["placement"]["node_group"], job["placement"]
        assert "7" in api.get(f"/v1/jobs/{cid}/logs").text
        attempts = api.get(f"/v1/jobs/{cid}/attempts").json()
        assert [a["cluster"] for a in attempts] == ["cloud"]
        cloud_token = Path(states[1]["token_path"]).read_text().strip()
        ray_job = httpx.get(f"{states[1]['dashboard_url']}/api/jobs/{attempts[0]['submission_id']}",
                            headers={"Authorization": f"Bearer {cloud_token}"}, timeout=10).json()
        assert ray_job["metadata"]["raylane_cluster"] == "cloud"
        ready = api.get("/readyz").json()
        assert {n: c["ok"] for n, c in ready["clusters"].items()} == {"onprem": True, "cloud": True}

        # cloud unreachable while its job keeps running (every process paused) past the grace: the job is
        # placed again on onprem; once cloud answers, the attempt given up there is stopped, and the job's
        # status and result are its onprem attempt's.
        hold = api.post("/v1/jobs", json={"name": "hold", "kind": "command", "entrypoint": "sleep 3600",
                                          "resources": {"gpus_per_worker": 2, "cpus_per_worker": 1},
                                          "placement": {"cluster": "onprem"}}).json()
        wait_for(lambda: api.get(f"/v1/jobs/{hold['id']}").json()["status"] == "RUNNING", timeout=120,
                 what="onprem's GPUs held")
        r = api.post("/v1/jobs", json={"name": "moved", "kind": "command", "entrypoint": SLEEPER,
                                       "resources": {"gpus_per_worker": 1, "cpus_per_worker": 1}})
        assert r.status_code == 201, r.text
        mid = r.json()["id"]
        job = wait_for(lambda: (j := api.get(f"/v1/jobs/{mid}").json())["status"] == "RUNNING" and j,
                       timeout=300, what="the GPU job running on cloud after its scale-up")
        assert job["placement"]["cluster"] == "cloud", job["placement"]
        paused = cluster_pids(states[1])
        nodeprocs._kill_each(paused, signal.SIGSTOP)
        try:
            first = wait_for(lambda: (a := api.get(f"/v1/jobs/{mid}/attempts").json())[0]["status"] == "LOST" and a[0],
                             timeout=GRACE_S + 120, what="cloud lost past the grace")
            assert first["cause"] == "CLUSTER_LOST" and first["cluster"] == "cloud", first
            assert api.get("/readyz").json()["clusters"]["cloud"]["lost"] is True
            assert api.post(f"/v1/jobs/{hold['id']}/cancel").status_code == 200  # onprem's GPUs free up
            job = wait_for(lambda: (j := api.get(f"/v1/jobs/{mid}").json())["status"] in ("SUCCEEDED", "FAILED")
                           and j, timeout=180, what="the moved job to end on onprem")
        finally:
            nodeprocs._kill_each(paused, signal.SIGCONT)
        assert job["status"] == "SUCCEEDED" and job["placement"]["cluster"] == "onprem", job
        ray_job = lambda: httpx.get(f"{states[1]['dashboard_url']}/api/jobs/{first['submission_id']}",  # noqa: E731
                                    headers={"Authorization": f"Bearer {cloud_token}"}, timeout=10).json()
        wait_for(lambda: ray_job().get("status") in ("STOPPED", "FAILED"), timeout=120,
                 what="the given-up attempt stopped on cloud once it answers")
        attempts = api.get(f"/v1/jobs/{mid}/attempts").json()
        assert [(a["cluster"], a["status"]) for a in attempts] == [("cloud", "LOST"), ("onprem", "SUCCEEDED")]
        assert api.get(f"/v1/jobs/{mid}").json()["status"] == "SUCCEEDED"

        # cloud's head killed mid-run (every process of cloud, SIGKILL): its training job ends CLUSTER_LOST
        # after the grace and finishes on onprem from its checkpoint on the loopback S3 endpoint; onprem's
        # own jobs are undisturbed.
        hold = api.post("/v1/jobs", json={"name": "hold-2", "kind": "command", "entrypoint": "sleep 3600",
                                          "resources": {"gpus_per_worker": 2, "cpus_per_worker": 1},
                                          "placement": {"cluster": "onprem"}}).json()
        by = api.post("/v1/jobs", json={"name": "bystander", "kind": "command", "entrypoint": "sleep 3600",
                                        "resources": {"cpus_per_worker": 1}, "placement": {"cluster": "onprem"}}).json()
        for j in (hold, by):
            wait_for(lambda j=j: api.get(f"/v1/jobs/{j['id']}").json()["status"] == "RUNNING", timeout=120,
                     what=f"{j['name']} running on onprem")
        r = api.post("/v1/jobs", json={"name": "train-moved", "kind": "training", "entrypoint": "examples.train:main",
                                       "resources": {"num_workers": 1, "gpus_per_worker": 1, "cpus_per_worker": 1},
                                       "args": {"steps": 300, "step_sleep": 0.05, "checkpoint_every": 40}})
        assert r.status_code == 201, r.text
        tid = r.json()["id"]
        job = wait_for(lambda: (j := api.get(f"/v1/jobs/{tid}").json())["status"] == "RUNNING" and j,
                       timeout=300, what="the training job running on cloud")
        assert job["placement"]["cluster"] == "cloud", job["placement"]
        prefix = f"fleet/default/{tid}/checkpoints/"
        stored = wait_for(lambda: sorted({k[len(prefix):].split("/")[0] for k in s3.keys(prefix)
                                          if k.endswith("/.raylane-committed")}), timeout=180,
                          what="a checkpoint of the training job on S3")
        nodeprocs._kill_each(cluster_pids(states[1]), signal.SIGKILL)
        lost = wait_for(lambda: (a := api.get(f"/v1/jobs/{tid}/attempts").json())[0]["status"] == "LOST" and a[0],
                        timeout=GRACE_S + 120, what="cloud lost past the grace after its head was killed")
        assert lost["cause"] == "CLUSTER_LOST" and lost["cluster"] == "cloud", lost
        for j in (hold, by):  # onprem's jobs: still on their first attempt, running
            got = api.get(f"/v1/jobs/{j['id']}").json()
            assert (got["status"], got["attempts"]) == ("RUNNING", 1), got
        assert api.post(f"/v1/jobs/{hold['id']}/cancel").status_code == 200  # onprem's GPUs free up
        done = wait_for(lambda: (j := api.get(f"/v1/jobs/{tid}").json())["status"] in ("SUCCEEDED", "FAILED")
                        and j, timeout=300, what="the training job to finish on onprem")
        assert done["status"] == "SUCCEEDED" and done["placement"]["cluster"] == "onprem", done
        resumed = done["result"]["workers"][0]["return"]["resumed_from"]
        assert resumed >= int(stored[0].split("_")[1]) > 0, (resumed, stored)
        assert [a["cluster"] for a in api.get(f"/v1/jobs/{tid}/attempts").json()] == ["cloud", "onprem"]
        assert api.post(f"/v1/jobs/{by['id']}/cancel").status_code == 200
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)  # the server dies without a word
            proc.wait(30)
    if states:
        wait_for(lambda: not leftovers(states), timeout=120, what="both clusters' processes to end")
