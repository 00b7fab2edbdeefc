"""One Ray backend per cluster of the fleet (docs/fleet.md): each cluster reached
at its own dashboard URL and GCS address with its own token, nothing shared.

Invariants:
- a cluster's token is read from its ``token_file`` or ``token_env`` when the
  backends are built, never from the fleet file (``fleet.ClusterSpec``); a
  cluster without one falls back to ``default_token`` only when it is the
  deployment's one cluster (RAYLANE_RAY_AUTH_TOKEN, ~/.ray/auth_token);
- an attempt with no recorded cluster (``attempts.cluster`` NULL: made before
  fleets, or by a deployment of one cluster) belongs to the *attached* cluster;
- submission ids are derived from the job id and the attempt number
  (``ids.submission_id``), both global, so they are unique across clusters: a
  job's attempt on a cluster that comes back after being declared lost never
  shares an id with its retry elsewhere.

Building a backend opens no connection (``RayJobsBackend`` makes an HTTP client
only); reachability is each backend's own (``backends.reachability``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from raylane.orchestrator.domain.errors import Invalid
from raylane.orchestrator.domain.fleet import Fleet


@dataclass
class FleetBackends:
    """The backends of a fleet by cluster name, and the attached one."""

    backends: dict[str, object]
    attached: str

    def of(self, cluster: str | None):
        """The backend of an attempt's cluster (None: the attached cluster's)."""
        name = cluster or self.attached
        try:
            return self.backends[name]
        except KeyError:
            raise Invalid(f"no cluster {name!r} in the fleet; its clusters: {', '.join(self.backends)}",
                          field="cluster") from None

    @classmethod
    def build(cls, fleet: Fleet, attached: str, *, environ: dict[str, str] | None = None,
              default_token: str | None = None, make: Callable[..., object] | None = None) -> "FleetBackends":
        """A backend for every cluster with a ``dashboard_url``; ``Invalid`` naming the
        field for a cluster that cannot be reached (no URL, an unreadable token).
        ``make(dashboard_url, token, gcs_address=...)`` builds one (default:
        ``RayJobsBackend``, its GCS client made lazily by the caller)."""
        if make is None:
            from raylane.orchestrator.backends.ray_jobs import RayJobsBackend

            def make(url: str, token: str | None, gcs_address: str | None = None):
                return RayJobsBackend(url, token)

        out: dict[str, object] = {}
        for c in fleet.members:
            if not c.spec.dashboard_url:
                raise Invalid(f"cluster {c.name} has no dashboard_url: Raylane cannot reach it",
                              field=f"clusters.{c.name}.dashboard_url")
            token = c.spec.read_token(environ)
            if token is None and len(fleet.members) == 1:
                token = default_token
            out[c.name] = make(c.spec.dashboard_url, token, gcs_address=c.spec.gcs_address)
        if attached not in out:
            raise Invalid(f"no cluster {attached!r} in the fleet", field="cluster")
        return cls(out, attached)
