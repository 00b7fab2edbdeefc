"""The auth epoch read from a SQLite file on the event loop (``api.epochs``):
a connection of its own, never waiting on a lock. See ``SQLiteEpoch``."""

from __future__ import annotations

import logging
import os
import sqlite3
from urllib.parse import quote

from sqlalchemy.engine import Engine

log = logging.getLogger(__name__)


class SQLiteEpoch:
    """The auth epoch from a SQLite file, without blocking: ``None`` when SQLite
    is busy or the read fails (the caller reads the pooled way)."""

    SQL = "SELECT n FROM auth_epoch WHERE id = 1"

    def __init__(self, path: str):
        # mode=rw: the file the engine uses or an error, never a new empty one;
        # timeout=0: never wait on a lock on the event loop; autocommit: no
        # snapshot kept between reads.
        self._conn = sqlite3.connect(f"file:{quote(path)}?mode=rw", uri=True, timeout=0, isolation_level=None,
                                     check_same_thread=False)

    @classmethod
    def of(cls, engine: Engine) -> "SQLiteEpoch | None":
        """One for ``engine``'s database when it is a SQLite file (not in memory):
        the file a pooled connection has open, as SQLite names it (absolute), so a
        relative URL and a later change of directory cannot point it elsewhere."""
        if engine.dialect.name != "sqlite":
            return None
        with engine.connect() as conn:
            path = next((row[2] for row in conn.exec_driver_sql("PRAGMA database_list") if row[1] == "main"), "")
        if not path or not os.path.isabs(path):  # in memory (or a temporary database): ""
            return None
        try:
            return cls(path)
        except sqlite3.Error as e:
            log.warning("auth epoch: cannot open %s for reads on the event loop (%s); reading through the pool",
                        path, e)
            return None

    def __call__(self) -> int | None:
        try:
            rows = self._conn.execute(self.SQL).fetchall()  # stepped to the end: the read transaction is over
        except sqlite3.Error as e:
            log.debug("auth epoch: SQLite read failed (%s); reading through the pool", e)
            return None
        return rows[0][0] if rows else None

    def close(self) -> None:
        self._conn.close()
