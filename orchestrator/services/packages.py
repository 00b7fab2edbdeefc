"""Code packages as the API sees them: upload (content-addressed, so a tree
already here is never stored twice), ask whether one exists, and check that the
packages a spec names exist before it is stored.

Rules: a package's bytes must hash to the sha256 it is uploaded under and fit
``RAYLANE_PACKAGE_MAX_BYTES``; only members and admins upload (the API's
``MemberDep``). Each upload runs a bounded sweep of packages unused for
``RAYLANE_PACKAGE_RETENTION_S`` that no live job names, so storage stays bounded
without a loop of its own.
"""

from __future__ import annotations

import hashlib
import logging
from datetime import timedelta

from raylane.orchestrator.domain.errors import Invalid
from raylane.orchestrator.domain.packages import SHA256_RE, package_sha
from raylane.orchestrator.domain.specs import JobSpec
from raylane.orchestrator.settings import Settings
from raylane.orchestrator.store import db, packages as store_packages
from raylane.orchestrator.store.transitions import utcnow

log = logging.getLogger(__name__)


def spec_packages(spec: JobSpec) -> list[tuple[str, str]]:
    """(field, sha256) of every package URI in the spec's runtime_env."""
    env = spec.runtime_env
    items = ([("runtime_env.working_dir", env.working_dir)] if env.working_dir else []) + \
        [("runtime_env.py_modules", m) for m in env.py_modules]
    return [(f, sha) for f, v in items if (sha := package_sha(v))]


class Packages:
    def __init__(self, settings: Settings, sessions):
        self.settings = settings
        self.sessions = sessions

    def exists(self, sha256: str) -> bool:
        _check_name(sha256)
        with db.read(self.sessions) as s:
            return store_packages.exists_(s, sha256)

    def upload(self, sha256: str, data: bytes, *, project: str | None, actor: str) -> bool:
        """Store a package; True if new, False if it was already here."""
        _check_name(sha256)
        limit = self.settings.package_max_bytes
        if len(data) > limit:
            raise Invalid(f"the package is {len(data)} bytes; at most {limit} are allowed "
                          f"(RAYLANE_PACKAGE_MAX_BYTES)", field="body")
        got = hashlib.sha256(data).hexdigest()
        if got != sha256:
            raise Invalid(f"the body's sha256 is {got}, not {sha256}", field="sha256")
        now = utcnow()
        with db.transaction(self.sessions) as s:
            created = store_packages.put(s, sha256, data, project=project, actor=actor, now=now)
        self.sweep()
        return created

    def sweep(self) -> list[str]:
        cutoff = utcnow() - timedelta(seconds=self.settings.package_retention_s)
        with db.transaction(self.sessions) as s:
            gone = store_packages.sweep(s, unused_before=cutoff)
        if gone:
            log.info("deleted %d unused package(s): %s", len(gone), ", ".join(g[:12] for g in gone))
        return gone

    @staticmethod
    def names_any(spec: JobSpec) -> bool:
        """Whether ``claim_for`` has packages to claim (a transaction) for ``spec``."""
        return bool(spec_packages(spec))

    def claim_for(self, spec: JobSpec) -> None:
        """Every package the spec names exists; each is marked used now, so the
        sweep keeps it while the job is submitted."""
        refs = spec_packages(spec)
        if not refs:
            return
        now = utcnow()
        with db.transaction(self.sessions) as s:
            for field, sha in refs:
                if not store_packages.touch(s, sha, now=now):
                    raise Invalid(f"{field}: package {sha} was never uploaded (or was deleted as unused): "
                                  f"upload it with PUT /v1/packages/{sha}", field=field)


def _check_name(sha256: str) -> None:
    if not SHA256_RE.match(sha256):
        raise Invalid("a package is named by the sha256 of its bytes: 64 lower-case hex digits", field="sha256")
