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


def test_sqlites_lock_is_the_databases_availability_a_broken_statement_is_not(tmp_path):
    """SQLite raises OperationalError for both: "database is locked" may pass when
    tried again (503 and Retry-After), "no such table" never will (a 500 with a
    traceback, not a retry loop)."""
    import sqlite3

    from sqlalchemy import exc, text

    from raylane.orchestrator.store import db

    engine = db.make_engine(f"sqlite:///{tmp_path / 'x.db'}")
    try:
        engine.connect().close()  # the file made, in WAL mode
        holder = sqlite3.connect(tmp_path / "x.db", isolation_level=None)
        holder.execute("BEGIN IMMEDIATE")  # another process holds the write lock
        with engine.connect() as other:
            other.connection.dbapi_connection.execute("PRAGMA busy_timeout=0")
            try:
                other.execute(text("CREATE TABLE t (x INTEGER)"))  # the engine begins IMMEDIATE: locked
            except exc.OperationalError as e:
                locked = e
            other.rollback()
        holder.execute("ROLLBACK")
        holder.close()
        with engine.connect() as other:
            try:
                other.execute(text("SELECT * FROM no_such_table"))
            except exc.OperationalError as e:
                missing = e
        assert "locked" in str(locked) and db.is_transient(locked)
        assert "no such table" in str(missing) and not db.is_transient(missing)
        assert not db.is_transient(ValueError("locked"))
    finally:
        engine.dispose()


def test_a_broken_schema_is_a_500_not_a_retry_forever(settings, cp):
    """A table gone (a half-applied migration, a hand-edited database) fails every
    retry: the client gets a 500 it can report, not a 503 telling it to retry."""
    from fastapi.testclient import TestClient
    from sqlalchemy import text

    from raylane.api.app import create_app
    from raylane.orchestrator.store import db

    with TestClient(create_app(settings, cp=cp), headers=ADMIN_HEADERS, raise_server_exceptions=False) as c:
        job = c.post("/v1/jobs", json=SPEC).json()
        assert c.get(f"/v1/jobs/{job['id']}/events").status_code == 200
        with db.transaction(cp.sessions) as s:
            s.execute(text("ALTER TABLE events RENAME TO events_gone"))
        r = c.get(f"/v1/jobs/{job['id']}/events")
        assert r.status_code == 500 and "Retry-After" not in r.headers, (r.status_code, r.text)
