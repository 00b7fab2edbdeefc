"""Ray's dashboard through Raylane (``/ray``), against the shared local cluster and
a real ``raylane-server serve``: what acts is refused for every role, reads
follow the project scoping, Ray's token never comes back, streamed logs work,
direct access to Ray still needs Ray's token, and a member's headless Chromium
opens their job's ``dashboard_url`` (job page with its log) but not another
project's job."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import httpx
import pytest

from tests.conftest import ADMIN_TOKEN, ROOT, ServerProcess
from tests.helpers import wait_for

pytestmark = pytest.mark.ray
OWN, OTHER = "alpha", "beta"
ROLES = ("admin", "member", "viewer")
# Each job's driver prints its marker and runs one Ray task (so it has a Ray job id and tasks).
DRIVER = ("import ray; ray.init(); f = ray.remote(lambda: 1); ray.get(f.remote()); "
          "print('proxy', 'marker', '{p}', sep='-', flush=True)")  # the marker is not in the entrypoint
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--headless", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--disable-quic", "--no-first-run"]
ARTIFACTS = ROOT / "test-artifacts"


class World:
    def __init__(self, srv: ServerProcess, ray_token: str, dashboard: str):
        self.srv, self.ray_token, self.dashboard = srv, ray_token, dashboard
        self.tokens: dict[str, str] = {"admin": ADMIN_TOKEN}
        self.jobs: dict[str, dict] = {}  # project -> Raylane job (terminal)
        self.ray_jobs: dict[str, dict] = {}  # project -> Ray's JobDetails
        self.seen: list[httpx.Response] = []  # every answer through /ray, checked for Ray's token

    def proxy(self, method: str, path: str, role: str | None, **kw) -> httpx.Response:
        headers = {"Authorization": f"Bearer {self.tokens[role]}"} if role else {}
        r = httpx.request(method, f"{self.srv.url}/ray/{path}", headers=headers, timeout=30, **kw)
        self.seen.append(r)
        return r


@pytest.fixture(scope="module")
def world(ray_cluster, tmp_path_factory):
    st = ray_cluster.state
    tmp = tmp_path_factory.mktemp("proxy")
    srv = ServerProcess({
        "RAYLANE_DATABASE_URL": f"sqlite:///{tmp / 'raylane.db'}", "RAYLANE_DATA_DIR": str(tmp / "data"),
        "RAYLANE_AUTH_ENABLED": "true", "RAYLANE_DASHBOARD_URL": st.dashboard_url,
        "RAYLANE_RAY_AUTH_TOKEN": st.token, "RAYLANE_RAY_ADDRESS": st.gcs_address,
        "RAYLANE_DISPATCH_INTERVAL_S": "0.5", "RAYLANE_RECONCILE_INTERVAL_S": "0.5",
        "RAYLANE_RAY_PROXY_AUDIT_EVERY": "1"}, tmp / "server.log").start(timeout=120)
    try:
        w = World(srv, st.token, st.dashboard_url)
        api = httpx.Client(base_url=srv.url, headers=srv.headers, timeout=30)
        for p in (OWN, OTHER):
            assert api.post("/v1/projects", json={"name": p}).status_code == 201
        for role in ("member", "viewer"):
            r = api.post("/v1/tokens", json={"name": f"{role}-1", "project": OWN, "role": role})
            assert r.status_code == 201, r.text
            w.tokens[role] = r.json()["token"]
        # Ray jobs of their own (not the warm lane): their driver logs, tasks and ids are Ray's.
        ids = {p: api.post("/v1/jobs", json={"name": f"job-{p}", "kind": "command", "project": p, "lane": "isolated",
                                             "entrypoint": f'python -c "{DRIVER.format(p=p)}"'}).json()["id"]
               for p in (OWN, OTHER)}

        def done(p):
            j = api.get(f"/v1/jobs/{ids[p]}").json()
            assert j["status"] == "SUCCEEDED", f"{j['status']}: {j.get('status_reason')}"
            return j

        for p in (OWN, OTHER):
            w.jobs[p] = wait_for(lambda: done(p), timeout=240, what=f"job in {p} succeeded")
            r = httpx.get(f"{st.dashboard_url}/api/jobs/{w.jobs[p]['ray_submission_id']}",
                          headers=ray_cluster.auth_headers(), timeout=10)
            w.ray_jobs[p] = r.json()
        yield w
    finally:
        srv.kill()


def sid(w: World, p: str) -> str:
    return w.jobs[p]["ray_submission_id"]


def driver_log(w: World, p: str, kind: str = "file") -> str:
    return (f"api/v0/logs/{kind}?node_id={w.ray_jobs[p]['driver_node_id']}"
            f"&filename=job-driver-{sid(w, p)}.log&lines=1000")


def tasks(w: World, p: str, what: str = "api/v0/tasks?detail=1&limit=100&") -> str:
    return f"{what}filter_keys=job_id&filter_predicates=%3D&filter_values={w.ray_jobs[p]['job_id']}"


def test_dashboard_url_points_at_the_proxied_job_page(world):
    for p in (OWN, OTHER):
        job = world.jobs[p]
        assert job["dashboard_url"] == f"{world.srv.url}/ray/#/jobs/{sid(world, p)}"
    attempts = httpx.get(f"{world.srv.url}/v1/jobs/{world.jobs[OWN]['id']}/attempts",
                         headers=world.srv.headers, timeout=10).json()
    assert attempts[0]["dashboard_url"] == f"{world.srv.url}/ray/#/jobs/{sid(world, OWN)}"


def test_every_acting_endpoint_is_refused_for_every_role(world):
    other = sid(world, OTHER)
    acting = [
        ("POST", "api/jobs/", {"json": {"entrypoint": "echo pwned", "submission_id": "through-proxy"}}),
        ("POST", f"api/jobs/{other}/stop", {}),
        ("DELETE", f"api/jobs/{other}", {}),
        ("PUT", "api/packages/gcs/_ray_pkg_0123456789abcdef.zip", {"content": b"PK\x05\x06" + b"\0" * 18}),
        ("GET", "api/packages/gcs/_ray_pkg_0123456789abcdef.zip", {}),
        ("PUT", "api/serve/applications/", {"json": {"applications": []}}),
        ("DELETE", "api/serve/applications/", {}),
        ("POST", "api/authenticate", {}),
        ("GET", "api/actors/kill?actor_id=00&force_kill=true", {}),
        ("GET", "worker/traceback?pid=1&ip=127.0.0.1", {}),
        ("GET", "worker/cpu_profile?pid=1&ip=127.0.0.1&duration=1", {}),
        ("GET", "task/traceback?task_id=00", {}),
        ("GET", "memory_profile?pid=1&ip=127.0.0.1", {}),
        ("PATCH", "api/jobs/", {}),
        ("GET", "api/jobs/%2e%2e/%2e%2e/nodes", {}),  # percent-encoded: no client folds it away
        ("GET", "static/%2e%2e/api/jobs/", {}),  # out of the public shell
    ]
    wrong = []
    for method, path, kw in acting:
        for role in ROLES:
            r = world.proxy(method, path, role, **kw)
            if r.status_code != 403:
                wrong.append(f"{method} {path} as {role}: {r.status_code} {r.text[:120]}")
        r = world.proxy(method, path, None, **kw)
        if r.status_code != 401:
            wrong.append(f"{method} {path} anonymous: {r.status_code}")
    assert not wrong, "\n".join(wrong)
    # Nothing reached Ray: no new job, the other project's job still there and finished.
    listed = httpx.get(f"{world.dashboard}/api/jobs/", headers={"Authorization": f"Bearer {world.ray_token}"},
                       timeout=10).json()
    assert "through-proxy" not in {j.get("submission_id") for j in listed}
    assert any(j.get("submission_id") == other and j["status"] == "SUCCEEDED" for j in listed)


def test_reads_follow_the_project_scoping(world):
    own, other = sid(world, OWN), sid(world, OTHER)
    own_hex, other_hex = world.ray_jobs[OWN]["job_id"], world.ray_jobs[OTHER]["job_id"]
    assert own_hex and other_hex
    for role in ROLES:
        admin = role == "admin"
        listed = world.proxy("GET", "api/jobs/", role)
        assert listed.status_code == 200, listed.text
        ids = {j.get("submission_id") for j in listed.json()}
        assert own in ids and ((other in ids) == admin), (role, ids)
        assert all((j.get("metadata") or {}).get("raylane_project") == OWN for j in listed.json()) or admin
        # One's own job: its page, its log (job API and log file), its tasks.
        assert world.proxy("GET", f"api/jobs/{own}", role).json()["submission_id"] == own
        assert "proxy-marker-alpha" in world.proxy("GET", f"api/jobs/{own}/logs", role).json()["logs"]
        r = world.proxy("GET", driver_log(world, OWN), role)
        assert r.status_code == 200 and "proxy-marker-alpha" in r.text, (role, r.status_code, r.text[:200])
        r = world.proxy("GET", tasks(world, OWN), role)
        assert r.status_code == 200 and r.json()["data"]["result"]["total"] >= 1, (role, r.text[:200])
        assert world.proxy("GET", tasks(world, OWN, "api/v0/tasks/summarize?"), role).status_code == 200
        # Another project's job: not found, by submission id or Ray's job id, and its log and tasks.
        another = [f"api/jobs/{other}", f"api/jobs/{other_hex}", f"api/jobs/{other}/logs",
                   driver_log(world, OTHER), f"api/v0/logs/file?node_id={world.ray_jobs[OTHER]['driver_node_id']}&submission_id={other}", tasks(world, OTHER),
                   tasks(world, OTHER, "api/v0/tasks/summarize?")]
        for path in another:
            r = world.proxy("GET", path, role)
            assert r.status_code == (200 if admin else 404), (role, path, r.status_code, r.text[:200])
            assert "proxy-marker-beta" not in r.text or admin
        # Cluster-wide lists and other processes' logs: admins only.
        for path in ("logical/actors", "api/v0/actors", "api/v0/placement_groups?detail=1&limit=10000",
                     "api/v0/tasks?detail=1&limit=100", "api/v0/nodes", "nodes?view=hostNameList",
                     f"api/v0/logs?node_id={world.ray_jobs[OWN]['driver_node_id']}"):
            r = world.proxy("GET", path, role)
            assert r.status_code == (200 if admin else (404 if "tasks" in path else 403)), (role, path, r.text[:200])
        r = world.proxy("GET", f"{driver_log(world, OWN)}&task_id=00", role)
        assert r.status_code != 200 or admin
        # The cluster's shape, and the app's shell, for everyone.
        for path in ("nodes?view=summary", "api/cluster_status", "api/v0/cluster_metadata", "api/version",
                     "timezone"):
            assert world.proxy("GET", path, role).status_code == 200, (role, path)
        mode = world.proxy("GET", "api/authentication_mode", role).json()
        assert mode == {"authentication_mode": "disabled"}  # the app never asks for Ray's token
    # The app itself is public, as Ray's own is; its data is not.
    page = world.proxy("GET", "", None)
    assert page.status_code == 200 and "Ray Dashboard" in page.text
    assert world.proxy("GET", "api/jobs/", None).status_code == 401
    redirect = httpx.get(f"{world.srv.url}/ray", timeout=10)
    assert redirect.status_code == 307 and redirect.headers["location"].endswith("/ray/")


def test_streamed_log_and_no_answer_carries_rays_token(world):
    # A followed log: chunks arrive while the answer is open; the client leaves first.
    url = f"{world.srv.url}/ray/{driver_log(world, OWN, 'stream')}&interval=0.5"
    got = b""
    with httpx.stream("GET", url, headers={"Authorization": f"Bearer {world.tokens['member']}"}, timeout=30) as r:
        assert r.status_code == 200
        for chunk in r.iter_raw():
            got += chunk
            if b"proxy-marker-alpha" in got:
                break
    assert b"proxy-marker-alpha" in got
    r = world.proxy("GET", driver_log(world, OTHER, "stream") + "&interval=0.5", "member")
    assert r.status_code == 404
    # Every answer of this module's requests so far: not one byte of Ray's token, body or header.
    token = world.ray_token
    assert len(token) >= 16 and world.seen
    for resp in world.seen:
        assert token not in resp.text and token not in json.dumps(dict(resp.headers)), resp.request.url


def test_refusals_and_reads_are_audited(world):
    world.proxy("POST", f"api/jobs/{sid(world, OTHER)}/stop", "member")
    world.proxy("GET", f"api/jobs/{sid(world, OTHER)}", "viewer")
    world.proxy("GET", f"api/jobs/{sid(world, OWN)}", "viewer")
    rows = httpx.get(f"{world.srv.url}/v1/audit", params={"limit": 500}, headers=world.srv.headers,
                     timeout=10).json()["items"]
    mine = [(e["method"], e["status_code"], e["actor"]) for e in rows if e["path"].startswith("/ray/")]
    assert ("POST", 403, "member-1") in mine
    assert ("GET", 404, "viewer-1") in mine
    assert ("GET", 200, "viewer-1") in mine  # RAYLANE_RAY_PROXY_AUDIT_EVERY=1 here: every read


def test_direct_access_to_rays_dashboard_still_needs_rays_token(world):
    for headers in ({}, {"Authorization": f"Bearer {world.tokens['admin']}"},
                    {"Authorization": f"Bearer {world.tokens['member']}"}):
        r = httpx.get(f"{world.dashboard}/api/jobs/", headers=headers, timeout=10)
        assert r.status_code in (401, 403), (headers, r.status_code)
    assert httpx.get(f"{world.dashboard}/api/jobs/", headers={"Authorization": f"Bearer {world.ray_token}"},
                     timeout=10).status_code == 200


def test_session_cookie_only_opens_ray_and_dies_with_its_token(world):
    api = httpx.Client(base_url=world.srv.url, headers=world.srv.headers, timeout=10)
    token = api.post("/v1/tokens", json={"name": "short-lived", "project": OWN, "role": "viewer"}).json()
    signed = httpx.post(f"{world.srv.url}/v1/session", headers={"Authorization": f"Bearer {token['token']}"},
                        timeout=10)
    assert signed.status_code == 204
    header = signed.headers["set-cookie"]
    assert "HttpOnly" in header and "SameSite=Strict" in header and "Path=/ray" in header and "Max-Age=3600" in header
    cookie = signed.cookies["raylane_session"]
    assert token["token"] not in header  # the cookie holds no secret
    jar = {"raylane_session": cookie}
    assert httpx.get(f"{world.srv.url}/ray/api/jobs/", cookies=jar, timeout=10).status_code == 200
    assert httpx.get(f"{world.srv.url}/v1/jobs", cookies=jar, timeout=10).status_code == 401  # never /v1
    forged = cookie[:-2] + ("AA" if not cookie.endswith("AA") else "BB")
    assert httpx.get(f"{world.srv.url}/ray/api/jobs/", cookies={"raylane_session": forged},
                     timeout=10).status_code == 401
    assert api.post(f"/v1/tokens/{token['id']}/revoke").status_code == 200
    assert httpx.get(f"{world.srv.url}/ray/api/jobs/", cookies=jar, timeout=10).status_code == 401


def test_proxy_is_bounded_per_token_and_frees_a_slot_when_the_client_goes(world, tmp_path):
    # A second replica on the same database (tokens shared), with tight bounds.
    st = world.srv.env
    srv = ServerProcess({k: st[k] for k in ("RAYLANE_DATABASE_URL", "RAYLANE_DASHBOARD_URL", "RAYLANE_RAY_AUTH_TOKEN",
                                            "RAYLANE_RAY_ADDRESS", "RAYLANE_AUTH_ENABLED")}
                        | {"RAYLANE_DATA_DIR": str(tmp_path / "data"), "RAYLANE_LOOPS_ENABLED": "false",
                           "RAYLANE_AUTO_MIGRATE": "false", "RAYLANE_RAY_PROXY_PER_TOKEN": "1",
                           "RAYLANE_RAY_PROXY_STREAM_MAX_S": "12"}, tmp_path / "server.log").start(timeout=120)
    try:
        member = {"Authorization": f"Bearer {world.tokens['member']}"}
        stream = f"{srv.url}/ray/{driver_log(world, OWN, 'stream')}&interval=0.5"
        with httpx.stream("GET", stream, headers=member, timeout=30) as r:
            assert r.status_code == 200
            chunks = r.iter_raw()  # held: a dropped iterator closes the response
            next(chunks)
            # The member's one slot is taken: refused before Ray is asked; another token is not.
            second = httpx.get(f"{srv.url}/ray/api/jobs/", headers=member, timeout=10)
            assert second.status_code == 429 and int(second.headers["retry-after"]) > 0, second.text
            assert "RAYLANE_RAY_PROXY_PER_TOKEN" in second.json()["detail"]
            viewer = {"Authorization": f"Bearer {world.tokens['viewer']}"}
            assert httpx.get(f"{srv.url}/ray/api/jobs/", headers=viewer, timeout=10).status_code == 200
        # The client left: its slot frees (the server saw the disconnect, not the stream's end).
        wait_for(lambda: httpx.get(f"{srv.url}/ray/api/jobs/", headers=member, timeout=10).status_code == 200,
                 timeout=8, what="the member's slot freed after the client went (before the 12 s stream cap)")
        # A stream nobody closes ends at RAYLANE_RAY_PROXY_STREAM_MAX_S, with what it had.
        with httpx.stream("GET", stream, headers=member, timeout=60) as r:
            body = r.read()
        assert b"proxy-marker-alpha" in body
    finally:
        srv.kill()


# Chromium -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def browser():
    assert Path(CHROMIUM).exists(), "no chromium: `make test` installs it (apt-get install -y chromium)"
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield b
        b.close()


def test_member_browser_opens_their_jobs_dashboard_url_but_not_another_projects(world, browser):
    ctx = browser.new_context(viewport={"width": 1360, "height": 900})
    page = ctx.new_page()
    page.set_default_timeout(30_000)
    try:
        # Sign in once through /ui with the member's Raylane token (no Ray token anywhere).
        with page.expect_response(lambda r: r.url.endswith("/v1/session") and r.request.method == "POST") as signed:
            page.goto(f"{world.srv.url}/ui/?token={world.tokens['member']}")
        assert signed.value.status == 204
        cookies = {c["name"]: c for c in ctx.cookies()}
        session = cookies["raylane_session"]
        assert session["httpOnly"] and session["sameSite"] == "Strict" and session["path"] == "/ray"
        assert page.evaluate("document.cookie") == ""  # no script can read it

        own = world.jobs[OWN]
        page.goto(own["dashboard_url"])
        page.get_by_text(sid(world, OWN)).first.wait_for()
        # The driver log, in the job page's log viewer (the marker is only in the log, not the entrypoint).
        page.get_by_text("proxy-marker-alpha").first.wait_for(timeout=60_000)
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "ray-dashboard-member-job.png"), full_page=True)

        # Another project's job page: Ray's job read answers 404 to this browser, and nothing of it shows.
        other = sid(world, OTHER)
        with page.expect_response(lambda r: r.url.endswith(f"/ray/api/jobs/{other}")) as read:
            page.goto(world.jobs[OTHER]["dashboard_url"])
        assert read.value.status == 404
        assert page.request.get(f"{world.srv.url}/ray/api/jobs/{other}").status == 404
        assert page.request.get(f"{world.srv.url}/ray/api/jobs/{sid(world, OWN)}").status == 200
        page.wait_for_load_state("networkidle")
        assert "proxy-marker-beta" not in page.content()
    finally:
        ctx.close()
