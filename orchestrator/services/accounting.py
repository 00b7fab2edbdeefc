"""The accounting service functions the API calls: read attempts in a window
(``store.usage``), price them (``costs``), and shape the answers of
``/v1/costs``, ``/v1/report`` and ``/v1/jobs/{id}/cost``."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any

from raylane.orchestrator.domain import costs
from raylane.orchestrator.domain.errors import Invalid
from raylane.orchestrator.domain.profile import Profile
from raylane.orchestrator.domain.values import require_timezone
from raylane.orchestrator.store import db
from raylane.orchestrator.store.jobs import get_row
from raylane.orchestrator.store.transitions import utcnow
from raylane.orchestrator.store.usage import load_usage

if TYPE_CHECKING:
    from raylane.orchestrator.services.controlplane import ControlPlane

DEFAULT_WINDOW = timedelta(days=7)
EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)  # a job's cost covers its whole life
# A window is read attempt by attempt; a bound keeps one request from reading years of them.
MAX_WINDOW = timedelta(days=400)


def profile(cp: "ControlPlane") -> Profile:
    """The profile prices come from: the attached cluster's, else the configured (or shipped) one."""
    if cp.profile is not None:
        return cp.profile
    cached = getattr(cp, "_accounting_profile", None)
    if cached is None:
        cached = Profile.load(cp.settings.profile)
        cp._accounting_profile = cached
    return cached


def window(start: datetime | None, end: datetime | None, now: datetime | None = None) -> tuple[datetime, datetime]:
    """[start, end): default the last 7 days; both need a timezone; at most ``MAX_WINDOW``."""
    require_timezone("start", start)
    require_timezone("end", end)
    end = end or now or utcnow()
    start = start or end - DEFAULT_WINDOW
    if start >= end:
        raise Invalid("start must be before end", field="start")
    if end - start > MAX_WINDOW:
        raise Invalid(f"the window is at most {MAX_WINDOW.days} days", field="start")
    return start, end


def _priced(cp: "ControlPlane", start: datetime, end: datetime, now: datetime, *, project: str | None,
            job_id: str | None = None) -> list[costs.AttemptCost]:
    with db.transaction(cp.sessions) as s:
        usages = load_usage(s, start=start, end=end, project=project, job_id=job_id, with_spec=False)
    return costs.costs(usages, profile(cp), start=start, end=end, now=now)


def cost_breakdown(cp: "ControlPlane", *, group_by: str, start: datetime | None, end: datetime | None,
                   project: str | None) -> dict[str, Any]:
    now = utcnow()
    start, end = window(start, end, now)
    out = costs.breakdown(_priced(cp, start, end, now, project=project), group_by)
    return {"start": start, "end": end, "project": project, **out}


def report(cp: "ControlPlane", *, start: datetime | None, end: datetime | None, project: str | None) -> dict[str, Any]:
    now = utcnow()
    start, end = window(start, end, now)
    with db.transaction(cp.sessions) as s:
        usages = load_usage(s, start=start, end=end, project=project)
    out = costs.report(usages, profile(cp), start=start, end=end, now=now,
                       break_even=cp.settings.break_even_utilisation)
    out["project"] = project
    if project is not None:
        out["notes"].append("utilisation counts this project's attempts only; other projects share the same nodes")
    return out


def job_cost(cp: "ControlPlane", job_id: str, *, project: str | None) -> dict[str, Any]:
    """Every attempt of one job, priced over its whole life."""
    now = utcnow()
    with db.transaction(cp.sessions) as s:
        get_row(s, job_id, project)  # NotFound, also for another project's job
        usages = load_usage(s, start=EPOCH, end=now, job_id=job_id)
    items = [costs.attempt_cost(u, profile(cp), start=EPOCH, end=now, now=now) for u in usages]
    return {
        "job_id": job_id,
        "cost": sum(c.cost for c in items), "on_demand_cost": sum(c.on_demand_cost for c in items),
        "spot_savings": sum(c.savings for c in items),
        "attempts": [{"number": c.usage.number, "node_group": c.usage.node_group, "market": c.usage.market,
                      "resources": c.usage.resources, "hours": c.hours, "node_share": c.share, "cost": c.cost,
                      "on_demand_cost": c.on_demand_cost, "cause": c.usage.cause,
                      "running": c.usage.ended_at is None and c.usage.started_at is not None}
                     for c in items],
    }
