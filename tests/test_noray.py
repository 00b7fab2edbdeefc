"""A server whose Ray cluster cannot be reached (its dashboard URL is a closed local
port): it still accepts jobs, and says which part is missing everywhere a user
looks: ``/readyz`` (200, ``degraded``, ``ray`` unreachable since when), each
queued job's reason (written once per outage), ``raylane submit --wait`` and
``raylane wait``, and one warning in the log per outage, not one per pass.
"""

from __future__ import annotations

import json
import logging
import signal
import subprocess
import sys

import httpx
import pytest
import yaml

from tests.conftest import ADMIN_HEADERS, ROOT, ServerProcess, free_port
from tests.helpers import wait_for

HELLO = {"name": "hello", "kind": "command", "entrypoint": "python -c 'print(42)'"}
UNREACHABLE = "Ray cluster unreachable since "
PASSES = 5  # dispatcher passes watched for a second warning


def _ray_warnings(caplog) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.levelno >= logging.WARNING and r.name.startswith("raylane")]


def test_no_ray_readyz_job_reason_and_one_warning(settings, caplog):
    from fastapi.testclient import TestClient

    from raylane.api.app import create_app
    from raylane.orchestrator.services.controlplane import ControlPlane
    from raylane.orchestrator.store import db
    from raylane.orchestrator.store.job_reads import list_events

    dash = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    s = settings.model_copy(update={"dashboard_url": dash, "loops_enabled": True, "dispatch_interval_s": 0.05})
    cp = ControlPlane(s)
    caplog.set_level(logging.INFO, logger="raylane")
    try:
        with TestClient(create_app(s, cp=cp), headers=ADMIN_HEADERS) as api:
            r = api.post("/v1/jobs", json=HELLO)
            assert r.status_code == 201, r.text
            jid = r.json()["id"]

            job = wait_for(lambda: (j := api.get(f"/v1/jobs/{jid}").json())["status_reason"].startswith(UNREACHABLE)
                           and j, what="the job's reason to name Ray")
            assert job["status"] == "PENDING"

            ready = api.get("/readyz")
            # Accepting jobs (a load balancer keeps sending submits), not able to run them.
            assert ready.status_code == 200
            body = ready.json()
            assert body["status"] == "degraded" and body["accepting_jobs"] and not body["running_jobs"]
            assert body["database"]["ok"] and not body["ray"]["ok"] and body["ray"]["state"] == "unreachable"
            assert body["ray"]["reason"] in job["status_reason"] and "Ray" in body["reason"]

            # Several passes later: still one warning, and the reason was written once.
            first = cp.dispatcher.passes
            wait_for(lambda: cp.dispatcher.passes >= first + PASSES, what=f"{PASSES} more dispatcher passes")
            second = api.post("/v1/jobs", json={**HELLO, "name": "second"}).json()["id"]
            wait_for(lambda: api.get(f"/v1/jobs/{second}").json()["status_reason"] == job["status_reason"],
                     what="a job submitted during the outage to name Ray")
            warnings = _ray_warnings(caplog)
            assert len(warnings) == 1, [r.getMessage() for r in warnings]
            assert "unreachable" in warnings[0].getMessage() and dash in warnings[0].getMessage()
            with db.transaction(cp.sessions) as sess:
                reasons = [e.reason for e in list_events(sess, jid, project=None)]
            assert sum(UNREACHABLE in x for x in reasons) == 1, reasons
    finally:
        cp.close()


def test_outage_begins_once_and_ends_once(caplog):
    from raylane.orchestrator.backends.reachability import REACHABLE, UNREACHABLE as DOWN, Reachability

    caplog.set_level(logging.INFO, logger="raylane")
    t = Reachability("http://ray.example:8265")
    assert t.now().state == "unknown"
    since = t.down("refused")
    assert t.down("refused again") == since and t.now().state == DOWN
    t.up()
    t.up()
    assert t.now().state == REACHABLE
    assert t.down("refused") >= since  # a new outage: a new start
    levels = [(r.levelname, r.getMessage().split(" (")[0]) for r in caplog.records]
    assert levels == [("WARNING", "Ray cluster at http://ray.example:8265 unreachable"),
                      ("INFO", "Ray cluster at http://ray.example:8265 reachable again"),
                      ("WARNING", "Ray cluster at http://ray.example:8265 unreachable")]


def test_readyz_without_a_ray_cluster_attached_is_ok(api):
    body = api.get("/readyz").json()
    assert body["status"] == "ok" and body["ray"]["state"] == "not attached" and not body["running_jobs"]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    from raylane.orchestrator.store import migrate

    tmp = tmp_path_factory.mktemp("noray")
    url = f"sqlite:///{tmp / 'raylane.db'}"
    migrate.upgrade(url)
    env = {"RAYLANE_DATABASE_URL": url, "RAYLANE_DATA_DIR": str(tmp), "RAYLANE_LOOPS_ENABLED": "true",
           "RAYLANE_DASHBOARD_URL": f"http://127.0.0.1:{free_port()}"}
    sp = ServerProcess(env, tmp / "server.log").start()
    yield sp
    sp.kill()


def test_cli_wait_prints_that_ray_is_unreachable(server, tmp_path):
    from raylane import Client, JobStatus
    from tests.test_cli import CLI_START_S, EXIT_AFTER_CTRL_C_S, PipeLines, env_for, rl, submitted_id

    health = Client(server.url).health()
    assert health.ok and health.status == "degraded" and health.ray.state == "unreachable"
    spec = tmp_path / "hello.yaml"
    spec.write_text(yaml.safe_dump(HELLO))
    p = subprocess.Popen([sys.executable, "-m", "raylane.client.cli", "submit", str(spec), "--wait"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT, env=env_for(server.url))
    lines = PipeLines(p)
    try:
        job_id = submitted_id(lines.until("out", r"Submitted job", CLI_START_S))
        line = lines.until("err", UNREACHABLE, CLI_START_S)
        assert "PENDING" in line
        p.send_signal(signal.SIGINT)
        p.wait(EXIT_AFTER_CTRL_C_S)
    finally:
        p.kill()
    assert p.returncode == 130
    # `raylane wait` on the job tells the same story, bounded by its own timeout.
    r = rl("wait", job_id, "--timeout", "0", url=server.url)
    assert r.returncode == 3 and UNREACHABLE in r.stderr, r.stderr
    assert httpx.get(f"{server.url}/v1/jobs/{job_id}").json()["status"] == JobStatus.PENDING.value


def test_jobs_claimed_as_ray_went_away_say_so_and_are_submitted_once_when_it_answers(settings):
    """The dashboard lists nodes but its Jobs API no longer answers (Ray went away
    within a pass): every queued job and every attempt claimed in that pass says
    "Ray cluster unreachable" after that one pass, each once, with no further
    submit tried in it; when Ray answers, the first pass submits the same
    attempts (same ids, no new attempt), and the jobs that do not fit go back
    to their admission reason."""
    import httpx

    from raylane.orchestrator.domain.profile import default_profile
    from raylane.orchestrator.domain.specs import JobSpec
    from raylane.orchestrator.services.controlplane import ControlPlane
    from raylane.orchestrator.store import db
    from raylane.orchestrator.store.job_reads import list_events

    ray = {"jobs_api": False, "dashboard": True}
    posted: list[str] = []

    def dashboard(req: httpx.Request) -> httpx.Response:
        if not ray["dashboard"] or (req.url.path.startswith("/api/jobs") and not ray["jobs_api"]):
            raise httpx.ConnectError("connection refused", request=req)
        if req.url.path == "/nodes":  # one 2-CPU node in group cpu: two 1-CPU commands fit, the third waits
            node = {"raylet": {"nodeId": "n1", "state": "ALIVE", "resourcesTotal": {"CPU": 2},
                               "labels": {"ray.io/node-group": "cpu", "ray.io/market-type": "ON_DEMAND"}}}
            return httpx.Response(200, json={"data": {"summary": [node]}})
        if req.method == "POST" and req.url.path == "/api/jobs/":
            posted.append(json.loads(req.content)["submission_id"])
            return httpx.Response(200, json={"submission_id": posted[-1]})
        return httpx.Response(404)

    cp = ControlPlane(settings)
    try:
        from raylane.orchestrator.services.assembly import attach_ray

        attach_ray(cp, "http://ray.invalid", None, default_profile())
        cp.backend.http = httpx.Client(base_url="http://ray.invalid", transport=httpx.MockTransport(dashboard))
        ids = [cp.submit(JobSpec(name=f"j{i}", kind="command", entrypoint="true"), project="default",
                         actor="t")[0].id for i in range(3)]

        cp.dispatcher.run_once()  # nodes listed, two admitted, the first submit refused
        reasons = {j: cp.get(j, project=None).status_reason for j in ids}
        assert all(r.startswith(UNREACHABLE) for r in reasons.values()), reasons
        assert posted == []
        states = sorted(cp.get(j, project=None).status.value for j in ids)
        assert states == ["DISPATCHING", "DISPATCHING", "PENDING"], states

        ray["dashboard"] = False
        for _ in range(3):  # the outage goes on: nothing claimed, nothing rewritten
            cp.dispatcher.run_once()
        assert {j: cp.get(j, project=None).status_reason for j in ids} == reasons
        with db.transaction(cp.sessions) as s:
            for j in ids:
                said = [e.reason for e in list_events(s, j, project=None) if e.reason and UNREACHABLE in e.reason]
                assert len(said) == 1, said

        ray.update(dashboard=True, jobs_api=True)
        cp.dispatcher.run_once()
        jobs = {j: cp.get(j, project=None) for j in ids}
        submitted = [j for j in jobs.values() if j.status.value == "DISPATCHING"]
        waiting = [j for j in jobs.values() if j.status.value == "PENDING"]
        assert len(submitted) == 2 and len(waiting) == 1, {j.id: (j.status, j.status_reason) for j in jobs.values()}
        assert sorted(posted) == sorted(f"raylane-{j.id}-1" for j in submitted), posted  # same attempts, once each
        assert all(j.status_reason.startswith("submitted to Ray") for j in submitted), [j.status_reason for j in submitted]
        assert UNREACHABLE not in waiting[0].status_reason and "cpu" in waiting[0].status_reason, waiting[0].status_reason
    finally:
        cp.close()
