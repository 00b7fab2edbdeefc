"""The web page at /ui in a real headless Chromium (Debian's, driven by Playwright)
against a real ``raylane-server serve``: job list with filters and live status, a job
page with its trials chart, routing reasons, cost and Ray link, node groups
without Ray, and the cost report. Screenshots go to test-artifacts/.

Chromium comes from Debian (``make test`` installs it); Playwright's own browser
download is never used. Missing chromium is a failure, not a skip: CI must run this.
"""

from __future__ import annotations

import math
import shutil
from datetime import timedelta
from pathlib import Path

import httpx
import pytest
from sqlalchemy import insert

from tests.conftest import ROOT, free_port
from tests.helpers import wait_for

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--headless", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--disable-quic", "--no-first-run"]
ARTIFACTS = ROOT / "test-artifacts"
N_TRIALS = 16

SWEEP = {"name": "lr-sweep", "kind": "sweep", "entrypoint": "examples.sweep:objective", "project": "research",
         "resources": {"cpus_per_worker": 1},
         "sweep": {"metric": "loss", "mode": "min", "num_samples": N_TRIALS, "max_concurrent_trials": 4,
                   "search_space": {"lr": {"loguniform": [1e-5, 1e-2]}, "batch_size": {"choice": [16, 32, 64]}}}}
FINETUNE = {"name": "finetune", "kind": "training", "entrypoint": "examples.train:main", "project": "ml",
            "resources": {"num_workers": 2, "gpus_per_worker": 1, "cpus_per_worker": 1}, "priority": 80}
HELLO = {"name": "hello", "kind": "command", "entrypoint": "python -c 'print(42)'", "project": "ml"}


@pytest.fixture(scope="module")
def browser():
    assert Path(CHROMIUM).exists(), "no chromium: `make test` installs it (apt-get install -y chromium)"
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield b
        b.close()


@pytest.fixture
def page(browser):
    ctx = browser.new_context(viewport={"width": 1360, "height": 900})
    pg = ctx.new_page()
    pg.set_default_timeout(20_000)
    errors: list[str] = []
    pg.on("pageerror", lambda e: errors.append(str(e)))
    pg.on("console", lambda m: m.type == "error" and "Failed to load resource" not in m.text and errors.append(m.text))
    yield pg
    ctx.close()
    assert not errors, f"JavaScript errors on the page: {errors}"


def shot(page, name: str) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / name), full_page=True)


def _server(server_factory, tmp_path, **extra):
    from raylane.orchestrator.store import migrate

    url = f"sqlite:///{tmp_path / 'ui.db'}"
    migrate.upgrade(url)
    env = {"RAYLANE_DATABASE_URL": url, "RAYLANE_DATA_DIR": str(tmp_path), "RAYLANE_LOOPS_ENABLED": "false",
           "RAYLANE_AUTH_ENABLED": "true", "RAYLANE_LOG_FORMAT": "json", **extra}
    return server_factory(env).start(), url


def _plane(url, tmp_path):
    from raylane.orchestrator.services.controlplane import ControlPlane
    from raylane.orchestrator.settings import Settings

    return ControlPlane(Settings(database_url=url, data_dir=tmp_path, auto_migrate=False, loops_enabled=False))


def _ran_sweep(cp, job_id: str) -> None:
    """What dispatcher and reconciler would have written for a finished sweep: an
    attempt on spot that ran 20 minutes, its trials and result."""
    from raylane.orchestrator.domain.ids import submission_id
    from raylane.orchestrator.domain.states import JobStatus
    from raylane.orchestrator.store import db, usage_rows
    from raylane.orchestrator.store.job_reads import get_row
    from raylane.orchestrator.store.jobs import save_trials, set_result
    from raylane.orchestrator.store.tables import attempts
    from raylane.orchestrator.store.transitions import transition, utcnow

    now = utcnow()
    with db.transaction(cp.sessions) as s:
        row = get_row(s, job_id, None)
        pl = row["placement"]
        transition(s, job_id, JobStatus.DISPATCHING, reason=f"admitted to {pl['node_group']}; attempt 1",
                   actor="scheduler", attempt=1, values={"attempts": 1})
        s.execute(insert(attempts).values(
            job_id=job_id, number=1, submission_id=submission_id(job_id, 1), node_group=pl["node_group"],
            market=pl["market"], status="SUCCEEDED", resources=pl["total"], created_at=now - timedelta(minutes=21),
            started_at=now - timedelta(minutes=20), ended_at=now - timedelta(seconds=5)))
        usage_rows.track(s, job_id, 1)  # written around the store's writers
        transition(s, job_id, JobStatus.RUNNING, reason="attempt 1 running on Ray", actor="reconciler", attempt=1,
                   values={"started_at": now - timedelta(minutes=20)})
        trials = []
        for i in range(N_TRIALS):
            lr = 10 ** (-5 + 3 * i / (N_TRIALS - 1))
            loss = round((math.log10(lr) + 3.2) ** 2 + 0.05 + 0.03 * ((i * 7) % 5), 4)
            trials.append({"trial_id": f"t{i:03d}", "config": {"lr": lr, "batch_size": [16, 32, 64][i % 3]},
                           "metrics": {"loss": loss, "training_iteration": 10}, "node_group": "spot-cpu",
                           "status": "TERMINATED"})
        save_trials(s, job_id, trials, attempt=1)
        best = min(trials, key=lambda t: t["metrics"]["loss"])
        set_result(s, job_id, {"best": {"config": best["config"], "metrics": best["metrics"]},
                               "num_trials": N_TRIALS}, attempt=1)
        transition(s, job_id, JobStatus.SUCCEEDED, reason="attempt 1 succeeded", actor="reconciler", attempt=1,
                   values={"finished_at": now})


def _running(cp, job_id: str) -> None:
    from raylane.orchestrator.domain.ids import submission_id
    from raylane.orchestrator.domain.states import JobStatus
    from raylane.orchestrator.store import db, usage_rows
    from raylane.orchestrator.store.job_reads import get_row
    from raylane.orchestrator.store.tables import attempts
    from raylane.orchestrator.store.transitions import transition, utcnow

    now = utcnow()
    with db.transaction(cp.sessions) as s:
        pl = get_row(s, job_id, None)["placement"]
        transition(s, job_id, JobStatus.DISPATCHING, reason=f"admitted to {pl['node_group']}; attempt 1",
                   actor="scheduler", attempt=1, values={"attempts": 1})
        s.execute(insert(attempts).values(
            job_id=job_id, number=1, submission_id=submission_id(job_id, 1), node_group=pl["node_group"],
            market=pl["market"], status="RUNNING", resources=pl["total"], created_at=now - timedelta(hours=2),
            started_at=now - timedelta(hours=2)))
        usage_rows.track(s, job_id, 1)
        transition(s, job_id, JobStatus.RUNNING, reason="attempt 1 running on Ray", actor="reconciler", attempt=1,
                   values={"started_at": now - timedelta(hours=2)})


def test_jobs_list_job_page_trials_chart_and_costs(server_factory, tmp_path, page):
    # A Ray dashboard address where nothing listens: the server routes jobs with the
    # profile (no live view) and links attempts into that dashboard, through /ray.
    dash = f"http://127.0.0.1:{free_port()}"
    srv, url = _server(server_factory, tmp_path, RAYLANE_DASHBOARD_URL=dash)
    ids = {}
    for spec in (SWEEP, FINETUNE, HELLO):
        r = httpx.post(srv.url + "/v1/jobs", json=spec, headers=srv.headers, timeout=30)
        assert r.status_code == 201, r.text
        ids[spec["name"]] = r.json()["id"]
    cp = _plane(url, tmp_path)
    try:
        _ran_sweep(cp, ids["lr-sweep"])
        _running(cp, ids["finetune"])
    finally:
        cp.close()

    # The token comes in the URL once, is kept in localStorage and leaves the address bar.
    page.goto(f"{srv.url}/ui/?token={srv.token}")
    page.wait_for_selector("#jobs tr[data-job]")
    assert "token=" not in page.url
    assert page.locator("#jobs tr[data-job]").count() == 3
    row = page.locator(f'#jobs tr[data-job="{ids["lr-sweep"]}"]')
    assert row.locator(".badge").inner_text() == "SUCCEEDED"
    assert page.locator(f'#jobs tr[data-job="{ids["finetune"]}"] .badge').inner_text() == "RUNNING"
    # Nothing listens at the dashboard's address: the page says so above every view (from /readyz).
    page.wait_for_selector("#ray-banner:not([hidden])")
    assert page.locator("#ray-banner").inner_text().startswith("Ray cluster unreachable since ")
    shot(page, "ui-jobs.png")

    # Filters.
    page.select_option("#f-status", "RUNNING")
    wait_for(lambda: page.locator("#jobs tr[data-job]").count() == 1, timeout=10, what="filtered list")
    assert page.locator("#jobs tr[data-job]").get_attribute("data-job") == ids["finetune"]
    page.select_option("#f-status", "")
    page.fill("#f-name", "hel")
    page.press("#f-name", "Enter")
    wait_for(lambda: page.locator("#jobs tr[data-job]").count() == 1, timeout=10, what="name filter")
    page.fill("#f-name", "")
    page.press("#f-name", "Enter")
    wait_for(lambda: page.locator("#jobs tr[data-job]").count() == 3, timeout=10, what="all jobs again")
    # The kind filter offers the server's kinds (GET /v1/kinds), not a list of its own.
    from raylane.orchestrator.domain.kinds import KINDS

    wait_for(lambda: page.locator("#f-kind option").count() == len(KINDS) + 1, timeout=10, what="kinds from the API")
    assert page.locator("#f-kind option").evaluate_all("os => os.map(o => o.value)") == ["", *KINDS]
    assert page.locator('#f-kind option[value="sweep"]').get_attribute("title") == KINDS["sweep"].summary
    page.select_option("#f-kind", "sweep")
    wait_for(lambda: page.locator("#jobs tr[data-job]").count() == 1, timeout=10, what="kind filter")
    assert page.locator("#jobs tr[data-job]").get_attribute("data-job") == ids["lr-sweep"]
    page.select_option("#f-kind", "")
    wait_for(lambda: page.locator("#jobs tr[data-job]").count() == 3, timeout=10, what="all kinds again")

    # Live status: a change made elsewhere shows without reloading.
    r = httpx.post(f"{srv.url}/v1/jobs/{ids['hello']}/cancel", headers=srv.headers, timeout=30)
    assert r.json()["job"]["status"] == "CANCELLED"
    page.wait_for_function(
        f"""() => {{ const b = document.querySelector('#jobs tr[data-job="{ids["hello"]}"] .badge');
                    return b && b.textContent === 'CANCELLED'; }}""", timeout=15_000)

    # Into the sweep: trials chart with one point per trial, reasons, cost, Ray link, events.
    row.click()
    page.wait_for_selector("#trials-chart circle")
    assert page.locator("#trials-chart circle").count() == N_TRIALS
    assert page.locator("#trials-chart circle.best").count() >= 1
    assert page.locator("#trials-chart path.best-line").count() == 1
    assert page.locator("#trials tbody tr").count() == N_TRIALS
    reasons = page.locator("#reasons li").all_inner_texts()
    assert any("independent trials" in r for r in reasons), reasons
    # The link opens Ray's dashboard through this server (/ray), never Ray's own address.
    href = page.locator("#ray-link").get_attribute("href")
    assert href == f"{srv.url}/ray/#/jobs/raylane-{ids['lr-sweep']}-1", href
    assert page.locator("#events li").count() >= 4
    assert page.locator("#job-cost").inner_text().startswith("$")
    assert page.locator("#attempts tbody tr").count() == 1
    shot(page, "ui-job-sweep.png")

    # Costs: chart and tables, from /v1/costs and /v1/report.
    page.click('a[data-nav="costs"]')
    page.wait_for_selector("#cost-chart rect.cost-bar")
    assert page.locator("#gpu-decisions tbody tr").count() >= 1
    page.select_option("#c-group-by", "node_group")
    page.wait_for_function("() => [...document.querySelectorAll('#cost-chart text')].some(t => t.textContent === 'gpu')")
    shot(page, "ui-costs.png")

    # Node groups with a dashboard that does not answer: the groups, no capacity.
    page.click('a[data-nav="nodes"]')
    page.wait_for_selector("#node-groups table")
    assert "spot-cpu" in page.locator("#node-groups").inner_text()


def test_without_ray_and_without_token(server_factory, tmp_path, page):
    srv, _ = _server(server_factory, tmp_path)
    page.goto(f"{srv.url}/ui/#/jobs")
    page.wait_for_selector("#banner:not([hidden])")
    assert "token" in page.locator("#banner").inner_text()
    page.fill("#token-input", srv.token)
    page.click("#token-form button")
    page.wait_for_selector("#jobs td.empty")
    assert page.locator("#banner").is_hidden()
    # /v1/node-groups answers 422 without Ray: the page says so instead of breaking.
    page.click('a[data-nav="nodes"]')
    page.wait_for_selector("#no-ray")
    assert "no Ray cluster is attached" in page.locator("#no-ray").inner_text()
    shot(page, "ui-nodes-no-ray.png")


def test_the_page_acts_pages_and_keeps_its_state_in_the_url(server_factory, tmp_path, page, browser):
    """#18.5 without Ray: paging, filters in the URL, a project column, cancel and
    resubmit with the caller's rights, arrays and pipelines shown as groups,
    schedules with pause, and a 400 px wide page that never scrolls sideways."""
    srv, _ = _server(server_factory, tmp_path)
    post = lambda path, body: httpx.post(srv.url + path, json=body, headers=srv.headers, timeout=30)  # noqa: E731
    for p in ("ml", "research"):
        assert post("/v1/projects", {"name": p}).status_code in (201, 409)
    assert post("/v1/jobs/batch", {"jobs": [{**HELLO, "name": f"bulk-{i}"} for i in range(55)]}).status_code == 201
    research = post("/v1/jobs", {**HELLO, "name": "lonely", "project": "research"}).json()
    arr = post("/v1/arrays", {**HELLO, "name": "shard", "array": {"size": 3, "max_parallel": 1}}).json()
    pipe = post("/v1/jobs/batch", {"jobs": [{**HELLO, "name": "train"},
                                            {**HELLO, "name": "evaluate", "depends_on": ["train"]}]}).json()["ids"]
    sch = post("/v1/schedules", {"name": "nightly", "cron": "0 2 * * *", "spec": HELLO}).json()
    viewer = post("/v1/tokens", {"name": "vic", "project": "ml", "role": "viewer"}).json()["token"]

    # Paging: 50 a page, the cursor in the URL.
    page.goto(f"{srv.url}/ui/?token={srv.token}#/jobs")
    page.wait_for_selector("#jobs tr[data-job]")
    assert page.locator("#jobs tr[data-job]").count() == 50
    page.click("#page-next")
    page.wait_for_function("() => location.hash.includes('cursor=')")
    wait_for(lambda: page.locator("#jobs tr[data-job]").count() == 11, timeout=10, what="the older page")  # 61 jobs
    older = page.url
    page.click("#page-first")
    wait_for(lambda: page.locator("#jobs tr[data-job]").count() == 50, timeout=10, what="the newest page")
    page.goto(older)  # a page is a link
    wait_for(lambda: page.locator("#jobs tr[data-job]").count() == 11, timeout=10, what="the older page by its URL")

    # Filters are the URL too, and the project shows in its column.
    page.goto(f"{srv.url}/ui/#/jobs?project=research&status=PENDING")
    wait_for(lambda: page.locator("#jobs tr[data-job]").count() == 1, timeout=10, what="research's job")
    assert page.locator("#f-project").input_value() == "research"
    assert page.locator("#f-status").input_value() == "PENDING"
    assert "research" in page.locator(f'#jobs tr[data-job="{research["id"]}"]').inner_text()

    # Arrays and pipelines as groups.
    page.goto(f"{srv.url}/ui/#/jobs?label=raylane.array%3D{arr['id']}")
    wait_for(lambda: page.locator("#jobs tr[data-job]").count() == 3, timeout=10, what="the array's members")
    assert page.locator("#jobs .tag").all_inner_texts() == ["array #2", "array #1", "array #0"]
    page.locator("#jobs tr[data-job] a.mono").first.click()
    page.wait_for_selector("#array-counts")
    assert "PENDING 3" in page.locator("#array-counts").inner_text() and "held" in page.locator("#array-counts").inner_text()
    page.goto(f"{srv.url}/ui/#/jobs/{pipe[1]}")
    page.wait_for_selector("#parents li")
    parent = page.locator("#parents li").inner_text()
    assert "train" in parent and "PENDING" in parent and "needs it to succeed" in parent

    # Cancel, then resubmit, as the admin.
    page.goto(f"{srv.url}/ui/#/jobs/{research['id']}")
    page.click("#cancel")
    page.wait_for_function("() => (document.querySelector('#job-head .badge') || {}).textContent === 'CANCELLED'")
    assert page.locator("#cancel").count() == 0  # nothing left to cancel
    page.click("#resubmit")
    page.wait_for_function(f"() => location.hash.startsWith('#/jobs/') && !location.hash.endsWith('{research['id']}')")
    page.wait_for_function("() => (document.querySelector('#job-head .badge') || {}).textContent === 'PENDING'")
    assert page.locator("#job-project").inner_text().startswith("research")

    # Schedules: listed with the next run, paused from the page.
    page.click('a[data-nav="schedules"]')
    page.wait_for_selector(f'tr[data-schedule="{sch["id"]}"]')
    page.click(f'tr[data-schedule="{sch["id"]}"] button')
    page.wait_for_function(f"""() => (document.querySelector('tr[data-schedule="{sch["id"]}"]') || {{textContent: ''}}).textContent.includes('paused')""")

    # A viewer sees the same buttons; the server refuses, and the page says why.
    page.goto(f"{srv.url}/ui/?token={viewer}#/jobs/{pipe[0]}")
    page.click("#cancel")
    page.wait_for_function("() => (document.querySelector('#action-msg') || {textContent: ''}).textContent.includes('refused')")
    assert "viewer may only read" in page.locator("#action-msg").inner_text()

    # A phone: 400 px wide, nothing scrolls sideways on the list or a job.
    phone = browser.new_context(viewport={"width": 400, "height": 800})
    try:
        pg = phone.new_page()
        pg.goto(f"{srv.url}/ui/?token={srv.token}#/jobs")
        pg.wait_for_selector("#jobs tr[data-job]")
        assert pg.evaluate("document.documentElement.scrollWidth") <= 400
        ARTIFACTS.mkdir(exist_ok=True)
        pg.screenshot(path=str(ARTIFACTS / "ui-jobs-400px.png"), full_page=True)
        pg.goto(f"{srv.url}/ui/#/jobs/{pipe[1]}")
        pg.wait_for_selector("#parents li")
        assert pg.evaluate("document.documentElement.scrollWidth") <= 400
        pg.screenshot(path=str(ARTIFACTS / "ui-job-400px.png"), full_page=True)
    finally:
        phone.close()
