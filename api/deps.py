"""Dependencies shared by routers: the control plane and the caller."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request

from orchestrator.service import ControlPlane


def get_cp(request: Request) -> ControlPlane:
    return request.app.state.cp


@dataclass(frozen=True)
class Caller:
    """Who is calling. ``project`` scopes every read and write; None means all
    projects (an admin)."""

    name: str
    project: str | None
    role: str = "admin"


def get_caller(request: Request) -> Caller:
    # Until token auth lands every caller is the local admin of every project.
    return Caller(name="local", project=None, role="admin")


CP = Annotated[ControlPlane, Depends(get_cp)]
CallerDep = Annotated[Caller, Depends(get_caller)]
