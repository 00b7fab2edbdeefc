"""The only writer of a job's status and of an attempt's.

``transition`` is a compare-and-set: it reads the current status, checks the
arrow against ``states.ALLOWED``, and updates ``WHERE id=:id AND status=:seen``.
If another writer got there first (rowcount 0), it re-reads and tries again a
bounded number of times, then raises ``InvalidTransition``. Every change writes
an event row in the same transaction.

``set_attempt`` does the same for an attempt (``states.ATTEMPT_ALLOWED``), keyed
by job id and attempt number; an attempt's change has no event of its own (the
job's transition written with it names the attempt).

A job's change then runs the registered after-effects (``store.effects``, listed
in ``store.policy``: tallies, the webhook outbox, arrays, dependents), in the same
transaction. ``set_attempt`` keeps ``store.tallies`` in step (an attempt's
failure cause and start) and the attempt's held span (``store.usage_rows``); so
does ``set_attempt_cause``, the only other writer of an attempt's cause.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any, Iterable

from sqlalchemy import bindparam, insert, select, update
from sqlalchemy.orm import Session
from sqlalchemy.sql import ClauseElement

from raylane.orchestrator.domain.errors import InvalidTransition, NotFound
from raylane.orchestrator.domain.states import ALLOWED, ATTEMPT_ALLOWED, AttemptStatus, JobStatus
from raylane.orchestrator.store import effects, tallies, usage_rows
from raylane.orchestrator.store.effects import Moved
from raylane.orchestrator.store.prepared import PreparedInsert
from raylane.orchestrator.store.tables import attempts, events, jobs

# A status can change only a few times; more lost races than this means a bug
# (avoid an infinite loop if one happens).
MAX_CAS_RETRIES = 8


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


# The statements of every status change, built once with bound parameters: a
# statement built per call (``update(jobs).where(jobs.c.id == job_id).values(...)``)
# spent more CPU building its clauses and its cache key than the database spent
# running it (bench/lifecycle_cpu.py). An UPDATE's SET comes from the parameters'
# keys, so one statement serves every set of columns (SQLAlchemy caches one
# compiled form per set). Parameter names start with ``b_``: a bound name may not
# be a column's.
_JOB_SEEN = select(jobs.c.status, jobs.c.node_group, jobs.c.array_id).where(jobs.c.id == bindparam("b_id"))
_JOB_MOVE = update(jobs).where(jobs.c.id == bindparam("b_id"), jobs.c.status == bindparam("b_src"))
_EVENT = insert(events)
_ATTEMPT_WHERE = (attempts.c.job_id == bindparam("b_job"), attempts.c.number == bindparam("b_number"))
_ATTEMPT_SEEN = select(attempts.c.status, attempts.c.cause, attempts.c.node_group, attempts.c.created_at,
                       attempts.c.started_at, attempts.c.ended_at).where(*_ATTEMPT_WHERE)
_ATTEMPT_SEEN_LOCKED = _ATTEMPT_SEEN.with_for_update()
_ATTEMPT_MOVE = update(attempts).where(*_ATTEMPT_WHERE, attempts.c.status == bindparam("b_src"))


_CHECKED: set[tuple[str, frozenset[str]]] = set()  # (table, column names) sets already checked


def _plain(values: dict[str, Any], table=jobs) -> bool:
    """Values that can travel as parameters (no SQL expression among them). A name
    that is no column raises, as ``.values(**values)`` did: as parameters it would
    be dropped without a word."""
    names = frozenset(values)
    if (table.name, names) not in _CHECKED:
        unknown = names - set(table.c.keys())
        if unknown:
            raise ValueError(f"{table.name} has no column {', '.join(sorted(unknown))}")
        _CHECKED.add((table.name, names))
    return not any(isinstance(v, ClauseElement) for v in values.values())


def transition(
    session: Session,
    job_id: str,
    to: JobStatus,
    *,
    reason: str | None,
    actor: str,
    expected: Iterable[JobStatus] | None = None,
    attempt: int | None = None,
    values: dict[str, Any] | None = None,
    now: datetime | None = None,
    cascade: bool = True,
) -> JobStatus:
    """Move ``job_id`` to ``to``; return the status it came from. ``cascade``: an end
    updates the job's dependents (``store.dependencies``, which passes False while it
    walks a chain itself).

    ``expected`` narrows the allowed sources further (e.g. the reconciler only
    moves RUNNING jobs to SUCCEEDED). ``values`` are other columns set in the
    same UPDATE. ``status_reason`` is set to ``reason`` unless ``values`` sets it.
    """
    now = now or utcnow()
    allowed = {s for s, dsts in ALLOWED.items() if to in dsts}
    if expected is not None:
        allowed &= set(expected)
    for _ in range(MAX_CAS_RETRIES):
        seen = session.execute(_JOB_SEEN, {"b_id": job_id}).first()
        if seen is None:
            raise NotFound(f"job {job_id} not found")
        src = JobStatus(seen.status)
        array_id = seen.array_id
        if src not in allowed:
            raise InvalidTransition(f"job {job_id} is {src.value}; it cannot become {to.value}")
        vals = {"status_reason": reason, **(values or {}), "status": to.value, "updated_at": now}
        if _plain(vals):
            res = session.execute(_JOB_MOVE, {"b_id": job_id, "b_src": src.value, **vals})
        else:
            res = session.execute(update(jobs).where(jobs.c.id == job_id, jobs.c.status == src.value).values(**vals))
        if res.rowcount == 1:
            ev = session.execute(_EVENT, {"job_id": job_id, "at": now, "from_status": src.value, "to_status": to.value,
                                          "reason": reason, "actor": actor, "attempt": attempt})
            moved = Moved(session, job_id, src, to, seen.node_group, vals.get("node_group", seen.node_group),
                          array_id, ev.inserted_primary_key[0], now, cascade)
            for rule in effects.rules(to):  # store.policy: tallies, the webhook outbox, arrays, dependents
                rule.run(moved)
            return src
    raise InvalidTransition(f"job {job_id}: lost {MAX_CAS_RETRIES} races moving to {to.value}")


_JOBS_SEEN = select(jobs.c.id, jobs.c.status, jobs.c.node_group, jobs.c.project, jobs.c.created_at) \
    .where(jobs.c.id.in_(bindparam("b_ids", expanding=True)))
_EVENTS_LATER = PreparedInsert(events)


def transition_many(session: Session, moves: list[dict[str, Any]], to: JobStatus, *, actor: str,
                    now: datetime, expected: Iterable[JobStatus] | None = None) -> dict[str, datetime]:
    """``transition`` of many jobs to one non-terminal status, each from the status
    it was read in by this transaction (under its lock): ``moves`` are dicts of
    ``job_id``, ``src``, ``reason``, ``attempt`` and ``values``. One read of the
    jobs, one executemany of the updates, the events with the commit (one at a
    time, with their deliveries, if a hook wants ``to``); an admission pass made
    seven statements a job. If a job is not in ``src`` any more, they all go through
    ``transition`` with ``expected``, as before. Returns each job's ``created_at``."""
    if to.is_terminal():
        raise ValueError("an end has cascades (arrays, dependents): use transition")
    if not moves:
        return {}
    seen = {r.id: r for r in session.execute(_JOBS_SEEN, {"b_ids": [m["job_id"] for m in moves]})}
    allowed = {s for s, dsts in ALLOWED.items() if to in dsts}
    if expected is not None:
        allowed &= set(expected)
    stale = [m for m in moves if m["job_id"] not in seen or seen[m["job_id"]].status != m["src"].value
             or m["src"] not in allowed]
    rules = effects.rules(to)
    projects = {r.project for r in seen.values()}
    hooked = any(r.wants_events(session, projects, to) for r in rules if r.wants_events is not None)
    if stale or hooked or len({frozenset(m["values"]) for m in moves}) > 1 \
            or not session.bind.dialect.supports_sane_multi_rowcount:
        for m in moves:
            transition(session, m["job_id"], to, reason=m["reason"], actor=actor, expected=expected,
                       attempt=m["attempt"], values=m["values"], now=now)
        return {m["job_id"]: seen[m["job_id"]].created_at for m in moves if m["job_id"] in seen}
    params = []
    for m in moves:
        vals = {"status_reason": m["reason"], **m["values"], "status": to.value, "updated_at": now}
        if not _plain(vals):
            raise ValueError("transition_many takes values as parameters only")
        params.append({"b_id": m["job_id"], "b_src": m["src"].value, **vals})
    res = session.execute(_JOB_MOVE, params)
    if res.rowcount != len(moves):  # the rows are the transaction's: nothing else moved them
        raise InvalidTransition(f"moved {res.rowcount} of {len(moves)} jobs to {to.value}")
    batched = [r for r in rules if r.wants_events is None]  # a rule that wants each event made the batch go singly
    for m, p in zip(moves, params):
        moved = Moved(session, m["job_id"], m["src"], to, seen[m["job_id"]].node_group,
                      p.get("node_group", seen[m["job_id"]].node_group), None, None, now, True)
        for rule in batched:
            rule.run(moved)
    _EVENTS_LATER.defer(session, [{"job_id": m["job_id"], "at": now, "from_status": m["src"].value,
                                   "to_status": to.value, "reason": m["reason"], "actor": actor,
                                   "attempt": m["attempt"]} for m in moves])
    return {m["job_id"]: seen[m["job_id"]].created_at for m in moves}


def record_event(
    session: Session, job_id: str, *, status: JobStatus, reason: str, actor: str,
    attempt: int | None = None, now: datetime | None = None,
) -> None:
    """An event that is not a status change (e.g. "waiting for 2 GPUs")."""
    session.execute(_EVENT, {"job_id": job_id, "at": now or utcnow(), "from_status": status.value,
                             "to_status": status.value, "reason": reason, "actor": actor, "attempt": attempt})


def set_attempt(
    session: Session,
    job_id: str,
    number: int,
    to: AttemptStatus,
    *,
    expected: Iterable[AttemptStatus] | None = None,
    values: dict[str, Any] | None = None,
) -> AttemptStatus:
    """Move attempt ``number`` of ``job_id`` to ``to``; return the status it came from.

    A compare-and-set like ``transition``: an arrow ``states.ATTEMPT_ALLOWED``
    lacks, or a status outside ``expected``, raises ``InvalidTransition``.
    """
    allowed = {s for s, dsts in ATTEMPT_ALLOWED.items() if to in dsts}
    if expected is not None:
        allowed &= set(expected)
    key = {"b_job": job_id, "b_number": number}
    # Locked (PostgreSQL): the cause read here is the one this update replaces,
    # even when set_attempt_cause writes the same row meanwhile. SQLite
    # serialises writers already.
    seen_q = _ATTEMPT_SEEN_LOCKED if session.bind.dialect.name == "postgresql" else _ATTEMPT_SEEN
    for _ in range(MAX_CAS_RETRIES):
        seen = session.execute(seen_q, key).first()
        if seen is None:
            raise NotFound(f"attempt {number} of job {job_id} not found")
        src = AttemptStatus(seen.status)
        if src not in allowed:
            raise InvalidTransition(f"attempt {number} of job {job_id} is {src.value}; it cannot become {to.value}")
        if _plain(values or {}, attempts):
            res = session.execute(_ATTEMPT_MOVE, {**key, "b_src": src.value, **(values or {}), "status": to.value})
        else:
            res = session.execute(update(attempts).where(attempts.c.job_id == job_id, attempts.c.number == number,
                                                         attempts.c.status == src.value)
                                  .values(**(values or {}), status=to.value))
        if res.rowcount == 1:
            vals = values or {}
            if "cause" in vals:
                tallies.cause_changed(session, seen.node_group, seen.cause, vals["cause"])
            if vals.get("started_at") is not None and seen.started_at is None:
                tallies.observe(session, "dispatch_latency", seen.node_group,
                                (vals["started_at"] - seen.created_at).total_seconds())
            usage_rows.moved(session, job_id, number, _span(seen), _span(seen, {**vals, "status": to.value}))
            return src
    raise InvalidTransition(f"attempt {number} of job {job_id}: lost {MAX_CAS_RETRIES} races moving to {to.value}")


def set_attempt_cause(session: Session, job_id: str, number: int, cause: str, *,
                      message: str | None = None) -> None:
    """Name the cause a live attempt will end with (Raylane is stopping it), and its message if given."""
    where = (attempts.c.job_id == job_id, attempts.c.number == number)
    seen = session.execute(_for_update(session, select(
        attempts.c.status, attempts.c.cause, attempts.c.node_group, attempts.c.created_at, attempts.c.started_at,
        attempts.c.ended_at).where(*where))).first()
    if seen is None:
        raise NotFound(f"attempt {number} of job {job_id} not found")
    vals: dict[str, Any] = {"cause": cause}
    if message is not None:
        vals["message"] = message
    session.execute(update(attempts).where(*where).values(**vals))
    tallies.cause_changed(session, seen.node_group, seen.cause, cause)
    usage_rows.moved(session, job_id, number, _span(seen), _span(seen, vals))


def _span(seen, changed: dict[str, Any] | None = None) -> tuple[int | None, int | None]:
    """The held span of the attempt read as ``seen``, with ``changed`` written over it."""
    v = {"status": seen.status, "cause": seen.cause, "created_at": seen.created_at,
         "started_at": seen.started_at, "ended_at": seen.ended_at}
    v.update({k: changed[k] for k in v if changed and k in changed})
    return usage_rows.span_micros(**v)


def _for_update(session: Session, q):
    """``q`` locking its rows on PostgreSQL (SQLite serialises writers already)."""
    return q.with_for_update() if session.bind.dialect.name == "postgresql" else q
