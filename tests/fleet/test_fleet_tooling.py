"""The local fleet's tooling without starting Ray: which cluster is which kind, in
what order, on which addresses; and finding a cluster's processes by its GCS
address alone (``nodeprocs.naming``)."""

from __future__ import annotations

import subprocess
import sys

from typer.testing import CliRunner

from raylane.orchestrator.domain.fleet import Fleet
from raylane.orchestrator.tooling import nodeprocs
from raylane.orchestrator.tooling.autoscaling import AutoscalingCluster
from raylane.orchestrator.tooling.localcluster import LocalCluster
from raylane.orchestrator.tooling.localfleet import IP_BLOCK, LocalFleet
from tests.helpers import wait_for


def test_local_hybrid_starts_onprem_static_then_cloud_autoscaling_on_addresses_apart(tmp_path):
    fleet = LocalFleet(Fleet.load("local-hybrid"), tmp_path)
    assert list(fleet.clusters) == ["onprem", "cloud"]  # owned first: it runs work at once
    onprem, cloud = fleet.clusters["onprem"], fleet.clusters["cloud"]
    assert type(onprem) is LocalCluster and isinstance(cloud, AutoscalingCluster)
    assert onprem.dir == tmp_path / "onprem" and cloud.dir == tmp_path / "cloud"
    assert cloud.first_ip - onprem.first_ip == IP_BLOCK
    assert not fleet.is_up() and fleet.reach()["cloud"]["gcs_address"] is None
    assert LocalFleet.recorded(tmp_path) is None  # nothing started, nothing recorded


def test_a_cluster_s_processes_are_found_by_its_gcs_address_not_a_longer_port(tmp_path):
    arg = "--gcs-address=127.0.0.1:43210"
    proc = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()", arg], stdin=subprocess.PIPE)
    try:
        wait_for(lambda: proc.pid in nodeprocs.naming("127.0.0.1:43210"), timeout=10)
        assert proc.pid not in nodeprocs.naming("127.0.0.1:4321")
    finally:
        proc.kill()
        proc.wait()


def test_cluster_up_with_a_bad_fleet_says_which_field(tmp_path, monkeypatch):
    from raylane.api.cli import app

    bad = tmp_path / "fleet.yaml"
    bad.write_text("name: x\nclusters:\n  - {name: c, tier: rented, token: abc, cost: {model: per_node_hour}, "
                   "groups: [{name: head, role: head, cpus: 0, memory_gb: 1}]}\n")
    monkeypatch.setenv("RAYLANE_DATA_DIR", str(tmp_path / "data"))
    r = CliRunner().invoke(app, ["cluster", "up", "--fleet", str(bad)])
    assert r.exit_code != 0
    assert "clusters.c.token" in r.output and "token_file" in r.output


def test_profile_render_renders_one_cluster_of_a_fleet():
    import yaml

    from raylane.api.cli import app

    r = CliRunner().invoke(app, ["profile", "render", "--target", "kuberay", "--fleet", "local-hybrid",
                                 "--cluster", "cloud"])
    assert r.exit_code == 0, r.output
    assert "rendered from cluster profile 'cloud'" in r.output
    body = yaml.safe_load(r.output)
    text = yaml.safe_dump(body)
    assert "gpu-spot" in text and "spot-cpu" in text
    r = CliRunner().invoke(app, ["profile", "render", "--target", "kuberay", "--fleet", "local-hybrid",
                                 "--cluster", "mars"])
    assert r.exit_code == 2 and "no cluster 'mars'" in r.output and "onprem, cloud" in r.output


def test_profile_render_renders_every_cluster_of_a_fleet(tmp_path):
    import yaml

    from raylane.api.cli import app

    r = CliRunner().invoke(app, ["profile", "render", "--target", "kuberay", "--fleet", "local-hybrid",
                                 "--out", str(tmp_path / "deploy")])
    assert r.exit_code == 0, r.output
    files = sorted(p.name for p in (tmp_path / "deploy").iterdir())
    assert files == ["cloud-kuberay.yaml", "onprem-kuberay.yaml"]
    onprem = (tmp_path / "deploy" / "onprem-kuberay.yaml").read_text()
    assert onprem.startswith("# Cluster onprem (owned) of fleet local-hybrid.")
    groups = yaml.safe_dump(yaml.safe_load((tmp_path / "deploy" / "cloud-kuberay.yaml").read_text()))
    assert "gpu-spot" in groups and "gpu-spot" not in onprem
    # Printed one after another without --out; --check needs one cluster.
    r = CliRunner().invoke(app, ["profile", "render", "--target", "compose", "--fleet", "local-hybrid"])
    assert r.exit_code == 0 and r.output.count("# Cluster ") == 2
    r = CliRunner().invoke(app, ["profile", "render", "--target", "kuberay", "--fleet", "local-hybrid",
                                 "--check", str(tmp_path / "x.yaml")])
    assert r.exit_code == 2 and "give --cluster" in r.output
