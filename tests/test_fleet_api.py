"""The fleet through the API (``services/fleetplan.py``): ``POST /v1/plan`` on a
fleet of several clusters names the cluster, the tier and every candidate's
reason; ``GET /v1/fleet`` lists the clusters; a submitted job's
``placement.cluster`` / ``placement.tier`` is checked against the fleet, a bad
one refused with 4xx naming the field. No Ray here: the fleet file alone."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from tests.conftest import ADMIN_HEADERS, ADMIN_TOKEN

TRAIN = {"name": "finetune", "kind": "training", "entrypoint": "examples.train:main",
         "resources": {"num_workers": 2, "gpus_per_worker": 1, "cpus_per_worker": 1},
         "placement": {"node_group": "auto", "colocate": True}}
HELLO = {"name": "hello", "kind": "command", "entrypoint": "python -c 'print(42)'"}


def client(tmp_path, **overrides):
    from raylane.api.app import create_app
    from raylane.orchestrator.services.controlplane import ControlPlane
    from raylane.orchestrator.settings import Settings
    from raylane.orchestrator.store import migrate

    url = f"sqlite:///{tmp_path / 'raylane.db'}"
    migrate.upgrade(url)
    settings = Settings(database_url=url, data_dir=tmp_path, auto_migrate=False, loops_enabled=False,
                        admin_token=ADMIN_TOKEN, submit_rate_per_s=0, gc_freeze=False, **overrides)
    cp = ControlPlane(settings)
    return cp, TestClient(create_app(settings, cp=cp), headers=ADMIN_HEADERS)


@pytest.fixture
def hybrid(tmp_path):
    cp, c = client(tmp_path, fleet="local-hybrid")
    with c:
        yield cp, c
    cp.close()


def test_plan_on_a_fleet_names_the_cluster_the_tier_and_each_candidate(hybrid):
    _, api = hybrid
    r = api.post("/v1/plan", json=TRAIN)
    assert r.status_code == 200, r.text
    p = r.json()
    assert (p["cluster"], p["tier"], p["node_group"], p["strategy"]) == ("onprem", "owned", "gpu", "STRICT_PACK")
    assert "placed on onprem gpu (owned)" in p["reasons"]
    assert "cloud gpu-spot: no live view of it now, $2.10/h spot" in p["reasons"]
    assert "cloud gpu: no live view of it now, $6.98/h on demand" in p["reasons"]
    r = api.post("/v1/plan", json={**TRAIN, "placement": {"tier": "rented"}})
    assert (r.json()["cluster"], r.json()["node_group"], r.json()["market"]) == ("cloud", "gpu-spot", "SPOT")


@pytest.mark.parametrize("placement,field,words", [
    ({"cluster": "mars"}, "placement.cluster", "no cluster 'mars'"),
    ({"cluster": "onprem", "tier": "rented"}, "placement.tier", "onprem is owned"),
    ({"cluster": "Not A Name"}, "placement.cluster", "pattern"),
    ({"tier": "borrowed"}, "placement.tier", "owned"),
])
def test_a_bad_pin_is_a_4xx_naming_the_field_never_a_500(hybrid, placement, field, words):
    _, api = hybrid
    r = api.post("/v1/plan", json={**TRAIN, "placement": placement})
    assert r.status_code == 422, r.text
    detail = r.json()["detail"][0]
    assert ".".join(str(x) for x in detail["loc"]).endswith(field) and words in detail["msg"], detail


def test_get_fleet_lists_clusters_tiers_costs_and_groups_without_secrets(hybrid):
    _, api = hybrid
    f = api.get("/v1/fleet").json()
    assert f["name"] == "local-hybrid"
    onprem, cloud = f["clusters"]
    assert (onprem["name"], onprem["tier"], onprem["cost"], onprem["attached"]) == \
        ("onprem", "owned", {"model": "fixed", "per_hour": 12.0}, True)
    assert (cloud["name"], cloud["tier"], cloud["attached"]) == ("cloud", "rented", False)
    assert [g["name"] for g in cloud["groups"]] == ["gpu-spot", "gpu", "spot-cpu", "cpu"]
    assert "token" not in str(f) and "gcs" not in str(f)


def test_a_submitted_job_s_pins_are_checked_against_the_fleet(tmp_path):
    """With a router (a server wired to Ray), as app.py wires it: pins checked first."""
    from raylane.orchestrator.domain.profile import default_profile
    from raylane.orchestrator.domain.routing import route
    from raylane.orchestrator.services import fleetplan

    cp, c = client(tmp_path)  # no RAYLANE_FLEET: today's one cluster, a fleet of one named default
    with c as api:
        cp.router = fleetplan.guard(cp, lambda spec: route(spec, default_profile()))
        assert api.post("/v1/jobs", json={**HELLO, "placement": {"cluster": "default"}}).status_code == 201
        assert api.post("/v1/jobs", json={**HELLO, "placement": {"tier": "rented"}}).status_code == 201
        r = api.post("/v1/jobs", json={**HELLO, "placement": {"tier": "owned"}})
        assert r.status_code == 422 and "has no owned cluster" in r.json()["detail"][0]["msg"], r.text
        assert r.json()["detail"][0]["loc"][-1] == "placement.tier"
        r = api.post("/v1/plan", json={**HELLO, "placement": {"cluster": "onprem"}})
        assert r.status_code == 422 and "no cluster 'onprem'" in r.text
        assert api.post("/v1/plan", json=HELLO).json()["cluster"] is None  # one cluster: placed as before
    cp.close()


def test_a_job_pinned_to_a_cluster_jobs_are_not_dispatched_to_yet_is_refused_with_why(tmp_path):
    from raylane.orchestrator.domain.profile import default_profile
    from raylane.orchestrator.domain.routing import route
    from raylane.orchestrator.services import fleetplan

    cp, c = client(tmp_path, fleet="local-hybrid")
    with c as api:
        cp.router = fleetplan.guard(cp, lambda spec: route(spec, default_profile()))
        r = api.post("/v1/jobs", json={**HELLO, "placement": {"cluster": "cloud"}})
        assert r.status_code == 422, r.text
        assert "dispatched to cluster onprem only" in r.text and r.json()["detail"][0]["loc"][-1] == "placement.cluster"
        r = api.post("/v1/jobs", json={**HELLO, "placement": {"cluster": "onprem"}})
        assert r.status_code == 201, r.text
        # The stored placement names the cluster the dispatcher sends it to: its attempts record it.
        placement = api.get(f"/v1/jobs/{r.json()['id']}").json()["placement"]
        assert (placement["cluster"], placement["tier"]) == ("onprem", "owned")
    cp.close()


def test_report_has_a_fleet_section_judging_owned_groups_and_pricing_the_alternatives(hybrid):
    _, api = hybrid
    rep = api.get("/v1/report", params={"start": "2026-12-01T00:00:00+00:00",
                                         "end": "2026-12-01T10:00:00+00:00"}).json()
    f = rep["fleet"]
    assert f["target_utilisation"] == 0.7 and f["window_hours"] == 10
    assert [(g["cluster"], g["node_group"], g["verdict"]) for g in f["owned_groups"]] == \
        [("onprem", "gpu", "shrink"), ("onprem", "cpu", "shrink")]  # idle: below the target
    assert f["cost"]["owned_fixed"] == 120.0 and f["as_all_owned"]["cost"] == 120.0
    assert f["rented_spend"] == [] and any("do not record their cluster" in n for n in f["notes"])
