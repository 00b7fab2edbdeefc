"""The local hybrid fleet (``orchestrator/tooling/localfleet.py``): two Ray clusters
on this machine, ``onprem`` (owned, static) and ``cloud`` (rented, scaling from
zero through Ray's autoscaler), each with its own head, ports and token, both
gone with their owner however it dies.

One bring-up for the whole file (a 2-core machine): an owner process starts the
fleet ``owned``, as ``raylane-server serve --local-cluster`` does with
RAYLANE_FLEET; the test reads each cluster as a client would (its dashboard, with
its own token), asks ``cloud`` for a spot node, then SIGKILLs the owner and
waits until no process of either cluster is left."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from raylane.orchestrator.domain.fleet import Fleet
from raylane.orchestrator.tooling import nodeprocs
from tests.helpers import wait_for

pytestmark = [pytest.mark.ray, pytest.mark.slow]
GROUP, MARKET = "ray.io/node-group", "ray.io/market-type"
ROOT = Path(__file__).resolve().parents[2]

OWNER = """
import json, sys
from raylane.orchestrator.domain.fleet import Fleet
from raylane.orchestrator.tooling.localfleet import LocalFleet
fleet = LocalFleet(Fleet.load("local-hybrid"), sys.argv[1], source="local-hybrid")
fleet.up(owned=True)
print(json.dumps({"reach": fleet.reach(), "reach_file": str(fleet.reach_file)}), flush=True)
sys.stdin.read()  # until the test kills this process
"""


def nodes(reach: dict) -> list[dict]:
    token = Path(reach["token_path"]).read_text().strip()
    r = httpx.get(reach["dashboard_url"] + "/nodes?view=summary", headers={"Authorization": f"Bearer {token}"},
                  timeout=10)
    r.raise_for_status()
    return [n["raylet"] for n in r.json()["data"]["summary"] if n["raylet"].get("state") == "ALIVE"]


def labelled(reach: dict) -> dict[str, dict]:
    return {n["labels"][GROUP]: n for n in nodes(reach) if GROUP in n.get("labels", {})}


def leftovers(reach: dict) -> list[int]:
    """Processes of the fleet still there: naming a cluster's GCS address or Ray temp dir."""
    pids = set()
    for r in reach.values():
        pids.update(nodeprocs.naming(r["gcs_address"]))
        pids.update(p for p in map(int, filter(str.isdigit, os.listdir("/proc"))) if nodeprocs.is_ours(p, r["temp_dir"]))
    return sorted(pids)


@pytest.fixture
def owner(tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
    proc = subprocess.Popen([sys.executable, "-c", OWNER, str(tmp_path / "fleet")], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    line = proc.stdout.readline()  # the fleet is up (or the owner failed)
    if not line:
        proc.kill()
        pytest.fail(f"the fleet did not come up: {proc.stderr.read()[-4000:]}")
    started = json.loads(line)
    yield proc, started
    if proc.poll() is None:  # the test failed before its kill: still take everything down
        proc.kill()
        proc.wait()
    wait_for(lambda: not leftovers(started["reach"]), timeout=120, what="the fleet's processes to end")


def plan_on_the_fleet(reach_file: str, onprem: dict, tmp_path: Path) -> None:
    import yaml
    from fastapi.testclient import TestClient

    from raylane.api.app import create_app
    from raylane.orchestrator.settings import Settings
    from raylane.orchestrator.store import migrate
    from tests.conftest import ADMIN_HEADERS, ADMIN_TOKEN

    fleet = Fleet.load(reach_file)
    profile = tmp_path / "onprem-profile.yaml"
    profile.write_text(yaml.safe_dump(fleet.cluster("onprem").profile.model_dump()))
    url = f"sqlite:///{tmp_path / 'raylane.db'}"
    migrate.upgrade(url)
    settings = Settings(database_url=url, data_dir=tmp_path / "cp", auto_migrate=False, loops_enabled=False,
                        admin_token=ADMIN_TOKEN, gc_freeze=False, fleet=reach_file, profile=profile,
                        dashboard_url=onprem["dashboard_url"], ray_address=onprem["gcs_address"],
                        ray_auth_token=Path(onprem["token_path"]).read_text().strip())
    train = {"name": "finetune", "kind": "training", "entrypoint": "examples.train:main",
             "resources": {"num_workers": 2, "gpus_per_worker": 1, "cpus_per_worker": 1}}
    sweep = {"name": "lr", "kind": "sweep", "entrypoint": "examples.sweep:objective",
             "resources": {"cpus_per_worker": 1}, "placement": {"tier": "rented"},
             "sweep": {"metric": "loss", "mode": "min", "num_samples": 4, "max_concurrent_trials": 2,
                       "search_space": {"lr": {"uniform": [0.1, 1.0]}}}}
    with TestClient(create_app(settings), headers=ADMIN_HEADERS) as api:
        p = api.post("/v1/plan", json=train).json()
        assert (p["cluster"], p["node_group"]) == ("onprem", "gpu"), p
        assert "onprem gpu: room now (2 of 2 GPUs free, 4 of 4 CPUs free)" in p["reasons"], p["reasons"]
        assert "cloud gpu-spot: scale-up from 0 nodes, $2.10/h spot" in p["reasons"], p["reasons"]
        p = api.post("/v1/plan", json=sweep).json()
        assert (p["cluster"], p["node_group"], p["market"]) == ("cloud", "spot-cpu", "SPOT"), p
        spot = next(r for r in p["reasons"] if r.startswith("cloud spot-cpu: "))
        assert "no live view" not in spot, p["reasons"]  # cloud's node list, read with cloud's own token


def test_local_hybrid_fleet_two_clusters_own_ports_and_tokens_scale_from_zero_and_die_with_their_owner(owner, tmp_path):
    proc, started = owner
    reach = started["reach"]
    onprem, cloud = reach["onprem"], reach["cloud"]

    # Two clusters, nothing shared: heads, ports, tokens, temp dirs; never Redis's 6379.
    assert onprem["gcs_address"] != cloud["gcs_address"] and onprem["dashboard_url"] != cloud["dashboard_url"]
    assert not any(r["gcs_address"].endswith(":6379") for r in reach.values())
    assert Path(onprem["token_path"]).read_text() != Path(cloud["token_path"]).read_text()
    # Each dashboard refuses the other cluster's token.
    other = Path(cloud["token_path"]).read_text().strip()
    assert httpx.get(onprem["dashboard_url"] + "/nodes?view=summary", timeout=10,
                     headers={"Authorization": f"Bearer {other}"}).status_code in (401, 403)

    # onprem: owned and static, its gpu (2 logical GPUs) and cpu nodes up from the start.
    groups = labelled(onprem)
    assert set(groups) == {"head", "gpu", "cpu"}, groups.keys()
    assert groups["gpu"]["labels"][MARKET] == "ON_DEMAND"
    assert groups["gpu"]["resourcesTotal"]["GPU"] == 2 and "GPU" not in groups["cpu"]["resourcesTotal"]
    # cloud: rented, every group at zero: only its head, which carries no group label.
    assert labelled(cloud) == {}
    assert len(nodes(cloud)) == 1

    # The reach file a control plane reads (RAYLANE_FLEET): the fleet with each cluster's reach.
    fleet = Fleet.load(started["reach_file"])
    assert fleet.cluster("onprem").spec.dashboard_url == onprem["dashboard_url"]
    assert fleet.cluster("cloud").spec.read_token() == other

    # A driver asking for cloud's spot-cpu group: Ray's autoscaler adds a node there, with its labels.
    from ray.job_submission import JobSubmissionClient

    client = JobSubmissionClient(cloud["dashboard_url"], headers={"Authorization": f"Bearer {other}"})
    client.submit_job(entrypoint="python -c 'print(42)'", entrypoint_num_cpus=1,
                      entrypoint_label_selector={GROUP: "spot-cpu"})
    spot = wait_for(lambda: labelled(cloud).get("spot-cpu"), timeout=180, what="a spot-cpu node on cloud")
    assert spot["labels"][MARKET] == "SPOT"
    assert "spot-cpu" not in labelled(onprem)  # the other cluster saw nothing of it

    # A control plane on the fleet (as serve --local-cluster wires it) plans with both clusters live.
    plan_on_the_fleet(started["reach_file"], onprem, tmp_path)

    # The owner dies without a word (SIGKILL): both clusters go, autoscaled node included.
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    wait_for(lambda: not leftovers(reach), timeout=120, what="the fleet's processes to end")
