"""Response headers that protect a browser.

- Every answer: ``X-Content-Type-Options: nosniff``, so a body (a job's log, a
  result, an error echoing input) is never run as another type than the one sent.
- The JSON API (``/v1/...``): ``Cache-Control: no-store`` unless the route set its
  own: its answers hold what a project would not leave in a shared cache (specs
  with their env vars, tokens and signing secrets on creation, logs).
- The web page at ``/ui``: besides, a Content Security Policy (scripts, styles and
  requests from this server only, never framed), ``X-Frame-Options: DENY`` for
  browsers without CSP, and no referrer. Only ``/ui``: Swagger UI and ReDoc
  (``/docs``, ``/redoc``) start themselves with an inline script, which this
  policy would block.

Ray's dashboard behind ``/ray`` gets its own set (``api/rayproxy.py``).
"""

from __future__ import annotations

UI_PREFIX = "/ui"
UI_HEADERS = [
    (b"content-security-policy",
     b"default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
     b"object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"),
    (b"x-frame-options", b"DENY"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
]


API_PREFIX = "/v1/"
NOSNIFF = (b"x-content-type-options", b"nosniff")
NO_STORE = (b"cache-control", b"no-store")


def _under(path: str, prefix: str) -> bool:
    return path == prefix or path.startswith(prefix + "/")


class SecurityHeaders:
    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path = scope.get("path", "")
        if _under(path, UI_PREFIX):
            forced, default = UI_HEADERS, []
        elif path.startswith(API_PREFIX):
            forced, default = [NOSNIFF], [NO_STORE]
        else:
            forced, default = [NOSNIFF], []

        async def with_headers(message):
            if message["type"] == "http.response.start":
                names = {name for name, _ in forced}
                headers = [h for h in message.get("headers", []) if h[0].lower() not in names] + forced
                present = {h[0].lower() for h in headers}
                message["headers"] = headers + [h for h in default if h[0] not in present]
            await send(message)

        await self.app(scope, receive, with_headers)

