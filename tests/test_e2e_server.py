"""End to end against a real `raylane-server serve` (uvicorn) on a free port."""

from __future__ import annotations

import httpx
import pytest

HELLO = {"name": "hello", "kind": "command", "entrypoint": "python -c 'print(42)'"}


@pytest.fixture
def server_env(db_url, tmp_path):
    return {"RAYLANE_DATABASE_URL": db_url, "RAYLANE_DATA_DIR": str(tmp_path), "RAYLANE_LOOPS_ENABLED": "false"}


def test_submit_survives_sigkill_restart(server_factory, server_env):
    srv = server_factory(server_env).start()
    r = httpx.post(srv.url + "/v1/jobs", json=HELLO, headers={"Idempotency-Key": "e2e-1"})
    assert r.status_code == 201
    job = r.json()
    assert httpx.post(srv.url + f"/v1/jobs/{job['id']}/cancel").json()["job"]["status"] == "CANCELLED"
    srv.kill(9)  # SIGKILL: no shutdown hooks run

    srv2 = server_factory(server_env).start()
    got = httpx.get(srv2.url + f"/v1/jobs/{job['id']}").json()
    assert got["status"] == "CANCELLED" and got["name"] == "hello"
    evs = httpx.get(srv2.url + f"/v1/jobs/{job['id']}/events").json()
    assert [e["to_status"] for e in evs] == ["PENDING", "CANCELLED"]
    # The idempotency key survives too: the retry after the crash is the same job.
    again = httpx.post(srv2.url + "/v1/jobs", json=HELLO, headers={"Idempotency-Key": "e2e-1"})
    assert again.status_code == 200 and again.json()["id"] == job["id"]


def test_chunked_body_over_limit_is_413(server_factory, server_env):
    srv = server_factory({**server_env, "RAYLANE_MAX_BODY_BYTES": "65536"}).start()

    def chunks():
        yield b'{"name": "'
        for _ in range(100):
            yield b"x" * 4096
        yield b'"}'

    r = httpx.post(srv.url + "/v1/jobs", content=chunks(), headers={"content-type": "application/json"})
    assert r.status_code == 413 and "larger than 65536" in r.json()["detail"]
    assert httpx.get(srv.url + "/v1/jobs").json()["items"] == []
    assert httpx.get(srv.url + "/docs").status_code == 200



@pytest.mark.slow
def test_two_worker_processes_serve_one_port_and_a_killed_one_is_replaced(server_factory, pg_template, tmp_path):
    """RAYLANE_WORKERS=2 on PostgreSQL: one port, two uvicorn processes (two replicas),
    the schema migrated once before they start. Submits from 8 clients at once, one
    worker killed -9 midway (uvicorn starts another): every acknowledged submit is
    stored once (clients retry with the same Idempotency-Key)."""
    import os
    import signal
    from concurrent.futures import ThreadPoolExecutor
    from pathlib import Path

    from tests.conftest import fresh_pg_database
    from tests.helpers import wait_for

    url = fresh_pg_database(pg_template)
    sp = server_factory({"RAYLANE_DATABASE_URL": url, "RAYLANE_WORKERS": "2", "RAYLANE_LOOPS_ENABLED": "false",
                         "RAYLANE_DATA_DIR": str(tmp_path)}).start()

    def workers() -> list[int]:
        kids = Path(f"/proc/{sp.proc.pid}/task/{sp.proc.pid}/children").read_text().split()
        out = []
        for k in kids:  # uvicorn's workers, not multiprocessing's resource tracker
            try:
                if b"spawn_main" in Path(f"/proc/{k}/cmdline").read_bytes():
                    out.append(int(k))
            except OSError:
                pass  # it just ended
        return out

    first = wait_for(lambda: len(workers()) == 2 and workers(), timeout=60, what="two worker processes")

    def submit(i: int) -> str:
        for _ in range(100):
            try:
                r = httpx.post(sp.url + "/v1/jobs", json={**HELLO, "name": f"w{i}"},
                               headers={"Idempotency-Key": f"w-{i}"}, timeout=10)
                if r.status_code in (200, 201):
                    return r.json()["id"]
            except httpx.HTTPError:
                pass  # the killed worker's connection: send again, same key
        raise AssertionError(f"submit {i} never acknowledged")

    with ThreadPoolExecutor(8) as pool:
        early = list(pool.map(submit, range(60)))
        os.kill(first[0], signal.SIGKILL)
        late = list(pool.map(submit, range(60, 120)))
    wait_for(lambda: len(workers()) == 2 and first[0] not in workers(), timeout=60, what="a new worker")
    ids = early + late
    assert len(set(ids)) == 120
    listed = httpx.get(sp.url + "/v1/jobs", params={"limit": 500}, timeout=10).json()["items"]
    assert sorted(j["id"] for j in listed) == sorted(ids)  # each stored once, nothing else


@pytest.mark.slow
def test_a_browser_session_holds_on_every_worker(server_factory, tmp_path):
    """The session cookie (Ray's dashboard under /ray) is signed by one worker and
    checked by whichever the next request reaches: they share one secret. Ray is
    down here: 502 is "signed in, Ray unreachable", 401 would be a refused cookie."""
    from tests.conftest import ADMIN_TOKEN, free_port

    sp = server_factory({"RAYLANE_WORKERS": "2", "RAYLANE_LOOPS_ENABLED": "false", "RAYLANE_AUTH_ENABLED": "true",
                         "RAYLANE_DATA_DIR": str(tmp_path), "RAYLANE_ADMIN_TOKEN": ADMIN_TOKEN,
                         "RAYLANE_DASHBOARD_URL": f"http://127.0.0.1:{free_port()}"}).start()
    signed_in = httpx.post(sp.url + "/v1/session", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}, timeout=10)
    assert signed_in.status_code == 204
    codes = set()
    for _ in range(20):  # new connections: both workers answer some
        with httpx.Client(cookies=signed_in.cookies, timeout=10) as c:
            codes.add(c.get(sp.url + "/ray/api/jobs/").status_code)
    assert codes == {502}, codes
    assert httpx.get(sp.url + "/ray/api/jobs/", timeout=10).status_code == 401  # no cookie: refused
