"""/v1/session: a browser's sign-in to Ray's dashboard under ``/ray`` (``api.session``).

``POST`` with the Raylane token as Bearer sets the session cookie; ``DELETE``
clears it. Any role may sign in: what ``/ray`` shows depends on the role."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response

from raylane.api.deps import ReaderDep

router = APIRouter(prefix="/v1/session", tags=["session"])


def _secure(request: Request) -> bool:
    public = request.app.state.settings.public_url or ""
    return request.url.scheme == "https" or public.startswith("https://")


@router.post("", status_code=204, response_class=Response,
             responses={204: {"description": "Signed in: the answer sets the HttpOnly `raylane_session` cookie "
                                             "for /ray (Ray's dashboard)"}})
def sign_in(request: Request, caller: ReaderDep) -> Response:
    sessions = request.app.state.sessions
    response = Response(status_code=204)
    # A session stands for a token; local-admin mode (auth off) has none and needs none.
    if caller.token_id:
        response.headers["set-cookie"] = sessions.set_cookie_header(caller.token_id, secure=_secure(request))
        response.headers["cache-control"] = "no-store"
    return response


@router.delete("", status_code=204, response_class=Response,
               responses={204: {"description": "Signed out: the cookie is cleared"}})
def sign_out(request: Request, caller: ReaderDep) -> Response:
    response = Response(status_code=204)
    response.headers["set-cookie"] = request.app.state.sessions.clear_cookie_header(secure=_secure(request))
    return response
