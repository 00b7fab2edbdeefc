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

``defer``: a row nothing reads or references before the commit waits, and
the transaction's deferred rows go at commit (``send_deferred``). On
PostgreSQL as one statement (data-modifying CTEs) with its tallies' upsert as
the main one: a submit's job, label, event and audit rows and its tallies were
five statements between BEGIN and COMMIT, each a round trip and SQLAlchemy's
and psycopg's per-statement work; they are one, and so are a group commit's
hundred submits. SQLite has no INSERT in a CTE (and no round trips): there
each table's deferred rows are one executemany. Inside a savepoint (whose
rollback must drop them), ``defer`` executes at once.
"""

from __future__ import annotations

import copy
import logging
import operator
from typing import Any, Collection, Sequence

from sqlalchemy import JSON, Table, event, exc, insert
from sqlalchemy.orm import Session

log = logging.getLogger(__name__)
_DEFERRED = "prepared.deferred"  # session.info: [(table, head, values, rows, params)] to send at commit
MAX_DEFERRED_PARAMS = 30_000  # PostgreSQL: bound parameters in one deferred statement; past it, what waits is sent


class _Waiting(list):
    """A transaction's deferred rows, and how many bound parameters they hold."""
    params = 0


class PreparedInsert:
    """``INSERT INTO table (...) VALUES (...)`` without RETURNING, for ``execute(session, rows)``."""

    def __init__(self, table: Table):
        self.table = table
        self._forms: dict[tuple[str, tuple[str, ...]], tuple[str, tuple[str, ...], dict, dict, bool]] = {}
        self._positional: dict[tuple[str, tuple[str, ...]], tuple[str, str, tuple[str, ...], dict, dict]] = {}
        self._ordered: dict[tuple[str, ...], str] = {}  # SQLite: execute_many's statement, by column order
        self._copies: dict[tuple[tuple[str, ...], bool], tuple[str, list[str] | None]] = {}  # PostgreSQL: COPY forms

    def defer(self, session: Session, rows: dict[str, Any] | Sequence[dict[str, Any]]) -> None:
        """``execute``, or outside a savepoint: kept, and sent with the transaction's
        other deferred rows when it commits (``send_deferred``). Only for rows
        nothing reads before the commit; a foreign key to a row deferred earlier in
        the same transaction holds (parents' tables are sent first)."""
        rows = [rows] if isinstance(rows, dict) else list(rows)
        if not rows:
            return
        if session.in_nested_transaction():
            return self.execute(session, rows)
        conn = session.connection()
        deferred = session.info.get(_DEFERRED)
        if deferred is None:
            deferred = session.info[_DEFERRED] = _Waiting()
        if conn.dialect.name != "postgresql":  # SQLite: one executemany a table at commit
            form = self._forms.get((conn.dialect.name, tuple(rows[0])))
            if form is None:
                form = self._compile(conn.dialect, tuple(rows[0]))
            sql, order, procs, defaults, positional = form
            deferred.append((self.table, sql, "", len(rows),
                             [self._params(r, order, procs, defaults, positional) for r in rows]))
            return
        form = self._positional.get((conn.dialect.name, tuple(rows[0])))
        if form is None:
            form = self._compile_positional(conn.dialect, tuple(rows[0]))
        head, values, order, procs, defaults = form
        params = []
        for r in rows:
            params.extend(self._params(r, order, procs, defaults, True))
        if len(params) + deferred.params > MAX_DEFERRED_PARAMS:  # PostgreSQL takes 65,535
            send_deferred(session)  # what waits goes now, in order; this row starts the next statement
            if len(params) > MAX_DEFERRED_PARAMS:
                return self.execute(session, rows)
            deferred = session.info[_DEFERRED] = _Waiting()
        deferred.params += len(params)
        deferred.append((self.table, head, values, len(rows), params))

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
        a ``COPY`` (``_copy``)."""
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
            _head, _row, order, procs, defaults = form
        else:
            form = self._forms.get((conn.dialect.name, keys)) or self._compile(conn.dialect, keys)
            _sql, order, procs, defaults, positional = form
            if not positional:  # pragma: no cover - SQLite's paramstyle is qmark
                raise ValueError("execute_many needs a positional paramstyle")
        fixed = {k: procs[k](v) if k in procs else v for k, v in {**defaults, **common}.items()}
        # A row's values first, in the order of ``take``, then the shared ones:
        # one itemgetter call a row where nothing it gives needs converting.
        take = [k for k in order if k not in fixed]
        convert = [None if k in encoded else procs.get(k) for k in take]
        last = tuple(fixed[k] for k in order if k in fixed)
        columns = (*take, *(k for k in order if k in fixed))
        if any(convert):
            values = [tuple(p(r[k]) if p is not None else r[k] for k, p in zip(take, convert)) + last for r in rows]
        else:
            getter = operator.itemgetter(*take)
            values = [(getter(r),) + last for r in rows] if len(take) == 1 else [getter(r) + last for r in rows]
        if pg:
            # Binary COPY takes a JSON column's value as text: the rows must give it
            # so (``encoded``), not as SQLAlchemy's processor makes it (psycopg's Json).
            binary = all(k in encoded for k in columns if self._is_json(k))
            self._copy(conn, columns, values, binary=binary)
        else:
            conn.exec_driver_sql(self._sqlite_sql(conn.dialect, columns), values)

    def _is_json(self, key: str) -> bool:
        return isinstance(self.table.c[key].type, JSON)

    def _copy(self, conn, keys: tuple[str, ...], values: list[tuple], *, binary: bool) -> None:
        """PostgreSQL: the rows by ``COPY ... FROM STDIN`` on the session's connection
        (its transaction), in PostgreSQL's binary format, psycopg encoding each value
        in C. Multi-row VALUES cost more a row in the server process (psycopg's
        Python work on every bound parameter, ~21,000 a 1,000-job batch) and in
        PostgreSQL's (parsing and planning them); measured alone, 1,000 jobs with
        their labels and events: 12.3 ms of the server's CPU as VALUES, 8.1 by
        COPY's text format, 5.6 by its binary one (31-41 ms end to end). An error
        is SQLAlchemy's, as from any statement (an ``IntegrityError`` is one)."""
        raw = conn.connection.dbapi_connection
        form = self._copies.get((keys, binary))
        if form is None:
            form = self._copies[(keys, binary)] = self._copy_form(conn.dialect, raw, keys, binary=binary)
        sql, types = form
        dbapi = conn.dialect.loaded_dbapi
        try:
            with raw.cursor() as cur, cur.copy(sql) as copy:
                if types:
                    copy.set_types(types)
                for row in values:
                    copy.write_row(row)
        except dbapi.Error as e:
            lost = conn.dialect.is_disconnect(e, raw, None)
            if lost:
                conn.invalidate(e)
            raise exc.DBAPIError.instance(sql, None, e, dbapi.Error, connection_invalidated=lost,
                                          dialect=conn.dialect) from e

    def _copy_form(self, dialect, raw, keys: tuple[str, ...], *, binary: bool) -> tuple[str, list[str] | None]:
        """(COPY statement, the columns' type names for its binary format), or text
        format (no types) if not ``binary`` or a column's type is not one psycopg
        knows by name. A ``json`` column takes the JSON text a row gives as
        ``text``: PostgreSQL reads json's binary form as its text."""
        q = dialect.identifier_preparer
        head = f"COPY {q.format_table(self.table)} ({', '.join(q.quote(self.table.c[k].name) for k in keys)}) FROM STDIN"
        if not binary:
            return head, None
        types = []
        for k in keys:
            name = self.table.c[k].type.compile(dialect=dialect).split("(")[0].strip().lower()
            name = "text" if name == "json" else name
            if raw.adapters.types.get(name) is None or name == "jsonb":  # jsonb's binary form has a version byte
                return head, None
            types.append(name)
        return head + " (FORMAT BINARY)", types

    def _sqlite_sql(self, dialect, keys: tuple[str, ...]) -> str:
        """``INSERT INTO table (keys...) VALUES (?, ...)``, the columns in the given order."""
        sql = self._ordered.get(keys)
        if sql is None:
            q = dialect.identifier_preparer
            names = ", ".join(q.quote(self.table.c[k].name) for k in keys)
            sql = self._ordered[keys] = \
                f"INSERT INTO {q.format_table(self.table)} ({names}) VALUES ({', '.join('?' * len(keys))})"
        return sql

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
    """The transaction's deferred rows, a table's rows together, tables in the
    order their foreign keys need (parents first). PostgreSQL: one statement,
    each table's rows a multi-row VALUES in a CTE of ``then`` (a statement with no
    WITH of its own, the tallies' upsert), or of the last insert; a batch of a
    group commit (``store.groupcommit``) is one statement however many units
    it holds, and its text takes a few shapes (psycopg parses and caches each,
    the server plans it). SQLite: one ``executemany`` a table (the sqlite3
    module's loop in C, not a statement's Python overhead a row), then ``then``.
    Called by the commit hook (``store.tallies``). Returns whether ``then`` went
    with them (False: nothing was deferred, send it yourself)."""
    if session.in_nested_transaction():  # a savepoint's rollback would take other units' rows with it
        return False
    deferred = session.info.pop(_DEFERRED, None)
    if not deferred:
        return False
    merged: dict[tuple[str, str], list] = {}  # (head, one row's VALUES) -> [table, rows, params]
    for table, head, values, n, params in deferred:
        slot = merged.setdefault((head, values), [table, 0, []])
        slot[1] += n
        slot[2].extend(params)
    rank = _ranks(deferred[0][0].metadata)
    groups = sorted(merged.items(), key=lambda kv: rank.get(kv[1][0], len(rank)))  # stable within a table
    conn = session.connection()
    if conn.dialect.name != "postgresql":
        for (sql, _), (_, n, params) in groups:
            conn.exec_driver_sql(sql, params if n > 1 else params[0])
        if then is not None:
            conn.exec_driver_sql(*then)
        return then is not None
    parts = [(head + ", ".join([values] * n), params) for (head, values), (_, n, params) in groups]
    if then is not None:
        parts.append(then)
    *ctes, (main, _) = parts
    sql = ("WITH " + ", ".join(f"d{i} AS ({q})" for i, (q, _) in enumerate(ctes)) + " " + main) if ctes else main
    conn.exec_driver_sql(sql, tuple(v for _, p in parts for v in p))
    return then is not None


_RANKS: dict[int, dict] = {}


def _ranks(metadata) -> dict:
    """Each table's place in ``metadata.sorted_tables`` (a table after those its foreign keys name)."""
    ranks = _RANKS.get(id(metadata))
    if ranks is None:
        ranks = _RANKS[id(metadata)] = {t: i for i, t in enumerate(metadata.sorted_tables)}
    return ranks


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
