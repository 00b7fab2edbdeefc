"""Projects, API tokens and the audit trail. Functions take a session and leave
committing to the caller's unit of work, like ``store.jobs``.

A token is stored only as the sha256 of its secret; looking a caller up is one
indexed read by that hash (``uq_api_tokens_token_hash``).

Invariant: every write that can change who a token is or whether it is live
(its revoked_at, expires_at, role, project, name or hash; a delete) raises the
auth epoch in its own transaction, so a replica that cached the token under the
old epoch drops it on the next request (``services.access``). Triggers on
``api_tokens`` raise it (migration 0012), so no writer, this module's or a
hand-written UPDATE, can forget to; ``mark`` (last_used_at) does not raise it.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import and_, insert, select, text, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from raylane.orchestrator.domain.errors import Conflict, Invalid, NotFound
from raylane.orchestrator.domain.views import AuditEntry, Project, Token
from raylane.orchestrator.store.job_reads import decode_cursor, encode_cursor
from raylane.orchestrator.store.prepared import PreparedInsert
from raylane.orchestrator.store.tables import api_tokens, audit_log, auth_epoch, projects
from raylane.orchestrator.store.transitions import utcnow

BOOTSTRAP_LOCK_ID = 0x726C5F61646D  # PostgreSQL advisory lock: one replica bootstraps at a time
# How stale last_used_at may be: one write per token per minute, not one per request.
LAST_USED_RESOLUTION = timedelta(seconds=60)
MAX_AUDIT_PAGE = 500


# Projects --------------------------------------------------------------------


def create_project(session: Session, name: str, *, description: str | None, actor: str) -> Project:
    row = {"name": name, "description": description, "created_at": utcnow(), "created_by": actor}
    try:
        with session.begin_nested():
            session.execute(insert(projects).values(**row))
    except IntegrityError:
        raise Conflict(f"project {name} already exists", field="name") from None
    return Project(**row)


def get_project(session: Session, name: str) -> Project:
    row = session.execute(select(projects).where(projects.c.name == name)).mappings().first()
    if row is None:
        raise NotFound(f"project {name} not found", field="project")
    return Project(**row)


def list_projects(session: Session, *, only: str | None = None) -> list[Project]:
    q = select(projects).order_by(projects.c.name)
    if only is not None:
        q = q.where(projects.c.name == only)
    return [Project(**r) for r in session.execute(q).mappings()]


# Tokens ----------------------------------------------------------------------


def _token(row) -> Token:
    return Token(**{k: row[k] for k in Token.model_fields})


def insert_token(session: Session, *, token_id: str, token_hash: str, name: str, project: str | None, role: str,
                 actor: str, expires_at: datetime | None) -> Token:
    if project is not None:
        get_project(session, project)
    row = {"id": token_id, "token_hash": token_hash, "name": name, "project": project, "role": role,
           "created_at": utcnow(), "created_by": actor, "expires_at": expires_at}
    session.execute(insert(api_tokens).values(**row))
    return _token({**row, "revoked_at": None, "revoked_by": None, "last_used_at": None})


def token_by_hash(session: Session, token_hash: str, *, now: datetime, mark_used: bool = True) -> dict[str, Any] | None:
    """The live token with this hash (not revoked, not expired), and mark it used
    (unless ``mark_used`` is False: the caller then asks ``needs_mark``)."""
    row = session.execute(select(api_tokens).where(
        api_tokens.c.token_hash == token_hash, api_tokens.c.revoked_at.is_(None),
    )).mappings().first()
    if row is None or (row["expires_at"] is not None and row["expires_at"] <= now):
        return None
    if mark_used and needs_mark(row, now):
        mark(session, row["id"], now)
    return dict(row)


def needs_mark(row, now: datetime) -> bool:
    last = row["last_used_at"]
    return last is None or now - last > LAST_USED_RESOLUTION


def mark(session: Session, token_id: str, now: datetime) -> None:
    session.execute(update(api_tokens).where(api_tokens.c.id == token_id).values(last_used_at=now))


def token_by_id(session: Session, token_id: str, *, now: datetime) -> dict[str, Any] | None:
    """The live token with this id (not revoked, not expired): a session cookie's
    token, checked again on every request."""
    row = session.execute(select(api_tokens).where(
        api_tokens.c.id == token_id, api_tokens.c.revoked_at.is_(None),
    )).mappings().first()
    if row is None or (row["expires_at"] is not None and row["expires_at"] <= now):
        return None
    return dict(row)


def list_tokens(session: Session, *, project: str | None = None, include_revoked: bool = False) -> list[Token]:
    q = select(api_tokens).order_by(api_tokens.c.created_at, api_tokens.c.id)
    if project is not None:
        q = q.where(api_tokens.c.project == project)
    if not include_revoked:
        q = q.where(api_tokens.c.revoked_at.is_(None))
    return [_token(r) for r in session.execute(q).mappings()]


_EPOCH = select(auth_epoch.c.n).where(auth_epoch.c.id == 1)  # read on every request: built once


def epoch(conn) -> int:
    """The auth epoch (one primary-key read; ``conn``: a Session or a Connection)."""
    return conn.execute(_EPOCH).scalar_one()


def revoke_token(session: Session, token_id: str, *, actor: str) -> Token:
    """Revoke at once: the next request with it is refused. Revoking twice is a no-op."""
    session.execute(update(api_tokens).where(api_tokens.c.id == token_id, api_tokens.c.revoked_at.is_(None))
                    .values(revoked_at=utcnow(), revoked_by=actor))
    row = session.execute(select(api_tokens).where(api_tokens.c.id == token_id)).mappings().first()
    if row is None:
        raise NotFound(f"token {token_id} not found", field="token_id")
    return _token(row)


def live_admin_exists(session: Session, *, now: datetime) -> bool:
    rows = session.execute(select(api_tokens.c.expires_at).where(
        api_tokens.c.role == "admin", api_tokens.c.revoked_at.is_(None))).all()
    return any(e is None or e > now for (e,) in rows)


def token_id_by_hash(session: Session, token_hash: str) -> tuple[str, bool] | None:
    row = session.execute(select(api_tokens.c.id, api_tokens.c.revoked_at)
                          .where(api_tokens.c.token_hash == token_hash)).first()
    return (row.id, row.revoked_at is not None) if row else None


def lock_bootstrap(session: Session) -> None:
    """Hold the bootstrap lock until this transaction ends, so two replicas
    starting together do not both create an admin token."""
    # SQLite transactions start with BEGIN IMMEDIATE (store.db): already serialised.
    if session.bind.dialect.name == "postgresql":
        session.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": BOOTSTRAP_LOCK_ID})


def revoke_created_by_except(session: Session, created_by: str, token_hash: str, *, revoked_by: str) -> None:
    """Revoke the live tokens ``created_by`` made, all but the one with ``token_hash``."""
    session.execute(update(api_tokens).where(api_tokens.c.created_by == created_by,
                                             api_tokens.c.token_hash != token_hash,
                                             api_tokens.c.revoked_at.is_(None))
                    .values(revoked_at=utcnow(), revoked_by=revoked_by))


# Audit -----------------------------------------------------------------------


def record(session: Session, entry: dict[str, Any]) -> int:
    """Insert one audit row; return its id."""
    # The row as parameters: one statement compiled once (``.values(**entry)``
    # built and keyed a new one per request).
    return session.execute(insert(audit_log), entry).inserted_primary_key[0]


# No RETURNING id (measured 93 -> 74 us an insert on PostgreSQL), compiled once (store.prepared).
_AUDIT_ROW = PreparedInsert(audit_log)


def append(session: Session, entry: dict[str, Any]) -> None:
    """``record``, for a caller that needs no id back (a submit's own row); on
    PostgreSQL it goes with the commit (``PreparedInsert.defer``)."""
    _AUDIT_ROW.defer(session, entry)


def add_to_counts(session: Session, counts: dict[int, int]) -> None:
    """Add ``n`` to the ``count`` of audit row ``id``, for each id: n in ``counts``."""
    for row_id, n in sorted(counts.items()):  # one order for every replica: no deadlock between them
        session.execute(update(audit_log).where(audit_log.c.id == row_id).values(count=audit_log.c.count + n))


def list_audit(session: Session, *, limit: int = 100, cursor: str | None = None, actor: str | None = None,
               action: str | None = None, since: datetime | None = None) -> tuple[list[AuditEntry], str | None]:
    """A page of audit rows, newest first; the cursor is the last id seen."""
    limit = max(1, min(limit, MAX_AUDIT_PAGE))
    conds = []
    if actor:
        conds.append(audit_log.c.actor == actor)
    if action:
        conds.append(audit_log.c.action == action)
    if since:
        conds.append(audit_log.c.at >= since)
    if cursor:
        try:
            before = int(decode_cursor(cursor))
        except ValueError:
            raise Invalid("cursor is not one this API returned", field="cursor") from None
        conds.append(audit_log.c.id < before)
    rows = session.execute(select(audit_log).where(and_(*conds)).order_by(audit_log.c.id.desc())
                           .limit(limit + 1)).mappings().all()
    more = len(rows) > limit
    rows = rows[:limit]
    return [AuditEntry(**r) for r in rows], (encode_cursor(str(rows[-1]["id"])) if more and rows else None)
