"""Dependencies shared by routers: the control plane and the caller.

``raylane.api.auth.AuthMiddleware`` has already resolved the Bearer token to a
``Caller`` (or refused the request with 401) before a router runs; these
dependencies read it and apply the role rules:

- ``CallerDep``: any role for reads; for a mutating method (POST, PUT, PATCH,
  DELETE) at least a member. A new endpoint that takes ``CallerDep`` is
  therefore read-only for viewers unless it says otherwise.
- ``ReaderDep``: any role, whatever the method (``POST /v1/plan`` stores nothing).
- ``MemberDep``: admin or member. ``AdminDep``: admin only.

An admin's requests cover every project unless ``?project=`` narrows them; a
member's or viewer's ``?project=`` must be their own (another project is "not
found", the same answer as a project that does not exist).
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from raylane.orchestrator.services.access import LOCAL_ADMIN, Caller, Role, check_project_visible
from raylane.orchestrator.domain.errors import Forbidden, Unauthorized
from raylane.orchestrator.services.controlplane import ControlPlane

__all__ = ["CP", "Caller", "CallerDep", "ReaderDep", "MemberDep", "AdminDep", "get_caller"]

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


def get_cp(request: Request) -> ControlPlane:
    return request.app.state.cp


def _resolved(request: Request) -> Caller:
    caller = getattr(request.state, "caller", None)
    if caller is None:
        # Only public paths reach a router without a caller (raylane.api.auth.PUBLIC_PATHS).
        if not request.app.state.settings.auth_enabled:
            return LOCAL_ADMIN
        raise Unauthorized("this endpoint needs an API token: send 'Authorization: Bearer <token>'")
    project = request.query_params.get("project")
    if project:
        check_project_visible(caller, project)
        caller = caller.narrowed(project)
    return caller


def get_reader(request: Request) -> Caller:
    return _resolved(request)


def get_caller(request: Request) -> Caller:
    caller = _resolved(request)
    if request.method not in SAFE_METHODS and not caller.can_write:
        raise Forbidden(f"a {caller.role} may only read; this needs a member or admin token")
    return caller


def get_member(request: Request) -> Caller:
    return get_caller(request)


def get_admin(request: Request) -> Caller:
    caller = _resolved(request)
    if caller.role != Role.ADMIN.value:
        raise Forbidden("this needs an admin token")
    return caller


# The dependencies themselves are async: FastAPI runs a sync dependency in the
# thread pool, a round trip through a worker thread for a few attribute reads
# (three of them on every submit). None of them blocks.


async def _cp(request: Request) -> ControlPlane:
    return get_cp(request)


async def _reader(request: Request) -> Caller:
    return get_reader(request)


async def _caller(request: Request) -> Caller:
    return get_caller(request)


async def _member(request: Request) -> Caller:
    return get_member(request)


async def _admin(request: Request) -> Caller:
    return get_admin(request)


CP = Annotated[ControlPlane, Depends(_cp)]
CallerDep = Annotated[Caller, Depends(_caller)]
ReaderDep = Annotated[Caller, Depends(_reader)]
MemberDep = Annotated[Caller, Depends(_member)]
AdminDep = Annotated[Caller, Depends(_admin)]
