"""Raylane's public Python face. ``pip install raylane`` gives this SDK and the CLI
without Ray, SQLAlchemy or FastAPI."""

from orchestrator.specs import JobKind, JobSpec  # noqa: F401
from orchestrator.states import FailureCause, JobStatus  # noqa: F401

__version__ = "0.1.0"
