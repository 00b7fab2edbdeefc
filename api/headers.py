"""Response headers that protect a browser: on the web page at ``/ui``, a Content
Security Policy (scripts, styles and requests from this server only, never framed),
``X-Frame-Options: DENY`` for browsers without CSP, and ``nosniff`` so a file is
never run as another type than the one sent.

Only ``/ui``: Swagger UI and ReDoc (``/docs``, ``/redoc``) start themselves with an
inline script, which this policy would block.
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


class UIHeaders:
    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        path = scope.get("path", "") if scope["type"] == "http" else ""
        if not (path == UI_PREFIX or path.startswith(UI_PREFIX + "/")):
            return await self.app(scope, receive, send)

        async def with_headers(message):
            if message["type"] == "http.response.start":
                names = {name for name, _ in UI_HEADERS}
                message["headers"] = [h for h in message.get("headers", []) if h[0].lower() not in names] + UI_HEADERS
            await send(message)

        await self.app(scope, receive, with_headers)
