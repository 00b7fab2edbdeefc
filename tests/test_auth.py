"""Authentication, roles and project scoping through the FastAPI app, on SQLite and
PostgreSQL: the route x role x project matrix, tokens (revocation, only hashes
stored, bootstrap), audit rows, submit rate limits and the job policy."""

from __future__ import annotations

import hashlib
import math
import os
import stat
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable

import httpx
import pytest
from fastapi.routing import iter_route_contexts
from sqlalchemy import select

from raylane.orchestrator.domain.profile import default_profile
from raylane.orchestrator.domain.views import TokenCreate
from raylane.orchestrator.domain.routing import GroupState, route
from raylane.orchestrator.store import db
from raylane.orchestrator.store.tables import api_tokens, audit_log
from raylane.orchestrator.testing import FakeRay
from tests.conftest import ADMIN_TOKEN
from tests.helpers import wait_for

HELLO = {"name": "hello", "kind": "command", "entrypoint": "python -c 'print(42)'"}
ROLES = ("admin", "member", "viewer", "anonymous")
TARGETS = ("own", "other")  # the caller's project (alpha) or another one (beta)
OWN, OTHER = "alpha", "beta"


def bearer(token: str | None) -> dict[str, str]:
    # An empty Authorization header overrides the admin token the `api` client sends by default.
    return {"Authorization": f"Bearer {token}" if token else ""}


@dataclass
class World:
    """Two projects, a member and a viewer of alpha, a job in each project."""

    api: Any
    cp: Any
    tokens: dict[str, str | None] = field(default_factory=dict)
    jobs: dict[str, str] = field(default_factory=dict)

    def project(self, target: str) -> str:
        return OWN if target == "own" else OTHER

    def job(self, target: str) -> str:
        return self.jobs[self.project(target)]

    def list_params(self, target: str) -> dict[str, str]:
        # "other" on a list: ask for another project with ?project=.
        return {} if target == "own" else {"project": OTHER}

    def hook(self, target: str) -> str:
        """A webhook of the target's project (a new one each call: a DELETE may have taken the last)."""
        from raylane.orchestrator.domain.views import WebhookCreate

        return self.cp.webhooks.create(WebhookCreate(url="http://8.8.8.8/hook"), project=self.project(target),
                                       actor="t").id

    def schedule(self, target: str) -> str:
        """A schedule of the target's project (a new one each call: a DELETE may have taken the last)."""
        from raylane.orchestrator.domain.views import ScheduleCreate

        return self.cp.schedules.create(ScheduleCreate(name=f"s-{uuid.uuid4().hex[:8]}", cron="@daily", spec=HELLO),
                                        project=self.project(target), actor="t").id

    def array(self, target: str) -> str:
        """An array of the target's project."""
        from raylane.orchestrator.domain.specs import JobSpec

        spec = JobSpec.model_validate({**HELLO, "array": {"size": 2, "max_parallel": 1}})
        return self.cp.submit_array(spec, project=self.project(target), actor="t").id

    def throwaway_token(self) -> str:
        return self.cp.access.create_token(TokenCreate(name="throwaway", project=OWN, role="viewer"), actor="t").id


@pytest.fixture
def world(api, cp) -> World:
    profile = default_profile()
    cp.profile = profile
    cp.router = lambda spec: route(spec, profile)
    cp.backend = FakeRay(profile)  # Ray read, not run: one node per local node of each group
    w = World(api=api, cp=cp)
    for p in (OWN, OTHER):
        assert api.post("/v1/projects", json={"name": p}).status_code == 201
        w.jobs[p] = api.post("/v1/jobs", json={**HELLO, "project": p}).json()["id"]
    w.tokens["admin"] = ADMIN_TOKEN
    w.tokens["anonymous"] = None
    for role in ("member", "viewer"):
        r = api.post("/v1/tokens", json={"name": f"{role}-1", "project": OWN, "role": role})
        assert r.status_code == 201, r.text
        w.tokens[role] = r.json()["token"]
    return w


# The rule table ----------------------------------------------------------------------
#
# Every (method, path) of the app needs a rule. Access classes:
#   PUBLIC         anyone, also without a token
#   AUTHENTICATED  any valid token; not project data (the cluster's shape, a plan, whoami)
#   READ_PROJECT   any role, own project; another project's objects are 404 to non-admins
#   WRITE_PROJECT  admin or member, own project (404 otherwise); viewers 403
#   SUBMIT         admin or member; a spec for another project is 403 to a member
#   MEMBER         admin or member, whatever the project (uploading a code package); viewers 403
#   ADMIN          admins only (403 to others)
# Anonymous callers get 401 everywhere but PUBLIC.

PUBLIC, AUTHENTICATED, READ_PROJECT, WRITE_PROJECT, SUBMIT, MEMBER, ADMIN = (
    "PUBLIC", "AUTHENTICATED", "READ_PROJECT", "WRITE_PROJECT", "SUBMIT", "MEMBER", "ADMIN")
NO_PACKAGE = "0" * 64  # a sha256 nobody uploaded


@dataclass(frozen=True)
class Req:
    method: str
    url: str
    params: dict[str, str] | None = None
    json: Any = None


@dataclass(frozen=True)
class Rule:
    access: str
    ok: int = 200  # the status when the call is allowed
    request: Callable[[World, str], Req] | None = None  # default: the method on the path as is


def get(url: str, *, scoped: bool = False) -> Callable[[World, str], Req]:
    return lambda w, t: Req("GET", url, params=w.list_params(t) if scoped else None)


def job_path(method: str, suffix: str = "") -> Callable[[World, str], Req]:
    return lambda w, t: Req(method, f"/v1/jobs/{w.job(t)}{suffix}")


RULES: dict[tuple[str, str], Rule] = {
    ("GET", "/healthz"): Rule(PUBLIC),
    ("GET", "/readyz"): Rule(PUBLIC),
    ("GET", "/openapi.json"): Rule(PUBLIC),
    ("GET", "/docs"): Rule(PUBLIC),
    ("GET", "/docs/oauth2-redirect"): Rule(PUBLIC),
    ("GET", "/redoc"): Rule(PUBLIC),
    # Code packages: whether one is stored (HEAD; 404 for one never uploaded), and an
    # upload (a body that does not hash to the path's sha256 is 422 once access is granted)
    ("GET", "/v1/packages/{sha256}"): Rule(AUTHENTICATED, 404, lambda w, t: Req("HEAD", f"/v1/packages/{NO_PACKAGE}")),
    ("PUT", "/v1/packages/{sha256}"): Rule(MEMBER, 422, lambda w, t: Req("PUT", f"/v1/packages/{NO_PACKAGE}",
                                                                         json={"not": "a zip"})),
    # Jobs
    ("POST", "/v1/jobs"): Rule(SUBMIT, 201, lambda w, t: Req("POST", "/v1/jobs", json={**HELLO, "project": w.project(t)})),
    ("POST", "/v1/jobs/batch"): Rule(SUBMIT, 201, lambda w, t: Req(
        "POST", "/v1/jobs/batch", json={"jobs": [{**HELLO, "project": w.project(t)}]})),
    ("GET", "/v1/jobs"): Rule(READ_PROJECT, request=get("/v1/jobs", scoped=True)),
    ("GET", "/v1/jobs/{job_id}"): Rule(READ_PROJECT, request=job_path("GET")),
    ("GET", "/v1/jobs/{job_id}/events"): Rule(READ_PROJECT, request=job_path("GET", "/events")),
    ("GET", "/v1/jobs/{job_id}/attempts"): Rule(READ_PROJECT, request=job_path("GET", "/attempts")),
    ("GET", "/v1/jobs/{job_id}/trials"): Rule(READ_PROJECT, request=job_path("GET", "/trials")),
    ("GET", "/v1/jobs/{job_id}/logs"): Rule(READ_PROJECT, request=job_path("GET", "/logs")),
    ("GET", "/v1/jobs/{job_id}/cost"): Rule(READ_PROJECT, request=job_path("GET", "/cost")),
    ("POST", "/v1/jobs/{job_id}/cancel"): Rule(WRITE_PROJECT, request=job_path("POST", "/cancel")),
    # Cluster
    ("POST", "/v1/plan"): Rule(AUTHENTICATED, request=lambda w, t: Req("POST", "/v1/plan", json=HELLO)),
    ("GET", "/v1/node-groups"): Rule(AUTHENTICATED),
    ("GET", "/v1/cluster"): Rule(AUTHENTICATED),
    ("GET", "/v1/kinds"): Rule(AUTHENTICATED),
    ("GET", "/v1/fleet"): Rule(AUTHENTICATED),
    # Costs
    ("GET", "/v1/costs"): Rule(READ_PROJECT, request=get("/v1/costs", scoped=True)),
    ("GET", "/v1/report"): Rule(READ_PROJECT, request=get("/v1/report", scoped=True)),
    # Access
    ("GET", "/v1/me"): Rule(AUTHENTICATED),
    ("POST", "/v1/tokens"): Rule(ADMIN, 201, lambda w, t: Req(
        "POST", "/v1/tokens", json={"name": "new", "project": w.project(t), "role": "viewer"})),
    ("GET", "/v1/tokens"): Rule(ADMIN),
    ("POST", "/v1/tokens/{token_id}/revoke"): Rule(ADMIN, request=lambda w, t: Req(
        "POST", f"/v1/tokens/{w.throwaway_token()}/revoke")),
    ("POST", "/v1/projects"): Rule(ADMIN, 201, lambda w, t: Req(
        "POST", "/v1/projects", json={"name": f"p-{uuid.uuid4().hex[:8]}"})),
    ("GET", "/v1/projects"): Rule(READ_PROJECT, request=get("/v1/projects", scoped=True)),
    ("GET", "/v1/projects/{project}/quota"): Rule(READ_PROJECT, request=lambda w, t: Req(
        "GET", f"/v1/projects/{w.project(t)}/quota")),
    ("PUT", "/v1/projects/{project}/quota"): Rule(ADMIN, request=lambda w, t: Req(
        "PUT", f"/v1/projects/{w.project(t)}/quota", json={"node_groups": {"gpu": {"max_gpus": 2}}})),
    ("GET", "/v1/audit"): Rule(ADMIN),
    # Webhooks: a project's own; another project's hook is 404 like a missing one
    ("POST", "/v1/webhooks"): Rule(WRITE_PROJECT, 201, lambda w, t: Req(
        "POST", "/v1/webhooks", json={"url": "http://8.8.8.8/hook", "project": w.project(t)})),
    ("GET", "/v1/webhooks"): Rule(READ_PROJECT, request=get("/v1/webhooks", scoped=True)),
    ("GET", "/v1/webhooks/{hook_id}"): Rule(READ_PROJECT, request=lambda w, t: Req("GET", f"/v1/webhooks/{w.hook(t)}")),
    ("DELETE", "/v1/webhooks/{hook_id}"): Rule(WRITE_PROJECT, 204, lambda w, t: Req(
        "DELETE", f"/v1/webhooks/{w.hook(t)}")),
    ("GET", "/v1/webhooks/{hook_id}/deliveries"): Rule(READ_PROJECT, request=lambda w, t: Req(
        "GET", f"/v1/webhooks/{w.hook(t)}/deliveries")),
    # Schedules: a project's own, like its jobs
    ("POST", "/v1/schedules"): Rule(SUBMIT, 201, lambda w, t: Req("POST", "/v1/schedules", json={
        "name": f"s-{uuid.uuid4().hex[:8]}", "cron": "@daily", "spec": {**HELLO, "project": w.project(t)}})),
    ("GET", "/v1/schedules"): Rule(READ_PROJECT, request=get("/v1/schedules", scoped=True)),
    ("GET", "/v1/schedules/{schedule_id}"): Rule(READ_PROJECT, request=lambda w, t: Req(
        "GET", f"/v1/schedules/{w.schedule(t)}")),
    ("POST", "/v1/schedules/{schedule_id}/pause"): Rule(WRITE_PROJECT, request=lambda w, t: Req(
        "POST", f"/v1/schedules/{w.schedule(t)}/pause")),
    ("POST", "/v1/schedules/{schedule_id}/resume"): Rule(WRITE_PROJECT, request=lambda w, t: Req(
        "POST", f"/v1/schedules/{w.schedule(t)}/resume")),
    ("DELETE", "/v1/schedules/{schedule_id}"): Rule(WRITE_PROJECT, 204, lambda w, t: Req(
        "DELETE", f"/v1/schedules/{w.schedule(t)}")),
    # Arrays: like the jobs they are made of
    ("POST", "/v1/arrays"): Rule(SUBMIT, 201, lambda w, t: Req("POST", "/v1/arrays", json={
        **HELLO, "project": w.project(t), "array": {"size": 2}})),
    ("GET", "/v1/arrays/{array_id}"): Rule(READ_PROJECT, request=lambda w, t: Req("GET", f"/v1/arrays/{w.array(t)}")),
    ("POST", "/v1/arrays/{array_id}/cancel"): Rule(WRITE_PROJECT, request=lambda w, t: Req(
        "POST", f"/v1/arrays/{w.array(t)}/cancel")),
    ("POST", "/v1/arrays/{array_id}/retry"): Rule(WRITE_PROJECT, request=lambda w, t: Req(
        "POST", f"/v1/arrays/{w.array(t)}/retry")),
    # A browser's session cookie for Ray's dashboard under /ray (any role signs in)
    ("POST", "/v1/session"): Rule(AUTHENTICATED, 204),
    ("DELETE", "/v1/session"): Rule(AUTHENTICATED, 204),
}
# Whole subtrees, whatever serves them (a mounted app, static files): a GET of the
# path itself (with a trailing slash for a mount) must answer as the rule says.
PREFIX_RULES: dict[str, Rule] = {
    # Swagger UI's and ReDoc's files for /docs and /redoc (a directory without an index page)
    "/ui/docs-assets": Rule(PUBLIC, request=get("/ui/docs-assets/swagger-ui.css")),
    "/ui": Rule(PUBLIC),
    "/metrics": Rule(ADMIN),
    # Ray's dashboard through Raylane: its reads need a token (here no Ray is attached:
    # 503); the role x endpoint matrix against a real cluster is tests/ray/test_ray_dashboard_proxy.py.
    "/ray": Rule(AUTHENTICATED, 503, request=get("/ray/api/version")),
}


def expected(rule: Rule, role: str, target: str) -> int:
    if rule.access == PUBLIC:
        return rule.ok
    if role == "anonymous":
        return 401
    if role == "admin":
        return rule.ok
    own = target == "own"
    if rule.access == AUTHENTICATED:
        return rule.ok
    if rule.access == READ_PROJECT:
        return rule.ok if own else 404
    if rule.access == WRITE_PROJECT:
        return 403 if role == "viewer" else (rule.ok if own else 404)
    if rule.access == SUBMIT:
        return 403 if role == "viewer" or not own else rule.ok
    if rule.access == MEMBER:
        return 403 if role == "viewer" else rule.ok
    if rule.access == ADMIN:
        return 403
    raise AssertionError(f"unknown access class {rule.access}")


def app_routes(app) -> list[tuple[str, str, bool]]:
    """(method, path, is_mount) for every route, HEAD left out (it follows GET)."""
    out = []
    for r in iter_route_contexts(app.routes):
        methods = sorted((r.methods or set()) - {"HEAD"})
        if not methods:
            out.append(("GET", r.path, True))  # a mount: static files or a sub-application
        out += [(m, r.path, False) for m in methods]
    return out


def rule_for(method: str, path: str) -> Rule | None:
    if (method, path) in RULES:
        return RULES[(method, path)]
    for prefix, rule in PREFIX_RULES.items():
        if path == prefix or path.startswith(prefix + "/"):
            return rule
    return None


def test_every_route_has_a_rule(api):
    missing = [f"{m} {p}" for m, p, _ in app_routes(api.app) if rule_for(m, p) is None]
    assert not missing, (
        f"no access rule for {', '.join(missing)}: add each to RULES in tests/test_auth.py "
        "(PUBLIC / AUTHENTICATED / READ_PROJECT / WRITE_PROJECT / SUBMIT / ADMIN) and make the endpoint "
        "enforce it (api/deps.py, api/auth.py)")


def test_route_role_project_matrix(world):
    """Every route x role x own/other project answers the status its rule says."""
    wrong = []
    for method, path, is_mount in app_routes(world.api.app):
        rule = rule_for(method, path)
        assert rule is not None, f"no access rule for {method} {path} (see test_every_route_has_a_rule)"
        for role in ROLES:
            for target in TARGETS:
                if rule.request is not None:
                    req = rule.request(world, target)
                else:
                    assert "{" not in path, f"{method} {path} has path parameters: give its rule a request"
                    req = Req(method, path + ("/" if is_mount else ""))
                r = world.api.request(req.method, req.url, params=req.params, json=req.json,
                                      headers=bearer(world.tokens[role]))
                want = expected(rule, role, target)
                if r.status_code != want:
                    wrong.append(f"{req.method} {path} as {role} ({target} project): {r.status_code}, "
                                 f"expected {want} [{rule.access}]: {r.text[:160]}")
    assert not wrong, "\n".join(wrong)


# Tokens ------------------------------------------------------------------------------


def test_no_or_bad_token_is_401_public_paths_stay_open(api):
    for headers in (bearer(None), bearer("rl_not-a-real-token"), {"Authorization": "Basic dXNlcjpwdw=="}):
        r = api.get("/v1/jobs", headers=headers)
        assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer", r.text
        assert "Bearer" in r.json()["detail"]
    for path in ("/healthz", "/readyz", "/openapi.json", "/docs", "/ui/"):
        assert api.get(path, headers=bearer(None)).status_code == 200, path
    me = api.get("/v1/me").json()
    assert me["role"] == "admin" and me["project"] is None and me["auth_enabled"] is True


def test_revoked_token_stops_working_at_once_and_only_its_hash_is_stored(api, cp):
    api.post("/v1/projects", json={"name": OWN})
    created = api.post("/v1/tokens", json={"name": "alice", "project": OWN, "role": "member"}).json()
    secret, tid = created["token"], created["id"]
    assert secret.startswith("rl_") and len(secret) > 40
    assert api.get("/v1/me", headers=bearer(secret)).json() == {
        "name": "alice", "project": OWN, "role": "member", "token_id": tid, "auth_enabled": True}
    # Listing never shows a secret.
    listed = {t["id"]: t for t in api.get("/v1/tokens").json()}
    assert "token" not in listed[tid] and listed[tid]["name"] == "alice"
    # The database holds the sha256 of the secret, and the secret nowhere.
    with db.transaction(cp.sessions) as s:
        rows = [dict(r) for r in s.execute(select(api_tokens)).mappings()]
    row = next(r for r in rows if r["id"] == tid)
    assert row["token_hash"] == hashlib.sha256(secret.encode()).hexdigest()
    assert all(secret not in str(v) for r in rows for v in r.values())
    assert all(ADMIN_TOKEN not in str(v) for r in rows for v in r.values())

    r = api.post(f"/v1/tokens/{tid}/revoke")
    assert r.status_code == 200 and r.json()["revoked_at"] and r.json()["revoked_by"] == "admin"
    r = api.get("/v1/me", headers=bearer(secret))
    assert r.status_code == 401
    assert api.post("/v1/jobs", json=HELLO, headers=bearer(secret)).status_code == 401
    assert api.post(f"/v1/tokens/{tid}/revoke").status_code == 200  # idempotent
    assert tid not in {t["id"] for t in api.get("/v1/tokens").json()}
    assert tid in {t["id"] for t in api.get("/v1/tokens", params={"include_revoked": True}).json()}
    assert api.post("/v1/tokens/tok_nope/revoke").status_code == 404


def test_token_rules(api):
    assert api.post("/v1/tokens", json={"name": "x", "role": "member"}).status_code == 422  # needs a project
    assert api.post("/v1/tokens", json={"name": "x", "project": "nope", "role": "member"}).status_code == 404
    assert api.post("/v1/tokens", json={"name": "x", "project": "default", "role": "owner"}).status_code == 422
    assert api.post("/v1/tokens", json={"name": "x", "project": "default", "rol": "viewer"}).status_code == 422
    api.post("/v1/projects", json={"name": OWN})
    assert api.post("/v1/projects", json={"name": OWN}).status_code == 409
    # An expired token is refused like a revoked one.
    tok = api.post("/v1/tokens", json={"name": "tmp", "project": OWN, "role": "viewer",
                                       "expires_in_days": 1}).json()
    assert api.get("/v1/me", headers=bearer(tok["token"])).status_code == 200
    with db.transaction(api.app.state.cp.sessions) as s:
        from datetime import datetime, timezone

        from sqlalchemy import update

        s.execute(update(api_tokens).where(api_tokens.c.id == tok["id"])
                  .values(expires_at=datetime(2000, 1, 1, tzinfo=timezone.utc)))
    assert api.get("/v1/me", headers=bearer(tok["token"])).status_code == 401
    # An admin token may carry a default project for its submissions.
    adm = api.post("/v1/tokens", json={"name": "ops", "project": OWN, "role": "admin"}).json()
    job = api.post("/v1/jobs", json=HELLO, headers=bearer(adm["token"])).json()
    assert job["project"] == OWN
    assert api.get(f"/v1/jobs/{job['id']}", headers=bearer(adm["token"]), params={"project": OTHER}).status_code == 404


def test_generated_admin_token_is_printed_once_and_written_0600(settings, capsys):
    from fastapi.testclient import TestClient

    from raylane.api.app import create_app
    from raylane.orchestrator.services.controlplane import ControlPlane

    settings.admin_token = None
    cp = ControlPlane(settings)
    try:
        with TestClient(create_app(settings, cp=cp)):
            pass
        out = capsys.readouterr().out
        path = settings.data_dir / "admin_token"
        secret = path.read_text().strip()
        assert secret in out and "shown once" in out
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
        with TestClient(create_app(settings, cp=cp)) as c:
            assert c.get("/v1/me", headers=bearer(secret)).json()["role"] == "admin"
            assert c.get("/v1/me", headers=bearer(ADMIN_TOKEN)).status_code == 401
        assert secret not in capsys.readouterr().out  # not generated (or printed) twice
        # Changing RAYLANE_ADMIN_TOKEN rotates: the setting's old token stops working.
        settings.admin_token = "rl_first-admin-token-aaaaaaaa"
        with TestClient(create_app(settings, cp=cp)) as c:
            assert c.get("/v1/me", headers=bearer("rl_first-admin-token-aaaaaaaa")).status_code == 200
        settings.admin_token = "rl_second-admin-token-bbbbbbb"
        with TestClient(create_app(settings, cp=cp)) as c:
            assert c.get("/v1/me", headers=bearer("rl_first-admin-token-aaaaaaaa")).status_code == 401
            assert c.get("/v1/me", headers=bearer("rl_second-admin-token-bbbbbbb")).status_code == 200
            assert c.get("/v1/me", headers=bearer(secret)).status_code == 200  # a generated one stays
    finally:
        cp.close()


def test_short_admin_token_setting_is_refused():
    from pydantic import ValidationError

    from raylane.orchestrator.settings import Settings

    with pytest.raises(ValidationError, match="at least 16"):
        Settings(admin_token="changeme")
    assert Settings(admin_token="").admin_token is None


def test_auth_disabled_every_caller_is_the_local_admin(settings, cp):
    from fastapi.testclient import TestClient

    from raylane.api.app import create_app

    settings.auth_enabled = False
    with TestClient(create_app(settings, cp=cp)) as c:
        assert c.get("/v1/me").json() == {"name": "local", "project": None, "role": "admin", "token_id": None,
                                          "auth_enabled": False}
        assert c.post("/v1/jobs", json=HELLO).status_code == 201


# Scoping -----------------------------------------------------------------------------


def test_members_see_and_touch_only_their_project(world):
    api, member, viewer = world.api, bearer(world.tokens["member"]), bearer(world.tokens["viewer"])
    mine = api.post("/v1/jobs", json=HELLO, headers=member).json()
    assert mine["project"] == OWN  # a member's job goes to its project without saying so
    listed = api.get("/v1/jobs", headers=member).json()["items"]
    assert {j["project"] for j in listed} == {OWN} and mine["id"] in {j["id"] for j in listed}
    assert {j["project"] for j in api.get("/v1/jobs", headers=viewer).json()["items"]} == {OWN}
    assert api.get("/v1/jobs", headers=member, params={"project": OWN}).status_code == 200
    # Another project's job is "not found", exactly like a job that does not exist.
    other = api.get(f"/v1/jobs/{world.jobs[OTHER]}", headers=member)
    missing = api.get("/v1/jobs/0000nope", headers=member)
    assert other.status_code == missing.status_code == 404
    assert api.post(f"/v1/jobs/{world.jobs[OTHER]}/cancel", headers=member).status_code == 404
    r = api.post("/v1/jobs", json={**HELLO, "project": OTHER}, headers=member)
    assert r.status_code == 403 and "only to project alpha" in r.json()["detail"]
    r = api.post("/v1/jobs", json=HELLO, headers=viewer)
    assert r.status_code == 403 and "viewer may only read" in r.json()["detail"]
    assert api.post(f"/v1/jobs/{mine['id']}/cancel", headers=viewer).status_code == 403
    assert api.post(f"/v1/jobs/{mine['id']}/cancel", headers=member).json()["job"]["status"] == "CANCELLED"
    # Admins see every project, or one with ?project=.
    assert {j["project"] for j in api.get("/v1/jobs").json()["items"]} == {OWN, OTHER}
    assert {j["project"] for j in api.get("/v1/jobs", params={"project": OTHER}).json()["items"]} == {OTHER}
    assert api.get(f"/v1/jobs/{world.jobs[OTHER]}", params={"project": OWN}).status_code == 404
    assert [p["name"] for p in api.get("/v1/projects", headers=viewer).json()] == [OWN]
    assert {p["name"] for p in api.get("/v1/projects").json()} >= {"default", OWN, OTHER}
    # Events carry the token owner's name as the actor.
    evs = api.get(f"/v1/jobs/{mine['id']}/events", headers=viewer).json()
    assert [e["actor"] for e in evs] == ["member-1", "member-1"]


# Audit -------------------------------------------------------------------------------


def test_every_mutating_request_is_audited(world):
    api, member = world.api, bearer(world.tokens["member"])
    before = api.get("/v1/audit", params={"limit": 500}).json()["items"]
    job = api.post("/v1/jobs", json=HELLO, headers=member).json()
    api.post(f"/v1/jobs/{job['id']}/cancel", headers=member)
    api.post("/v1/jobs", json={**HELLO, "project": OTHER}, headers=member)  # 403
    api.post("/v1/jobs", json=HELLO, headers=bearer(None))  # 401
    api.put("/v1/projects/alpha/quota", json={"node_groups": {"gpu": {"max_gpus": 1}}}, headers=member)  # 403
    api.get("/v1/jobs", headers=member)  # reads are not audited
    items = api.get("/v1/audit", params={"limit": 500}).json()["items"]
    new = items[: len(items) - len(before)]
    got = [(e["actor"], e["action"], e["status_code"], e["method"]) for e in reversed(new)]
    assert got == [
        ("member-1", "submit_job", 201, "POST"),
        ("member-1", "cancel_job", 200, "POST"),
        ("member-1", "submit_job", 403, "POST"),
        ("anonymous", "POST /v1/jobs", 401, "POST"),
        ("member-1", "set_quota", 403, "PUT"),
    ]
    assert new[-1]["target"] == job["id"]  # a submit names the job it created
    assert new[-2]["target"] == f"job_id={job['id']}" and new[-2]["path"] == f"/v1/jobs/{job['id']}/cancel"
    assert new[-1]["token_id"] and new[-1]["role"] == "member" and new[-1]["project"] == OWN
    assert new[-1]["client"] == "testclient"  # the client's address as the server saw it
    assert all(e["at"] for e in new)
    # Paged newest first; filters; admins only.
    page1 = api.get("/v1/audit", params={"limit": 2}).json()
    page2 = api.get("/v1/audit", params={"limit": 2, "cursor": page1["next_cursor"]}).json()
    assert [e["id"] for e in page1["items"] + page2["items"]] == [e["id"] for e in items[:4]]
    assert {e["actor"] for e in api.get("/v1/audit", params={"actor": "anonymous"}).json()["items"]} == {"anonymous"}
    assert api.get("/v1/audit", params={"action": "cancel_job"}).json()["items"][0]["target"] == f"job_id={job['id']}"
    assert api.get("/v1/audit", headers=member).status_code == 403
    assert api.get("/v1/audit", params={"cursor": "garbage"}).status_code == 422


def test_a_submit_writes_one_audit_row_with_its_job_and_a_replay_or_conflict_one_each(world):
    """A submit's row is written in the job's own transaction (api.auth's
    ``audit_entry``); the middleware then writes no second one. A replay with the
    same Idempotency-Key is a 200 row naming the same job; a conflict is a 409 row."""
    api, member = world.api, bearer(world.tokens["member"])
    before = len(api.get("/v1/audit", params={"limit": 500}).json()["items"])
    key = {**member, "Idempotency-Key": "audit-once"}
    first = api.post("/v1/jobs", json=HELLO, headers=key)
    again = api.post("/v1/jobs", json=HELLO, headers=key)
    clash = api.post("/v1/jobs", json={**HELLO, "name": "other"}, headers=key)
    assert (first.status_code, again.status_code, clash.status_code) == (201, 200, 409)
    items = api.get("/v1/audit", params={"limit": 500}).json()["items"]
    new = list(reversed(items[: len(items) - before]))
    assert [(e["action"], e["status_code"], e["target"]) for e in new] == [
        ("submit_job", 201, first.json()["id"]),
        ("submit_job", 200, first.json()["id"]),
        ("submit_job", 409, None),
    ]


def test_audit_rows_are_committed_before_the_response(api, cp):
    r = api.post("/v1/projects", json={"name": "gamma"})
    assert r.status_code == 201
    with db.transaction(cp.sessions) as s:
        last = s.execute(select(audit_log).order_by(audit_log.c.id.desc())).mappings().first()
    assert (last["action"], last["target"], last["status_code"]) == ("create_project", "gamma", 201)


# Rate limiting -----------------------------------------------------------------------


def test_submit_rate_limit_per_token_with_retry_after(world):
    from raylane.api.ratelimit import SubmitLimit

    world.api.app.state.submit_limit = SubmitLimit(rate_per_s=0.5, burst=3)  # 3 submits in any 6 s
    member = bearer(world.tokens["member"])
    t0 = time.monotonic()
    codes = [world.api.post("/v1/jobs", json=HELLO, headers=member).status_code for _ in range(3)]
    assert codes == [201, 201, 201]
    r = world.api.post("/v1/jobs/batch", json={"jobs": [HELLO]}, headers=member)
    took = time.monotonic() - t0
    # The first submit leaves the 6 s window 6 s after it was made: what is left of
    # that, rounded up (on a loaded machine the four requests take a while).
    assert r.status_code == 429 and "0.5/s" in r.json()["detail"]
    assert math.floor(6 - took) <= int(r.headers["retry-after"]) <= 6, (r.headers["retry-after"], took)
    # Another token has its own window; reads are never limited.
    assert world.api.post("/v1/jobs", json=HELLO).status_code == 201
    assert world.api.get("/v1/jobs", headers=member).status_code == 200


def test_submit_rate_limit_window_moves_on(world):
    from raylane.api.ratelimit import SubmitLimit

    world.api.app.state.submit_limit = SubmitLimit(rate_per_s=2, burst=2)  # 2 submits in any 1 s
    member = bearer(world.tokens["member"])

    def submit() -> int:
        return world.api.post("/v1/jobs", json=HELLO, headers=member).status_code

    assert [submit(), submit()] == [201, 201]
    r = world.api.post("/v1/jobs", json=HELLO, headers=member)
    assert r.status_code == 429 and r.headers["retry-after"] == "1"
    # Refused submits do not count: once the first two leave the window, two more pass
    # (each as its own has left: on a loaded machine the two were far apart), then no more.
    wait_for(lambda: submit() == 201, timeout=5, interval=0.1, what="the window to move past the first submit")
    wait_for(lambda: submit() == 201, timeout=5, interval=0.1, what="the window to move past the second submit")
    assert submit() == 429


REDIS_URL = "redis://127.0.0.1:6379/0"


@pytest.mark.parametrize("storage,together", [("memory://", 8), (REDIS_URL, 4)])
def test_replicas_sharing_a_redis_storage_share_the_limit(world, settings, cp, storage, together):
    """Two control planes (apps) on one database: with memory:// each allows a
    token its own burst; naming the same Redis, both together allow one burst."""
    from fastapi.testclient import TestClient

    from raylane.api.app import create_app

    shared = settings.model_copy(update={"submit_rate_per_s": 1.0, "submit_burst": 4, "rate_limit_storage": storage})
    member = bearer(world.tokens["member"])
    with TestClient(create_app(shared, cp=cp)) as a, TestClient(create_app(shared, cp=cp)) as b:
        codes = [c.post("/v1/jobs", json=HELLO, headers=member).status_code for _ in range(6) for c in (a, b)]
    assert codes.count(201) == together and codes[together:] == [429] * (12 - together), codes


# Policy --------------------------------------------------------------------------------


def test_policy_rules_refuse_with_the_rule_named(api, settings, tmp_path_factory):
    def submit(**over):
        return api.post("/v1/jobs", json={**HELLO, **over})

    r = submit(runtime_env={"env_vars": {"RAYLANE_PROJECT": "other"}})
    assert r.status_code == 403 and r.json()["rule"] == "policy.env_vars.reserved" and "RAYLANE_PROJECT" in r.text
    assert submit(runtime_env={"env_vars": {"RAY_ADDRESS": "x"}}).json()["rule"] == "policy.env_vars.reserved"
    assert submit(runtime_env={"env_vars": {"MY_FLAG": "1"}}).status_code == 201

    r = submit(runtime_env={"working_dir": "/etc"})
    assert r.status_code == 403 and r.json()["rule"] == "policy.working_dir.roots"
    code = tmp_path_factory.mktemp("code")  # under an allowed root (the temp dir), outside data_dir
    r = submit(runtime_env={"working_dir": str(code / "a" / ".." / ".." / "x")})
    assert r.status_code == 422 and r.json()["detail"][0]["rule"] == "policy.working_dir.traversal"
    assert r.json()["detail"][0]["loc"] == ["body", "runtime_env.working_dir"]
    r = submit(runtime_env={"working_dir": "relative/dir"})
    assert r.status_code == 422 and r.json()["detail"][0]["rule"] == "policy.working_dir.absolute"
    assert submit(runtime_env={"working_dir": str(code)}).status_code == 201
    # The control plane's own state (database, admin token) is never shipped.
    for inside in (settings.data_dir, settings.data_dir / "storage"):
        r = submit(runtime_env={"working_dir": str(inside)})
        assert r.status_code == 403 and r.json()["rule"] == "policy.working_dir.protected"
    # A symlink inside an allowed root that leads out of it is judged by where it leads.
    os.symlink("/etc", code / "etc-link")
    r = submit(runtime_env={"py_modules": [str(code / "etc-link")]})
    assert r.status_code == 403 and r.json()["rule"] == "policy.working_dir.roots"
    r = submit(runtime_env={"working_dir": "file:///etc"})
    assert r.status_code == 403 and r.json()["rule"] == "policy.working_dir.uri_scheme"
    assert submit(runtime_env={"working_dir": "s3://bucket/code.zip"}).status_code == 201

    settings.policy_pip_allowlist = ["numpy", "scikit-learn"]
    assert submit(runtime_env={"pip": ["numpy==2.0", "Scikit_Learn>=1"]}).status_code == 201
    r = submit(runtime_env={"pip": ["requests"]})
    assert r.status_code == 403 and r.json()["rule"] == "policy.pip.allowlist"
    for sneaky in ("--index-url=http://evil/simple", "git+https://x/y.git", "-r requirements.txt"):
        assert submit(runtime_env={"pip": [sneaky]}).json()["rule"] == "policy.pip.allowlist", sneaky
    settings.policy_allow_pip = False
    assert submit(runtime_env={"pip": ["numpy"]}).json()["rule"] == "policy.pip.allowed"

    settings.policy_max_gpus_per_job = 2
    settings.policy_max_workers_per_job = 4
    r = submit(kind="training", entrypoint="m:f", resources={"num_workers": 3, "gpus_per_worker": 1})
    assert r.status_code == 403 and r.json()["rule"] == "policy.resources.max_gpus_per_job"
    r = submit(kind="training", entrypoint="m:f", resources={"num_workers": 5})
    assert r.json()["rule"] == "policy.resources.max_workers_per_job"
    settings.policy_max_cpus_per_job = 2
    r = submit(resources={"cpus_per_worker": 2})  # 2 CPUs and the driver's 0.1
    assert r.json()["rule"] == "policy.resources.max_cpus_per_job" and "asks for 2.1 CPUs" in r.text
    # Batches name the refused index; plan applies the same rules; nothing was stored.
    before = len(api.get("/v1/jobs", params={"limit": 500}).json()["items"])
    r = api.post("/v1/jobs/batch", json={"jobs": [HELLO, {**HELLO, "runtime_env": {"env_vars": {"RAY_X": "1"}}}]})
    assert r.status_code == 403 and r.json()["detail"].startswith("jobs[1]:")
    assert len(api.get("/v1/jobs", params={"limit": 500}).json()["items"]) == before
    r = api.post("/v1/plan", json={**HELLO, "resources": {"cpus_per_worker": 2}})
    assert r.status_code == 403 and r.json()["rule"] == "policy.resources.max_cpus_per_job"


def test_state_dir_is_excluded_from_an_upload_that_contains_it(tmp_path):
    from raylane.orchestrator.domain.policy import state_excludes
    from raylane.orchestrator.domain.specs import JobSpec

    spec = JobSpec(**HELLO, runtime_env={"working_dir": str(tmp_path), "py_modules": ["s3://b/m.zip"]})
    assert state_excludes(spec, tmp_path / ".raylane") == ["/.raylane/"]
    assert state_excludes(spec, tmp_path.parent / "elsewhere") == []


# Quota endpoints -------------------------------------------------------------------


def test_quota_endpoints(world):
    api = world.api
    r = api.put("/v1/projects/alpha/quota", json={"node_groups": {"gpu": {"max_gpus": 1, "max_concurrent_jobs": 2},
                                                                   "cpu": {"max_cpus": 3}}})
    assert r.status_code == 200, r.text
    q = api.get("/v1/projects/alpha/quota", headers=bearer(world.tokens["viewer"])).json()
    unset = {"borrow_gpus": None, "borrow_cpus": None, "lend_gpus": None, "lend_cpus": None,
             "borrowed_gpus": 0, "borrowed_cpus": 0}  # sharing (docs/sharing.md), not set here
    assert q == {"project": "alpha", "node_groups": {
        "cpu": {"max_gpus": None, "max_cpus": 3.0, "max_concurrent_jobs": None, "used_gpus": 0, "used_cpus": 0,
                "active_jobs": 0, "fair_share_usage": 0.0, **unset},
        "gpu": {"max_gpus": 1.0, "max_cpus": None, "max_concurrent_jobs": 2, "used_gpus": 0, "used_cpus": 0,
                "active_jobs": 0, "fair_share_usage": 0.0, **unset}}}
    r = api.put("/v1/projects/alpha/quota", json={"node_groups": {"gpux": {"max_gpus": 1}}})
    assert r.status_code == 422 and "no node group gpux" in r.text
    assert api.put("/v1/projects/nope/quota", json={"node_groups": {}}).status_code == 404
    assert api.put("/v1/projects/alpha/quota", json={"node_groups": {"gpu": {"max_gpus": -1}}}).status_code == 422
    # PUT replaces: an empty body lifts every limit.
    api.put("/v1/projects/alpha/quota", json={"node_groups": {}})
    assert api.get("/v1/projects/alpha/quota").json()["node_groups"] == {}


# A real server --------------------------------------------------------------------------


def test_real_server_with_auth_on_generates_its_admin_token(server_factory, db_url, tmp_path):
    srv = server_factory({"RAYLANE_DATABASE_URL": db_url, "RAYLANE_DATA_DIR": str(tmp_path / "data"),
                          "RAYLANE_LOOPS_ENABLED": "false", "RAYLANE_AUTH_ENABLED": "true",
                          "RAYLANE_ADMIN_TOKEN": None}).start()
    assert httpx.get(srv.url + "/v1/jobs").status_code == 401
    secret = (tmp_path / "data" / "admin_token").read_text().strip()
    assert secret in srv.log_path.read_text()
    h = {"Authorization": f"Bearer {secret}"}
    assert httpx.post(srv.url + "/v1/jobs", json=HELLO, headers=h).status_code == 201
    assert httpx.get(srv.url + "/v1/me", headers=h).json()["role"] == "admin"
    assert httpx.get(srv.url + "/healthz").status_code == 200


def test_a_token_revoked_through_one_replica_is_refused_by_another_on_its_next_request(api, settings):
    """Two app instances on one database, each keeping verified tokens in memory: the
    second serves a token from memory (no read of api_tokens), yet refuses it on the
    first request after the first instance revoked it; an expiry written by hand too."""
    from fastapi.testclient import TestClient
    from sqlalchemy import event, update

    from raylane.api.app import create_app
    from raylane.orchestrator.services.controlplane import ControlPlane

    api.post("/v1/projects", json={"name": OWN})
    tok = api.post("/v1/tokens", json={"name": "bob", "project": OWN, "role": "member"}).json()
    tok2 = api.post("/v1/tokens", json={"name": "eve", "project": OWN, "role": "viewer"}).json()
    other_cp = ControlPlane(settings)
    token_reads = []

    @event.listens_for(other_cp.engine, "before_cursor_execute")
    def _seen(conn, cursor, statement, *args):
        if "FROM api_tokens" in statement:
            token_reads.append(statement)

    try:
        with TestClient(create_app(settings, cp=other_cp)) as other:
            for t in (tok, tok2):
                assert other.get("/v1/me", headers=bearer(t["token"])).status_code == 200
            token_reads.clear()
            assert other.get("/v1/me", headers=bearer(tok["token"])).json()["name"] == "bob"
            assert token_reads == [], "a verified token was read from the database again"

            assert api.post(f"/v1/tokens/{tok['id']}/revoke").status_code == 200
            assert other.get("/v1/me", headers=bearer(tok["token"])).status_code == 401
            assert other.post("/v1/jobs", json=HELLO, headers=bearer(tok["token"])).status_code == 401
            assert other.get("/v1/me", headers=bearer(tok2["token"])).status_code == 200  # read again, still live

            with db.transaction(api.app.state.cp.sessions) as s:  # an operator's UPDATE, around the store
                from datetime import datetime, timezone

                s.execute(update(api_tokens).where(api_tokens.c.id == tok2["id"])
                          .values(expires_at=datetime(2000, 1, 1, tzinfo=timezone.utc)))
            assert other.get("/v1/me", headers=bearer(tok2["token"])).status_code == 401
    finally:
        other_cp.close()
