"""/v1/packages: code uploaded by clients, named by the sha256 of its bytes.

``HEAD /v1/packages/{sha256}`` says whether the control plane has a package
(200) or not (404), so a client sends a tree it uploaded before not at all;
``PUT`` stores the raw zip (members and admins; at most
``RAYLANE_PACKAGE_MAX_BYTES``, which ``BodySizeLimit`` applies to this path
instead of ``RAYLANE_MAX_BODY_BYTES``). A spec refers to a package as
``runtime_env.working_dir: raylane://packages/<sha256>``.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Request, Response
from starlette.concurrency import run_in_threadpool

from raylane.api.deps import CP, CallerDep, MemberDep

PREFIX = "/v1/packages/"
router = APIRouter(prefix="/v1/packages", tags=["packages"])

Sha256 = Annotated[str, Path(min_length=64, max_length=64, pattern=r"^[0-9a-f]{64}$",
                             description="sha256 of the package's bytes, lower-case hex")]


@router.head("/{sha256}", summary="Whether a package is stored", status_code=200,
             responses={404: {"description": "Not stored: upload it"}})
def package_exists(sha256: Sha256, cp: CP, caller: CallerDep) -> Response:
    return Response(status_code=200 if cp.packages.exists(sha256) else 404)


@router.put("/{sha256}", summary="Upload a package (a zip of a working dir)", status_code=201,
            responses={200: {"description": "Already stored; nothing written"},
                       413: {"description": "Larger than RAYLANE_PACKAGE_MAX_BYTES"},
                       422: {"description": "The body's sha256 is not the one in the path"}},
            openapi_extra={"requestBody": {"required": True, "content": {
                "application/zip": {"schema": {"type": "string", "format": "binary"}}}}})
async def upload_package(sha256: Sha256, request: Request, cp: CP, caller: MemberDep) -> Response:
    data = await request.body()
    request.state.audit_target = sha256
    # The database write (and the sweep) off the event loop, as a sync route would run.
    created = await run_in_threadpool(cp.packages.upload, sha256, data, project=caller.project or caller.home_project,
                                      actor=caller.name)
    return Response(status_code=201 if created else 200,
                    content=f'{{"sha256": "{sha256}", "uri": "raylane://packages/{sha256}", '
                            f'"size_bytes": {len(data)}, "created": {str(created).lower()}}}',
                    media_type="application/json")
