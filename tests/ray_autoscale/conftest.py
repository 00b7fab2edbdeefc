"""The autoscaling local cluster (``tooling.autoscaling``), started once per
module: Ray's autoscaler with its fake multi-node provider adds ``gpu`` nodes
from zero when a job asks. The rest of the suite stays on the static cluster
(tests/ray).

Two profiles: the cluster's (what the autoscaler may start) and Raylane's (what
admission counts). They agree, except that Raylane believes group ``gpu-big``
may get a node while the autoscaler may start none: a scale-up that never comes,
as when a cloud has no capacity left."""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest
import yaml

from tests.conftest import ADMIN_HEADERS, ADMIN_TOKEN, WORKING_DIR_ROOTS
from tests.ray.conftest import control_plane_env

BIG = {"name": "gpu-big", "market": "ON_DEMAND", "accelerator": {"type": "A100", "count": 2}, "cpus": 2,
       "memory_gb": 2, "min_nodes": 0, "price_per_hour": 4.0}


def profiles():
    from raylane.orchestrator.domain.profile import Profile
    from raylane.orchestrator.tooling.autoscaling import AUTOSCALE_PROFILE

    base = yaml.safe_load(AUTOSCALE_PROFILE.read_text())
    # spot-cpu left out: one node fewer to start on a 2-core machine.
    groups = [g for g in base["groups"] if g["name"] != "spot-cpu"]
    cluster = Profile.model_validate({**base, "groups": [*groups, {**BIG, "max_nodes": 0}]})
    raylane = {**base, "groups": [*groups, {**BIG, "max_nodes": 1}]}
    return cluster, raylane


@pytest.fixture(scope="module")
def autoscaling_cluster(tmp_path_factory):
    from raylane.orchestrator.tooling.autoscaling import AutoscalingCluster

    cluster_profile, _ = profiles()
    cluster = AutoscalingCluster(cluster_profile, tmp_path_factory.mktemp("autoscaling"))
    with control_plane_env():
        cluster.up()
    yield cluster
    cluster.down()


@pytest.fixture
def autoscale_api(tmp_path, autoscaling_cluster):
    """A function: the API with its loops on the autoscaling cluster, with settings overridden."""
    from fastapi.testclient import TestClient

    from raylane.api.app import create_app
    from raylane.orchestrator.settings import Settings
    from raylane.orchestrator.store import migrate

    _, raylane_profile = profiles()
    profile_path = tmp_path / "profile.yaml"
    profile_path.write_text(yaml.safe_dump(raylane_profile))
    url = f"sqlite:///{tmp_path / 'raylane.db'}"
    migrate.upgrade(url)
    st = autoscaling_cluster.state
    with contextlib.ExitStack() as stack:
        def start(**overrides):
            settings = Settings(database_url=url, data_dir=tmp_path, auto_migrate=False, profile=profile_path,
                                dashboard_url=st.dashboard_url, ray_auth_token=st.token, ray_address=st.gcs_address,
                                reconcile_interval_s=0.5, dispatch_interval_s=0.5, admin_token=ADMIN_TOKEN,
                                submit_rate_per_s=0, policy_working_dir_roots=WORKING_DIR_ROOTS,
                                autoscale_ahead_jobs=1, **overrides)
            return stack.enter_context(TestClient(create_app(settings), headers=ADMIN_HEADERS))
        yield start


FUNCS = str(Path(__file__).parents[1] / "ray" / "funcs")
