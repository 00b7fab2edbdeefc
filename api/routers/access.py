"""/v1/me, /v1/tokens, /v1/projects (and their quotas), /v1/audit: who may do what."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query, Request, Response

from raylane.api.deps import CP, AdminDep, ReaderDep
from raylane.api.params import Text, When
from raylane.orchestrator.services.access import check_project_visible
from raylane.orchestrator.domain.values import require_timezone
from raylane.orchestrator.domain.views import (
    AuditPage, NewToken, Project, ProjectCreate, ProjectQuota, QuotaUpdate, Token, TokenCreate, Whoami,
)

router = APIRouter(prefix="/v1", tags=["access"])

TokenId = Annotated[str, Path(min_length=1, max_length=32, pattern=r"^[A-Za-z0-9_]+$")]
ProjectName = Annotated[str, Path(min_length=1, max_length=64, pattern=r"^[a-z0-9][a-z0-9-]*$")]


@router.get("/me", response_model=Whoami)
def whoami(request: Request, caller: ReaderDep) -> Whoami:
    """The caller as the server sees the token: name, project and role."""
    return Whoami(name=caller.name, project=caller.project, role=caller.role, token_id=caller.token_id,
                  auth_enabled=request.app.state.settings.auth_enabled)


# Tokens ---------------------------------------------------------------------------


@router.post("/tokens", status_code=201, response_model=NewToken,
             responses={404: {"description": "No such project"}})
def create_token(body: TokenCreate, cp: CP, caller: AdminDep, request: Request, response: Response) -> NewToken:
    """A new API token. The secret is in this response only; the server keeps its sha256."""
    response.headers["Cache-Control"] = "no-store"  # no proxy or browser cache may keep the secret
    tok = cp.access.create_token(body, actor=caller.name)
    request.state.audit_target = tok.id
    return tok


@router.get("/tokens", response_model=list[Token])
def list_tokens(cp: CP, caller: AdminDep, include_revoked: bool = False,
                project: Annotated[Text | None, Query(max_length=64)] = None) -> list[Token]:
    return cp.access.list_tokens(project=caller.project, include_revoked=include_revoked)


@router.post("/tokens/{token_id}/revoke", response_model=Token)
def revoke_token(token_id: TokenId, cp: CP, caller: AdminDep) -> Token:
    """Revoke a token at once: its next request gets 401. Revoking twice is a no-op."""
    return cp.access.revoke_token(token_id, actor=caller.name)


# Projects ---------------------------------------------------------------------------


@router.post("/projects", status_code=201, response_model=Project,
             responses={409: {"description": "The project exists"}})
def create_project(body: ProjectCreate, cp: CP, caller: AdminDep, request: Request) -> Project:
    request.state.audit_target = body.name
    return cp.access.create_project(body.name, description=body.description, actor=caller.name)


@router.get("/projects", response_model=list[Project])
def list_projects(cp: CP, caller: ReaderDep,
                  project: Annotated[Text | None, Query(max_length=64)] = None) -> list[Project]:
    """Every project for an admin; a member or viewer sees their own."""
    return cp.access.list_projects(only=caller.project)


@router.get("/projects/{project}/quota", response_model=ProjectQuota)
def get_quota(project: ProjectName, cp: CP, caller: ReaderDep) -> ProjectQuota:
    """The project's limits per node group, what its active jobs hold there now, and
    its decayed usage there as fair share counts it."""
    check_project_visible(caller, project)
    return cp.access.quota(project, profile=cp.profile)


@router.put("/projects/{project}/quota", response_model=ProjectQuota,
            responses={404: {"description": "No such project"}})
def set_quota(project: ProjectName, body: QuotaUpdate, cp: CP, caller: AdminDep) -> ProjectQuota:
    """Replace the project's quota (groups not named have no limit)."""
    known = {g.name for g in cp.profile.groups} if cp.profile is not None else None
    return cp.access.set_quota(project, body.node_groups, actor=caller.name, known_groups=known, profile=cp.profile)


# Audit ---------------------------------------------------------------------------


@router.get("/audit", response_model=AuditPage)
def audit(cp: CP, caller: AdminDep,
          limit: Annotated[int, Query(ge=1, le=500)] = 100,
          cursor: Annotated[Text | None, Query(max_length=512)] = None,
          actor: Annotated[Text | None, Query(max_length=128)] = None,
          action: Annotated[Text | None, Query(max_length=128)] = None,
          since: When | None = None) -> AuditPage:
    """Mutating requests, newest first: who, what, on which target, from where, with which status."""
    require_timezone("since", since)
    items, next_cursor = cp.access.audit(limit=limit, cursor=cursor, actor=actor, action=action, since=since)
    return AuditPage(items=items, next_cursor=next_cursor)
