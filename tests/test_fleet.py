"""The fleet model (``orchestrator/domain/fleet.py``): several Ray clusters, owned
and rented, each with its reach, groups and cost; errors name the field; today's
one-cluster settings are a fleet of one."""

from __future__ import annotations

import copy

import pytest
import yaml

from raylane.orchestrator.domain.errors import Invalid
from raylane.orchestrator.domain.fleet import FLEETS_DIR, Fleet, FixedCost, configured
from raylane.orchestrator.domain.profile import DEFAULT_PROFILE, default_profile
from raylane.orchestrator.settings import Settings

HEAD = {"name": "head", "role": "head", "cpus": 0, "memory_gb": 2}
DOC = {
    "name": "two",
    "clusters": [
        {"name": "onprem", "tier": "owned", "dashboard_url": "http://10.0.0.5:8265", "gcs_address": "10.0.0.5:6380",
         "token_file": "/etc/raylane/onprem-token", "cost": {"model": "fixed", "per_hour": 30.0},
         "groups": [HEAD, {"name": "gpu", "accelerator": {"type": "H100", "count": 8}, "cpus": 96, "memory_gb": 1000,
                           "min_nodes": 2, "max_nodes": 2, "price_per_hour": 3},
                    {"name": "cpu", "cpus": 32, "memory_gb": 128, "min_nodes": 4, "max_nodes": 4,
                     "price_per_hour": 1}]},
        {"name": "cloud", "tier": "rented", "dashboard_url": "https://ray.cloud.example:8443",
         "gcs_address": "ray-head.cloud.internal:6379", "token_env": "CLOUD_RAY_TOKEN",
         "cost": {"model": "per_node_hour"},
         "groups": [HEAD, {"name": "gpu-spot", "market": "SPOT", "accelerator": {"type": "H100", "count": 8},
                           "cpus": 96, "memory_gb": 1000, "max_nodes": 4, "price_per_hour": 30.0}]},
    ],
}


def doc(**changes):
    d = copy.deepcopy(DOC)
    for path, value in changes.items():
        *head, last = path.split("__")
        node = d
        for k in head:
            node = node[int(k)] if k.isdigit() else node[k]
        if value is ...:
            del node[last]
        else:
            node[last] = value
    return d


def refused(d) -> Invalid:
    with pytest.raises(Invalid) as e:
        Fleet.parse(d)
    return e.value


def test_a_fleet_of_two_clusters_loads_with_tiers_reach_groups_and_costs():
    f = Fleet.parse(DOC)
    assert f.names == ["onprem", "cloud"]
    onprem, cloud = f.members
    assert onprem.owned and not cloud.owned
    assert [g.name for g in onprem.profile.workers] == ["gpu", "cpu"]
    assert onprem.profile.head.name == "head"
    assert isinstance(onprem.spec.cost, FixedCost) and onprem.fixed_per_hour == 30.0
    assert cloud.fixed_per_hour == 0.0
    assert [c.name for c in f.owned] == ["onprem"] and [c.name for c in f.rented] == ["cloud"]
    # The fixed 30 $/h split by weight: 2 gpu nodes of weight 3, 4 cpu nodes of weight 1.
    assert onprem.amortised_node_hour(onprem.profile.group("gpu")) == pytest.approx(30 * 3 / 10)
    assert onprem.amortised_node_hour(onprem.profile.group("cpu")) == pytest.approx(30 * 1 / 10)
    assert cloud.amortised_node_hour(cloud.profile.group("gpu-spot")) == 0.0


def test_the_token_is_read_from_its_file_or_variable_never_the_fleet_file(tmp_path):
    token_file = tmp_path / "tok"
    token_file.write_text("s3cret-from-file\n")
    f = Fleet.parse(doc(clusters__0__token_file=str(token_file)))
    assert f.cluster("onprem").spec.read_token() == "s3cret-from-file"
    assert f.cluster("cloud").spec.read_token({"CLOUD_RAY_TOKEN": "from-env"}) == "from-env"
    with pytest.raises(Invalid) as e:
        f.cluster("cloud").spec.read_token({})
    assert e.value.field == "clusters.cloud.token_env" and "CLOUD_RAY_TOKEN" in e.value.message
    with pytest.raises(Invalid) as e:
        Fleet.parse(doc(clusters__0__token_file=str(tmp_path / "missing"))).cluster("onprem").spec.read_token()
    assert e.value.field == "clusters.onprem.token_file"


@pytest.mark.parametrize("where,value", [("token", "a" * 64), ("token", "hunter2"), ("token_env", "f" * 64),
                                         ("token_env", "0123456789ABCDEF0123456789ABCDEF")])
def test_a_literal_token_is_refused_with_the_field_named(where, value):
    e = refused(doc(**{f"clusters__1__{where}": value}))
    assert e.field == f"clusters.cloud.{where}"
    assert "token" in e.message and value not in e.message  # the error does not echo the secret


@pytest.mark.parametrize("change,field,words", [
    ({"clusters__0__cost": {"model": "per_node_hour"}}, "clusters.onprem", "fixed amount"),
    ({"clusters__1__cost": {"model": "fixed", "per_hour": 5}}, "clusters.cloud", "per node-hour"),
    ({"clusters__0__cost": {"model": "fixed", "per_hour": -1}}, "clusters.onprem.cost.per_hour", "greater than 0"),
    ({"clusters__0__cost": {"model": "leased"}}, "clusters.onprem.cost", "model"),
    ({"clusters__0__tier": "borrowed"}, "clusters.onprem.tier", "owned"),
    ({"clusters__1__name": "onprem"}, "fleet", "repeated: onprem"),
    ({"clusters__1__name": "Cloud/1"}, "clusters.1.name", "pattern"),
    ({"clusters__0__groups__1__max_nodes": 3}, "clusters.onprem", "min_nodes (2) must equal max_nodes (3)"),
    ({"clusters__1__groups__1__price_per_hour": 0}, "clusters.cloud", "gpu-spot: a rented group is paid"),
    ({"clusters__1__groups": [{**HEAD, "role": "worker"}]}, "clusters.cloud", "exactly one head group"),
    ({"clusters__1__groups": ...}, "clusters.cloud", "groups:"),
    ({"clusters__1__token_file": "/x"}, "clusters.cloud", "give one"),
    ({"clusters__1__gcs_address": "http://x"}, "clusters.cloud.gcs_address", "pattern"),
    ({"clusters__1__colour": "blue"}, "clusters.cloud.colour", "Extra inputs"),
])
def test_a_bad_fleet_is_refused_naming_the_field(change, field, words):
    e = refused(doc(**change))
    assert e.field == field, e.message
    assert words in e.message and field.split(".")[-1] in e.message or field == "fleet"


def test_a_cluster_may_take_its_groups_from_a_profile_file_beside_the_fleet_file(tmp_path):
    prof = yaml.safe_load(DEFAULT_PROFILE.read_text())
    (tmp_path / "cloud.yaml").write_text(yaml.safe_dump(prof))
    d = doc(clusters__1__groups=..., clusters__1__profile="cloud.yaml")
    (tmp_path / "fleet.yaml").write_text(yaml.safe_dump(d))
    f = Fleet.load(tmp_path / "fleet.yaml")
    assert [g.name for g in f.cluster("cloud").profile.workers] == ["gpu", "spot-cpu", "cpu"]
    # The profile's groups obey the tier's rules too.
    prof["groups"][2]["price_per_hour"] = 0
    (tmp_path / "cloud.yaml").write_text(yaml.safe_dump(prof))
    with pytest.raises(Invalid) as e:
        Fleet.load(tmp_path / "fleet.yaml")
    assert "spot-cpu: a rented group is paid" in e.value.message
    with pytest.raises(Invalid) as e:
        Fleet.load(tmp_path / "nowhere.yaml")
    assert e.value.field == "fleet" and "nowhere.yaml" in e.value.message


def test_today_s_single_cluster_settings_are_a_fleet_of_one():
    prof = default_profile()
    f = configured(None, prof, dashboard_url="http://127.0.0.1:8265", gcs_address="127.0.0.1:6380")
    assert f.names == ["default"]
    (c,) = f.members
    assert c.profile is prof and c.tier == "rented"  # priced per node-hour, as profiles always were
    assert c.spec.dashboard_url == "http://127.0.0.1:8265" and c.spec.gcs_address == "127.0.0.1:6380"
    assert Settings().fleet is None  # nothing to set for one cluster


def test_a_profile_that_worked_before_fleets_works_unpriced():
    """A rented group of a fleet file names its price; a profile of today's one cluster
    need not (price_per_hour defaults to 0), and keeps working."""
    doc = yaml.safe_load(DEFAULT_PROFILE.read_text())
    for g in doc["groups"]:
        g.pop("price_per_hour", None)
    from raylane.orchestrator.domain.profile import Profile

    f = configured(None, Profile.model_validate(doc))
    assert f.names == ["default"] and f.members[0].profile.group("gpu").price_per_hour == 0


def test_a_relative_profile_is_found_from_the_local_fleet_s_reach_file(tmp_path):
    from raylane.orchestrator.tooling.localfleet import LocalFleet

    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "cloud.yaml").write_text(DEFAULT_PROFILE.read_text())
    d = doc(clusters__1__groups=..., clusters__1__profile="cloud.yaml")
    (tmp_path / "src" / "fleet.yaml").write_text(yaml.safe_dump(d))
    local = LocalFleet(Fleet.load(tmp_path / "src" / "fleet.yaml"), tmp_path / "run")
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "reach.yaml").write_text(yaml.safe_dump(local.with_reach().model_dump(
        exclude={"base_dir"}, exclude_none=True)))
    again = Fleet.load(tmp_path / "run" / "reach.yaml")
    assert [g.name for g in again.cluster("cloud").profile.workers] == ["gpu", "spot-cpu", "cpu"]


def test_the_shipped_local_hybrid_fleet_is_what_issue_45_describes():
    f = configured("local-hybrid", default_profile())
    onprem, cloud = f.cluster("onprem"), f.cluster("cloud")
    assert onprem.owned and onprem.spec.local == "static"
    assert onprem.profile.group("gpu").gpus == 2 and onprem.profile.group("cpu").gpus == 0
    assert not cloud.owned and cloud.spec.local == "autoscale"
    assert {g.name: (g.market, g.min_nodes) for g in cloud.profile.workers} == {
        "gpu-spot": ("SPOT", 0), "gpu": ("ON_DEMAND", 0), "spot-cpu": ("SPOT", 0), "cpu": ("ON_DEMAND", 0)}
    assert not any(c.spec.token_file or c.spec.token_env for c in f.members)  # the local fleet hands its own
    assert (FLEETS_DIR / "local-hybrid.yaml").exists()


def test_settings_refuse_a_bad_rented_spend_cap():
    from pydantic import ValidationError

    assert Settings(fleet_rented_spend_cap={"ml": 5, "*": 1}).fleet_rented_spend_cap == {"ml": 5, "*": 1}
    with pytest.raises(ValidationError, match="RAYLANE_FLEET_RENTED_SPEND_CAP"):
        Settings(fleet_rented_spend_cap={"ml": -1})


@pytest.mark.parametrize("name", ["api", "static", "logs"])
def test_a_cluster_named_like_a_dashboard_path_is_refused(name):
    from raylane.orchestrator.domain.errors import Invalid
    from raylane.orchestrator.domain.fleet import Fleet

    doc = {"name": "acme", "clusters": [{"name": name, "tier": "owned", "cost": {"model": "fixed", "per_hour": 1.0},
                                         "groups": [{"name": "cpu", "cpus": 4, "memory_gb": 2}]}]}
    with pytest.raises(Invalid) as e:
        Fleet.parse(doc)
    assert "is a path of Ray's dashboard" in e.value.message and "clusters" in (e.value.field or ""), e.value.field
