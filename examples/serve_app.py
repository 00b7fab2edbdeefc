"""A CPU inference service for examples/service.yaml: POST {"x": 2} -> {"y": 7}."""

from __future__ import annotations

from starlette.requests import Request


class Linear:
    def __init__(self):
        self.slope, self.intercept = 3.0, 1.0

    async def __call__(self, request: Request) -> dict:
        body = await request.json()
        return {"y": self.slope * float(body["x"]) + self.intercept}
