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


def test_local_hybrid_fleet_two_clusters_own_ports_and_tokens_scale_from_zero_and_die_with_their_owner(owner):
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

    # The owner dies without a word (SIGKILL): both clusters go, autoscaled node included.
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    wait_for(lambda: not leftovers(reach), timeout=120, what="the fleet's processes to end")
