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

# The subpackages are the repo's top-level folders (pyproject.toml's package-dir,
# the same names): a wheel holds them as real folders under raylane/, an editable
# install maps them. A checkout that is only on sys.path (PYTHONPATH=<checkout>:
# a benchmark's `tree`, Alembic's prepend_sys_path, a script run from the repo
# root) finds them through this finder, which answers for this package alone, so
# another checkout's editable install never lends it its code. No links (issue 44).
_SUBPACKAGES = ("api", "client", "jobs", "migrations", "orchestrator")


class _CheckoutFinder:
    """``raylane.<subpackage>`` is ``<checkout>/<subpackage>/`` (a meta path finder)."""

    def __init__(self, top: str, package_path: list[str]):
        self.top, self.package_path = top, package_path

    def find_spec(self, fullname, path=None, target=None):
        parent, _, name = fullname.rpartition(".")
        # `path` is the parent package's __path__: this very object only for this package.
        if parent != __name__ or name not in _SUBPACKAGES or path is not self.package_path:
            return None
        import os
        from importlib.util import spec_from_file_location

        folder = os.path.join(self.top, name)
        init = os.path.join(folder, "__init__.py")
        if not os.path.isfile(init):
            return None
        return spec_from_file_location(fullname, init, submodule_search_locations=[folder])


def _use_the_checkout() -> None:
    import os
    import sys
    from importlib.machinery import PathFinder

    here = os.path.dirname(os.path.abspath(__file__))
    top = os.path.dirname(here)
    if os.path.isdir(os.path.join(here, "orchestrator")) or not os.path.isfile(
            os.path.join(top, "orchestrator", "__init__.py")):
        return  # installed from a wheel: the subpackages are folders here
    # One finder at a time: a package imported again (its modules dropped) replaces its own.
    sys.meta_path[:] = [f for f in sys.meta_path if type(f).__name__ != "_CheckoutFinder"]
    at = next((i for i, f in enumerate(sys.meta_path) if f is PathFinder), len(sys.meta_path))
    sys.meta_path.insert(at, _CheckoutFinder(top, __path__))


_use_the_checkout()
del _use_the_checkout

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
