"""Cost and utilisation accounting: exact figures from a fixed profile and known
attempt durations (pure functions), then the same through the store and
``/v1/costs``, ``/v1/report`` and ``/v1/jobs/{id}/cost`` on SQLite and PostgreSQL."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from sqlalchemy import insert, update

from raylane.orchestrator.domain import costs
from raylane.orchestrator.domain.costs import AttemptUsage
from raylane.orchestrator.domain.profile import Profile

T0 = datetime(2026, 3, 2, 0, 0, tzinfo=timezone.utc)
H = timedelta(hours=1)

PROFILE = Profile.model_validate({
    "name": "fixed",
    "groups": [
        {"name": "head", "role": "head", "cpus": 0, "memory_gb": 2, "min_nodes": 1, "max_nodes": 1,
         "price_per_hour": 0.1},
        {"name": "gpu", "market": "ON_DEMAND", "accelerator": {"type": "H100", "count": 2}, "cpus": 8,
         "memory_gb": 64, "min_nodes": 1, "max_nodes": 2, "price_per_hour": 8.0},
        {"name": "gpu-spot", "market": "SPOT", "accelerator": {"type": "H100", "count": 2}, "cpus": 8,
         "memory_gb": 64, "min_nodes": 0, "max_nodes": 4, "price_per_hour": 3.0},
        {"name": "spot-cpu", "market": "SPOT", "cpus": 4, "memory_gb": 16, "min_nodes": 0, "max_nodes": 10,
         "price_per_hour": 0.10},
        {"name": "cpu", "market": "ON_DEMAND", "cpus": 4, "memory_gb": 16, "min_nodes": 2, "max_nodes": 4,
         "price_per_hour": 0.20},
    ],
})


def usage(job_id, *, group, market, resources, start, hours, number=1, kind="training", project="ml",
          cause=None, status="SUCCEEDED", entrypoint="examples.train:main", result=None, ended=True):
    return AttemptUsage(
        job_id=job_id, project=project, kind=kind, name=job_id, number=number, node_group=group, market=market,
        resources=resources, status=status, cause=cause, created_at=start - timedelta(seconds=5), started_at=start,
        ended_at=start + hours * H if ended else None, spec={"entrypoint": entrypoint}, result=result)


TRAIN = usage("train", group="gpu", market="ON_DEMAND", resources={"CPU": 2, "GPU": 2}, start=T0, hours=3)
SWEEP = usage("sweep", group="spot-cpu", market="SPOT", resources={"CPU": 8}, start=T0, hours=2, kind="sweep",
              project="research", entrypoint="examples.sweep:objective")
# Preempted on spot after 1 h, retried on on-demand for 2 h: two attempts, two charges.
PRE_1 = usage("flaky", group="gpu-spot", market="SPOT", resources={"CPU": 1, "GPU": 1}, start=T0, hours=1,
              cause="PREEMPTED", status="FAILED")
PRE_2 = usage("flaky", group="gpu", market="ON_DEMAND", resources={"CPU": 1, "GPU": 1}, start=T0 + 2 * H, hours=2,
              number=2)
END = T0 + 10 * H


def priced(*us, start=T0, end=END, now=END):
    return costs.costs(us, PROFILE, start=start, end=end, now=now)


def test_an_on_demand_gpu_attempt_costs_hours_times_node_share_times_price():
    (c,) = priced(TRAIN)
    # share = max(2 of 8 CPUs, 2 of 2 GPUs) = 1 node; 3 h x 1 x $8.00
    assert c.share == 1.0 and c.hours == 3.0
    assert c.cost == pytest.approx(24.0) and c.on_demand_cost == pytest.approx(24.0) and c.savings == 0


def test_a_spot_sweep_saves_the_difference_to_its_on_demand_twin():
    (c,) = priced(SWEEP)
    # 8 CPUs on 4-CPU nodes: a share of 2 nodes. Spot: 2 h x 2 x $0.10; its on-demand twin "cpu": 2 h x 2 x $0.20.
    assert c.share == 2.0
    assert c.cost == pytest.approx(0.40)
    assert c.on_demand_cost == pytest.approx(0.80)
    assert c.savings == pytest.approx(0.40)


def test_a_preempted_then_retried_job_is_charged_once_per_attempt():
    out = costs.breakdown(priced(PRE_1, PRE_2), "project")
    (row,) = out["rows"]
    # attempt 1: 1 h x max(1/8, 1/2) x $3 = 1.50 (on demand: 1 h x 0.5 x $8 = 4.00)
    # attempt 2: 2 h x 0.5 x $8 = 8.00 (already on demand)
    assert row["attempts"] == 2 and row["jobs"] == 1
    assert row["cost"] == pytest.approx(9.50)
    assert row["on_demand_cost"] == pytest.approx(12.00)
    assert row["spot_savings"] == pytest.approx(2.50)
    assert row["gpu_hours"] == pytest.approx(3.0) and row["hours"] == pytest.approx(3.0)


def test_breakdowns_by_project_node_group_and_kind_add_up():
    items = priced(TRAIN, SWEEP, PRE_1, PRE_2)
    by_project = {r["key"]: r for r in costs.breakdown(items, "project")["rows"]}
    assert by_project["ml"]["cost"] == pytest.approx(24.0 + 9.5)
    assert by_project["research"]["cost"] == pytest.approx(0.40)
    by_group = {r["key"]: r["cost"] for r in costs.breakdown(items, "node_group")["rows"]}
    assert by_group == pytest.approx({"gpu": 32.0, "gpu-spot": 1.5, "spot-cpu": 0.4})
    by_kind = costs.breakdown(items, "kind")
    assert [r["key"] for r in by_kind["rows"]] == ["training", "sweep"]  # most expensive first
    assert by_kind["total"]["cost"] == pytest.approx(33.9)
    assert by_kind["total"]["spot_savings"] == pytest.approx(0.4 + 2.5)
    assert by_kind["total"]["attempts"] == 4 and by_kind["total"]["jobs"] == 3


def test_the_window_clips_attempts_and_a_running_one_counts_until_now():
    # TRAIN ran 00:00-03:00; a window from 02:00 sees its last hour only.
    (c,) = priced(TRAIN, start=T0 + 2 * H, end=T0 + 10 * H)
    assert c.hours == pytest.approx(1.0) and c.cost == pytest.approx(8.0)
    running = usage("live", group="cpu", market="ON_DEMAND", resources={"CPU": 2}, start=T0, hours=0, ended=False,
                    status="RUNNING")
    (c,) = priced(running, now=T0 + 90 * timedelta(minutes=1))
    assert c.hours == pytest.approx(1.5) and c.cost == pytest.approx(1.5 * 0.5 * 0.20)
    # Outside the window entirely: not counted.
    assert priced(TRAIN, start=T0 + 4 * H) == []


def test_attempts_that_never_held_resources_cost_nothing():
    refused = usage("refused", group="gpu", market="ON_DEMAND", resources={"GPU": 2}, start=T0, hours=1,
                    cause="SUBMIT_ERROR", status="FAILED")
    claimed = AttemptUsage(job_id="c", project="p", kind="command", name="c", number=1, node_group="gpu",
                           market="ON_DEMAND", resources={"GPU": 2}, status="CLAIMED", cause=None, created_at=T0,
                           started_at=None, ended_at=None)
    # Ray finished it before the reconciler saw it running: charged from dispatch (an upper bound).
    quick = AttemptUsage(job_id="q", project="p", kind="command", name="q", number=1, node_group="cpu",
                         market="ON_DEMAND", resources={"CPU": 4}, status="SUCCEEDED", cause=None, created_at=T0,
                         started_at=None, ended_at=T0 + H)
    items = priced(refused, claimed, quick)
    assert [c.usage.job_id for c in items] == ["q"]
    assert items[0].cost == pytest.approx(0.20)


def test_utilisation_is_held_resource_hours_over_the_min_nodes_fleet():
    util = {u["node_group"]: u for u in costs.utilisation(priced(TRAIN, SWEEP, PRE_1, PRE_2), PROFILE,
                                                           start=T0, end=END)}
    # gpu: min_nodes 1 x 2 GPUs x 10 h = 20 GPU-h available; held 2 x 3 h + 1 x 2 h = 8.
    assert util["gpu"]["nodes"] == 1
    assert util["gpu"]["gpu_hours_available"] == pytest.approx(20.0)
    assert util["gpu"]["gpu_hours_used"] == pytest.approx(8.0)
    assert util["gpu"]["gpu_utilisation"] == pytest.approx(0.4)
    # gpu-spot has min_nodes 0: counted as one node.
    assert util["gpu-spot"]["nodes"] == 1 and util["gpu-spot"]["gpu_utilisation"] == pytest.approx(1 / 20)
    # cpu: 2 nodes x 4 CPUs x 10 h = 80 CPU-h; nothing ran there.
    assert util["cpu"]["cpu_hours_available"] == pytest.approx(80.0) and util["cpu"]["cpu_utilisation"] == 0
    assert util["spot-cpu"]["cpu_utilisation"] == pytest.approx(16 / 40)
    assert util["cpu"]["gpu_utilisation"] is None  # no GPUs to use


def test_report_says_own_or_rent_per_gpu_group_and_lists_cheaper_placements():
    busy = usage("busy", group="gpu", market="ON_DEMAND", resources={"CPU": 8, "GPU": 2}, start=T0, hours=7.5)
    idle_gpu = usage("idle-gpu", group="gpu", market="ON_DEMAND", resources={"CPU": 1, "GPU": 1}, start=T0,
                     hours=1, kind="command", entrypoint="python -c 'print(42)'")
    said_so = usage("said-so", group="gpu", market="ON_DEMAND", resources={"CPU": 1, "GPU": 1}, start=T0,
                    hours=1, result={"gpu_utilization": 0})
    real_gpu = usage("real-gpu", group="gpu", market="ON_DEMAND", resources={"CPU": 1, "GPU": 1}, start=T0,
                     hours=1, kind="command", entrypoint="python train.py --cuda")
    od_sweep = usage("od-sweep", group="cpu", market="ON_DEMAND", resources={"CPU": 4}, start=T0, hours=5,
                     kind="sweep", entrypoint="examples.sweep:objective")
    rep = costs.report([busy, idle_gpu, said_so, real_gpu, od_sweep], PROFILE, start=T0, end=END, now=END,
                       break_even=0.7)
    gpu = {g["node_group"]: g for g in rep["gpu_groups"]}
    # gpu: 2 x 7.5 + 3 x 1 = 18 of 20 GPU-h = 90% >= 70%: own.
    assert gpu["gpu"]["utilisation"] == pytest.approx(0.9) and gpu["gpu"]["verdict"] == "own"
    assert gpu["gpu-spot"]["utilisation"] == 0 and gpu["gpu-spot"]["verdict"] == "rent"
    assert "break-even" in gpu["gpu"]["advice"]
    found = {(c["job_id"], c["finding"]): c for c in rep["cheaper_placements"]}
    assert set(found) == {("idle-gpu", "gpu_unused"), ("said-so", "gpu_unused"), ("od-sweep", "elastic_on_demand")}
    # The GPU command held half a GPU node for 1 h ($4.00); on "cpu" its 1 CPU is a quarter node: $0.05.
    c = found[("idle-gpu", "gpu_unused")]
    assert c["cost"] == pytest.approx(4.0) and c["cheaper_node_group"] == "cpu"
    assert c["cheaper_cost"] == pytest.approx(0.05) and c["saving"] == pytest.approx(3.95)
    assert "reports gpu_utilization=0" in found[("said-so", "gpu_unused")]["reason"]
    # The on-demand sweep: 5 h x 1 node x $0.20 = $1.00; on spot-cpu $0.50.
    s = found[("od-sweep", "elastic_on_demand")]
    assert s["cheaper_node_group"] == "spot-cpu" and s["saving"] == pytest.approx(0.5)
    assert rep["total"]["cost"] == pytest.approx(8 * 7.5 + 4 + 4 + 4 + 1.0)


# Through the store and the API ---------------------------------------------------


def _attempt(cp, job_id, number, *, group, market, resources, start, hours, cause=None, status="SUCCEEDED"):
    from raylane.orchestrator.domain.ids import submission_id
    from raylane.orchestrator.store import db, usage_rows
    from raylane.orchestrator.store.tables import attempts, jobs

    with db.transaction(cp.sessions) as s:
        s.execute(insert(attempts).values(
            job_id=job_id, number=number, submission_id=submission_id(job_id, number), node_group=group,
            market=market, status=status, resources=resources, created_at=start - timedelta(seconds=3),
            started_at=start, ended_at=start + hours * H if hours is not None else None, cause=cause))
        s.execute(update(jobs).where(jobs.c.id == job_id).values(attempts=number, node_group=group))
        usage_rows.track(s, job_id, number)  # an attempt written around the store's writers


@pytest.fixture
def fixed_profile(cp, tmp_path):
    import yaml

    path = tmp_path / "profile.yaml"
    path.write_text(yaml.safe_dump(PROFILE.model_dump(mode="json")))
    cp.settings.profile = path
    return PROFILE


def _submit(api, name, project, kind="training"):
    spec = {"name": name, "kind": kind, "entrypoint": "examples.train:main", "project": project}
    if kind == "sweep":
        spec.update(entrypoint="examples.sweep:objective",
                    sweep={"metric": "loss", "search_space": {"lr": {"uniform": [0.1, 0.2]}}})
    r = api.post("/v1/jobs", json=spec)
    assert r.status_code == 201, r.text
    return r.json()["id"]


def test_costs_and_report_through_the_api(api, cp, fixed_profile):
    train = _submit(api, "train", "ml")
    sweep = _submit(api, "sweep", "research", kind="sweep")
    _attempt(cp, train, 1, group="gpu-spot", market="SPOT", resources={"CPU": 1, "GPU": 1}, start=T0, hours=1,
             cause="PREEMPTED", status="FAILED")
    _attempt(cp, train, 2, group="gpu", market="ON_DEMAND", resources={"CPU": 1, "GPU": 1}, start=T0 + 2 * H, hours=2)
    _attempt(cp, sweep, 1, group="spot-cpu", market="SPOT", resources={"CPU": 8}, start=T0, hours=2)
    window = {"start": T0.isoformat(), "end": END.isoformat()}

    r = api.get("/v1/costs", params={"group_by": "project", **window})
    assert r.status_code == 200, r.text
    body = r.json()
    rows = {x["key"]: x for x in body["rows"]}
    assert rows["ml"]["cost"] == pytest.approx(9.5) and rows["ml"]["attempts"] == 2 and rows["ml"]["jobs"] == 1
    assert rows["ml"]["spot_savings"] == pytest.approx(2.5)
    assert rows["research"]["cost"] == pytest.approx(0.4) and rows["research"]["spot_savings"] == pytest.approx(0.4)
    assert body["total"]["cost"] == pytest.approx(9.9)

    by_group = {x["key"]: x["cost"] for x in api.get("/v1/costs", params={"group_by": "node_group", **window})
                .json()["rows"]}
    assert by_group == pytest.approx({"gpu": 8.0, "gpu-spot": 1.5, "spot-cpu": 0.4})
    # ?project= narrows an admin's view.
    only = api.get("/v1/costs", params={"group_by": "kind", "project": "research", **window}).json()
    assert [x["key"] for x in only["rows"]] == ["sweep"] and only["total"]["cost"] == pytest.approx(0.4)

    rep = api.get("/v1/report", params=window).json()
    gpu = {g["node_group"]: g for g in rep["gpu_groups"]}
    assert gpu["gpu"]["gpu_hours_used"] == pytest.approx(2.0) and gpu["gpu"]["verdict"] == "rent"
    assert rep["break_even_utilisation"] == 0.7

    jc = api.get(f"/v1/jobs/{train}/cost").json()
    assert [a["number"] for a in jc["attempts"]] == [1, 2]
    assert [a["cost"] for a in jc["attempts"]] == pytest.approx([1.5, 8.0])
    assert jc["cost"] == pytest.approx(9.5) and jc["attempts"][0]["cause"] == "PREEMPTED"


def test_a_bad_window_is_refused(api):
    assert api.get("/v1/costs", params={"start": "2026-01-02T00:00:00"}).status_code == 422  # no timezone
    r = api.get("/v1/costs", params={"start": "2026-01-02T00:00:00Z", "end": "2026-01-01T00:00:00Z"})
    assert r.status_code == 422 and "before" in r.text
    assert api.get("/v1/costs", params={"group_by": "colour"}).status_code == 422
    assert api.get("/v1/jobs/nosuchjob/cost").status_code == 404
