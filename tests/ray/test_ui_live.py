"""The web page live on the real cluster (#18.5): a command job prints a line a
second and the page's Follow shows them as they come, then says the job ended;
Cancel on another running job stops it; a sweep's trials appear, in the API and
on its page, while it runs, not only at its end."""

from __future__ import annotations

import threading
from pathlib import Path

import httpx
import pytest

from tests.conftest import ADMIN_HEADERS, ADMIN_TOKEN, free_port
from tests.helpers import wait_for
from tests.ray.conftest import wait_status
from tests.test_ui_browser import browser, page  # noqa: F401  (fixtures)

pytestmark = pytest.mark.ray


@pytest.fixture
def live_server(ray_settings):
    """The API with its loops on the shared cluster, served by a real uvicorn in this process."""
    import uvicorn

    from raylane.api.app import create_app

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(ray_settings), host="127.0.0.1", port=port, log_level="warning"))
    t = threading.Thread(target=server.run, daemon=True)
    t.start()
    url = f"http://127.0.0.1:{port}"
    def up():
        try:
            return httpx.get(url + "/healthz", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    wait_for(up, timeout=60, what="server up")
    yield url
    server.should_exit = True
    t.join(30)


def test_follow_a_running_jobs_log_and_cancel_another(live_server, page):  # noqa: F811
    c = httpx.Client(base_url=live_server, headers=ADMIN_HEADERS, timeout=30)
    slow = c.post("/v1/jobs", json={"name": "ticker", "kind": "command", "resources": {"cpus_per_worker": 0.1},
                                    "entrypoint": "for i in 1 2 3 4 5 6; do echo tick-$i; sleep 1; done"}).json()
    forever = c.post("/v1/jobs", json={"name": "forever", "kind": "command", "resources": {"cpus_per_worker": 0.1},
                                       "entrypoint": "sleep 600"}).json()
    page.goto(f"{live_server}/ui/?token={ADMIN_TOKEN}#/jobs/{slow['id']}")
    page.wait_for_selector("#log-follow")
    page.click("#log-follow")
    page.wait_for_function("() => document.querySelector('#log').textContent.includes('tick-2')", timeout=120_000)
    assert "tick-6" not in page.locator("#log").inner_text()  # live: the job is still printing
    page.wait_for_function("() => document.querySelector('#log').textContent.includes('tick-6')", timeout=60_000)
    page.wait_for_function("() => document.querySelector('#log-state').textContent.includes('ended')", timeout=60_000)
    assert wait_status(c, slow["id"], {"SUCCEEDED"})["status"] == "SUCCEEDED"

    wait_status(c, forever["id"], {"RUNNING"})
    page.goto(f"{live_server}/ui/#/jobs/{forever['id']}")
    page.click("#cancel")
    page.wait_for_function("() => ['CANCELLING', 'CANCELLED'].includes((document.querySelector('#job-head .badge') || {}).textContent)")
    assert wait_status(c, forever["id"], {"CANCELLED"}, timeout=60)["status"] == "CANCELLED"
    c.close()


FUNCS = str(Path(__file__).parent / "funcs")


def test_a_sweeps_trials_show_while_it_runs(live_server, page):  # noqa: F811
    c = httpx.Client(base_url=live_server, headers=ADMIN_HEADERS, timeout=30)
    spec = {"name": "slow-sweep", "kind": "sweep", "entrypoint": "funcs:slow_trial",
            "runtime_env": {"working_dir": FUNCS}, "resources": {"cpus_per_worker": 0.5},
            "sweep": {"metric": "score", "mode": "max", "num_samples": 1, "max_concurrent_trials": 2,
                      "search_space": {"x": {"grid": list(range(10))}}}}
    job = c.post("/v1/jobs", json=spec).json()
    page.goto(f"{live_server}/ui/?token={ADMIN_TOKEN}#/jobs/{job['id']}")

    def partly_done():
        j = c.get(f"/v1/jobs/{job['id']}").json()
        assert j["status"] not in ("SUCCEEDED", "FAILED", "CANCELLED"), "ended before any trial showed"
        n = len(c.get(f"/v1/jobs/{job['id']}/trials").json())
        return j["status"] == "RUNNING" and 1 <= n < 10 and n

    wait_for(partly_done, timeout=240, what="some trials stored while the sweep runs", interval=0.2)
    # The page shows them too, while its badge still says RUNNING.
    page.wait_for_function("""() => document.querySelectorAll('#trials tbody tr').length >= 1 &&
        (document.querySelector('#job-head .badge') || {}).textContent === 'RUNNING'""", timeout=60_000)
    done = wait_status(c, job["id"], {"SUCCEEDED", "FAILED"}, timeout=240)
    assert done["status"] == "SUCCEEDED", done["status_reason"]
    assert len(c.get(f"/v1/jobs/{job['id']}/trials").json()) == 10  # the final list replaced the live one
    c.close()
