from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from raylane.api.deps import CP

router = APIRouter(tags=["health"])


@router.get("/healthz", summary="The process is up")
def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/readyz", summary="The database is reachable and migrated to head",
            responses={503: {"description": "Not ready; `reason` says why"}})
def readyz(cp: CP):
    ok, reason = cp.ready()
    return JSONResponse({"status": "ok" if ok else "unavailable", "reason": reason}, status_code=200 if ok else 503)
