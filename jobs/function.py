"""Function jobs: ``entrypoint`` (``package.module:function``) called once with
the spec's ``args`` as keyword arguments; its return value is the job's result
(a dict as it is, anything else as ``{"value": ...}``).

As a Ray job, the runner (``python -m raylane.jobs.run``) calls it in its
driver after ``ray.init``, so the function may use Ray. In a warm lane
(``raylane.jobs.lane``) one of the host's warm workers calls it
(``raylane.jobs.lane_workers``): no interpreter start, no ``import ray``, no
fork per call (docs/fast-lane.md).
"""

from __future__ import annotations

from typing import Any

from raylane.jobs.base import RunContext, load_callable


def call(entrypoint: str, args: dict[str, Any]) -> dict[str, Any]:
    out = load_callable(entrypoint)(**args)
    return out if isinstance(out, dict) else {"value": out}


def run(ctx: RunContext) -> dict[str, Any]:
    return call(ctx.spec.entrypoint, ctx.spec.args)
