"""POST /bench/bare-submit: the framework's own ceiling for a submit, for the benchmarks only.

Mounted only with ``RAYLANE_BENCH_BARE_ENDPOINT=true`` (off by default, never in
production). A request goes through everything ``POST /v1/jobs`` goes through
before its route stores anything: the same middleware (request ids, headers,
the body limit, the token lookup), the same dependencies (a member's token, the
submit rate limit), the same JSON body validated into the same ``JobSpec``.
Then it answers 201 and stores nothing, not even the audit row the middleware
writes for a mutating request. ``bench/submit_throughput.py --bare-pairs``
alternates it with real submits on the same server: the ratio of the two is
what the store and the queue cost, on whatever machine runs it."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request, Response

from raylane.api.deps import MemberDep
from raylane.api.ratelimit import submit_limit
from raylane.orchestrator.domain.specs import JobSpec

router = APIRouter(prefix="/bench", tags=["bench"], include_in_schema=False)

BODY = b'{"stored":false}'


@router.post("/bare-submit", status_code=201, dependencies=[Depends(submit_limit)])
async def bare_submit(spec: JobSpec, caller: MemberDep, request: Request) -> Response:
    # The real route commits its audit row with the job (api.auth, ``audited``);
    # this one has no job to commit it with, and a row of its own would be a
    # store the real route does not pay apart: none is written.
    request.state.audited = True
    return Response(BODY, media_type="application/json", status_code=201)
