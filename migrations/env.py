"""Alembic environment: the URL from Raylane's settings, the metadata from the store.

On PostgreSQL the upgrade holds an advisory lock, so several control-plane
replicas starting together migrate once, one after another, not at the same time.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy import text

from raylane.orchestrator.settings import Settings
from raylane.orchestrator.store.db import make_engine
from raylane.orchestrator.store.tables import metadata

MIGRATION_LOCK_ID = 0x7261796C616E65  # "raylane"


def run_migrations_online() -> None:
    connectable = context.config.attributes.get("connection")
    if connectable is not None:
        _run(connectable)
        return
    url = context.config.get_main_option("sqlalchemy.url") or Settings().resolved_database_url
    engine = make_engine(url)
    with engine.connect() as conn:
        _run(conn)
    engine.dispose()


def _run(conn) -> None:
    if conn.dialect.name == "postgresql":
        conn.execute(text("SELECT pg_advisory_lock(:k)"), {"k": MIGRATION_LOCK_ID})
    context.configure(connection=conn, target_metadata=metadata, render_as_batch=True, compare_type=True)
    with context.begin_transaction():
        context.run_migrations()
    if conn.dialect.name == "postgresql":
        conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": MIGRATION_LOCK_ID})
        conn.commit()


run_migrations_online()
