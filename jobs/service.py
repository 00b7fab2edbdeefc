"""Online services: a Ray Serve application from an import path, placed on the
router's node group (CPU inference on spot, on-demand as soft fallback), with
replicas or autoscaling from the spec.

The driver stays up while the service runs: the Ray job is the service's
lifetime. Cancel (Ray stops the job with SIGTERM) deletes the application, so no
replica outlives its job.

Serve's proxies bind where the cluster profile's ``serve`` section says (the
control plane passes it as ``protocol.Env.SERVE``), and the job reports the URL a
client should use: the profile's ``public_url`` (an ingress, a load balancer) when
set, else the driver node's address when the proxies bind every interface, else
the bound address itself.
"""

from __future__ import annotations

import json
import os
import signal
import threading
from typing import Any

from ray import serve

from raylane.jobs.base import RunContext, load_callable, report_result
from raylane.orchestrator.domain.profile import ServeIngress
from raylane.orchestrator.domain.protocol import Env

ANY_ADDRESS = {"0.0.0.0", "::", ""}


def ingress() -> ServeIngress:
    """The profile's ``serve`` section as the control plane sent it (its defaults without one)."""
    raw = os.environ.get(Env.SERVE)
    return ServeIngress.model_validate(json.loads(raw)) if raw else ServeIngress()


def client_url(ing: ServeIngress, route_prefix: str, node_ip: str) -> str:
    """The URL a client should use for a route (see the module's docstring)."""
    if ing.public_url:
        return ing.public_url.rstrip("/") + route_prefix
    host = node_ip if ing.host in ANY_ADDRESS else ing.host
    if ":" in host:
        host = f"[{host}]"  # an IPv6 address in a URL
    return f"http://{host}:{ing.port}{route_prefix}"


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
    ing = ingress()
    serve.start(http_options={"host": ing.host, "port": ing.port})
    name = app_name(ctx)
    serve.run(app, name=name, route_prefix=svc.route_prefix, blocking=False)
    import ray

    url = client_url(ing, svc.route_prefix, ray.util.get_node_ip_address())
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
