"""Raylane's public Python face. ``pip install raylane`` gives this SDK and the CLI
without Ray, SQLAlchemy or FastAPI.

    from raylane import Client, NotFound

    with Client() as rl:                      # RAYLANE_URL, RAYLANE_TOKEN
        job = rl.submit("examples/hello.yaml")
        print(rl.wait(job.id, timeout=600).status)

docs/sdk.md has the whole tour.
"""

# The one version string: pyproject.toml reads it for the distribution, the API
# reports it, and the SDK sends it in its User-Agent.
__version__ = "0.1.0"

from raylane.client.sdk import (  # noqa: E402,F401
    DEFAULT_URL, MAX_ATTEMPTS, AsyncClient, Client, ClusterInfo, ClusterNode, Conflict, ConnectionFailed, Forbidden,
    Health, JobFunction, NodeGroupStatus, NotFound, RaylaneError, RateLimited, ServerError, Unauthorized,
    ValidationFailed, WaitTimeout, job,
)
from raylane.orchestrator.domain.views import (  # noqa: E402,F401
    Attempt, BatchSubmitResponse, CancelResponse, Job, JobEvent, JobPage, Placement, Trial,
)
from raylane.orchestrator.domain.specs import JobKind, JobSpec  # noqa: E402,F401
from raylane.orchestrator.domain.states import FailureCause, JobStatus  # noqa: E402,F401

__all__ = [
    "Client", "AsyncClient", "job", "JobFunction",
    "RaylaneError", "NotFound", "Conflict", "ValidationFailed", "Unauthorized", "Forbidden", "RateLimited",
    "ServerError", "ConnectionFailed", "WaitTimeout",
    "Job", "JobPage", "JobEvent", "Attempt", "Placement", "CancelResponse", "BatchSubmitResponse",
    "NodeGroupStatus", "ClusterInfo", "ClusterNode", "Health", "Trial",
    "JobSpec", "JobKind", "JobStatus", "FailureCause", "DEFAULT_URL", "MAX_ATTEMPTS",
]
