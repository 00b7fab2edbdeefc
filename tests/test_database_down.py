"""A database that stops answering is a 503 the client can retry, not a 500:
PostgreSQL refusing connections (every pooled one cut off) while a submit
comes in, then back; the retried submit is stored once."""

from __future__ import annotations

from sqlalchemy import func, select

from tests.conftest import ADMIN_HEADERS, WORKING_DIR_ROOTS, _pg_admin, fresh_pg_database

SPEC = {"name": "down", "kind": "command", "entrypoint": "true"}


def _refuse(name: str, refuse: bool) -> None:
    with _pg_admin() as admin:
        admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS {"false" if refuse else "true"}')
        if refuse:
            admin.execute("SELECT pg_terminate_backend(pid, 5000) FROM pg_stat_activity WHERE datname = %s", (name,))


def test_a_submit_while_the_database_is_unreachable_is_a_503_and_its_retry_is_stored_once(pg_template, tmp_path):
    from fastapi.testclient import TestClient

    from raylane.api.app import create_app
    from raylane.orchestrator.services.controlplane import ControlPlane
    from raylane.orchestrator.settings import Settings
    from raylane.orchestrator.store import db
    from raylane.orchestrator.store.tables import jobs

    url = fresh_pg_database(pg_template)
    name = url.rsplit("/", 1)[1]
    settings = Settings(database_url=url, data_dir=tmp_path, auto_migrate=False, loops_enabled=False,
                        admin_token=ADMIN_HEADERS["Authorization"].split()[1], submit_rate_per_s=0,
                        policy_working_dir_roots=WORKING_DIR_ROOTS, gc_freeze=False)
    cp = ControlPlane(settings)
    try:
        with TestClient(create_app(settings, cp=cp), headers=ADMIN_HEADERS) as c:
            assert c.post("/v1/jobs", json=SPEC).status_code == 201
            _refuse(name, True)
            try:
                r = c.post("/v1/jobs", json=SPEC, headers={"Idempotency-Key": "retry-me"})
                assert r.status_code == 503, r.text
                assert r.headers["Retry-After"] == "1" and "retry" in r.json()["detail"]
                assert c.get("/v1/jobs").status_code == 503  # reads too
            finally:
                _refuse(name, False)
            again = c.post("/v1/jobs", json=SPEC, headers={"Idempotency-Key": "retry-me"})
            assert again.status_code == 201, again.text
            assert c.post("/v1/jobs", json=SPEC, headers={"Idempotency-Key": "retry-me"}).status_code == 200
        with db.transaction(cp.sessions) as s:
            assert s.execute(select(func.count()).select_from(jobs)).scalar_one() == 2
    finally:
        cp.close()
