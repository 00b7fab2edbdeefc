"""The HTTP layer: FastAPI routers, request limits, error mapping. Routers are
thin: they parse, call ``orchestrator.service.ControlPlane``, and return."""
