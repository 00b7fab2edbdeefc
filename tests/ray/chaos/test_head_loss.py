"""The Ray head dies and comes back, in both of Ray's modes.

- Without GCS fault tolerance the new head starts an empty cluster: the running
  attempt is unknown to it, becomes LOST, and is retried (resuming from the
  job's checkpoint) on the new cluster.
- With GCS fault tolerance backed by the local Redis (a key namespace of the
  cluster's own, deleted afterwards), the new head reads the cluster back: the
  running attempt is found again and finishes; nothing is run twice.

Either way the job's history stays in Raylane's database. Each test has a small
cluster of its own (a head and one on-demand CPU node) whose head it kills.
"""

from __future__ import annotations

import time

import pytest
import yaml

from tests.conftest import ADMIN_HEADERS, ADMIN_TOKEN, WORKING_DIR_ROOTS
from tests.helpers import wait_for
from tests.ray.chaos.test_spot_loss import record
from tests.ray.conftest import wait_status

pytestmark = [pytest.mark.ray, pytest.mark.slow]
REDIS = "127.0.0.1:6379"
TERMINAL = {"SUCCEEDED", "FAILED", "CANCELLED"}
PROFILE = {"name": "head-loss", "groups": [
    {"name": "head", "role": "head", "cpus": 0, "memory_gb": 1},
    {"name": "cpu", "cpus": 2, "memory_gb": 1, "max_nodes": 1, "local_nodes": 1},
]}
SPEC = {"name": "head-loss", "kind": "training", "entrypoint": "examples.train:main",
        "resources": {"num_workers": 1, "cpus_per_worker": 1},
        "args": {"steps": 400, "step_sleep": 0.05}, "retry": {"backoff_s": 0.5}}


@pytest.fixture(params=["no-gcs-ft", "gcs-ft"])
def head_cluster(request, tmp_path):
    from raylane.orchestrator.tooling.localcluster import LocalCluster
    from raylane.orchestrator.domain.profile import Profile

    profile_path = tmp_path / "profile.yaml"
    profile_path.write_text(yaml.safe_dump(PROFILE))
    cluster = LocalCluster(Profile.load(profile_path), tmp_path / "cluster",
                           gcs_ft_redis=REDIS if request.param == "gcs-ft" else None)
    cluster.up()
    try:
        yield request.param, cluster, profile_path
    finally:
        namespace = cluster.state.storage_namespace
        cluster.down()
        if namespace:
            assert not redis_keys(namespace), "the cluster's Redis namespace was left behind"


def redis_keys(namespace: str) -> list[bytes]:
    import redis

    host, port = REDIS.split(":")
    with redis.Redis(host=host, port=int(port)) as r:
        return list(r.scan_iter(match=f"RAY{namespace}@*"))  # Ray prefixes its keys so


@pytest.fixture
def head_api(head_cluster, tmp_path):
    from fastapi.testclient import TestClient

    from raylane.api.app import create_app
    from raylane.orchestrator.settings import Settings
    from raylane.orchestrator.store import migrate

    mode, cluster, profile_path = head_cluster
    url = f"sqlite:///{tmp_path / 'raylane.db'}"
    migrate.upgrade(url)
    settings = Settings(database_url=url, data_dir=tmp_path, auto_migrate=False, profile=profile_path,
                        dashboard_url=cluster.state.dashboard_url, ray_auth_token=cluster.state.token,
                        ray_address=cluster.state.gcs_address,
                        reconcile_interval_s=0.5, dispatch_interval_s=0.5, admin_token=ADMIN_TOKEN,
                        submit_rate_per_s=0, policy_working_dir_roots=WORKING_DIR_ROOTS)
    with TestClient(create_app(settings), headers=ADMIN_HEADERS) as c:
        yield mode, cluster, c, settings


def test_head_killed_and_restarted(head_api):
    mode, cluster, api, settings = head_api
    job = api.post("/v1/jobs", json=SPEC).json()
    checkpoints = settings.storage_local_root / "default" / job["id"] / "checkpoints"
    wait_status(api, job["id"], {"RUNNING"}, timeout=120)
    wait_for(lambda: len(list(checkpoints.glob("checkpoint_*"))) >= 1, timeout=120, what="a first checkpoint")
    before = api.get(f"/v1/jobs/{job['id']}/events").json()

    killed_at = time.monotonic()
    cluster.kill_head()
    # The control plane keeps serving from its database while Ray's head is gone.
    assert api.get(f"/v1/jobs/{job['id']}").json()["status"] == "RUNNING"
    cluster.restart_head()
    head_back_s = time.monotonic() - killed_at

    done = wait_status(api, job["id"], TERMINAL, timeout=300)
    recovered_s = time.monotonic() - killed_at
    assert done["status"] == "SUCCEEDED", done["status_reason"]
    atts = api.get(f"/v1/jobs/{job['id']}/attempts").json()
    ret = done["result"]["workers"][0]["return"]
    events = api.get(f"/v1/jobs/{job['id']}/events").json()
    # History intact: every event from before the loss is still there, in order.
    assert events[:len(before)] == before
    if mode == "gcs-ft":
        # Found again on the restarted head: one attempt, never re-run, never resumed.
        assert [a["cause"] for a in atts] == [None], atts
        assert ret["resumed_from"] == 0 and ret["steps_run"] == 400, ret
        assert not [e for e in events if e["to_status"] == "RETRYING"], events
    else:
        # Ray forgot the attempt: LOST, then retried on the new cluster from the checkpoint.
        assert [a["cause"] for a in atts] == ["LOST", None], atts
        assert ret["resumed_from"] >= 50 and ret["steps_run"] == 400 - ret["resumed_from"], ret
        retrying = [e for e in events if e["to_status"] == "RETRYING" and e["from_status"] != "RETRYING"]
        assert len(retrying) == 1 and "LOST" in retrying[0]["reason"], retrying
    record(test=f"head_loss_{mode}", head_restart_s=round(head_back_s, 1), job_done_after_kill_s=round(recovered_s, 1),
           attempts=len(atts), resumed_from_step=ret["resumed_from"])
