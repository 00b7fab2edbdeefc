"""INSERTs of a fixed set of columns, compiled once per dialect and sent as the
driver's SQL (``Connection.exec_driver_sql``).

A submit writes four rows (the job, its labels, its event, its audit row). As
``session.execute(insert(table), row)`` each went through the ORM's execute,
a cache-key lookup of the compiled statement and the bind processing that
compilation set up, per statement. Here the statement is compiled once per
(dialect, columns), each row is processed with the same bind processors
SQLAlchemy would use (the columns' types: UTC datetimes, JSON, booleans), and
the driver's SQL runs on the session's connection: still in its transaction,
with SQLAlchemy's error wrapping (an ``IntegrityError`` is one) and its
disconnect handling. Columns a row leaves out take their scalar Python default
(``Column(default=0)``) as ``insert()`` would; a column with another kind of
default must be given.
"""

from __future__ import annotations

from typing import Any, Sequence

from sqlalchemy import Table, insert
from sqlalchemy.orm import Session


class PreparedInsert:
    """``INSERT INTO table (...) VALUES (...)`` without RETURNING, for ``execute(session, rows)``."""

    def __init__(self, table: Table):
        self.table = table
        self._forms: dict[tuple[str, tuple[str, ...]], tuple[str, tuple[str, ...], dict, dict, bool]] = {}

    def execute(self, session: Session, rows: dict[str, Any] | Sequence[dict[str, Any]]) -> None:
        """Insert one row (a dict) or several (a list of dicts with the same keys)."""
        many = not isinstance(rows, dict)
        if many and len(rows) < 2:  # one row is not an executemany (psycopg runs those as a pipeline)
            if not rows:
                return
            rows, many = rows[0], False
        first = rows[0] if many else rows
        conn = session.connection()
        form = self._forms.get((conn.dialect.name, tuple(first)))
        if form is None:
            form = self._compile(conn.dialect, tuple(first))
        sql, order, procs, defaults, positional = form
        params = [self._params(r, order, procs, defaults, positional) for r in rows] if many else \
            self._params(rows, order, procs, defaults, positional)
        conn.exec_driver_sql(sql, params)

    @staticmethod
    def _params(row, order, procs, defaults, positional):
        if defaults:
            row = {**defaults, **row}
        values = [procs[k](row[k]) if k in procs else row[k] for k in order]
        return tuple(values) if positional else dict(zip(order, values))

    def _compile(self, dialect, keys: tuple[str, ...]):
        defaults = {}
        for col in self.table.c:
            if col.key in keys or col.default is None:
                continue
            if not col.default.is_scalar:
                raise ValueError(f"{self.table.name}.{col.key} has a non-scalar default: give it in the row")
            defaults[col.key] = col.default.arg
        compiled = insert(self.table).compile(dialect=dialect, column_keys=[*keys, *defaults])
        order = tuple(compiled.positiontup) if compiled.positional else tuple(compiled.binds)
        unknown = set(order) - set(keys) - set(defaults)
        if unknown:  # a bind parameter no row gives: the form above misread the table
            raise ValueError(f"{self.table.name}: no value for {sorted(unknown)}")
        form = (str(compiled), order, dict(compiled._bind_processors), defaults, compiled.positional)
        self._forms[(dialect.name, keys)] = form
        return form
