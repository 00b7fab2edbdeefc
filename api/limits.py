"""Request body limit with a JSON 413 (Starlette's own answers in plain text).

By Content-Length when the client sends one; otherwise by counting chunks as
they arrive, raising HTTPException(413), which FastAPI passes through its body
parsing to the error handlers in ``raylane.api.errors``. A path under a prefix
in ``per_prefix`` has that prefix's limit instead (code packages are larger
than any JSON body).
"""

from __future__ import annotations

import json

from starlette.exceptions import HTTPException


class BodySizeLimit:
    def __init__(self, app, max_bytes: int, per_prefix: dict[str, int] | None = None):
        self.app = app
        self.default_max_bytes = max_bytes
        self.per_prefix = dict(per_prefix or {})

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path = scope.get("path", "")
        max_bytes = next((v for p, v in self.per_prefix.items() if path.startswith(p)), self.default_max_bytes)
        for name, value in scope.get("headers", ()):
            if name == b"content-length":
                try:
                    too_big = int(value) > max_bytes
                except ValueError:
                    return await self._reject(send, 400, "Content-Length is not a number")
                if too_big:
                    return await self._reject(send, 413, f"request body is larger than {max_bytes} bytes")
        seen = 0

        async def limited_receive():
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > max_bytes:
                    raise HTTPException(413, f"request body is larger than {max_bytes} bytes")
            return message

        await self.app(scope, limited_receive, send)

    @staticmethod
    async def _reject(send, status: int, detail: str):
        body = json.dumps({"detail": detail}).encode()
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})
