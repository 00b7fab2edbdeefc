"""Counts kept as rows, so ``/metrics`` reads a few hundred rows instead of
counting every job and attempt ever stored (2.7 s a scrape at 1,000,000 jobs).

A *tally* is a number named ``(name, label1, label2)``. Every store function
that changes what a tally counts adds its *delta* to the session (``add``,
``observe``); the session's deltas are written when it commits, in the same
transaction (a ``before_commit`` hook, below), so a tally moves exactly when
the rows it counts do: a rolled-back transaction moves neither. The writers are
``jobs.submit``/``submit_batch`` (a job appears), ``transitions.transition``
(the only writer of a job's status), ``queue.admit`` (an attempt appears) and
``transitions.set_attempt``/``set_attempt_cause`` (an attempt's cause or start).

Tallies (label1, label2):

- ``jobs`` (status, node group): jobs now in each status (a gauge);
- ``jobs_created`` (kind, ""): jobs ever submitted;
- ``attempts`` (node group, market): attempts ever dispatched;
- ``retries`` (node group, ""): attempts after a job's first;
- ``failures`` (node group, cause): attempts that carry a failure cause;
- ``admission_wait``, ``dispatch_latency`` (node group, bucket): histograms;
  the bucket is an upper bound (``str(float(b))``), ``+Inf`` (the count) or
  ``sum`` (the total seconds); bounds are cumulative, like Prometheus'.

*Shards*: on PostgreSQL a transaction writes its deltas to one of ``SHARDS``
rows per tally: its connection's own (numbered as this process's pool opens
them; another replica's connection may share one), so concurrent submits, each
on its own connection, do not queue behind one hot row's lock until the
holder's commit; a read sums the shards. Deltas are
written in key order, so two transactions never lock the same rows in opposite
orders (no deadlock). SQLite serialises writers anyway: one shard.

``recount`` computes every tally from the tables with full scans: the test that
walks every transition compares the two, and ``rebuild`` repairs the rows.
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from datetime import datetime
from typing import Sequence

from sqlalchemy import Integer, case, cast, delete, event, func, select
from sqlalchemy.orm import Session

from raylane.orchestrator.domain.states import FailureCause
from raylane.orchestrator.store import prepared
from raylane.orchestrator.store import effects
from raylane.orchestrator.store.tables import attempts, jobs, tallies

NONE = "none"  # the node group of a job or attempt not yet routed
# PostgreSQL rows per tally: at least the pool's connections (db.make_engine: 10
# + 20 overflow), so two live connections never share a row.
SHARDS = 32
Key = tuple[str, str, str]

# Seconds. Admission waits range from instant to hours on a busy GPU group.
ADMISSION_BUCKETS = (0.1, 0.5, 1, 2, 5, 10, 30, 60, 300, 900, 1800, 3600, 4 * 3600, 12 * 3600, 24 * 3600)
# Dispatch latency: Ray accepting the submission and starting the driver.
DISPATCH_BUCKETS = (0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 300, 900)
BUCKETS = {"admission_wait": ADMISSION_BUCKETS, "dispatch_latency": DISPATCH_BUCKETS}

_PENDING = "tallies.pending"  # session.info key: this transaction's deltas
_SAVED = "tallies.saved"  # session.info key: the deltas as each open savepoint found them


def group(name: str | None) -> str:
    return name or NONE


def add(session: Session, name: str, label1: str, label2: str = "", delta: float = 1) -> None:
    """Count ``delta`` more under the tally, when this session commits."""
    pending = session.info.setdefault(_PENDING, defaultdict(float))
    pending[(name, label1, label2)] += delta


def observe(session: Session, name: str, node_group: str | None, seconds: float) -> None:
    """One observation of histogram ``name`` (``BUCKETS``)."""
    g = group(node_group)
    for b in BUCKETS[name]:
        if seconds <= b:
            add(session, name, g, str(float(b)))
    add(session, name, g, "+Inf")
    add(session, name, g, "sum", seconds)


def job_moved(session: Session, *, src: str | None, src_group: str | None, to: str | None,
              to_group: str | None, n: int = 1) -> None:
    """``n`` jobs left (status, group) ``src`` for ``to``; None: they did not exist / no longer do."""
    if src is not None:
        add(session, "jobs", src, group(src_group), -n)
    if to is not None:
        add(session, "jobs", to, group(to_group), n)


def cause_changed(session: Session, node_group: str | None, old: str | None, new: str | None) -> None:
    if old == new:
        return
    if old is not None:
        add(session, "failures", group(node_group), old, -1)
    if new is not None:
        add(session, "failures", group(node_group), new, 1)


def attempt_created(session: Session, *, node_group: str | None, market: str | None, number: int,
                    created_at: datetime, job_created_at: datetime) -> None:
    g = group(node_group)
    add(session, "attempts", g, market or NONE)
    if number > 1:
        add(session, "retries", g)
    else:
        observe(session, "admission_wait", g, (created_at - job_created_at).total_seconds())


# Rows per upsert statement: a transaction's deltas are a few (a submit: 2) to a
# few dozen (an admission pass's histograms); 5 parameters each stays far under
# SQLite's limit of bound parameters.
UPSERT_ROWS = 100
_UPSERT: dict[tuple[str, int], str] = {}  # (dialect, rows) -> the statement's text


def _upsert(dialect: str, n: int) -> str:
    """One multi-row ``INSERT ... ON CONFLICT DO UPDATE`` for ``n`` deltas, as the
    driver's SQL, built once per row count. It replaced an executemany of one
    compiled upsert: psycopg runs an executemany as a pipeline, ~130 us of CPU more
    than one statement for a submit's two rows (docs/benchmarks.md). Rows are in
    key order, which a multi-row insert keeps when it locks them."""
    sql = _UPSERT.get((dialect, n))
    if sql is None:
        mark = "%s" if dialect == "postgresql" else "?"
        row = "(" + ", ".join([mark] * 5) + ")"
        sql = _UPSERT[(dialect, n)] = (
            f"INSERT INTO {tallies.name} (name, label1, label2, shard, value) VALUES {', '.join([row] * n)} "
            f"ON CONFLICT (name, label1, label2, shard) DO UPDATE SET value = {tallies.name}.value + excluded.value")
    return sql


_numbers = itertools.count()  # connections of this process, in the order they opened


def _shard(session: Session) -> int:
    info = session.connection().info  # the pooled DBAPI connection's: lives as long as it does
    if "tallies.shard" not in info:
        info["tallies.shard"] = next(_numbers) % SHARDS
    return info["tallies.shard"]


def _flush(session: Session) -> None:
    """The deltas, and on PostgreSQL the rows deferred until commit (``store.prepared``):
    with them, the first upsert is that one statement's main part. A savepoint's
    commit (SQLAlchemy runs this hook for it too) writes the deltas and leaves the
    deferred rows to the transaction's own commit: a rollback of an enclosing
    savepoint would otherwise drop rows already taken from the session."""
    top = not session.in_nested_transaction()
    pending = session.info.pop(_PENDING, None)
    if not pending:
        if top:
            prepared.send_deferred(session)
        return
    dialect = session.bind.dialect.name
    shard = _shard(session) if dialect == "postgresql" else 0
    rows = [(*k, shard, float(v)) for k, v in sorted(pending.items()) if v != 0]
    conn = session.connection()
    for i in range(0, len(rows), UPSERT_ROWS):
        chunk = rows[i:i + UPSERT_ROWS]
        upsert = (_upsert(dialect, len(chunk)), tuple(v for r in chunk for v in r))
        if i > 0 or not top or not prepared.send_deferred(session, upsert):
            conn.exec_driver_sql(*upsert)
    if top:
        prepared.send_deferred(session)  # every delta was 0


@event.listens_for(Session, "before_commit")
def _before_commit(session: Session) -> None:
    _flush(session)


def flush(session: Session) -> None:
    """What the commit hook sends, sent now: the transaction's last statements
    before COMMIT (the hook then finds nothing left). ``store.groupcommit`` calls
    it to know that an error after it is the COMMIT's own."""
    _flush(session)


# A rolled-back transaction's deltas are dropped with its rows; a rolled-back
# savepoint's too (the group committer runs each unit in one): the deltas as they
# were when it began come back. A savepoint that commits writes them (above).


@event.listens_for(Session, "after_transaction_create")
def _after_create(session: Session, transaction) -> None:
    if transaction.nested:
        session.info.setdefault(_SAVED, {})[id(transaction)] = dict(session.info.get(_PENDING) or {})


@event.listens_for(Session, "after_soft_rollback")
def _after_soft_rollback(session: Session, previous_transaction) -> None:
    saved = session.info.get(_SAVED, {}).get(id(previous_transaction))
    if previous_transaction.nested and saved is not None:
        session.info[_PENDING] = defaultdict(float, saved)


@event.listens_for(Session, "after_transaction_end")
def _after_end(session: Session, transaction) -> None:
    if transaction.parent is None:
        session.info.pop(_PENDING, None)
        session.info.pop(_SAVED, None)


# Reading -----------------------------------------------------------------------


def read(session: Session, names: Sequence[str] | None = None) -> dict[Key, float]:
    """Every tally (or those named), shards summed; rows that sum to 0 are left out."""
    q = select(tallies.c.name, tallies.c.label1, tallies.c.label2, func.sum(tallies.c.value)).group_by(
        tallies.c.name, tallies.c.label1, tallies.c.label2)
    if names is not None:
        q = q.where(tallies.c.name.in_(list(names)))
    return {(n, a, b): v for n, a, b, v in session.execute(q) if v}


def histogram(kept: dict[Key, float], name: str) -> dict[str, tuple[int, float, list[int]]]:
    """Node group -> (count, sum, [observations <= each bucket]) from ``read``'s answer."""
    out: dict[str, tuple[int, float, list[int]]] = {}
    bounds = [str(float(b)) for b in BUCKETS[name]]
    for g in {a for n, a, _ in kept if n == name}:
        out[g] = (int(kept.get((name, g, "+Inf"), 0)), float(kept.get((name, g, "sum"), 0.0)),
                  [int(kept.get((name, g, b), 0)) for b in bounds])
    return out


# The truth, by full scans -------------------------------------------------------


def _seconds_between(session: Session, later, earlier):
    """``later - earlier`` in seconds, as ``observe`` got it from Python's datetimes,
    to the bit: a histogram's recount must put a wait at a bucket's bound where
    the kept count did. SQLite stores ``YYYY-MM-DD HH:MM:SS.ffffff``; its
    ``julianday`` difference was 20 us off (a double of ~2.46e6 days), so a wait
    of 0.09999 s was counted over 0.1. Whole seconds (``%s``, exact) and the
    microseconds' digits, as integers, then one division, as ``total_seconds``."""
    if session.bind.dialect.name == "postgresql":
        return func.extract("epoch", later - earlier)

    def whole(t):  # of the text's own seconds: strftime rounds a fraction to ms first (07.999993 -> 08)
        return cast(func.strftime("%s", func.substr(t, 1, 19)), Integer)

    def micros(t):
        return cast(func.substr(t, 21, 6), Integer)

    return ((whole(later) - whole(earlier)) * 1_000_000 + micros(later) - micros(earlier)) / 1_000_000.0


def recount(session: Session) -> dict[Key, float]:
    """Every tally computed from the tables (full scans: for tests and repairs only)."""
    out: dict[Key, float] = {}
    jg = func.coalesce(jobs.c.node_group, NONE)
    ag = func.coalesce(attempts.c.node_group, NONE)
    for st, g, n in session.execute(select(jobs.c.status, jg, func.count()).group_by(jobs.c.status, jg)):
        out[("jobs", st, g)] = n
    for kind, n in session.execute(select(jobs.c.kind, func.count()).group_by(jobs.c.kind)):
        out[("jobs_created", kind, "")] = n
    market = func.coalesce(attempts.c.market, NONE)
    for g, m, n in session.execute(select(ag, market, func.count()).group_by(ag, market)):
        out[("attempts", g, m)] = n
    for g, n in session.execute(select(ag, func.count()).where(attempts.c.number > 1).group_by(ag)):
        out[("retries", g, "")] = n
    for g, cause, n in session.execute(select(ag, attempts.c.cause, func.count())
                                       .where(attempts.c.cause.is_not(None)).group_by(ag, attempts.c.cause)):
        out[("failures", g, cause)] = n
    hists = (
        ("admission_wait", _seconds_between(session, attempts.c.created_at, jobs.c.created_at),
         [attempts.c.job_id == jobs.c.id, attempts.c.number == 1]),
        ("dispatch_latency", _seconds_between(session, attempts.c.started_at, attempts.c.created_at),
         [attempts.c.started_at.is_not(None)]),
    )
    for name, seconds, where in hists:
        sub = select(ag.label("g"), seconds.label("d")).where(*where).subquery()
        cols = [func.count(), func.coalesce(func.sum(sub.c.d), 0.0)]
        cols += [func.sum(case((sub.c.d <= b, 1), else_=0)) for b in BUCKETS[name]]
        for g, count, total, *le in session.execute(select(sub.c.g, *cols).group_by(sub.c.g)):
            out[(name, g, "+Inf")] = count
            out[(name, g, "sum")] = total
            for b, n in zip(BUCKETS[name], le):
                out[(name, g, str(float(b)))] = n
    return {k: float(v) for k, v in out.items() if v}


def rebuild(session: Session) -> None:
    """Replace the kept tallies with ``recount``'s (in the caller's transaction)."""
    session.info.pop(_PENDING, None)
    session.execute(delete(tallies))
    for (name, a, b), v in recount(session).items():
        add(session, name, a, b, v)


assert "PREEMPTED" in FailureCause.__members__, "metrics read preemptions as failures with this cause"


def _job_counted(m: effects.Moved) -> None:
    job_moved(m.session, src=m.src.value, src_group=m.src_group, to=m.to.value, to_group=m.to_group)


# A job's change moves it between two (status, group) counts (store.effects).
effects.register(effects.Effect("tallies", 10, _job_counted))
