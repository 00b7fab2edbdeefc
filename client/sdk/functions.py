"""``@job``: a Python function as a job (``JobFunction``)."""

from __future__ import annotations

import functools
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping, overload

from pydantic import ValidationError as _PydanticValidationError

from raylane.orchestrator.domain.views import Job
from raylane.orchestrator.domain.specs import JobSpec
from raylane.client.sdk.errors import _spec_error

if TYPE_CHECKING:  # pragma: no cover
    from raylane.client.sdk.sync import Client

# The client ``JobFunction.submit`` makes when given none: ``Client``, handed in by
# the package (``raylane.client.sdk``), which imports both. This module does not
# import ``sync``, which imports it (``Client.submit_function``).
default_client: Callable[[], "Client"] | None = None


# Functions as jobs --------------------------------------------------------------------


_JOB_OPTIONS = frozenset({
    "name", "gpus", "cpus", "num_workers", "memory_gb", "accelerator_type", "node_group", "market", "priority",
    "timeout_s", "labels", "pip", "env_vars", "max_attempts", "project", "working_dir",
})


def _import_path(fn: Callable[..., Any]) -> tuple[str, str]:
    """``module:function`` and the directory to ship so that the import works there."""
    qual = getattr(fn, "__qualname__", "") or ""
    if not qual or "<" in qual:
        raise TypeError(f"raylane.job needs a module-level function; {qual or fn!r} is nested or a lambda, "
                        "so the cluster could not import it by name")
    modname = getattr(fn, "__module__", None)
    mod = sys.modules.get(modname or "")
    file = getattr(mod, "__file__", None)
    if not file:
        raise TypeError(f"raylane.job needs a function defined in a .py file; {qual} comes from {modname!r} "
                        "(a notebook or the REPL?), which the cluster cannot import")
    if modname == "__main__":
        spec = getattr(mod, "__spec__", None)
        modname = spec.name if spec is not None and spec.name and spec.name != "__main__" else Path(file).stem
    path = Path(file).resolve()
    # The directory that holds the top-level package: `a.b.c` in /x/a/b/c.py ships /x.
    ups = modname.count(".") + (1 if path.name == "__init__.py" else 0)
    root = path.parent
    for _ in range(ups):
        root = root.parent
    return f"{modname}:{qual}", str(root)


class JobFunction:
    """A function that runs on the cluster as a Raylane ``training`` job.

    Made by ``@raylane.job``. Calling it calls the function (that is what the
    cluster does: the training runner imports ``module:function`` and calls it
    with the run context on each worker). ``submit`` sends it as a job.
    """

    def __init__(self, fn: Callable[..., Any], **options: Any):
        unknown = set(options) - _JOB_OPTIONS
        if unknown:
            raise TypeError(f"unknown raylane.job option(s): {', '.join(sorted(unknown))}")
        self.fn = fn.fn if isinstance(fn, JobFunction) else fn
        self.job_options = options
        functools.update_wrapper(self, self.fn)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<raylane job function {self.fn.__module__}.{self.fn.__qualname__}>"

    def options(self, **overrides: Any) -> "JobFunction":
        """A copy with some options changed: ``train.options(gpus=2).submit(...)``."""
        return JobFunction(self.fn, **{**self.job_options, **overrides})

    def spec(self, **args: Any) -> JobSpec:
        """The ``JobSpec`` this function is submitted as, with ``args`` as ``ctx.args``.

        Raises:
            TypeError: the function is not importable by name, or ``args`` is not JSON.
            ValidationFailed: an option is out of range (e.g. ``gpus=1.5``).
        """
        o = self.job_options
        entrypoint, root = _import_path(self.fn)
        try:
            json.dumps(args)
        except (TypeError, ValueError) as e:
            raise TypeError(f"job arguments must be JSON-serialisable: {e}") from None
        name = o.get("name") or self.fn.__name__.lstrip("_") or "function"
        resources: dict[str, Any] = {"num_workers": o.get("num_workers", 1), "cpus_per_worker": o.get("cpus", 1),
                                     "gpus_per_worker": o.get("gpus", 0)}
        if o.get("memory_gb") is not None:
            resources["memory_gb_per_worker"] = o["memory_gb"]
        if o.get("accelerator_type"):
            resources["accelerator_type"] = o["accelerator_type"]
        body: dict[str, Any] = {
            "name": name, "kind": "training", "entrypoint": entrypoint, "resources": resources, "args": args,
            "runtime_env": {"working_dir": o.get("working_dir") or root, "pip": list(o.get("pip") or []),
                            "env_vars": dict(o.get("env_vars") or {})},
            "placement": {"node_group": o.get("node_group", "auto"), "market": o.get("market", "auto")},
            "labels": {"raylane.io/function": self.fn.__name__[:256], **(o.get("labels") or {})},
        }
        for key in ("priority", "timeout_s", "project"):
            if o.get(key) is not None:
                body[key] = o[key]
        if o.get("max_attempts") is not None:
            body["retry"] = {"max_attempts": o["max_attempts"]}
        try:
            return JobSpec.model_validate(body)
        except _PydanticValidationError as e:
            raise _spec_error(e, f"raylane.job({self.fn.__name__})") from None

    def submit(self, *, client: Client | None = None, idempotency_key: str | None = None, **args: Any) -> Job:
        """Submit the function as a job; keyword arguments become ``ctx.args``.

        Args:
            client: the client to use; default ``Client()`` (RAYLANE_URL, RAYLANE_TOKEN).
            idempotency_key: as for ``Client.submit``.
            **args: JSON-serialisable arguments for the function.

        Returns:
            The stored job.

        Raises:
            TypeError, ValidationFailed, ConnectionFailed: see ``Client.submit_function``.

        Example::

            job = train.submit(lr=1e-3, epochs=3)
        """
        if client is not None:
            return client.submit_function(self, args=args, idempotency_key=idempotency_key)
        with default_client() as c:
            return c.submit_function(self, args=args, idempotency_key=idempotency_key)


@overload
def job(fn: Callable[..., Any], /) -> JobFunction: ...


@overload
def job(*, gpus: float = ..., cpus: float = ..., num_workers: int = ..., name: str | None = ...,
        memory_gb: float | None = ..., accelerator_type: str | None = ..., node_group: str = ...,
        market: str = ..., priority: int | None = ..., timeout_s: float | None = ...,
        labels: Mapping[str, str] | None = ..., pip: list[str] | None = ..., env_vars: Mapping[str, str] | None = ...,
        max_attempts: int | None = ..., project: str | None = ...,
        working_dir: str | None = ...) -> Callable[[Callable[..., Any]], JobFunction]: ...


def job(fn: Callable[..., Any] | None = None, /, **options: Any):
    """Turn a module-level function into a job: ``@raylane.job(gpus=1)``.

    The function runs as a ``training`` job with ``num_workers`` workers (one by
    default), each holding ``gpus`` GPUs and ``cpus`` CPUs; with GPUs it is
    routed to a GPU node group, gang-scheduled. Each worker calls
    ``fn(ctx)``: ``ctx.args`` holds the keyword arguments given to ``submit``,
    ``ctx.rank`` / ``ctx.world_size`` the worker's place, ``ctx.checkpoint_dir``
    a directory that survives retries, ``ctx.report(**metrics)`` logs metrics.
    The return values are in ``job.result["workers"][i]["return"]``.

    The job's entrypoint is ``module:function``, and the directory holding the
    function's top-level package is shipped as ``runtime_env.working_dir``:
    zipped on this machine (``.gitignore`` honoured), uploaded to the server as
    a code package unless it has that tree already, and handed to Ray by the
    server; no filesystem is shared. ``working_dir=`` another local directory,
    or a URI Ray can fetch (``s3://...zip``, ``https://...zip``), overrides it.
    Keep the directory small: all of it is uploaded (at most 100 MiB).

    Args:
        gpus: GPUs per worker (fractions share a GPU).
        cpus: CPUs per worker.
        num_workers: workers, all started together (a gang).
        name: the job name; default the function's name.
        memory_gb, accelerator_type, node_group, market, priority, timeout_s,
        labels, pip, env_vars, max_attempts, project, working_dir: as in the
            job spec (``max_attempts`` is ``retry.max_attempts``).

    Returns:
        A ``JobFunction``: call it as the function, or ``.submit(**args)``.

    Example::

        import raylane

        @raylane.job(gpus=1)
        def finetune(ctx):
            lr = ctx.args["lr"]
            ...
            return {"loss": 0.1}

        if __name__ == "__main__":
            job = finetune.submit(lr=1e-4)
            print(raylane.Client().wait(job.id).result)
    """
    if fn is not None:
        return JobFunction(fn, **options)
    return lambda f: JobFunction(f, **options)
