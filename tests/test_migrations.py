"""The migration chain builds exactly the schema the code declares
(``store.tables.metadata``), on SQLite and PostgreSQL, and goes down to nothing
and up again: a column added to the tables without a migration (or a migration
that drifts from the tables) fails here, not on an operator's upgrade."""

from __future__ import annotations

from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import create_engine, inspect

from raylane.orchestrator.store import migrate
from raylane.orchestrator.store.tables import metadata


def _diffs(url: str) -> list:
    engine = create_engine(url)
    try:
        with engine.connect() as c:
            return compare_metadata(MigrationContext.configure(c), metadata)
    finally:
        engine.dispose()


def test_the_chain_is_one_line_of_revisions():
    script = ScriptDirectory.from_config(migrate.alembic_config("sqlite://"))
    assert len(script.get_heads()) == 1, script.get_heads()
    revs = list(script.walk_revisions())
    assert len(revs) == len({r.revision for r in revs})
    assert all(r.down_revision is None or isinstance(r.down_revision, str) for r in revs)  # no merges


def test_migrated_schema_matches_the_tables_and_round_trips(db_url):
    assert _diffs(db_url) == []  # db_url is migrated to head
    cfg = migrate.alembic_config(db_url)
    command.downgrade(cfg, "base")
    engine = create_engine(db_url)
    try:
        assert set(inspect(engine).get_table_names()) <= {"alembic_version"}
    finally:
        engine.dispose()
    command.upgrade(cfg, "head")
    assert _diffs(db_url) == []
