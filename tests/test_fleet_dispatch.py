"""Dispatch across a fleet (issue 45, ``services.fleetdispatch``): the shipped
local-hybrid fleet's two clusters, ``onprem`` (owned) and ``cloud`` (rented,
scaling from zero), as two in-memory Ray clusters (``FakeRay``), behind one
queue, through the API and the real loops, on SQLite and PostgreSQL.

The loops are turned by the test (``turn``); Ray's side is moved by the test
(``start``, ``finish``, ``down``). What only live clusters show (two real heads,
a killed head, a paused one) is tests/fleet/'s."""

from __future__ import annotations

from datetime import timedelta

import pytest

from raylane.orchestrator.domain.fleet import configured
from raylane.orchestrator.domain.ids import submission_id
from raylane.orchestrator.domain.profile import Profile
from raylane.orchestrator.services import fleetdispatch
from raylane.orchestrator.testing import FakeRay

MAX_TURNS = 100
TRAIN = {"name": "finetune", "kind": "training", "entrypoint": "examples.train:main",
         "resources": {"num_workers": 2, "gpus_per_worker": 1, "cpus_per_worker": 1}}


@pytest.fixture
def settings(settings):
    """Every job a Ray job (FakeRay runs no warm lane). RAYLANE_AUTOSCALE_AHEAD_JOBS
    stays unset: cloud scales, so its dispatcher sends jobs ahead of its scale-up
    all the same (``fleetdispatch.scale_ahead``)."""
    assert settings.autoscale_ahead_jobs == 0
    return settings.model_copy(update={"fast_lane": False, "fleet": "local-hybrid", "fleet_cluster_grace_s": 60.0})


@pytest.fixture
def fleet(cp, monkeypatch):
    # The loops are turned far faster than real time here: the placer reads each cluster's nodes every pass.
    monkeypatch.setattr(fleetdispatch, "VIEW_CACHE_S", 0.0)
    monkeypatch.setattr(fleetdispatch, "UNPLACED_RETRY_S", 0.0)  # ... and tries an unplaced job again every pass
    monkeypatch.setattr(fleetdispatch, "RUNS_KEPT_S", 0.0)  # ... and reads past runs afresh every pass
    f = configured("local-hybrid", Profile.load(None))
    rays = {c.name: FakeRay(c.profile, name=c.name) for c in f.members}
    for g in f.cluster("cloud").profile.workers:  # cloud scales from zero: no worker node until a job asks
        for node in rays["cloud"].node_ids(g.name):
            rays["cloud"].kill_node(node)
    fd = fleetdispatch.attach_fleet(cp, f, rays, "onprem")
    return fd, rays


def turn(fd, times: int = 1) -> None:
    """One pass of each loop: place, then each cluster admits and submits, then reads Ray."""
    for _ in range(times):
        fd.placer.run_once()
        for m in fd.members.values():
            m.dispatcher.run_once()
        for m in fd.members.values():
            m.reconciler.run_once()


def run_until(fd, done, what: str):
    for _ in range(MAX_TURNS):
        turn(fd)
        got = done()
        if got:
            return got
    raise AssertionError(f"{what}: not after {MAX_TURNS} passes of the loops")


def job(api, job_id: str) -> dict:
    return api.get(f"/v1/jobs/{job_id}").json()


def submitted_to(ray: FakeRay) -> list[str]:
    return [s.submission_id for s in ray.submitted]


def attempts(api, job_id: str) -> list[dict]:
    return api.get(f"/v1/jobs/{job_id}/attempts").json()


def test_training_runs_on_onprem_and_the_next_goes_to_cloud_with_why(api, fleet):
    fd, rays = fleet
    a = api.post("/v1/jobs", json=TRAIN).json()
    sid_a = submission_id(a["id"], 1)
    run_until(fd, lambda: sid_a in submitted_to(rays["onprem"]), "first training submitted to onprem")
    rays["onprem"].start(sid_a)
    run_until(fd, lambda: job(api, a["id"])["status"] == "RUNNING", "first training running")
    assert attempts(api, a["id"])[0]["cluster"] == "onprem"

    b = api.post("/v1/jobs", json=TRAIN).json()
    sid_b = submission_id(b["id"], 1)
    run_until(fd, lambda: sid_b in submitted_to(rays["cloud"]), "second training submitted to cloud")
    assert sid_b not in submitted_to(rays["onprem"]) and sid_a not in submitted_to(rays["cloud"])
    j = job(api, b["id"])
    assert j["placement"]["cluster"] == "cloud" and j["placement"]["tier"] == "rented"
    assert j["placement"]["node_group"] == "gpu-spot"  # training checkpoints: spot first among rented
    events = " | ".join(e["reason"] or "" for e in api.get(f"/v1/jobs/{b['id']}/events").json())
    assert "placed on cloud gpu-spot (rented)" in events and "scale-up from 0 nodes" in events
    assert "onprem gpu: 2 of 2 GPUs held" in " | ".join(j["placement"]["reasons"])
    rays["cloud"].add_node("gpu-spot")  # the scale-up came
    rays["cloud"].start(sid_b)
    run_until(fd, lambda: job(api, b["id"])["status"] == "RUNNING", "second training running on cloud")
    assert attempts(api, b["id"])[0]["cluster"] == "cloud"
    assert rays["cloud"].submission(sid_b).metadata["raylane_cluster"] == "cloud"


def test_a_sweep_goes_to_cloud_spot_while_onprem_cpus_are_held(api, fleet):
    fd, rays = fleet
    hold = api.post("/v1/jobs", json={"name": "hold", "kind": "command", "entrypoint": "sleep infinity",
                                      "resources": {"cpus_per_worker": 3.5}, "placement": {"cluster": "onprem"}}).json()
    run_until(fd, lambda: submission_id(hold["id"], 1) in submitted_to(rays["onprem"]), "onprem cpu held")
    rays["onprem"].start(submission_id(hold["id"], 1))
    sweep = api.post("/v1/jobs", json={"name": "hpo", "kind": "sweep", "entrypoint": "examples.sweep:trainable",
                                       "resources": {"cpus_per_worker": 1},
                                       "sweep": {"metric": "loss", "mode": "min", "num_samples": 4, "max_concurrent_trials": 2,
                                                 "search_space": {"lr": {"loguniform": [1e-4, 1e-1]}}}})
    assert sweep.status_code == 201, sweep.text
    sid = submission_id(sweep.json()["id"], 1)
    run_until(fd, lambda: sid in submitted_to(rays["cloud"]), "sweep submitted to cloud")
    pl = job(api, sweep.json()["id"])["placement"]
    assert (pl["cluster"], pl["node_group"], pl["market"]) == ("cloud", "spot-cpu", "SPOT")


def test_a_job_pinned_to_onprem_waits_there_with_a_reason(api, fleet):
    fd, rays = fleet
    a = api.post("/v1/jobs", json=TRAIN).json()
    run_until(fd, lambda: submission_id(a["id"], 1) in submitted_to(rays["onprem"]), "onprem GPUs taken")
    rays["onprem"].start(submission_id(a["id"], 1))
    b = api.post("/v1/jobs", json={**TRAIN, "placement": {"cluster": "onprem"}}).json()
    run_until(fd, lambda: "GPUs in group gpu" in (job(api, b["id"])["status_reason"] or ""),
              "pinned job waits on onprem, saying for what")
    turn(fd, 5)
    assert job(api, b["id"])["status"] == "PENDING"
    assert rays["cloud"].submitted == [] and job(api, b["id"])["placement"]["cluster"] == "onprem"
    rays["onprem"].finish(submission_id(a["id"], 1))
    run_until(fd, lambda: submission_id(b["id"], 1) in submitted_to(rays["onprem"]), "pinned job runs once GPUs free")


def test_a_project_forbidden_to_rent_never_leaves_onprem(api, cp, fleet):
    fd, rays = fleet
    cp.settings = cp.settings.model_copy(update={"fleet_no_rent_projects": ["default"]})
    a = api.post("/v1/jobs", json=TRAIN).json()
    run_until(fd, lambda: submission_id(a["id"], 1) in submitted_to(rays["onprem"]), "first on onprem")
    rays["onprem"].start(submission_id(a["id"], 1))
    b = api.post("/v1/jobs", json=TRAIN).json()
    turn(fd, 10)
    j = job(api, b["id"])
    assert j["status"] == "PENDING" and j["placement"]["cluster"] == "onprem"
    assert rays["cloud"].submitted == []
    assert "may not rent" in " | ".join(j["placement"]["reasons"])


def _two_running(api, fd, rays):
    """A training job running on onprem (its GPUs full) and one on cloud."""
    a = api.post("/v1/jobs", json=TRAIN).json()
    run_until(fd, lambda: submission_id(a["id"], 1) in submitted_to(rays["onprem"]), "a on onprem")
    rays["onprem"].start(submission_id(a["id"], 1))
    b = api.post("/v1/jobs", json=TRAIN).json()
    run_until(fd, lambda: submission_id(b["id"], 1) in submitted_to(rays["cloud"]), "b on cloud")
    rays["cloud"].add_node("gpu-spot")
    rays["cloud"].start(submission_id(b["id"], 1))
    run_until(fd, lambda: job(api, a["id"])["status"] == job(api, b["id"])["status"] == "RUNNING", "both running")
    return a, b


def _outage(fd, cloud: FakeRay, seconds: float) -> None:
    """cloud stops answering; its outage is made to have begun ``seconds`` ago."""
    from dataclasses import replace
    from datetime import timedelta

    cloud.down = True
    turn(fd)  # its loops see it
    seen = cloud.reachability.now()
    assert seen.state == "unreachable"
    cloud.reachability._state = replace(seen, since=seen.since - timedelta(seconds=seconds))


def test_cloud_lost_past_the_grace_moves_its_jobs_and_fences_them_when_it_returns(api, fleet):
    fd, rays = fleet
    a, b = _two_running(api, fd, rays)
    _outage(fd, rays["cloud"], 61)
    turn(fd)
    att = attempts(api, b["id"])
    assert att[0]["status"] == "LOST" and att[0]["cause"] == "CLUSTER_LOST"
    events = [e["reason"] or "" for e in api.get(f"/v1/jobs/{b['id']}/events").json()]
    assert any("attempt 1 ended: CLUSTER_LOST: cluster cloud unreachable since" in e
               and "do not count against max_attempts" in e for e in events), events
    # onprem's job is undisturbed; b waits for onprem's GPUs (cloud is lost), not counted against max_attempts
    assert job(api, a["id"])["status"] == "RUNNING" and len(attempts(api, a["id"])) == 1
    run_until(fd, lambda: job(api, b["id"])["placement"]["cluster"] == "onprem", "b placed again on onprem")
    assert "cloud: lost" in " | ".join(job(api, b["id"])["placement"]["reasons"])
    rays["onprem"].finish(submission_id(a["id"], 1))
    sid_b2 = submission_id(b["id"], 2)
    run_until(fd, lambda: sid_b2 in submitted_to(rays["onprem"]), "b's second attempt on onprem")
    rays["onprem"].start(sid_b2)
    rays["onprem"].finish(sid_b2, result={"loss": 0.1})

    # cloud answers again: b's first attempt, still running there, is stopped before anything new is submitted
    rays["cloud"].down = False
    n_before = len(rays["cloud"].submitted)
    c = api.post("/v1/jobs", json={**TRAIN, "placement": {"cluster": "cloud"}}).json()
    turn(fd)
    assert submission_id(b["id"], 1) in rays["cloud"].stopped
    assert rays["cloud"].stopped.index(submission_id(b["id"], 1)) == 0
    run_until(fd, lambda: submission_id(c["id"], 1) in submitted_to(rays["cloud"]), "new work on cloud after the fence")
    assert len(rays["cloud"].submitted) == n_before + 1
    # b's late result there is ignored: its result and status are its onprem attempt's
    rays["cloud"].finish(submission_id(b["id"], 1), result={"loss": 99.0})
    run_until(fd, lambda: job(api, b["id"])["status"] == "SUCCEEDED", "b succeeded on onprem")
    turn(fd, 3)
    jb = job(api, b["id"])
    assert jb["result"] == {"loss": 0.1} and jb["attempts"] == 2
    assert [x["status"] for x in attempts(api, b["id"])] == ["LOST", "SUCCEEDED"]
    assert jb["failure_cause"] is None


def test_an_outage_shorter_than_the_grace_restarts_nothing(api, fleet):
    fd, rays = fleet
    a, b = _two_running(api, fd, rays)
    _outage(fd, rays["cloud"], 30)
    turn(fd, 5)
    rays["cloud"].down = False
    turn(fd, 3)
    assert job(api, b["id"])["status"] == "RUNNING"
    assert [x["status"] for x in attempts(api, b["id"])] == ["RUNNING"]
    assert rays["cloud"].stopped == []


def test_a_cluster_that_answers_the_last_ping_is_not_lost(api, fleet, monkeypatch):
    """Every loop's call failed past the grace, but the placer's own ping answers:
    a slow patch, not a lost cluster."""
    fd, rays = fleet
    a, b = _two_running(api, fd, rays)
    _outage(fd, rays["cloud"], 120)
    monkeypatch.setattr(rays["cloud"], "ping", lambda: True)
    fd.placer.run_once()
    assert [x["status"] for x in attempts(api, b["id"])] == ["RUNNING"]


def test_a_scale_up_that_does_not_come_moves_the_job_to_its_next_cluster(api, cp, fleet):
    fd, rays = fleet
    cp.settings = cp.settings.model_copy(update={"scale_up_deadline_s": 0.2})
    for m in fd.members.values():
        m.reconciler.settings = m.dispatcher.settings = cp.settings
    a = api.post("/v1/jobs", json=TRAIN).json()
    run_until(fd, lambda: submission_id(a["id"], 1) in submitted_to(rays["onprem"]), "a on onprem")
    rays["onprem"].start(submission_id(a["id"], 1))
    b = api.post("/v1/jobs", json=TRAIN).json()
    run_until(fd, lambda: submission_id(b["id"], 1) in submitted_to(rays["cloud"]), "b ahead of cloud's scale-up")
    assert submission_id(b["id"], 1) not in submitted_to(rays["onprem"])  # one nomination at a time
    # no node comes; after the deadline b is stopped on cloud and placed again, cloud's gpu groups left out
    run_until(fd, lambda: attempts(api, b["id"])[0]["cause"] == "SCALE_UP_TIMEOUT", "b's scale-up timed out")
    assert submission_id(b["id"], 1) in rays["cloud"].stopped
    run_until(fd, lambda: job(api, b["id"])["placement"]["cluster"] == "onprem", "b moved to onprem")
    jb = job(api, b["id"])
    assert jb["status"] != "FAILED"
    assert "cloud: its scale-up for this job did not come in time" in " | ".join(jb["placement"]["reasons"])
    rays["onprem"].finish(submission_id(a["id"], 1))
    run_until(fd, lambda: submission_id(b["id"], 2) in submitted_to(rays["onprem"]), "b runs on onprem")
    assert len(rays["cloud"].submitted) == 1  # cloud was not asked again


def test_a_job_whose_every_cluster_failed_to_scale_up_fails_saying_so(api, cp, fleet):
    fd, rays = fleet
    cp.settings = cp.settings.model_copy(update={"scale_up_deadline_s": 0.2})
    for m in fd.members.values():
        m.reconciler.settings = m.dispatcher.settings = cp.settings
    j = api.post("/v1/jobs", json={**TRAIN, "placement": {"cluster": "cloud"}}).json()
    run_until(fd, lambda: job(api, j["id"])["status"] == "FAILED", "pinned job fails once cloud did not scale up")
    got = job(api, j["id"])
    assert got["failure_cause"] == "SCALE_UP_TIMEOUT" and "scaled up in time" in got["status_reason"]
    assert rays["onprem"].submitted == []


def test_submission_ids_and_attempt_clusters_stay_apart_across_clusters(api, fleet):
    fd, rays = fleet
    a, b = _two_running(api, fd, rays)
    ids_onprem, ids_cloud = set(submitted_to(rays["onprem"])), set(submitted_to(rays["cloud"]))
    assert ids_onprem and ids_cloud and not ids_onprem & ids_cloud
    assert {x["cluster"] for x in attempts(api, a["id"])} == {"onprem"}
    assert {x["cluster"] for x in attempts(api, b["id"])} == {"cloud"}


def test_readyz_and_the_plan_see_each_cluster_on_its_own(api, fleet):
    fd, rays = fleet
    turn(fd)
    r = api.get("/readyz").json()
    assert r["status"] == "ok" and {n: c["ok"] for n, c in r["clusters"].items()} == {"onprem": True, "cloud": True}
    _outage(fd, rays["cloud"], 61)
    turn(fd)
    r = api.get("/readyz").json()
    assert r["status"] == "degraded" and r["running_jobs"] is True
    assert r["clusters"]["cloud"]["ok"] is False and r["clusters"]["cloud"]["lost"] is True
    assert r["clusters"]["onprem"]["ok"] is True and "cluster cloud unreachable" in r["reason"]
    plan = api.post("/v1/plan", json={**TRAIN, "placement": {"tier": "rented"}})
    assert plan.status_code in (409, 422) and "cloud: lost" in plan.text
    plan = api.post("/v1/plan", json=TRAIN).json()
    assert plan["cluster"] == "onprem" and "cloud: lost" in plan["reasons"]


def test_an_attempt_s_log_is_read_from_the_cluster_it_ran_on(api, fleet):
    fd, rays = fleet
    a, b = _two_running(api, fd, rays)
    rays["cloud"].write_logs(submission_id(b["id"], 1), "epoch 1 on cloud\n")
    rays["onprem"].write_logs(submission_id(a["id"], 1), "epoch 1 on onprem\n")
    assert "epoch 1 on cloud" in api.get(f"/v1/jobs/{b['id']}/logs").text
    assert "epoch 1 on onprem" in api.get(f"/v1/jobs/{a['id']}/logs").text


def test_metrics_are_labelled_by_cluster(api, fleet):
    fd, rays = fleet
    a, b = _two_running(api, fd, rays)
    text = api.get("/metrics").text
    assert 'raylane_cluster_up{cluster="onprem",tier="owned"} 1.0' in text
    assert 'raylane_cluster_up{cluster="cloud",tier="rented"} 1.0' in text
    assert 'raylane_cluster_jobs{cluster="cloud",status="RUNNING"} 1.0' in text
    assert 'raylane_cluster_jobs{cluster="onprem",status="RUNNING"} 1.0' in text
    _outage(fd, rays["cloud"], 61)
    turn(fd)
    text = api.get("/metrics").text
    assert 'raylane_cluster_up{cluster="cloud",tier="rented"} 0.0' in text
    assert 'raylane_cluster_lost{cluster="cloud"} 1.0' in text


def test_each_cluster_s_dashboard_is_under_ray_slash_its_name(api):
    """``/ray/<cluster>/...`` goes to that cluster's dashboard with its own token,
    under the same rules; ``/ray/...`` to the attached cluster's."""
    import httpx

    import json

    seen: list[tuple[str, str, str | None]] = []

    class Body(httpx.AsyncByteStream):  # streamed as Ray's dashboard's answers are
        def __init__(self, obj):
            self.data = json.dumps(obj).encode()

        async def __aiter__(self):
            yield self.data

    def dashboard(name):
        def answer(req: httpx.Request) -> httpx.Response:
            seen.append((name, req.url.path, req.headers.get("authorization")))
            if req.url.path == "/api/jobs/":
                return httpx.Response(200, headers={"content-type": "application/json"}, stream=Body([
                    {"submission_id": "raylane-x-1", "metadata": {"raylane_project": "default"}},
                    {"submission_id": "other", "metadata": {}}]))
            return httpx.Response(200, headers={"content-type": "application/json"}, stream=Body({"version": name}))
        return answer

    proxy = api.app.state.ray_proxy
    for name in ("onprem", "cloud"):
        proxy.bind(f"http://{name}.ray.invalid:8265", f"tok-{name}", cluster=name)
        proxy._targets[name].client = httpx.AsyncClient(base_url=f"http://{name}.ray.invalid:8265",
                                                        transport=httpx.MockTransport(dashboard(name)),
                                                        headers={"Authorization": f"Bearer tok-{name}"})
    proxy.bind("http://onprem.ray.invalid:8265", "tok-onprem")
    proxy._targets[None].client = proxy._targets["onprem"].client
    assert api.get("/ray/cloud/api/version").json() == {"version": "cloud"}
    assert seen[-1] == ("cloud", "/api/version", "Bearer tok-cloud")
    assert api.get("/ray/api/version").json() == {"version": "onprem"}
    assert seen[-1] == ("onprem", "/api/version", "Bearer tok-onprem")
    assert len(api.get("/ray/cloud/api/jobs/").json()) == 2 and seen[-1][0] == "cloud"  # an admin sees every job
    assert api.get("/ray/cloud/api/jobs/", headers={"Authorization": ""}).status_code == 401
    n = len(seen)
    r = api.get("/ray/mars/api/version")  # not a cluster: a path of the attached one, which the rules refuse
    assert r.status_code == 403 and "'mars/api/version' is not one of the reads that pass" in r.text
    assert len(seen) == n


def test_the_report_prices_each_attempt_on_the_cluster_it_ran_on(api, fleet):
    fd, rays = fleet
    a, b = _two_running(api, fd, rays)
    rays["onprem"].finish(submission_id(a["id"], 1))
    rays["cloud"].finish(submission_id(b["id"], 1))
    run_until(fd, lambda: job(api, b["id"])["status"] == job(api, a["id"])["status"] == "SUCCEEDED", "both ended")
    f = api.get("/v1/report").json()["fleet"]
    assert {c["name"]: c["attempts"] for c in f["clusters"]} == {"onprem": 1, "cloud": 1}
    spend = f["rented_spend"]
    assert [(r["cluster"], r["market"], r["attempts"]) for r in spend] == [("cloud", "SPOT", 1)]
    assert spend[0]["cost"] > 0 and f["cost"]["rented"] == spend[0]["cost"]
    assert not any("do not record their cluster" in n for n in f["notes"])


def test_get_fleet_shows_each_cluster_s_state_and_what_runs_where(api, fleet):
    fd, rays = fleet
    a, b = _two_running(api, fd, rays)
    api.post("/v1/jobs", json={**TRAIN, "placement": {"cluster": "onprem"}})
    turn(fd)
    f = api.get("/v1/fleet").json()
    assert f["dispatching"] is True and f["placing"] == 0
    got = {c["name"]: (c["state"], c["active_jobs"], c["queued_jobs"]) for c in f["clusters"]}
    assert got == {"onprem": ("reachable", 1, 1), "cloud": ("reachable", 1, 0)}
    _outage(fd, rays["cloud"], 61)
    turn(fd)
    f = api.get("/v1/fleet").json()
    assert {c["name"]: c["state"] for c in f["clusters"]} == {"onprem": "reachable", "cloud": "lost"}


def test_node_groups_and_nodes_by_cluster_count_each_cluster_s_own_jobs(api, fleet):
    fd, rays = fleet
    a, b = _two_running(api, fd, rays)  # a 2-GPU job on onprem's gpu, one on cloud's gpu-spot
    onprem = {g["name"]: g for g in api.get("/v1/node-groups").json()}
    assert onprem["gpu"]["used_by_raylane"].get("GPU") == 2 and onprem["gpu"]["active_jobs"] == 1
    cloud = {g["name"]: g for g in api.get("/v1/node-groups", params={"cluster": "cloud"}).json()}
    assert cloud["gpu-spot"]["used_by_raylane"].get("GPU") == 2 and cloud["gpu-spot"]["alive_nodes"] == 1
    assert cloud["gpu"]["used_by_raylane"] == {} and cloud["gpu"]["active_jobs"] == 0  # not onprem's gpu job
    nodes = api.get("/v1/cluster", params={"cluster": "cloud"}).json()["nodes"]
    assert {n["node_group"] for n in nodes if n["state"] == "ALIVE"} == {"head", "gpu-spot"}
    r = api.get("/v1/node-groups", params={"cluster": "mars"})
    assert r.status_code == 422 and "no cluster 'mars'" in r.text
    assert api.get("/v1/node-groups", params={"cluster": "Bad Name"}).status_code == 422


def test_a_no_rent_project_s_job_pinned_to_a_rented_cluster_is_refused_at_submit(api, cp, fleet):
    cp.settings = cp.settings.model_copy(update={"fleet_no_rent_projects": ["default"]})
    for placement, field in (({"cluster": "cloud"}, "placement.cluster"), ({"tier": "rented"}, "placement.tier")):
        r = api.post("/v1/jobs", json={**TRAIN, "placement": placement})
        assert r.status_code == 403, r.text
        assert "may not run jobs on rented clusters" in r.text and field in r.text
        r = api.post("/v1/jobs/batch", json={"jobs": [{**TRAIN, "placement": placement}]})
        assert r.status_code == 403, r.text
    assert api.post("/v1/jobs", json={**TRAIN, "placement": {"cluster": "onprem"}}).status_code == 201


def test_a_queued_job_moves_when_another_cluster_would_start_it_sooner(api, cp, fleet):
    """Judged again every RAYLANE_FLEET_RENOMINATE_S: a job waiting in cloud's queue
    (its spot group's one node taken) moves to onprem once onprem's GPUs free."""
    fd, rays = fleet
    cp.settings = cp.settings.model_copy(update={"fleet_renominate_s": 0.01})
    a, b = _two_running(api, fd, rays)  # onprem's gpu and cloud's one gpu-spot node both taken
    c = api.post("/v1/jobs", json=TRAIN).json()
    turn(fd, 3)
    jc = job(api, c["id"])
    # cloud's gpu-spot is at max_nodes: on demand next, sent ahead of its scale-up
    assert (jc["status"], jc["placement"]["cluster"], jc["placement"]["node_group"]) == ("DISPATCHING", "cloud", "gpu")
    assert "cloud gpu-spot: 1 of 1 nodes busy (max_nodes): waits in its queue" in " | ".join(jc["placement"]["reasons"])
    # on-demand cloud gpu is taken by c ahead of its scale-up; d waits: everything is full
    d = api.post("/v1/jobs", json=TRAIN).json()
    turn(fd, 3)
    before = job(api, d["id"])["placement"]
    assert job(api, d["id"])["status"] == "PENDING"
    rays["onprem"].finish(submission_id(a["id"], 1))
    run_until(fd, lambda: job(api, d["id"])["placement"]["cluster"] == "onprem", "d moved to onprem")
    events = " | ".join(e["reason"] or "" for e in api.get(f"/v1/jobs/{d['id']}/events").json())
    assert f"moved from {before['cluster']} {before['node_group']}" in events and "onprem gpu: room now" in events
    run_until(fd, lambda: submission_id(d["id"], 1) in submitted_to(rays["onprem"]), "d runs on onprem")
    assert submission_id(d["id"], 1) not in submitted_to(rays["cloud"])


def _onprem_busy_with_a_past_run(api, cp, fd, rays) -> dict:
    """A training job that ran 10 minutes on onprem, then one running there for 2
    minutes (no timeout_s: the placer expects it to end in ~8 from the first's run)."""
    from datetime import timedelta

    from raylane.orchestrator.store import db
    from raylane.orchestrator.store.tables import attempts as attempts_t, jobs as jobs_t
    from raylane.orchestrator.store.transitions import utcnow

    past = api.post("/v1/jobs", json=TRAIN).json()
    run_until(fd, lambda: submission_id(past["id"], 1) in submitted_to(rays["onprem"]), "a first run on onprem")
    rays["onprem"].start(submission_id(past["id"], 1))
    turn(fd)
    rays["onprem"].finish(submission_id(past["id"], 1))
    run_until(fd, lambda: job(api, past["id"])["status"] == "SUCCEEDED", "the first run ended")
    now = utcnow()
    with db.transaction(cp.sessions) as s:  # it ran 10 minutes
        s.execute(attempts_t.update().where(attempts_t.c.job_id == past["id"]).values(
            started_at=now - timedelta(minutes=20), ended_at=now - timedelta(minutes=10)))
    running = api.post("/v1/jobs", json=TRAIN).json()
    run_until(fd, lambda: submission_id(running["id"], 1) in submitted_to(rays["onprem"]), "the next on onprem")
    rays["onprem"].start(submission_id(running["id"], 1))
    run_until(fd, lambda: job(api, running["id"])["status"] == "RUNNING", "running on onprem")
    with db.transaction(cp.sessions) as s:  # started 2 minutes ago: ~8 left
        s.execute(jobs_t.update().where(jobs_t.c.id == running["id"]).values(started_at=now - timedelta(minutes=2)))
    return running


def test_owned_that_past_runs_say_frees_soon_is_waited_for_instead_of_renting(api, cp, fleet):
    """No timeout_s anywhere: the placer estimates when onprem's running training job
    ends from how long the last ones of its kind there ran, and a job that would wait
    less than RAYLANE_FLEET_OWNED_SOON_S for it waits on onprem instead of renting."""
    fd, rays = fleet
    cp.settings = cp.settings.model_copy(update={"fleet_owned_wait_share": 0.0})  # the 10 min alone
    _onprem_busy_with_a_past_run(api, cp, fd, rays)
    waiting = api.post("/v1/jobs", json=TRAIN).json()
    turn(fd, 3)
    pl = job(api, waiting["id"])["placement"]
    assert (pl["cluster"], pl["node_group"]) == ("onprem", "gpu"), pl["reasons"]
    assert any(r.startswith("onprem gpu: 2 of 2 GPUs held, next frees in ~8 min") for r in pl["reasons"]), pl["reasons"]
    assert rays["cloud"].submitted == []
    # with a shorter horizon for "soon", the same wait is too long: it rents
    cp.settings = cp.settings.model_copy(update={"fleet_owned_soon_s": 60.0})
    later = api.post("/v1/jobs", json=TRAIN).json()
    run_until(fd, lambda: submission_id(later["id"], 1) in submitted_to(rays["cloud"]), "rented when owned is not soon")


def test_the_queue_already_nominated_to_owned_counts_in_the_wait_and_the_budget_grows_with_the_run(api, cp, fleet):
    """Issue 45: the jobs already waiting on onprem are ahead of the next one. The
    first waits ~8 min there; the second would start after the first's ~10 min run,
    ~18 min away, past RAYLANE_FLEET_OWNED_SOON_S (10 min): it rents, though onprem's
    running job still frees in ~8 min. With RAYLANE_FLEET_OWNED_WAIT_SHARE 2 a
    training job may wait twice its 10 min run: the next one waits on onprem."""
    fd, rays = fleet
    cp.settings = cp.settings.model_copy(update={"fleet_owned_wait_share": 0.0})
    _onprem_busy_with_a_past_run(api, cp, fd, rays)
    first = api.post("/v1/jobs", json=TRAIN).json()
    turn(fd, 2)
    assert job(api, first["id"])["placement"]["cluster"] == "onprem"
    second = api.post("/v1/jobs", json=TRAIN).json()
    run_until(fd, lambda: submission_id(second["id"], 1) in submitted_to(rays["cloud"]), "the second rents")
    pl = job(api, second["id"])["placement"]
    assert any(r.startswith("onprem gpu: 2 of 2 GPUs held, 1 queued ahead (2 GPUs), starts in ~18 min (next frees "
                            "in ~8 min): after rented capacity") for r in pl["reasons"]), pl["reasons"]
    assert job(api, first["id"])["placement"]["cluster"] == "onprem"  # judged again: still its best
    cp.settings = cp.settings.model_copy(update={"fleet_owned_wait_share": 2.0})
    third = api.post("/v1/jobs", json=TRAIN).json()
    turn(fd, 3)
    pl = job(api, third["id"])["placement"]
    assert (pl["cluster"], job(api, third["id"])["status"]) == ("onprem", "PENDING"), pl["reasons"]
    assert any(r.startswith("onprem gpu: 2 of 2 GPUs held, 1 queued ahead (2 GPUs), starts in ~18 min")
               for r in pl["reasons"]), pl["reasons"]


def test_a_burst_does_not_rent_past_the_project_s_spend_cap(api, cp, fleet):
    fd, rays = fleet
    cp.settings = cp.settings.model_copy(update={"fleet_rented_spend_cap": {"default": 3.0}})
    a = api.post("/v1/jobs", json=TRAIN).json()
    run_until(fd, lambda: submission_id(a["id"], 1) in submitted_to(rays["onprem"]), "onprem's GPUs taken")
    rays["onprem"].start(submission_id(a["id"], 1))
    turn(fd)
    burst = api.post("/v1/jobs/batch", json={"jobs": [TRAIN, TRAIN, TRAIN]}).json()
    ids = [j["id"] if isinstance(j, dict) else j for j in burst.get("ids", burst.get("jobs", []))]
    assert len(ids) == 3, burst
    turn(fd, 2)
    clusters = [job(api, i)["placement"]["cluster"] for i in ids]
    assert clusters.count("cloud") == 1 and clusters.count("onprem") == 2, clusters  # $2.10/h fits $3, $4.20 not
    blocked = job(api, ids[clusters.index("onprem")])["placement"]["reasons"]
    assert any("over its cap of $3.00/h" in r for r in blocked), blocked


def test_a_cluster_unreachable_but_not_yet_lost_is_not_nominated(api, fleet):
    fd, rays = fleet
    a = api.post("/v1/jobs", json=TRAIN).json()
    run_until(fd, lambda: submission_id(a["id"], 1) in submitted_to(rays["onprem"]), "onprem's GPUs taken")
    rays["onprem"].start(submission_id(a["id"], 1))
    _outage(fd, rays["cloud"], 5)  # down, well within the grace
    b = api.post("/v1/jobs", json=TRAIN).json()
    turn(fd, 2)
    pl = job(api, b["id"])["placement"]
    assert pl["cluster"] == "onprem", pl["reasons"]  # waits for owned rather than for a cluster that does not answer
    assert any(r.startswith("cloud: unreachable") and "not yet lost" in r for r in pl["reasons"]), pl["reasons"]


def test_jobs_no_cluster_can_take_now_do_not_hold_up_those_behind_them(api, cp, fleet):
    from raylane.orchestrator.store import db
    from raylane.orchestrator.store import fleet as store_fleet
    from raylane.orchestrator.store.transitions import utcnow

    fd, rays = fleet
    _outage(fd, rays["cloud"], 61)
    turn(fd)
    assert "cloud" in fd.placer.lost
    stuck = api.post("/v1/jobs", json={**TRAIN, "priority": 90, "placement": {"cluster": "cloud"}}).json()
    turn(fd)
    assert "waits for a cluster: cloud: lost" in job(api, stuck["id"])["status_reason"]
    fresh = api.post("/v1/jobs", json={**TRAIN, "priority": 10}).json()
    with db.read(cp.sessions) as s:  # a batch of one: the stuck job, tried a moment ago, is not it
        head = store_fleet.to_place(s, lost=set(fd.placer.lost), retry_before=utcnow() - timedelta(seconds=10),
                                    limit=1)
    assert [j.id for j in head] == [fresh["id"]]


def test_a_job_preempted_on_onprem_resumes_on_rented_capacity(api, fleet):
    """Sharing on a fleet (docs/sharing.md): a high-priority job that must run on
    onprem preempts a low-priority one there; the victim, free to rent, is placed
    again at once and resumes on cloud rather than wait for onprem's GPUs. Placed
    the moment its attempt ended, before its preemptor was admitted, it is not
    nominated to onprem's momentarily free GPUs: they are owed to its preemptor
    (no re-judging of nominations moves it here: RAYLANE_FLEET_RENOMINATE_S is a
    minute, the test a few seconds)."""
    fd, rays = fleet
    for m in fd.members.values():  # preempt at once: no minimum run, no grace
        m.dispatcher.settings = m.reconciler.settings = m.dispatcher.settings.model_copy(
            update={"preempt_min_run_s": 0.0, "preempt_grace_s": 0.0})
    low = api.post("/v1/jobs", json={**TRAIN, "name": "low", "priority": 10}).json()
    sid = submission_id(low["id"], 1)
    run_until(fd, lambda: sid in submitted_to(rays["onprem"]), "the low job on onprem")
    rays["onprem"].start(sid)
    run_until(fd, lambda: job(api, low["id"])["status"] == "RUNNING", "the low job running")
    high = api.post("/v1/jobs", json={**TRAIN, "name": "high", "priority": 90,
                                      "placement": {"cluster": "onprem"}}).json()
    run_until(fd, lambda: sid in rays["onprem"].stopped, "the low job preempted on onprem")
    run_until(fd, lambda: submission_id(high["id"], 1) in submitted_to(rays["onprem"]), "the high job on onprem")
    run_until(fd, lambda: submission_id(low["id"], 2) in submitted_to(rays["cloud"]), "the low job placed on cloud")
    first, second = attempts(api, low["id"])
    assert (first["cluster"], first["cause"], first["preempt_for"]) == ("onprem", "PREEMPTED_BY_PRIORITY", high["id"])
    assert second["cluster"] == "cloud" and job(api, low["id"])["placement"]["tier"] == "rented"
    placed = [e["reason"] for e in api.get(f"/v1/jobs/{low['id']}/events").json()
              if (e["reason"] or "").startswith("placed on")]
    assert [r.split(" (")[0] for r in placed] == ["placed on onprem gpu", "placed on cloud gpu-spot"], placed
