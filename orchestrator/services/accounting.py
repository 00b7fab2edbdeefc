"""The accounting service functions the API calls: read a window's attempts
(``store.usage``), price them (``costs``), and shape the answers of
``/v1/costs``, ``/v1/report`` and ``/v1/jobs/{id}/cost``.

A window's costs and report price sums: the seconds held per key (project,
kind, node group, market, resources) summed in SQL, priced once per key (cost
is linear in held time), jobs counted in the same query; only the attempts that
could have had a cheaper placement are read one by one. So a request costs what
the window's keys and candidates are, not a Python loop over its attempts."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any

from raylane.orchestrator.domain import costs
from raylane.orchestrator.domain.errors import Invalid
from raylane.orchestrator.domain.profile import Profile
from raylane.orchestrator.domain.values import require_timezone
from raylane.orchestrator.services import fleetplan
from raylane.orchestrator.store import db
from raylane.orchestrator.store.job_reads import get_row
from raylane.orchestrator.store.transitions import utcnow
from raylane.orchestrator.store import usage
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


def _priced(rows: list[usage.Sum], prof: Profile) -> list[costs.AttemptCost]:
    return [costs.key_cost(r.usage, r.seconds, prof, r.attempts) for r in rows]


def cost_breakdown(cp: "ControlPlane", *, group_by: str, start: datetime | None, end: datetime | None,
                   project: str | None) -> dict[str, Any]:
    if group_by not in costs.GROUP_BY:  # before any read
        raise ValueError(f"group_by must be one of {', '.join(costs.GROUP_BY)}")
    now = utcnow()
    start, end = window(start, end, now)
    kw = {"start": start, "end": end, "now": now, "project": project}
    with db.read(cp.sessions) as s:
        rows = usage.sums(s, **kw)
    out = costs.breakdown(_priced(rows, profile(cp)), group_by, usage.jobs_by(rows, group_by),
                          usage.jobs_by(rows, None).get("", 0))
    return {"start": start, "end": end, "project": project, **out}


def report(cp: "ControlPlane", *, start: datetime | None, end: datetime | None, project: str | None) -> dict[str, Any]:
    now = utcnow()
    start, end = window(start, end, now)
    prof = profile(cp)
    kw = {"start": start, "end": end, "now": now, "project": project}
    with db.read(cp.sessions) as s:
        rows = usage.sums(s, **kw)
        candidates = usage.reviewed(s, **kw)
    items = _priced(rows, prof)
    by_group, total = usage.jobs_by(rows, "node_group"), usage.jobs_by(rows, None).get("", 0)
    reviewed = costs.costs(candidates, prof, start=start, end=end, now=now)
    out = costs.report_of(items, reviewed, prof, start=start, end=end,
                          break_even=cp.settings.break_even_utilisation, jobs_by_group=by_group, total_jobs=total)
    out["project"] = project
    out["fleet"] = fleetplan.economics(cp, rows, start=start, end=end)
    if project is not None:
        out["notes"].append("utilisation counts this project's attempts only; other projects share the same nodes")
    return out


def job_cost(cp: "ControlPlane", job_id: str, *, project: str | None) -> dict[str, Any]:
    """Every attempt of one job, priced over its whole life."""
    now = utcnow()
    with db.read(cp.sessions) as s:
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
