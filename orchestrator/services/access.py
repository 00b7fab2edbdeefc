"""Who may do what: roles, callers, API tokens, projects, quotas and the audit trail.

Words used here:

- *token*: a random secret (``rl_`` + 43 URL-safe characters) that a client sends
  as ``Authorization: Bearer <token>``. The database keeps only its sha256; the
  secret is shown once, to whoever created it. A token has a public ``id``
  (``tok_...``) for lists, revocation and audit rows.
- *caller*: who a request comes from (``Caller``): a name, a project scope and a role.
- *role*: ``admin`` manages projects, tokens and quotas and sees every project;
  ``member`` submits and cancels its project's jobs and reads its project;
  ``viewer`` reads its project.
- *bootstrap admin*: the token an operator starts with: ``RAYLANE_ADMIN_TOKEN``,
  or, when that is unset, one generated at the first start (printed once and
  written to ``<data_dir>/admin_token``, mode 0600).

Scoping is by project everywhere: the API passes ``Caller.project`` to every
store read and write (None: every project, admins only). An object of another
project is "not found", the same answer as an object that does not exist.
"""

from __future__ import annotations

import hashlib
import logging
import os
import secrets
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from enum import Enum
from pathlib import Path

from pydantic import SecretStr
from raylane.orchestrator.domain import fairshare
from raylane.orchestrator.domain.errors import Invalid, NotFound
from raylane.orchestrator.domain.profile import Profile
from raylane.orchestrator.domain.views import (
    AuditEntry, GroupLimits, GroupQuota, NewToken, Project, ProjectQuota, Token, TokenCreate,
)
from raylane.orchestrator.settings import Settings, private_dir
from raylane.orchestrator.store import db, fairshare as store_fairshare, quotas as store_quotas, tokens as store
from raylane.orchestrator.store.transitions import utcnow

log = logging.getLogger(__name__)

TOKEN_PREFIX = "rl_"
MAX_TOKEN_LEN = 512  # longer Bearer values are refused before hashing
ADMIN_TOKEN_FILE = "admin_token"
FROM_SETTING = "setting RAYLANE_ADMIN_TOKEN"  # created_by of the token that setting makes
GENERATED = "generated at first start"


class Role(str, Enum):
    """What a caller may do (docs/auth.md has the full table)."""

    ADMIN = "admin"  # projects, tokens, quotas, audit; every project's jobs
    MEMBER = "member"  # submit, cancel and read its project's jobs
    VIEWER = "viewer"  # read its project's jobs


@dataclass(frozen=True)
class Caller:
    """Who is calling. ``project`` scopes every read and write; None means all
    projects (an admin who did not narrow the request with ``?project=``)."""

    name: str
    project: str | None
    role: str = Role.ADMIN.value
    token_id: str | None = None
    home_project: str | None = None  # an admin token's default project for submissions

    @property
    def is_admin(self) -> bool:
        return self.role == Role.ADMIN.value

    @property
    def can_write(self) -> bool:
        return self.role in (Role.ADMIN.value, Role.MEMBER.value)

    def sees(self, project: str) -> bool:
        return self.project is None or self.project == project

    def narrowed(self, project: str) -> "Caller":
        return replace(self, project=project)


# Auth switched off (development): every caller is this admin, as before auth existed.
LOCAL_ADMIN = Caller(name="local", project=None, role=Role.ADMIN.value)


def new_secret() -> str:
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def new_token_id() -> str:
    return "tok_" + secrets.token_hex(8)


def hash_token(secret: str) -> str:
    # A token is 256 random bits: a plain (unsalted, fast) hash is enough; no
    # dictionary to slow down. It lets a lookup be one indexed read.
    return hashlib.sha256(secret.encode()).hexdigest()


# Tokens kept verified in memory per replica: far more than live tokens in any
# deployment; reaching it clears them all (each is read again once).
MAX_VERIFIED_TOKENS = 10_000


@dataclass
class _Verified:
    epoch: int  # the auth epoch read before the token's row was
    caller: Caller
    expires_at: datetime | None
    marked_at: datetime  # last_used_at as written (or read)


class Access:
    """The service functions for identities, projects, quotas and the audit
    trail: what ``api/`` calls. Each opens one unit of work."""

    def __init__(self, settings: Settings, sessions):
        self.settings = settings
        self.sessions = sessions
        self.writes = None  # the control plane's GroupCommit: audit rows share its commits
        self._verified: dict[str, _Verified] = {}  # sha256 of a secret -> the token as last verified

    # Authentication ----------------------------------------------------------

    def authenticate(self, secret: str | None) -> Caller | None:
        """The caller a Bearer secret belongs to, or None (unknown, revoked or expired).

        A verified token is kept in memory (``_verified``) tagged with the auth
        epoch read *before* its row was; a request reads the epoch (one
        primary-key read, no ORM) and trusts the kept token only while the
        epoch is unchanged. A revoke raises the epoch in its transaction
        (``store.tokens``), so once it commits the next request on every
        replica reads the token's row again and is refused. Expiry is checked
        against the clock on every request."""
        if not secret or len(secret) > MAX_TOKEN_LEN:
            return None
        now = utcnow()
        digest = hash_token(secret)
        epoch = self.epoch()
        kept = self._verified.get(digest)
        if kept is not None and kept.epoch == epoch:
            if kept.expires_at is not None and kept.expires_at <= now:
                return None
            if now - kept.marked_at > store.LAST_USED_RESOLUTION:
                self._mark(kept.caller.token_id, now)
                kept.marked_at = now
            return kept.caller
        # A read (no write lock), and a write at most once a minute per token (last_used_at).
        with db.read(self.sessions) as s:
            row = store.token_by_hash(s, digest, now=now, mark_used=False)
        if row is None:
            self._verified.pop(digest, None)
            return None
        marked = row["last_used_at"]
        if store.needs_mark(row, now):
            self._mark(row["id"], now)
            marked = now
        caller = _caller(row)
        if len(self._verified) >= MAX_VERIFIED_TOKENS:
            self._verified.clear()  # bounded: a flood of distinct valid tokens re-reads them
        self._verified[digest] = _Verified(epoch, caller, row["expires_at"], marked)
        return caller

    def epoch(self) -> int:
        """The auth epoch now (one primary-key read)."""
        with db.read_connection(self.sessions) as conn:
            return store.epoch(conn)

    def knows(self, digest: str) -> bool:
        """Whether the token of this sha256 was verified here (under some epoch)."""
        return digest in self._verified

    def remembered(self, digest: str, epoch: int) -> Caller | None | bool:
        """``authenticate`` without I/O, for a token verified before under ``epoch``
        (read after the request arrived): its caller, or None when it expired;
        False when that takes ``authenticate`` (not kept, kept under another
        epoch, or its ``last_used_at`` is due)."""
        kept = self._verified.get(digest)
        if kept is None or kept.epoch != epoch:
            return False
        now = utcnow()
        if kept.expires_at is not None and kept.expires_at <= now:
            return None
        if now - kept.marked_at > store.LAST_USED_RESOLUTION:
            return False
        return kept.caller

    def _mark(self, token_id: str, now) -> None:
        with db.transaction(self.sessions) as s:
            store.mark(s, token_id, now)

    def caller_by_token_id(self, token_id: str) -> Caller | None:
        """The caller of a live token by its public id (a signed session cookie
        names it), or None (unknown, revoked or expired)."""
        with db.read(self.sessions) as s:
            return _caller(store.token_by_id(s, token_id, now=utcnow()))

    def bootstrap(self) -> str | None:
        """Make sure an admin can get in. Returns a newly generated admin secret,
        which the caller shows once; None when nothing was generated."""
        configured = self.settings.admin_token
        if isinstance(configured, SecretStr):
            configured = configured.get_secret_value()
        if configured and configured.strip():
            self._ensure_setting_token(configured.strip())
            return None
        if not self.settings.auth_enabled:
            return None
        now = utcnow()
        with db.transaction(self.sessions) as s:
            store.lock_bootstrap(s)
            if store.live_admin_exists(s, now=now):
                return None
            secret = new_secret()
            store.insert_token(s, token_id=new_token_id(), token_hash=hash_token(secret), name="admin", project=None,
                               role=Role.ADMIN.value, actor=GENERATED, expires_at=None)
        self._write_secret_file(secret)
        return secret

    def admin_token_path(self) -> Path:
        return self.settings.data_dir / ADMIN_TOKEN_FILE

    def _ensure_setting_token(self, secret: str) -> None:
        h = hash_token(secret)
        with db.transaction(self.sessions) as s:
            store.lock_bootstrap(s)
            found = store.token_id_by_hash(s, h)
            if found is None:
                store.insert_token(s, token_id=new_token_id(), token_hash=h, name="admin", project=None,
                                   role=Role.ADMIN.value, actor=FROM_SETTING, expires_at=None)
            elif found[1]:
                log.warning("RAYLANE_ADMIN_TOKEN was revoked (token %s); it is refused until the setting changes",
                            found[0])
            # A changed setting rotates: the token the old value made stops working.
            store.revoke_created_by_except(s, FROM_SETTING, h, revoked_by="RAYLANE_ADMIN_TOKEN changed")

    def _write_secret_file(self, secret: str) -> None:
        path = self.admin_token_path()
        try:
            private_dir(path.parent)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(secret + "\n")
            os.chmod(path, 0o600)  # O_CREAT's mode applies only to a new file
        except OSError as e:
            log.error("could not write the admin token to %s: %s", path, e)

    # Tokens ----------------------------------------------------------------------

    def create_token(self, req: TokenCreate, *, actor: str) -> NewToken:
        if req.role != Role.ADMIN.value and req.project is None:
            raise Invalid(f"a {req.role} token needs a project", field="project")
        expires_at = utcnow() + timedelta(days=req.expires_in_days) if req.expires_in_days else None
        secret = new_secret()
        with db.transaction(self.sessions) as s:
            tok = store.insert_token(s, token_id=new_token_id(), token_hash=hash_token(secret), name=req.name,
                                     project=req.project, role=req.role, actor=actor, expires_at=expires_at)
        return NewToken(**tok.model_dump(), token=secret)

    def list_tokens(self, *, project: str | None = None, include_revoked: bool = False) -> list[Token]:
        with db.read(self.sessions) as s:
            return store.list_tokens(s, project=project, include_revoked=include_revoked)

    def revoke_token(self, token_id: str, *, actor: str) -> Token:
        with db.transaction(self.sessions) as s:
            return store.revoke_token(s, token_id, actor=actor)

    # Projects ----------------------------------------------------------------------

    def create_project(self, name: str, *, description: str | None, actor: str) -> Project:
        with db.transaction(self.sessions) as s:
            return store.create_project(s, name, description=description, actor=actor)

    def list_projects(self, *, only: str | None = None) -> list[Project]:
        with db.read(self.sessions) as s:
            return store.list_projects(s, only=only)

    # Quotas ----------------------------------------------------------------------

    def quota(self, project: str, *, profile: Profile | None = None) -> ProjectQuota:
        """The project's limits per node group, with what its active jobs hold now and
        its decayed usage there as fair share counts it (``domain.fairshare``: the
        unit of a group of ``profile`` is GPU-seconds where its nodes have GPUs)."""
        half_life = self.settings.fair_share_half_life_s
        with db.read(self.sessions) as s:
            limits = store_quotas.load_limits(s, project=project)
            used = store_quotas.usage(s, project=project)
            fair = store_fairshare.usage(s, now=utcnow(), half_life_s=half_life, project=project) \
                if half_life > 0 else None
        groups_of = profile.groups if profile is not None else []
        standing = None if fair is None else fairshare.Standing.of(
            fair, {g.name for g in groups_of if g.gpus > 0}, {g.name for g in groups_of})
        recent = {k for k, u in (fair or {}).items() if u.gpu_s > 0 or u.cpu_s > 0}
        groups: dict[str, GroupQuota] = {}
        for (_, g) in sorted(set(limits) | set(used) | recent):
            lim = limits.get((project, g)) or store_quotas.Limits()
            u = used.get((project, g)) or store_quotas.Usage()
            groups[g] = GroupQuota(max_gpus=lim.max_gpus, max_cpus=lim.max_cpus,
                                   max_concurrent_jobs=lim.max_concurrent_jobs, borrow_gpus=lim.borrow_gpus,
                                   borrow_cpus=lim.borrow_cpus, lend_gpus=lim.lend_gpus, lend_cpus=lim.lend_cpus,
                                   used_gpus=round(u.gpus, 6), used_cpus=round(u.cpus, 6), active_jobs=u.jobs,
                                   borrowed_gpus=round(max(0.0, u.gpus - lim.max_gpus), 6)
                                   if lim.max_gpus is not None else 0.0,
                                   borrowed_cpus=round(max(0.0, u.cpus - lim.max_cpus), 6)
                                   if lim.max_cpus is not None else 0.0,
                                   fair_share_usage=None if standing is None else round(standing.usage(project, g), 3))
        return ProjectQuota(project=project, node_groups=groups)

    def set_quota(self, project: str, groups: dict[str, GroupLimits], *, actor: str,
                  known_groups: set[str] | None = None, profile: Profile | None = None) -> ProjectQuota:
        if known_groups is not None:
            unknown = sorted(set(groups) - known_groups)
            if unknown:
                raise Invalid(f"no node group {', '.join(unknown)} in the cluster profile "
                              f"(groups: {', '.join(sorted(known_groups))})", field="node_groups")
        with db.transaction(self.sessions) as s:
            store.get_project(s, project)
            store_quotas.set_limits(s, project, {g: store_quotas.Limits(**lim.model_dump()) for g, lim in groups.items()},
                                    actor=actor)
        return self.quota(project, profile=profile)

    # Audit -------------------------------------------------------------------------

    def record(self, entry: dict) -> int:
        """Write one audit row; return its id (once committed: with the
        control plane's group commit when it has one, ``writes``)."""
        row = {**entry, "at": entry.get("at") or utcnow()}
        if self.writes is not None:
            return self.writes.run(lambda s: store.record(s, row))
        with db.transaction(self.sessions) as s:
            return store.record(s, row)

    def add_to_counts(self, counts: dict[int, int]) -> None:
        """Add requests to aggregated audit rows (``api.refusals``): row id -> how many."""
        with db.transaction(self.sessions) as s:
            store.add_to_counts(s, counts)

    def audit(self, *, limit: int, cursor: str | None, actor: str | None = None, action: str | None = None,
              since=None) -> tuple[list[AuditEntry], str | None]:
        with db.read(self.sessions) as s:
            return store.list_audit(s, limit=limit, cursor=cursor, actor=actor, action=action, since=since)


def _caller(row) -> Caller | None:
    if row is None:
        return None
    admin = row["role"] == Role.ADMIN.value
    return Caller(name=row["name"], project=None if admin else row["project"], role=row["role"],
                  token_id=row["id"], home_project=row["project"])


def check_project_visible(caller: Caller, project: str) -> None:
    """Another project's objects are "not found" to a non-admin, like missing ones."""
    if not caller.sees(project):
        raise NotFound(f"project {project} not found", field="project")
