"""The HTTP layer: FastAPI routers, request limits, error mapping. Routers are
thin: they parse, call ``raylane.orchestrator.services.controlplane.ControlPlane``, and return."""
