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

# Names are imported on first use (PEP 562), not with the package: the server and
# every Ray driver import ``raylane.*`` and should not pay for the client SDK.
_EXPORTS = {
    "raylane.client.sdk": (
        "DEFAULT_URL", "MAX_ATTEMPTS", "AmbiguousJobId", "AsyncClient", "Client", "ClusterInfo", "ClusterNode",
        "Conflict", "ConnectionFailed", "CostBreakdown", "Forbidden", "Health", "JobCost", "JobFunction",
        "KindInfo", "NodeGroupStatus", "NotFound", "RaylaneError", "RateLimited", "Report", "ServerError",
        "Unauthorized", "ValidationFailed", "WaitTimeout", "job",
    ),
    "raylane.orchestrator.domain.views": (
        "Attempt", "AuditPage", "BatchSubmitResponse", "CancelResponse", "Job", "JobEvent", "JobPage", "NewToken",
        "Placement", "Project", "ProjectQuota", "Token", "Trial", "Whoami",
    ),
    "raylane.orchestrator.domain.specs": ("JobKind", "JobSpec"),
    "raylane.orchestrator.domain.states": ("FailureCause", "JobStatus"),
}
_WHERE = {name: module for module, names in _EXPORTS.items() for name in names}


def __getattr__(name: str):
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'raylane' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # the next lookup is a plain attribute
    return value


def __dir__():
    return sorted(set(globals()) | set(_WHERE))


__all__ = [
    "Client", "AsyncClient", "job", "JobFunction",
    "RaylaneError", "NotFound", "Conflict", "ValidationFailed", "Unauthorized", "Forbidden", "RateLimited",
    "ServerError", "ConnectionFailed", "WaitTimeout", "AmbiguousJobId",
    "Job", "JobPage", "JobEvent", "Attempt", "Placement", "CancelResponse", "BatchSubmitResponse",
    "NodeGroupStatus", "ClusterInfo", "ClusterNode", "Health", "Trial", "KindInfo",
    "CostBreakdown", "JobCost", "Report", "Whoami", "Token", "NewToken", "Project", "ProjectQuota", "AuditPage",
    "JobSpec", "JobKind", "JobStatus", "FailureCause", "DEFAULT_URL", "MAX_ATTEMPTS",
]
