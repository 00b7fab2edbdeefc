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
