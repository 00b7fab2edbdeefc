"""One backend per cluster (``orchestrator/backends/fleet.py``), attempts that
record their cluster (migration 0018), and submission ids unique across clusters."""

from __future__ import annotations

import pytest

from raylane.orchestrator.backends.fleet import FleetBackends
from raylane.orchestrator.domain.errors import Invalid
from raylane.orchestrator.domain.fleet import Fleet
from raylane.orchestrator.domain.ids import submission_id
from raylane.orchestrator.domain.profile import default_profile

HEAD = {"name": "head", "role": "head", "cpus": 0, "memory_gb": 2}
WORKER = {"name": "cpu", "cpus": 4, "memory_gb": 2, "min_nodes": 1, "max_nodes": 1, "price_per_hour": 0.2}


def two(tmp_path) -> Fleet:
    (tmp_path / "onprem-token").write_text("onprem-secret\n")
    return Fleet.parse({"name": "two", "clusters": [
        {"name": "onprem", "tier": "owned", "dashboard_url": "http://10.0.0.5:8265", "gcs_address": "10.0.0.5:6380",
         "token_file": str(tmp_path / "onprem-token"), "cost": {"model": "fixed", "per_hour": 5},
         "groups": [HEAD, WORKER]},
        {"name": "cloud", "tier": "rented", "dashboard_url": "https://ray.cloud.example", "token_env": "CLOUD_TOK",
         "cost": {"model": "per_node_hour"}, "groups": [HEAD, WORKER]}]})


def fake(url, token, gcs_address=None):
    return {"url": url, "token": token, "gcs": gcs_address}


def test_each_cluster_gets_its_own_backend_reach_and_token(tmp_path):
    fb = FleetBackends.build(two(tmp_path), "onprem", environ={"CLOUD_TOK": "cloud-secret"}, make=fake)
    assert fb.of("onprem") == {"url": "http://10.0.0.5:8265", "token": "onprem-secret", "gcs": "10.0.0.5:6380"}
    assert fb.of("cloud") == {"url": "https://ray.cloud.example", "token": "cloud-secret", "gcs": None}
    assert fb.of(None) is fb.of("onprem")  # an attempt with no recorded cluster: the attached one
    with pytest.raises(Invalid) as e:
        fb.of("mars")
    assert e.value.field == "cluster"


def test_a_cluster_that_cannot_be_reached_is_refused_naming_the_field(tmp_path):
    with pytest.raises(Invalid) as e:
        FleetBackends.build(two(tmp_path), "onprem", environ={}, make=fake)
    assert e.value.field == "clusters.cloud.token_env"
    local = Fleet.load("local-hybrid")  # no reach until the local fleet fills it in
    with pytest.raises(Invalid) as e:
        FleetBackends.build(local, "onprem", make=fake)
    assert e.value.field == "clusters.onprem.dashboard_url"


def test_the_one_cluster_of_today_keeps_its_token_setting_and_builds_a_real_backend():
    from raylane.orchestrator.backends.ray_jobs import RayJobsBackend

    single = Fleet.single(default_profile(), dashboard_url="http://127.0.0.1:1")
    fb = FleetBackends.build(single, "default", default_token="tok")
    backend = fb.of(None)
    assert isinstance(backend, RayJobsBackend) and backend.dashboard_url == "http://127.0.0.1:1"
    assert backend.http.headers["Authorization"] == "Bearer tok"
    backend.http.close()


def test_submission_ids_are_unique_across_clusters():
    """An attempt number is the job's, whatever cluster runs it: a retry elsewhere
    never reuses the id of the attempt on a cluster that may come back."""
    ids = {submission_id("01jobid", n) for n in range(1, 6)}
    assert len(ids) == 5 and all(i.startswith("raylane-01jobid-") for i in ids)


def test_an_attempt_records_the_cluster_its_placement_names(cp):
    from raylane.orchestrator.domain.profile import default_profile
    from raylane.orchestrator.domain.routing import route
    from raylane.orchestrator.domain.specs import JobSpec
    from raylane.orchestrator.store import db, queue
    from raylane.orchestrator.store.job_reads import list_attempts
    from raylane.orchestrator.store.transitions import utcnow

    spec = JobSpec.model_validate({"name": "hello", "kind": "command", "entrypoint": "true"})
    placement = route(spec, default_profile()).model_copy(update={"cluster": "onprem", "tier": "owned"})
    job, _ = cp.submit(spec, project="default", actor="test")
    now = utcnow()
    with db.transaction(cp.sessions) as s:
        (waiting,) = [q for q in queue.queued(s, now=now) if q.id == job.id]
        queue.admit(s, waiting, placement, passed_over=[], owner="t", now=now, lease_until=now)
    with db.read(cp.sessions) as s:
        (attempt,) = list_attempts(s, job.id, project=None)
    assert attempt.cluster == "onprem"


class Submits:
    """What the dispatcher asks of a Ray backend to submit a job, recorded (no Ray)."""

    def __init__(self):
        from raylane.orchestrator.backends.reachability import Reachability

        self.submitted: dict[str, dict] = {}
        self.reachability = Reachability("ray")

    def cluster_view(self):
        from tests.test_scheduler import view

        return view()

    def put_inputs(self, sid, env):
        return f"inputs/{sid}"

    def forget_inputs(self, sid):
        pass

    def submit(self, *, submission_id, metadata, **_):
        self.submitted[submission_id] = metadata


def test_ray_job_metadata_names_the_cluster_of_a_fleet_placement(settings):
    from raylane.orchestrator.domain.routing import route
    from raylane.orchestrator.domain.specs import JobSpec
    from raylane.orchestrator.loops.dispatcher import Dispatcher
    from raylane.orchestrator.services.controlplane import ControlPlane

    plane = ControlPlane(settings)
    try:
        profile = default_profile()
        plane.router = lambda spec: route(spec, profile).model_copy(update={"cluster": "onprem", "tier": "owned"})
        ray = Submits()
        plane.dispatcher = Dispatcher(settings, plane.sessions, ray, profile)
        job, _ = plane.submit(JobSpec(name="c", kind="command", entrypoint="true"), project="default", actor="t")
        plane.dispatcher.run_once()
        meta = ray.submitted[submission_id(job.id, 1)]
        assert meta["raylane_cluster"] == "onprem" and meta["raylane_job_id"] == job.id
    finally:
        plane.close()


def test_timeout_ends_is_the_soonest_running_job_timeout_per_group(cp):
    from datetime import timedelta

    from sqlalchemy import update

    from raylane.orchestrator.domain.specs import JobSpec
    from raylane.orchestrator.store import db
    from raylane.orchestrator.store import fleet as store_fleet
    from raylane.orchestrator.store.tables import jobs
    from raylane.orchestrator.store.transitions import utcnow

    now = utcnow()
    made = []
    for name, timeout, started_ago in (("a", 600, 120), ("b", 900, 0), ("c", None, 0)):
        doc = {"name": name, "kind": "command", "entrypoint": "true", **({"timeout_s": timeout} if timeout else {})}
        job, _ = cp.submit(JobSpec.model_validate(doc), project="default", actor="t")
        made.append(job.id)
        with db.transaction(cp.sessions) as s:  # as the reconciler leaves a running job
            s.execute(update(jobs).where(jobs.c.id == job.id).values(
                status="RUNNING", node_group="cpu", started_at=now - timedelta(seconds=started_ago)))
    with db.read(cp.sessions) as s:
        ends = store_fleet.timeout_ends(s, now=now)
    assert ends == {"cpu": pytest.approx(480)}
