"""Webhooks (issue #18, point 4): a receiver on loopback gets every status change
of its project's jobs once, signed, with retries after it answered 500; the
delivery log says what happened; deliveries are written in the transaction of
the status change (a rolled-back change has none); two control-plane replicas
send each delivery once; bad hooks are refused with the field named."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from raylane.orchestrator.domain.states import JobStatus
from raylane.orchestrator.loops.notifier import Notifier, verify
from raylane.orchestrator.store import db, transitions
from tests.helpers import wait_for

HELLO = {"name": "hello", "kind": "command", "entrypoint": "echo hi"}


class Receiver:
    """A webhook receiver on loopback: records each request; answers the codes in
    ``script`` in turn, then 200."""

    def __init__(self, script: list[int] | None = None):
        self.requests: list[dict] = []
        self.script = list(script or [])
        self.lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                with outer.lock:
                    outer.requests.append({"headers": dict(self.headers), "body": body})
                    code = outer.script.pop(0) if outer.script else 200
                self.send_response(code)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def bodies(self) -> list[dict]:
        with self.lock:
            return [json.loads(r["body"]) for r in self.requests]

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def settings(settings):
    """The receivers here listen on loopback, which hooks may name only when allowed."""
    return settings.model_copy(update={"webhook_allow_private": True})


@pytest.fixture
def receiver():
    r = Receiver()
    yield r
    r.close()


def _hook(api, url, **body):
    r = api.post("/v1/webhooks", json={"url": url, **body})
    assert r.status_code == 201, r.text
    assert r.headers["cache-control"] == "no-store"
    return r.json()


def _cancelled_job(api, project: str | None = None) -> str:
    job = api.post("/v1/jobs", json={**HELLO, **({"project": project} if project else {})}).json()
    assert api.post(f"/v1/jobs/{job['id']}/cancel").status_code == 200
    return job["id"]


def _drain(notifier: Notifier, until, what: str, timeout: float = 30):
    """Run the notifier's passes until ``until()`` holds."""
    def step():
        notifier.run_once()
        return until()
    return wait_for(step, timeout=timeout, what=what)


def test_a_status_change_is_delivered_once_signed_after_a_500(api, cp, settings, receiver):
    receiver.script = [500]
    hook = _hook(api, receiver.url, statuses=["CANCELLED", "FAILED"])
    assert hook["secret"].startswith("whsec_") and hook["statuses"] == ["CANCELLED", "FAILED"]
    listed = api.get(f"/v1/webhooks/{hook['id']}").json()
    assert "secret" not in listed and listed["url"] == receiver.url.rsplit("/", 1)[0] + "/\u2026"  # no path
    assert hook["url"] == receiver.url  # its creator saw it whole, once
    job_id = _cancelled_job(api)
    notifier = Notifier(settings, cp.sessions)
    try:
        notifier.run_once()
        assert len(receiver.requests) == 1  # answered 500: retried after a backoff, not at once
        log = api.get(f"/v1/webhooks/{hook['id']}/deliveries").json()
        assert log[0]["status"] == "PENDING" and log[0]["attempts"] == 1 and log[0]["last_status_code"] == 500
        _drain(notifier, lambda: len(receiver.requests) == 2, "the retry")
        notifier.run_once()
    finally:
        notifier.stop()
    assert len(receiver.requests) == 2  # delivered: never sent again
    first, second = receiver.requests
    assert first["headers"]["Raylane-Delivery"] == second["headers"]["Raylane-Delivery"] == str(log[0]["id"])
    for r in receiver.requests:
        assert verify(hook["secret"], r["headers"]["Raylane-Signature"], r["body"])
        assert not verify("whsec_wrong", r["headers"]["Raylane-Signature"], r["body"])
        assert not verify(hook["secret"], r["headers"]["Raylane-Signature"], r["body"] + b" ")
    body = json.loads(second["body"])
    assert body["job"]["id"] == job_id and body["job"]["project"] == "default"
    assert (body["from_status"], body["to_status"], body["type"]) == ("PENDING", "CANCELLED", "job.status")
    log = api.get(f"/v1/webhooks/{hook['id']}/deliveries").json()
    assert [(d["status"], d["attempts"], d["last_status_code"]) for d in log] == [("DELIVERED", 2, 200)]


def test_only_the_projects_jobs_and_the_statuses_asked_for(api, cp, settings, receiver):
    assert api.post("/v1/projects", json={"name": "other"}).status_code == 201
    _hook(api, receiver.url, statuses=["CANCELLED"])
    _hook(api, receiver.url, statuses=["SUCCEEDED"])  # never fires here
    mine = _cancelled_job(api)
    _cancelled_job(api, project="other")
    notifier = Notifier(settings, cp.sessions)
    try:
        _drain(notifier, lambda: len(receiver.requests) >= 1, "a delivery")
        notifier.run_once()
    finally:
        notifier.stop()
    assert [b["job"]["id"] for b in receiver.bodies()] == [mine]


def test_a_receiver_that_keeps_failing_is_given_up_on(api, cp, settings, receiver):
    receiver.script = [500] * 10
    hook = _hook(api, receiver.url, statuses=["CANCELLED"])
    _cancelled_job(api)
    notifier = Notifier(settings.model_copy(update={"webhook_max_attempts": 2}), cp.sessions)
    try:
        _drain(notifier, lambda: api.get(f"/v1/webhooks/{hook['id']}/deliveries").json()[0]["status"] == "FAILED",
               "the delivery to fail")
    finally:
        notifier.stop()
    assert len(receiver.requests) == 2
    d = api.get(f"/v1/webhooks/{hook['id']}/deliveries").json()[0]
    assert d["attempts"] == 2 and d["last_status_code"] == 500 and "answered 500" in d["last_error"]


def test_an_unreachable_receiver_is_a_failed_try_with_its_error(api, cp, settings):
    hook = _hook(api, "http://127.0.0.1:9/nothing-listens", statuses=["CANCELLED"])
    _cancelled_job(api)
    notifier = Notifier(settings, cp.sessions)
    try:
        notifier.run_once()
    finally:
        notifier.stop()
    d = api.get(f"/v1/webhooks/{hook['id']}/deliveries").json()[0]
    assert d["status"] == "PENDING" and d["attempts"] == 1 and d["last_status_code"] is None
    assert d["last_error"] == "ConnectError"


def test_a_rolled_back_status_change_has_no_delivery(api, cp, receiver):
    hook = _hook(api, receiver.url, statuses=["CANCELLED"])
    job = api.post("/v1/jobs", json=HELLO).json()
    with pytest.raises(RuntimeError):
        with db.transaction(cp.sessions) as s:
            transitions.transition(s, job["id"], JobStatus.CANCELLED, reason="x", actor="t")
            raise RuntimeError("the rest of the transaction failed")
    assert api.get(f"/v1/webhooks/{hook['id']}/deliveries").json() == []
    assert api.get(f"/v1/jobs/{job['id']}").json()["status"] == "PENDING"


def test_deleting_a_hook_drops_its_pending_deliveries(api, cp, settings, receiver):
    hook = _hook(api, receiver.url, statuses=["CANCELLED"])
    _cancelled_job(api)
    assert api.delete(f"/v1/webhooks/{hook['id']}").status_code == 204
    assert api.get(f"/v1/webhooks/{hook['id']}").status_code == 404
    notifier = Notifier(settings, cp.sessions)
    try:
        notifier.run_once()
    finally:
        notifier.stop()
    assert receiver.requests == []


@pytest.mark.parametrize("body, field, words", [
    ({"url": "ftp://example.com/x"}, "url", "http:// or https://"),
    ({"url": "http:///nohost"}, "url", "with a host"),
    ({"url": "http://user:pw@example.com/"}, "url", "credentials"),
    ({"url": "http://example.com:99999/"}, "url", "invalid port"),
    ({"url": "http://blocked.internal/"}, "url", "RAYLANE_WEBHOOK_ALLOWED_HOSTS"),
    ({"url": "http://hooks.example.com/", "statuses": ["PENDING"]}, "statuses", "PENDING"),
    ({"url": "http://hooks.example.com/", "statuses": []}, "statuses", ""),
    ({"url": "http://hooks.example.com/", "statuses": ["DONE"]}, "statuses", ""),
    ({"url": "http://hooks.example.com/", "extra": 1}, "extra", ""),
    ({"url": "http://hooks.example.com/\ud800"}, "url", ""),
])
def test_bad_hooks_are_refused_naming_the_field(api, cp, body, field, words):
    cp.settings = cp.webhooks.settings = cp.settings.model_copy(update={"webhook_allowed_hosts": ["*.example.com",
                                                                                                   "127.0.0.1"]})
    # As raw JSON: a lone surrogate is valid JSON (an escape) but not UTF-8.
    r = api.post("/v1/webhooks", content=json.dumps(body), headers={"Content-Type": "application/json"})
    assert r.status_code == 422, r.text
    detail = r.json()["detail"]
    assert any(field in json.dumps(d.get("loc", [])) or field == d.get("field") for d in detail), detail
    assert words in json.dumps(detail)
    assert api.get("/v1/webhooks").json() == []


def test_a_hook_may_not_call_rays_dashboard(api, cp):
    cp.dashboard_url = "http://127.0.0.1:8265"
    for url in ("http://127.0.0.1:8265/api/jobs/", "http://localhost:8265/", "http://127.1:8265/x"):
        r = api.post("/v1/webhooks", json={"url": url})
        assert r.status_code == 422 and "Ray's dashboard" in r.text, url
    assert api.post("/v1/webhooks", json={"url": "http://127.0.0.1:8266/hook"}).status_code == 201


@pytest.mark.parametrize("url", ["http://127.0.0.1:9/x", "http://localhost/x", "http://169.254.169.254/latest/meta-data",
                                 "http://10.0.0.5/hook", "http://[::1]:80/x", "http://192.168.1.1/"])
def test_by_default_a_hook_must_resolve_to_public_addresses(api, cp, url):
    cp.webhooks.settings = cp.settings.model_copy(update={"webhook_allow_private": False})
    r = api.post("/v1/webhooks", json={"url": url})
    assert r.status_code == 422 and "not a public address" in r.text and "url" in str(r.json()["detail"])
    assert api.get("/v1/webhooks").json() == []


def test_the_notifier_checks_the_address_again_at_send(api, cp, settings, receiver):
    """A hook made while private receivers were allowed (or whose name now resolves
    elsewhere) is refused at send when they are not: nothing is sent."""
    hook = _hook(api, receiver.url, statuses=["CANCELLED"])
    _cancelled_job(api)
    notifier = Notifier(settings.model_copy(update={"webhook_allow_private": False}), cp.sessions)
    try:
        notifier.run_once()
    finally:
        notifier.stop()
    assert receiver.requests == []
    d = api.get(f"/v1/webhooks/{hook['id']}/deliveries").json()[0]
    assert d["status"] == "PENDING" and "not a public address" in d["last_error"]


@pytest.mark.slow
def test_two_replicas_send_each_delivery_once(server_factory, db_url, tmp_path, receiver):
    """Two real servers on one database, each with its notifier running: 20 status
    changes, 20 deliveries, each received once."""
    env = {"RAYLANE_DATABASE_URL": db_url, "RAYLANE_WEBHOOK_INTERVAL_S": "0.05", "RAYLANE_WEBHOOK_ALLOW_PRIVATE": "true"}
    a = server_factory({**env, "RAYLANE_DATA_DIR": str(tmp_path / "a")}).start()
    b = server_factory({**env, "RAYLANE_DATA_DIR": str(tmp_path / "b")}).start()
    hook = httpx.post(a.url + "/v1/webhooks", json={"url": receiver.url, "statuses": ["CANCELLED"]}).json()
    ids = []
    for i in range(20):
        srv = (a, b)[i % 2]
        job = httpx.post(srv.url + "/v1/jobs", json={**HELLO, "name": f"j{i}"}).json()
        assert httpx.post(f"{srv.url}/v1/jobs/{job['id']}/cancel").status_code == 200
        ids.append(job["id"])
    wait_for(lambda: len(receiver.requests) >= 20, timeout=60, what="20 deliveries")

    def all_delivered():
        log = httpx.get(f"{a.url}/v1/webhooks/{hook['id']}/deliveries").json()
        return len(log) == 20 and all(d["status"] == "DELIVERED" for d in log)

    wait_for(all_delivered, timeout=30, what="the log to say DELIVERED")
    assert sorted(b["job"]["id"] for b in receiver.bodies()) == sorted(ids)  # each once, none twice
    deliveries = [r["headers"]["Raylane-Delivery"] for r in receiver.requests]
    assert len(set(deliveries)) == 20 and len(receiver.requests) == 20


def test_a_schedules_ticks_reach_the_hooks_that_asked_for_them(api, cp, settings, receiver):
    """schedule.created and schedule.skipped, one delivery per handled tick, signed,
    to the hook that asked; a hook of job statuses only hears nothing of them; a tick
    handled twice (a redo) is announced once; deleting the schedule deletes its
    ticks' deliveries, so one still pending is never sent."""
    from datetime import timedelta

    from raylane.orchestrator.store import schedules as store_schedules

    hook = _hook(api, receiver.url, statuses=[], events=["schedule.created", "schedule.skipped"])
    assert hook["events"] == ["schedule.created", "schedule.skipped"] and hook["statuses"] == []
    jobs_only = _hook(api, receiver.url, statuses=["CANCELLED"])
    sch = api.post("/v1/schedules", json={"name": "tick", "cron": "* * * * *", "spec": HELLO, "overlap": "skip"})
    assert sch.status_code == 201, sch.text
    sid = sch.json()["id"]
    from sqlalchemy import update

    from raylane.orchestrator.store.tables import schedules

    with db.transaction(cp.sessions) as s:  # its ticks in the past: the notifier sends by the real clock
        first = store_schedules.get(s, sid, project=None)["next_at"] - timedelta(minutes=10)
        s.execute(update(schedules).where(schedules.c.id == sid).values(next_at=first))
    # Two ticks: the first makes a job; the second finds it still PENDING (no Ray
    # here) and is skipped by the overlap policy.
    assert cp.schedules.run_due(owner="a", now=first + timedelta(seconds=1)) == 1
    assert cp.schedules.run_due(owner="a", now=first + timedelta(minutes=1, seconds=1)) == 0
    with db.transaction(cp.sessions) as s:  # a replica redoing the first tick: recorded once, announced once
        store_schedules.record(s, sid, first, job_id=None, outcome="skipped", reason="redo", now=first,
                               project="default")
    notifier = Notifier(settings, cp.sessions)
    try:
        _drain(notifier, lambda: len(receiver.requests) >= 2, "two ticks' deliveries")
        notifier.run_once()
    finally:
        notifier.stop()
    assert len(receiver.requests) == 2
    bodies = sorted(receiver.bodies(), key=lambda b: b["tick"])
    created, skipped = bodies
    assert created["type"] == "schedule.created" and created["schedule"] == {"id": sid, "name": "tick",
                                                                              "project": "default"}
    (job,) = api.get("/v1/jobs", params={"label": f"raylane.schedule={sid}"}).json()["items"]
    assert created["job"] == {"id": job["id"]} and created["outcome"] == "created"
    assert skipped["type"] == "schedule.skipped" and skipped["job"] is None
    assert "overlap policy skip" in skipped["reason"]
    for r in receiver.requests:
        assert r["headers"]["Raylane-Event"] == json.loads(r["body"])["type"]
        assert verify(hook["secret"], r["headers"]["Raylane-Signature"], r["body"])
    log = api.get(f"/v1/webhooks/{hook['id']}/deliveries").json()
    assert sorted((d["type"], d["schedule_id"], d["status"]) for d in log) == [
        ("schedule.created", sid, "DELIVERED"), ("schedule.skipped", sid, "DELIVERED")]
    assert api.get(f"/v1/webhooks/{jobs_only['id']}/deliveries").json() == []
    # A third tick, then the schedule deleted before it was sent: nothing left to send.
    cp.schedules.run_due(owner="a", now=first + timedelta(minutes=2, seconds=1))
    assert len(api.get(f"/v1/webhooks/{hook['id']}/deliveries").json()) == 3
    assert api.delete(f"/v1/schedules/{sid}").status_code == 204
    assert api.get(f"/v1/webhooks/{hook['id']}/deliveries").json() == []  # gone with its ticks
    notifier = Notifier(settings, cp.sessions)
    try:
        notifier.run_once()
    finally:
        notifier.stop()
    assert len(receiver.requests) == 2


def test_a_hook_must_follow_something(api):
    r = api.post("/v1/webhooks", json={"url": "http://127.0.0.1:9/x", "statuses": []})
    assert r.status_code == 422 and "statuses" in str(r.json()["detail"])
    r = api.post("/v1/webhooks", json={"url": "http://127.0.0.1:9/x", "events": ["schedule.exploded"]})
    assert r.status_code == 422 and "events" in str(r.json()["detail"])


def test_a_hook_hears_only_its_own_projects_schedules(api, cp, settings, receiver):
    from datetime import timedelta

    from sqlalchemy import update

    from raylane.orchestrator.store import schedules as store_schedules
    from raylane.orchestrator.store.tables import schedules

    assert api.post("/v1/projects", json={"name": "other"}).status_code == 201
    mine = _hook(api, receiver.url, statuses=[], events=["schedule.created"])
    theirs = api.post("/v1/schedules", json={"name": "theirs", "cron": "* * * * *",
                                             "spec": {**HELLO, "project": "other"}})
    assert theirs.status_code == 201 and theirs.json()["project"] == "other", theirs.text
    sid = theirs.json()["id"]
    with db.transaction(cp.sessions) as s:
        first = store_schedules.get(s, sid, project=None)["next_at"] - timedelta(minutes=10)
        s.execute(update(schedules).where(schedules.c.id == sid).values(next_at=first))
    assert cp.schedules.run_due(owner="a", now=first + timedelta(seconds=1)) == 1
    assert api.get(f"/v1/webhooks/{mine['id']}/deliveries").json() == []
