"""Online services: a Ray Serve application from an import path, placed on the
router's node group (CPU inference on spot, on-demand as soft fallback), with
replicas or autoscaling from the spec.

The driver stays up while the service runs: the Ray job is the service's
lifetime. Cancel (Ray stops the job with SIGTERM) deletes the application, so no
replica outlives its job.
"""

from __future__ import annotations

import os
import signal
import threading
from typing import Any

from ray import serve

from raylane.jobs.base import RunContext, load_callable, report_result

SERVE_PORT = int(os.environ.get("RAYLANE_SERVE_PORT", "8100"))  # 8000 is Raylane's API


def app_name(ctx: RunContext) -> str:
    return f"raylane-{ctx.job_id}"


def run(ctx: RunContext) -> dict[str, Any]:
    svc = ctx.spec.effective_service
    pl = ctx.placement
    target = load_callable(ctx.spec.entrypoint)
    actor_opts: dict[str, Any] = {"num_cpus": pl.worker_resources.get("CPU", 1), "label_selector": pl.label_selector}
    if pl.worker_resources.get("GPU"):
        actor_opts["num_gpus"] = pl.worker_resources["GPU"]
    if svc.autoscaling:
        scale: dict[str, Any] = {"autoscaling_config": svc.autoscaling.model_dump()}
    else:
        scale = {"num_replicas": svc.replicas}
    if isinstance(target, serve.Application):
        app = target
    else:  # a deployment, or a plain class to make one of
        dep = target if isinstance(target, serve.Deployment) else serve.deployment(target)
        app = dep.options(ray_actor_options=actor_opts, **scale).bind()
    serve.start(http_options={"host": "127.0.0.1", "port": SERVE_PORT})
    name = app_name(ctx)
    serve.run(app, name=name, route_prefix=svc.route_prefix, blocking=False)
    url = f"http://127.0.0.1:{SERVE_PORT}{svc.route_prefix}"
    report_result(ctx.submission_id,
                  {"app": name, "route_prefix": svc.route_prefix, "url": url, "replicas": svc.replicas})

    stopped = threading.Event()

    def stop(*_):
        stopped.set()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    stopped.wait()
    serve.delete(name)
    return {"app": name, "route_prefix": svc.route_prefix, "url": url, "stopped": True}
