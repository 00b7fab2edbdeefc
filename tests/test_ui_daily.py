"""The job page and the dashboard link without rough edges (#48), in a real
headless Chromium against a real ``raylane-server serve`` (as
test_ui_browser.py): no stray "null" before Resubmit, a long result that wraps
with a way to see all of it, the resources a sweep really holds, the log's
state shown at once, every column of the jobs table reachable at 400 px, and a
dashboard link opened in a browser with no cookie going through a sign-in page
and back to the link. Screenshots go to test-artifacts/.
"""

from __future__ import annotations

import httpx

from raylane.orchestrator.store import db
from tests.conftest import free_port
from tests.helpers import wait_for
from tests.test_ui_browser import ARTIFACTS, SWEEP, _plane, _ran_sweep, _server, browser, page, shot  # noqa: F401

# A result as a batch job or a sweep writes it: one long line, no spaces to break at.
LONG = {"predictions": ["x" * 40 + f"-{i}" for i in range(60)], "note": "y" * 500}


def _finished_sweep(srv, url, tmp_path) -> str:
    spec = {**SWEEP, "sweep": {**SWEEP["sweep"], "max_concurrent_trials": 8}}
    r = httpx.post(srv.url + "/v1/jobs", json=spec, headers=srv.headers, timeout=30)
    assert r.status_code == 201, r.text
    job_id = r.json()["id"]
    cp = _plane(url, tmp_path)
    try:
        _ran_sweep(cp, job_id)
        from raylane.orchestrator.store.jobs import set_result

        with db.transaction(cp.sessions) as s:
            set_result(s, job_id, LONG, attempt=1)
    finally:
        cp.close()
    return job_id


def test_the_job_page_at_1400_px(server_factory, tmp_path, page):
    srv, url = _server(server_factory, tmp_path, RAYLANE_DASHBOARD_URL=f"http://127.0.0.1:{free_port()}")
    job_id = _finished_sweep(srv, url, tmp_path)
    page.set_viewport_size({"width": 1400, "height": 900})
    page.goto(f"{srv.url}/ui/?token={srv.token}#/jobs/{job_id}")
    page.wait_for_selector("#resubmit")
    page.wait_for_selector("#result")

    # No stray text beside the buttons of a finished job (no Cancel: it ended).
    actions = page.locator("#resubmit").evaluate("b => b.parentElement.textContent")
    assert "null" not in actions and actions.startswith("Resubmit"), actions
    assert "null" not in page.locator("main").inner_text()

    # Money as the CLI writes it: cents, two significant digits below a cent, never $0.0000.
    assert page.evaluate("[money(0), money(0.0014), money(0.5), money(123.456), money(0.000012)]") == \
        ["$0.00", "$0.0014", "$0.50", "$123.46", "$0.000012"]
    assert "$0.0000" not in page.locator("main").inner_text()

    # What the sweep holds: 8 trials at once of 1 CPU each, not "1 worker(s) x 1 CPU".
    held = page.locator("#job-resources").inner_text()
    assert held.startswith("8 concurrent trials x CPU 1") and "total CPU 8" in held, held

    # The log's state without a click (no Ray here: it says what the server answered),
    # and no empty black box meanwhile.
    wait_for(lambda: page.locator("#log-state").inner_text() not in ("", "reading\u2026"), timeout=15,
             what="the log read at once")
    assert "503" in page.locator("#log-state").inner_text() and not page.locator("#log").is_visible()

    # The long result wraps inside its card, is cut with a way to see all of it.
    box = page.locator("#result")
    assert box.evaluate("e => e.scrollWidth <= e.clientWidth"), "the result runs off its card"
    assert page.evaluate("document.documentElement.scrollWidth") <= 1400
    grid = page.locator(".grid2").bounding_box()
    assert page.locator("#job-resources").bounding_box()["x"] < grid["x"] + grid["width"] / 2  # cards side by side
    shown = box.inner_text()
    assert shown.endswith("\u2026") and len(shown) < 1000
    shot(page, "ui-job-1400px.png")
    page.click("#result-all")
    whole = box.inner_text()
    assert whole.rstrip().endswith("}") and '"note": "' + "y" * 500 in whole
    assert page.locator("#result-all").inner_text() == "Show less"
    shot(page, "ui-job-1400px-result-all.png")


def test_every_column_of_the_jobs_table_is_reachable_at_400_px(server_factory, tmp_path, browser):
    srv, url = _server(server_factory, tmp_path, RAYLANE_DASHBOARD_URL=f"http://127.0.0.1:{free_port()}")
    _finished_sweep(srv, url, tmp_path)
    phone = browser.new_context(viewport={"width": 400, "height": 800})
    try:
        pg = phone.new_page()
        pg.goto(f"{srv.url}/ui/?token={srv.token}#/jobs")
        pg.wait_for_selector("#jobs tr[data-job]")
        assert pg.evaluate("document.documentElement.scrollWidth") <= 400  # the page never scrolls sideways
        assert "null" not in pg.locator("main").inner_text()  # the pager said "nullnull" before
        heads = pg.locator("#jobs th")
        status = heads.nth(2)
        assert status.inner_text().upper() == "STATUS"
        box = status.bounding_box()
        assert box["x"] >= 0 and box["x"] + box["width"] <= 400, box  # in sight without scrolling
        assert pg.locator("#jobs tr[data-job] .badge").first.bounding_box()["x"] < 400
        ARTIFACTS.mkdir(exist_ok=True)
        pg.screenshot(path=str(ARTIFACTS / "ui-jobs-400px.png"), full_page=True)
        # The rest: the table scrolls sideways inside its panel, up to its last column.
        pg.locator("#jobs").evaluate("t => { const s = t.closest('.scroll'); s.scrollLeft = s.scrollWidth; }")
        last = heads.nth(heads.count() - 1)
        assert last.inner_text().upper() == "REASON"
        lb = last.bounding_box()
        assert lb["x"] >= 0 and lb["x"] < 400, lb
        pg.screenshot(path=str(ARTIFACTS / "ui-jobs-400px-scrolled.png"), full_page=True)
    finally:
        phone.close()


def test_a_dashboard_link_in_a_browser_with_no_cookie_signs_in_and_returns(server_factory, tmp_path, browser):
    srv, _ = _server(server_factory, tmp_path, RAYLANE_DASHBOARD_URL=f"http://127.0.0.1:{free_port()}")
    link = f"{srv.url}/ray/#/jobs/raylane-01m8nc9xj4knhq7tg4yck20jk3-1"
    fresh = browser.new_context(viewport={"width": 1000, "height": 700})  # no cookie, no token stored
    try:
        pg = fresh.new_page()
        pg.goto(link)
        pg.wait_for_selector("#signin-form")
        assert pg.url.startswith(f"{srv.url}/ui/signin.html?next=/ray/")
        assert pg.url.endswith("#/jobs/raylane-01m8nc9xj4knhq7tg4yck20jk3-1")  # the link's job came along
        assert "Sign in to open Ray's dashboard" in pg.inner_text("h1")
        assert "Job Query Error" not in pg.content()
        ARTIFACTS.mkdir(exist_ok=True)
        pg.screenshot(path=str(ARTIFACTS / "ui-dashboard-signin.png"), full_page=True)
        pg.fill("#signin-token", "not-a-token")
        pg.click("#signin-form button")
        pg.wait_for_function("() => document.querySelector('#signin-state').textContent.includes('refused')")
        pg.fill("#signin-token", srv.token)
        pg.click("#signin-form button")
        pg.wait_for_url(link)  # back to the link, now with the session cookie
        assert any(c["name"] == "raylane_session" for c in fresh.cookies())
        pg.reload()  # signed in: no detour any more
        assert pg.url == link
    finally:
        fresh.close()


def test_the_proxy_sends_only_browsers_without_a_session_to_sign_in(server_factory, tmp_path):
    srv, _ = _server(server_factory, tmp_path, RAYLANE_DASHBOARD_URL=f"http://127.0.0.1:{free_port()}")
    html = {"Accept": "text/html,application/xhtml+xml"}
    r = httpx.get(f"{srv.url}/ray/", headers=html, timeout=30)
    assert r.status_code == 303 and r.headers["location"] == "/ui/signin.html?next=/ray/"
    assert httpx.get(f"{srv.url}/ray/api/jobs/", timeout=30).status_code == 401  # a script: the 401
    signed = httpx.post(f"{srv.url}/v1/session", headers=srv.headers, timeout=30)
    assert signed.status_code == 204
    r = httpx.get(f"{srv.url}/ray/", headers=html, cookies=signed.cookies, timeout=30)
    assert r.status_code != 303  # signed in: Ray's page (here: nothing answers at Ray's address)
    r = httpx.get(f"{srv.url}/ray/", headers={**html, **srv.headers}, timeout=30)
    assert r.status_code != 303


def test_the_node_groups_page_shows_the_fleet_and_what_runs_where(server_factory, tmp_path, page):
    """RAYLANE_FLEET=local-hybrid: the page lists both clusters, their tier, state,
    jobs and groups (no Ray here: jobs run nowhere, the jobs are written as the
    loops would have)."""
    from raylane.orchestrator.store.tables import jobs
    from tests.test_ui_browser import _plane as plane_of

    srv, url = _server(server_factory, tmp_path, RAYLANE_FLEET="local-hybrid")
    api = httpx.Client(base_url=srv.url, headers={"Authorization": f"Bearer {srv.token}"}, timeout=30)
    ids = [api.post("/v1/jobs", json={"name": f"j{i}", "kind": "command", "entrypoint": "true"}).json()["id"]
           for i in range(3)]
    cp = plane_of(url, tmp_path)
    try:
        with db.transaction(cp.sessions) as s:
            s.execute(jobs.update().where(jobs.c.id == ids[0]).values(cluster="cloud", status="RUNNING"))
            s.execute(jobs.update().where(jobs.c.id == ids[1]).values(cluster="cloud"))
    finally:
        cp.close()
    page.set_viewport_size({"width": 1400, "height": 900})
    page.goto(f"{srv.url}/ui/?token={srv.token}#/nodes")
    page.wait_for_selector("#fleet")
    rows = {r.get_attribute("data-cluster"): r.inner_text() for r in page.locator("#fleet tbody tr").all()}
    assert set(rows) == {"onprem", "cloud"}
    assert "owned" in rows["onprem"] and "(attached)" in rows["onprem"] and "$12.00/h fixed" in rows["onprem"]
    assert "rented" in rows["cloud"] and "1 active, 1 queued" in rows["cloud"] and "gpu-spot (2 GPU) 0-1" in rows["cloud"]
    assert "0 active, 1 queued" in rows["onprem"]
    assert "lacks the other clusters' reach" in page.locator("#fleet-box").inner_text()
    shot(page, "ui-fleet.png")
