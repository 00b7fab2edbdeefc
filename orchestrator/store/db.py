"""Engines and sessions.

SQLite: WAL (readers never block the writer), a busy timeout, and every
transaction started with ``BEGIN IMMEDIATE``: pysqlite's deferred transactions
take the write lock only at the first write, and a reader upgrading to a writer
can fail with "database is locked" without waiting; IMMEDIATE makes writers
queue on the busy timeout instead. A ``read`` that never writes begins deferred
(``READ_ONLY``): it reads its WAL snapshot without queueing for the write lock,
so the per-request token lookup does not wait behind every submit's commit. PostgreSQL: psycopg 3, a pool (a connection idle over
``PING_IDLE_S`` pinged before use), READ COMMITTED, and ``FOR UPDATE SKIP LOCKED``
where work is claimed.
"""

from __future__ import annotations

import logging
import math
import sqlite3
import time
from contextlib import contextmanager
from typing import Iterator

from sqlalchemy import create_engine, event, exc, text
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session, sessionmaker  # Engine and Session: the type hints of the layers above

from raylane.orchestrator.domain.errors import StoreUnavailable

SQLITE_BUSY_TIMEOUT_MS = 30_000  # longer than any write transaction we make
PING_IDLE_S = 1.0  # PostgreSQL: a pooled connection idle longer is pinged before use
_IDLE_SINCE = "raylane.idle_since"  # a pool record's info key: when it was checked in
READ_ONLY = "raylane_read_only"  # a connection execution option: this transaction only reads
log = logging.getLogger(__name__)
# What a store call raises when the database failed (busy, gone, failing over), for
# the layers above, which import no SQLAlchemy (tests/test_layers.py).
StoreError = exc.SQLAlchemyError
# Of those, the database's availability (a locked SQLite, a connection lost, the
# pool's wait run out), not the statement's: the same work may succeed when tried again.
TransientStoreError = (exc.OperationalError, exc.InterfaceError, exc.TimeoutError)
# SQLite raises OperationalError for its own availability (locked, busy, the disk)
# and for a broken statement or schema alike ("no such table", "too many SQL
# variables", a read-only file): those fail again however often they are retried,
# so they are a 500 with a traceback, not a 503 that invites a retry loop.
_SQLITE_TRANSIENT = ("locked", "busy", "disk i/o error", "unable to open", "database or disk is full",
                     "interrupted")


def is_transient(e: BaseException) -> bool:
    """Whether a store error is the database's availability (``TransientStoreError``
    and, for SQLite, one of its availability errors), not the statement's."""
    if isinstance(e, StoreUnavailable):  # already said so, by a unit of work below
        return True
    if not isinstance(e, TransientStoreError):
        return False
    orig = getattr(e, "orig", None)
    if isinstance(e, exc.OperationalError) and type(orig).__module__ == "sqlite3":
        msg = str(orig).lower()
        return any(m in msg for m in _SQLITE_TRANSIENT)
    return True


def normalise_url(url: str) -> str:
    # Accept the URLs people paste: postgres:// and postgresql:// mean psycopg 3 here.
    for prefix in ("postgres://", "postgresql://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix):]
    return url


def make_engine(url: str, *, sqlite_synchronous: str = "FULL", pool_size: int = 10) -> Engine:
    url = normalise_url(url)
    if url.startswith("sqlite"):
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": SQLITE_BUSY_TIMEOUT_MS / 1000})

        @event.listens_for(engine, "connect")
        def _on_connect(dbapi_conn, _record):
            dbapi_conn.isolation_level = None  # we emit BEGIN ourselves (below)
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute(f"PRAGMA synchronous={sqlite_synchronous}")
            cur.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
            cur.execute("PRAGMA foreign_keys=ON")
            try:
                cur.execute("SELECT exp(0)")
            except sqlite3.OperationalError:  # a library built without its math functions: fair share's decay
                dbapi_conn.create_function("exp", 1, math.exp, deterministic=True)
            cur.close()

        @event.listens_for(engine, "begin")
        def _on_begin(conn):
            conn.exec_driver_sql("BEGIN" if conn.get_execution_options().get(READ_ONLY) else "BEGIN IMMEDIATE")

        _plain_savepoints(engine)
        return engine
    engine = create_engine(url, pool_size=pool_size, max_overflow=pool_size * 2)
    _ping_when_idle(engine)
    _plain_savepoints(engine)
    _cache_long_statements()
    return engine


# psycopg turns a statement's %s placeholders into $n in Python (a regex over the
# whole text) and caches the result only for statements under 4 KiB with at most
# 50 parameters: ORM-made INSERTs of varying row counts would churn its cache.
# Ours do not vary (store.prepared: a submit's rows and tallies as one statement,
# ~6 KB and ~60 parameters; batches go by COPY), and
# parsing them again on every execute was 10-15% of a PostgreSQL submit's CPU
# (py-spy). Up to these bounds they are cached (still an LRU of 128 statements).
PSYCOPG_CACHED_STATEMENT_LENGTH = 32 * 1024
PSYCOPG_CACHED_STATEMENT_PARAMS = 1024


def _cache_long_statements() -> None:
    try:
        from psycopg import _queries
    except ImportError:  # pragma: no cover - psycopg is the PostgreSQL driver we install
        return
    if hasattr(_queries, "MAX_CACHED_STATEMENT_LENGTH") and hasattr(_queries, "MAX_CACHED_STATEMENT_PARAMS"):
        _queries.MAX_CACHED_STATEMENT_LENGTH = max(_queries.MAX_CACHED_STATEMENT_LENGTH,
                                                   PSYCOPG_CACHED_STATEMENT_LENGTH)
        _queries.MAX_CACHED_STATEMENT_PARAMS = max(_queries.MAX_CACHED_STATEMENT_PARAMS,
                                                   PSYCOPG_CACHED_STATEMENT_PARAMS)
    else:  # pragma: no cover - a psycopg that moved them: tests/test_prepared.py says so
        log.warning("psycopg's statement cache bounds were not found; long statements are parsed every time")


def _plain_savepoints(engine: Engine) -> None:
    """SAVEPOINT, RELEASE and ROLLBACK TO as plain SQL. SQLAlchemy compiles a new
    clause for each (every savepoint has a new name), ~6% of a submit's CPU on
    SQLite, where the group commit opens one per unit. Its names
    (``sa_savepoint_<n>``) need no quoting."""
    d = engine.dialect
    d.do_savepoint = lambda conn, name: conn.exec_driver_sql(f"SAVEPOINT {name}")
    d.do_release_savepoint = lambda conn, name: conn.exec_driver_sql(f"RELEASE SAVEPOINT {name}")
    d.do_rollback_to_savepoint = lambda conn, name: conn.exec_driver_sql(f"ROLLBACK TO SAVEPOINT {name}")


def _ping_when_idle(engine: Engine) -> None:
    """``pool_pre_ping``, for connections idle longer than ``PING_IDLE_S`` only.

    A connection back in the pool for a moment was alive a moment ago; pinging
    it on every checkout was a round trip and ~3% of a submit's CPU (each
    request checks out one or two). One idle longer (the database restarted,
    a proxy cut it) is pinged and, if dead, replaced before use, as with
    ``pool_pre_ping``. A connection that dies within the window fails its one
    statement; SQLAlchemy then sees the disconnect and renews the whole pool."""

    @event.listens_for(engine, "checkin")
    def _checked_in(_dbapi_conn, record):
        record.info[_IDLE_SINCE] = time.monotonic()

    @event.listens_for(engine, "checkout")
    def _checkout(dbapi_conn, record, _proxy):
        since = record.info.get(_IDLE_SINCE)
        if since is not None and time.monotonic() - since <= PING_IDLE_S:
            return
        try:
            alive = engine.dialect.do_ping(dbapi_conn)
        except Exception as e:  # a dead connection raises: the pool tries a fresh one
            raise exc.DisconnectionError(str(e)) from e
        if not alive:
            raise exc.DisconnectionError("ping failed")


def pool_size(engine: Engine) -> int:
    """Connections the engine's pool keeps (QueuePool: ``size()``; others: 1)."""
    size = getattr(engine.pool, "size", None)
    n = size() if callable(size) else size
    return max(1, int(n or 1))


def make_sessionmaker(engine: Engine) -> sessionmaker[Session]:
    return sessionmaker(engine, expire_on_commit=False, autoflush=False)


@contextmanager
def unavailable_as_domain_error() -> Iterator[None]:
    """The database's availability failing a unit of work (``is_transient``) leaves
    the store as ``domain.errors.StoreUnavailable`` (the SQLAlchemy error its
    ``__cause__``), which the API maps to 503 without importing the store; any
    other error leaves as it was raised."""
    try:
        yield
    except TransientStoreError as e:
        if not is_transient(e):
            raise
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise StoreUnavailable(first) from e


@contextmanager
def transaction(factory: sessionmaker[Session]) -> Iterator[Session]:
    """One unit of work: commit on success, roll back on any error."""
    with unavailable_as_domain_error(), factory() as session:
        with session.begin():
            yield session


@contextmanager
def read(factory: sessionmaker[Session]) -> Iterator[Session]:
    """A unit of work that only reads (SQLite: no write lock; a write in it fails)."""
    with unavailable_as_domain_error(), factory() as session:
        with session.begin():
            session.connection(execution_options={READ_ONLY: True})
            yield session


@contextmanager
def read_connection(factory: sessionmaker[Session]):
    """``read`` without a Session, for one statement per request where the ORM's own
    work would cost more than the query: a Core connection (PostgreSQL: autocommit,
    no BEGIN and COMMIT round trips around the one SELECT)."""
    engine = factory.kw["bind"]
    with unavailable_as_domain_error():
        if engine.dialect.name == "postgresql":
            with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
                yield conn
            return
        with engine.connect().execution_options(**{READ_ONLY: True}) as conn:
            with conn.begin():
                yield conn


def ping(engine: Engine) -> None:
    """One round trip to the database; raises when it is down or unreachable."""
    with engine.connect() as conn:
        conn.execute(text("SELECT 1"))
