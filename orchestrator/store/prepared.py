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

``defer``: on PostgreSQL a row nothing reads or references before the commit
waits, and the transaction's deferred rows go to the server at commit as one
statement (data-modifying CTEs, ``send_deferred``) with its tallies' upsert as
the main one. A submit's job, label, event and audit rows and its tallies were
five statements between BEGIN and COMMIT, each a round trip and SQLAlchemy's
and psycopg's per-statement work; they are one. SQLite has no INSERT in a CTE
(and no round trips): there, and inside a savepoint (whose rollback must drop
them), ``defer`` executes at once.
"""

from __future__ import annotations

import copy
import logging
from typing import Any, Collection, Sequence

from sqlalchemy import Table, event, insert
from sqlalchemy.orm import Session

log = logging.getLogger(__name__)
_DEFERRED = "prepared.deferred"  # session.info: [(sql, params)] to send at commit (PostgreSQL)
MAX_DEFERRED_PARAMS = 30_000  # bound parameters deferred in one transaction; past it, rows execute at once
PG_PARAMS_PER_STATEMENT = 500  # execute_many on PostgreSQL: about this many bound parameters a statement (measured: 2,000 cost 2x)


class PreparedInsert:
    """``INSERT INTO table (...) VALUES (...)`` without RETURNING, for ``execute(session, rows)``."""

    def __init__(self, table: Table):
        self.table = table
        self._forms: dict[tuple[str, tuple[str, ...]], tuple[str, tuple[str, ...], dict, dict, bool]] = {}
        self._positional: dict[tuple[str, tuple[str, ...]], tuple[str, str, tuple[str, ...], dict, dict]] = {}

    def defer(self, session: Session, rows: dict[str, Any] | Sequence[dict[str, Any]]) -> None:
        """``execute``, or on PostgreSQL outside a savepoint: kept, and sent with the
        transaction's other deferred rows when it commits (``send_deferred``). Only
        for rows nothing reads before the commit; a foreign key to a row deferred
        earlier in the same transaction holds (the statement's checks run at its end)."""
        rows = [rows] if isinstance(rows, dict) else list(rows)
        if not rows:
            return
        conn = session.connection()
        if conn.dialect.name != "postgresql" or session.in_nested_transaction():
            return self.execute(session, rows)
        form = self._positional.get((conn.dialect.name, tuple(rows[0])))
        if form is None:
            form = self._compile_positional(conn.dialect, tuple(rows[0]))
        head, values, order, procs, defaults = form
        params = []
        for r in rows:
            params.extend(self._params(r, order, procs, defaults, True))
        deferred = session.info.setdefault(_DEFERRED, [])
        if len(params) + sum(len(p) for *_, p in deferred) > MAX_DEFERRED_PARAMS:  # PostgreSQL takes 65,535
            return self.execute(session, rows)
        deferred.append((head, values, len(rows), params))

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

    def execute_many(self, session: Session, rows: Sequence[dict[str, Any]], *,
                     common: dict[str, Any] | None = None, encoded: Collection[str] = ()) -> None:
        """Insert many rows with the same keys (a batch): ``common`` holds the
        values every row shares, bound once (a batch's one timestamp); a column in
        ``encoded`` is given as the driver takes it (a JSON column as its JSON text,
        ``model_dump_json``: encoded once by pydantic instead of dumped to Python
        and encoded again). SQLite runs the driver's ``executemany``; PostgreSQL
        multi-row VALUES of about ``PG_PARAMS_PER_STATEMENT`` bound parameters,
        pipelined (psycopg's executemany of a one-row INSERT is a statement a row)."""
        if not rows:
            return
        common = common or {}
        first = rows[0].keys()
        if first & common.keys() or any(r.keys() != first for r in rows):
            raise ValueError(f"{self.table.name}: every row needs the same keys, none of them in common")
        keys = tuple(first) + tuple(common)
        conn = session.connection()
        pg = conn.dialect.name == "postgresql"
        if pg:
            form = self._positional.get((conn.dialect.name, keys)) or self._compile_positional(conn.dialect, keys)
            head, values, order, procs, defaults = form
        else:
            form = self._forms.get((conn.dialect.name, keys)) or self._compile(conn.dialect, keys)
            sql, order, procs, defaults, positional = form
            if not positional:  # pragma: no cover - SQLite's paramstyle is qmark
                raise ValueError("execute_many needs a positional paramstyle")
        fixed = {k: procs[k](v) if k in procs else v for k, v in {**defaults, **common}.items()}
        slots = [(k, None if k in encoded else procs.get(k)) for k in order]
        template = [fixed.get(k) for k in order]
        varying = [(i, k, p) for i, (k, p) in enumerate(slots) if k not in fixed]
        params = []
        for r in rows:
            vals = template.copy()
            for i, k, p in varying:
                vals[i] = p(r[k]) if p is not None else r[k]
            params.append(vals)
        if not pg:
            conn.exec_driver_sql(sql, [tuple(v) for v in params])
            return
        # psycopg parses a statement's %s placeholders in Python, caching only short
        # statements: a 1,000-row VALUES (21,000 of them) cost more than the insert.
        # So: one statement of ``per`` rows, run as an executemany (parsed once,
        # pipelined), and the rows left over in statements of 2^k rows: a table
        # has a few statement shapes, not one per batch size, in psycopg's cache
        # (128 statements, store.db raises which it takes).
        per = max(1, min(len(params), PG_PARAMS_PER_STATEMENT // len(order)))
        full = len(params) - len(params) % per
        if full:
            sets = [tuple(v for row in params[i:i + per] for v in row) for i in range(0, full, per)]
            conn.exec_driver_sql(head + ", ".join([values] * per), sets if len(sets) > 1 else sets[0])
        rest = params[full:]
        while rest:
            k = 1 << (len(rest).bit_length() - 1)
            chunk, rest = rest[:k], rest[k:]
            conn.exec_driver_sql(head + ", ".join([values] * k), tuple(v for row in chunk for v in row))

    @staticmethod
    def _params(row, order, procs, defaults, positional):
        if defaults:
            row = {**defaults, **row}
        values = [procs[k](row[k]) if k in procs else row[k] for k in order]
        return tuple(values) if positional else dict(zip(order, values))

    def _defaults(self, keys: tuple[str, ...]) -> dict[str, Any]:
        """The scalar defaults of the columns a row leaves out."""
        defaults = {}
        for col in self.table.c:
            if col.key in keys or col.default is None:
                continue
            if not col.default.is_scalar:
                raise ValueError(f"{self.table.name}.{col.key} has a non-scalar default: give it in the row")
            defaults[col.key] = col.default.arg
        return defaults

    def _compile(self, dialect, keys: tuple[str, ...]):
        defaults = self._defaults(keys)
        compiled = insert(self.table).compile(dialect=dialect, column_keys=[*keys, *defaults])
        order = tuple(compiled.positiontup) if compiled.positional else tuple(compiled.binds)
        unknown = set(order) - set(keys) - set(defaults)
        if unknown:  # a bind parameter no row gives: the form above misread the table
            raise ValueError(f"{self.table.name}: no value for {sorted(unknown)}")
        form = (str(compiled), order, dict(compiled._bind_processors), defaults, compiled.positional)
        self._forms[(dialect.name, keys)] = form
        return form

    def _compile_positional(self, dialect, keys: tuple[str, ...]):
        """The PostgreSQL form with ``%s`` binds (statements joined into one keep
        their parameters in text order) and no RETURNING: ``(head, "(%s, ...)",
        order, processors, defaults)``; the VALUES tuple repeats for several rows."""
        fmt = copy.copy(dialect)  # the connected dialect: its types' processors and casts
        fmt.paramstyle, fmt.positional = "format", True
        defaults = self._defaults(keys)
        compiled = insert(self.table).inline().compile(dialect=fmt, column_keys=[*keys, *defaults])
        sql = str(compiled)
        head, sep, values = sql.rpartition(" VALUES ")
        order = tuple(compiled.positiontup)
        if not sep or not values.startswith("(") or set(order) - set(keys) - set(defaults):
            raise ValueError(f"{self.table.name}: unexpected form {sql!r}")
        form = (head + sep, values, order, dict(compiled._bind_processors), defaults)
        self._positional[(dialect.name, keys)] = form
        return form


def send_deferred(session: Session, then: tuple[str, tuple] | None = None) -> bool:
    """The transaction's deferred rows as one statement: each insert a CTE of
    ``then`` (a statement with no WITH of its own, the tallies' upsert), or of the
    last insert. Rows of the same table and columns go in one multi-row VALUES:
    the units of a group commit (``store.groupcommit``, PostgreSQL) each defer a
    job, an event and an audit row, and one CTE a table keeps the statement's
    text short and its shapes few (psycopg parses and caches each text; the
    server plans it). Called by the commit hook (``store.tallies``). Returns
    whether ``then`` went with them (False: nothing was deferred, send it yourself)."""
    deferred = session.info.pop(_DEFERRED, None)
    if not deferred:
        return False
    merged: dict[tuple[str, str], list] = {}  # (head, one row's VALUES) -> [rows, params]; text order kept
    for head, values, n, params in deferred:
        slot = merged.setdefault((head, values), [0, []])
        slot[0] += n
        slot[1].extend(params)
    parts = [(head + ", ".join([values] * n), params) for (head, values), (n, params) in merged.items()]
    if then is not None:
        parts.append(then)
    *ctes, (main, _) = parts
    sql = ("WITH " + ", ".join(f"d{i} AS ({q})" for i, (q, _) in enumerate(ctes)) + " " + main) if ctes else main
    session.connection().exec_driver_sql(sql, tuple(v for _, p in parts for v in p))
    return then is not None


@event.listens_for(Session, "after_commit")
def _none_left(session: Session) -> None:
    """Deferred rows still here after a commit were never sent: the commit hook
    that sends them (``store.tallies``) did not run. Say so loudly."""
    if session.info.get(_DEFERRED) and not session.in_nested_transaction():
        log.error("%d deferred inserts were not sent with the commit (store.tallies' hook missing)",
                  len(session.info[_DEFERRED]))


@event.listens_for(Session, "after_transaction_end")
def _drop_deferred(session: Session, transaction) -> None:
    if transaction.parent is None:  # committed (sent) or rolled back (dropped with the rest)
        session.info.pop(_DEFERRED, None)
