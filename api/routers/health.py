from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from raylane.api.deps import CP

router = APIRouter(tags=["health"])


@router.get("/healthz", summary="The process is up")
def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/readyz", summary="Ready to accept jobs (the database); `ray` says whether they can run",
            responses={200: {"description": "Accepting jobs. `status` is `degraded` when Ray is unreachable: "
                                            "jobs are stored and wait, `ray.reason` says since when"},
                       503: {"description": "Not accepting jobs (the database); `reason` says why"}})
def readyz(cp: CP):
    # 200 without Ray on purpose: a load balancer keeps routing submits to a replica
    # that stores them (they run when Ray is back); only the database decides.
    body = cp.readiness()
    return JSONResponse(body, status_code=200 if body["accepting_jobs"] else 503)
