"""One local multi-node Ray cluster for all Ray tests of a run (starting one
takes ~25 s on 2 cores), and a control plane with its loops attached to it.

The cluster lives as long as this package's tests (``tests/ray`` and
``tests/ray/chaos``), not the whole session: an idle 5-node cluster costs about
half a core, which the rest of the suite needs on a 2-core machine."""

from __future__ import annotations

import contextlib

import pytest

from tests.conftest import ADMIN_HEADERS, ADMIN_TOKEN, WORKING_DIR_ROOTS, fresh_sqlite_database
from tests.helpers import wait_for


# What an operator may well have in the server's environment: every node of the
# shared cluster is started with these set, so a job that could see the control
# plane's environment would see them (tests/ray/test_job_secrets.py looks).
CONTROL_PLANE_SECRETS = {"RAYLANE_ADMIN_TOKEN": "fake-admin-token-not-for-jobs-0123",
                         "RAYLANE_DATABASE_URL": "postgresql://raylane:fake-db-password@127.0.0.1:5432/raylane"}


# Ray's node health checks, for this test cluster only: a killed node is declared
# dead after ~5 s (a check every 1 s, 5 missed) instead of ~15 s (3 s, 5), so the
# node-loss tests wait less. Each check still has Ray's 10 s timeout, so a node slow
# to answer on a loaded machine is not taken for dead. Real fleets keep Ray's
# defaults (docs/reliability.md); nodes get RAY_* settings from the environment
# they start in (tooling.localcluster.node_env).
TEST_RAY_TUNING = {"RAY_health_check_period_ms": "1000", "RAY_health_check_failure_threshold": "5"}


@contextlib.contextmanager
def control_plane_env():
    """os.environ holds CONTROL_PLANE_SECRETS (and the test cluster's Ray tuning)
    inside the block, as it was after."""
    with pytest.MonkeyPatch.context() as mp:
        for k, v in {**CONTROL_PLANE_SECRETS, **TEST_RAY_TUNING}.items():
            mp.setenv(k, v)
        yield


@pytest.fixture(scope="package")
def ray_cluster(tmp_path_factory):
    from raylane.orchestrator.tooling.localcluster import LocalCluster
    from raylane.orchestrator.domain.profile import default_profile

    cluster = LocalCluster(default_profile(), tmp_path_factory.mktemp("cluster"))
    with control_plane_env():
        cluster.up()
    yield cluster
    cluster.down()


@pytest.fixture(autouse=True)
def _restore_shared_cluster(request):
    """After a test that used the shared cluster, put back what its chaos took
    away (a killed or drained node), so a failed chaos test cannot leave the
    next tests waiting for a node group that no longer has a node."""
    yield
    if "ray_cluster" in request.fixturenames:
        cluster = request.getfixturevalue("ray_cluster")
        if cluster.state is not None:
            with control_plane_env():
                cluster.restore()


@pytest.fixture
def ray_settings(tmp_path, ray_cluster, sqlite_template):
    from raylane.orchestrator.settings import Settings

    url = fresh_sqlite_database(sqlite_template, tmp_path)
    return Settings(database_url=url, data_dir=tmp_path, auto_migrate=False,
                    dashboard_url=ray_cluster.state.dashboard_url, ray_auth_token=ray_cluster.state.token,
                    ray_address=ray_cluster.state.gcs_address,
                    reconcile_interval_s=0.5, dispatch_interval_s=0.5,
                    admin_token=ADMIN_TOKEN, submit_rate_per_s=0, policy_working_dir_roots=WORKING_DIR_ROOTS)


@pytest.fixture
def rapi(ray_settings):
    """The API with dispatcher and reconciler running against the shared cluster, as the admin."""
    from fastapi.testclient import TestClient

    from raylane.api.app import create_app

    with TestClient(create_app(ray_settings), headers=ADMIN_HEADERS) as c:
        yield c
        cancel_leftovers(c)


ACTIVE = ["PENDING", "DISPATCHING", "RUNNING", "RETRYING", "CANCELLING"]


def cancel_leftovers(api, timeout: float = 90) -> None:
    """Cancel what a test left active, through the control plane, and wait until
    it has stopped. The cluster is shared by the package: a test that failed
    before its own clean-up (a gate job holding both GPUs) would otherwise leave
    its Ray jobs running, and every later test that needs those GPUs would wait
    for them and fail far from the cause."""
    left = api.get("/v1/jobs", params={"status": ACTIVE, "limit": 500}).json()["items"]
    if not left:
        return
    for j in left:
        api.post(f"/v1/jobs/{j['id']}/cancel")

    def stopped():
        still = api.get("/v1/jobs", params={"status": ACTIVE, "limit": 500}).json()["items"]
        assert not still, f"still active after cancel: {[(j['id'], j['status']) for j in still]}"
        return True

    wait_for(stopped, timeout=timeout, what="the test's leftover jobs to stop")


def wait_status(api, job_id: str, statuses: set[str], timeout: float = 120) -> dict:
    def check():
        j = api.get(f"/v1/jobs/{job_id}").json()
        assert j["status"] in statuses, f"{j['status']}: {j.get('status_reason')}"
        return j

    return wait_for(check, timeout=timeout, what=f"job {job_id} in {statuses}")
