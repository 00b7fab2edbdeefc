"""Run and check Alembic migrations from code (start-up, /readyz, tests)."""

from __future__ import annotations

import logging
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy.engine import Engine

# The folder of ``raylane.migrations`` beside that of ``raylane.orchestrator``,
# found by path: importing the ``raylane.migrations`` package from the store was a
# hidden circle (its env.py, which Alembic runs, imports the store). In a checkout
# they are the top-level folders orchestrator/ and migrations/; installed, raylane/
# orchestrator/ and raylane/migrations/ (pyproject.toml's package-dir).
MIGRATIONS_DIR = Path(__file__).parent.parent.parent / "migrations"
log = logging.getLogger(__name__)


def alembic_config(url: str) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return cfg


def upgrade(url: str, revision: str = "head", *, quiet: bool = False) -> None:
    """Migrate to ``revision``. ``quiet`` (the server's start-up): one log line
    for the whole run instead of Alembic's line per migration (~20 on a new
    database), which buried what a start-up has to say to a person."""
    if not quiet:
        command.upgrade(alembic_config(url), revision)
        return
    chatty = logging.getLogger("alembic.runtime.migration")
    level = chatty.level
    steps: list[str] = []

    class _Count(logging.Filter):
        def filter(self, record: logging.LogRecord) -> bool:
            if record.getMessage().startswith("Running upgrade"):
                steps.append(record.getMessage())
            return False

    counter = _Count()
    chatty.setLevel(logging.INFO)
    chatty.addFilter(counter)
    try:
        command.upgrade(alembic_config(url), revision)
    finally:
        chatty.removeFilter(counter)
        chatty.setLevel(level)
    if steps:
        log.info("database migrated to %s (%d migration%s)", revision if revision != "head" else head_revision(),
                 len(steps), "" if len(steps) == 1 else "s")


def head_revision() -> str:
    return ScriptDirectory.from_config(alembic_config("sqlite://")).get_current_head()


def current_revision(engine: Engine) -> str | None:
    # Asked by every /readyz: without this, each probe logs Alembic's "Context impl ..." line.
    chatty = logging.getLogger("alembic.runtime.migration")
    level = chatty.level
    chatty.setLevel(logging.WARNING)
    try:
        with engine.connect() as conn:
            return MigrationContext.configure(conn).get_current_revision()
    finally:
        chatty.setLevel(level)


def is_at_head(engine: Engine) -> bool:
    return current_revision(engine) == head_revision()
