"""One autoscaling local cluster (Ray's autoscaler v2 with its fake multi-node
provider, ``orchestrator.tooling.autoscaling``) for the scale-from-zero tests, and
a control plane that submits ahead of a scale-up.

Its own package, not ``tests/ray``: that package's static cluster is stopped
before this one starts, so a 2-core machine never runs both.

The profile is local-autoscale's (``gpu`` and ``spot-cpu`` from zero) plus two
groups for these tests alone: ``burst`` (from zero, at most 2 nodes: the bounded
queue) and ``a100`` (max_nodes 0: a scale-up that can never come)."""

from __future__ import annotations

import yaml
import pytest

from tests.conftest import ADMIN_HEADERS, ADMIN_TOKEN, WORKING_DIR_ROOTS, free_port

SCALE_AHEAD = 2  # RAYLANE_AUTOSCALE_AHEAD_JOBS of the control plane here
SERVE_PORT = free_port()  # where the profile tells Serve's proxies to listen
TEST_GROUPS = [
    {"name": "burst", "market": "ON_DEMAND", "cpus": 2, "memory_gb": 1, "min_nodes": 0, "max_nodes": 2,
     "price_per_hour": 0.08},
    # Bigger nodes than gpu's: the router puts an auto-routed GPU job on the smallest
    # fitting group by the profile alone, and would pick a100 (cheaper) over gpu.
    {"name": "a100", "market": "ON_DEMAND", "accelerator": {"type": "A100", "count": 2}, "cpus": 8,
     "memory_gb": 2, "min_nodes": 0, "max_nodes": 0, "price_per_hour": 3.0},
]


@pytest.fixture(scope="package")
def autoscale_profile(tmp_path_factory):
    from raylane.orchestrator.tooling.autoscaling import AUTOSCALE_PROFILE

    doc = yaml.safe_load(AUTOSCALE_PROFILE.read_text())
    doc["name"] = "test-autoscale"
    doc["groups"] += TEST_GROUPS
    # Services bind every interface, as a cluster that serves others does (test_serve_off_host).
    doc["serve"] = {"host": "0.0.0.0", "port": SERVE_PORT}
    path = tmp_path_factory.mktemp("profile") / "autoscale.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


@pytest.fixture(scope="package")
def autoscaling_cluster(tmp_path_factory, autoscale_profile):
    from raylane.orchestrator.domain.profile import Profile
    from raylane.orchestrator.tooling.autoscaling import AutoscalingCluster

    cluster = AutoscalingCluster(Profile.load(autoscale_profile), tmp_path_factory.mktemp("ascluster"))
    cluster.up()
    yield cluster
    cluster.down()


@pytest.fixture(scope="package")
def aapi(tmp_path_factory, autoscaling_cluster, autoscale_profile):
    """The API with its loops on the autoscaling cluster, as the admin."""
    from fastapi.testclient import TestClient

    from raylane.api.app import create_app
    from raylane.orchestrator.settings import Settings
    from raylane.orchestrator.store import migrate

    data = tmp_path_factory.mktemp("cp")
    url = f"sqlite:///{data / 'raylane.db'}"
    migrate.upgrade(url)
    st = autoscaling_cluster.state
    settings = Settings(database_url=url, data_dir=data, auto_migrate=False, profile=autoscale_profile,
                        dashboard_url=st.dashboard_url, ray_auth_token=st.token, ray_address=st.gcs_address,
                        reconcile_interval_s=0.5, dispatch_interval_s=0.5, autoscale_ahead_jobs=SCALE_AHEAD,
                        admin_token=ADMIN_TOKEN, submit_rate_per_s=0, policy_working_dir_roots=WORKING_DIR_ROOTS)
    with TestClient(create_app(settings), headers=ADMIN_HEADERS) as c:
        yield c
