"""Schedules as the API and the scheduler loop see them (docs/schedules.md).

``run_due`` is one scheduler pass: for each due schedule this replica leases,
the ticks from ``next_at`` to now are sorted by the missed policy
(``domain.schedules.plan``), each tick to run meets the overlap policy, and a
tick that runs submits the schedule's spec through the same path as
``POST /v1/jobs`` (policy, routing) with the Idempotency-Key
``schedule:<id>:<tick>``: a replica that redoes a pass (it took over an expired
lease) gets the same job back, so a tick makes one job whatever happens.
"""

from __future__ import annotations

import logging
import secrets
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Protocol

from raylane.orchestrator.domain import schedules as rules
from raylane.orchestrator.domain.errors import Conflict, Invalid, NotFound, RaylaneError
from raylane.orchestrator.domain.specs import JobSpec, check_exec_size
from raylane.orchestrator.domain.states import TERMINAL
from raylane.orchestrator.domain.views import Schedule, ScheduleCreate, ScheduleRun
from raylane.orchestrator.domain import policy
from raylane.orchestrator.store import db, schedules as store
from raylane.orchestrator.store.transitions import utcnow

if TYPE_CHECKING:  # pragma: no cover
    from raylane.orchestrator.settings import Settings

log = logging.getLogger(__name__)

SCHEDULE_LABEL = "raylane.schedule"  # on each job a schedule made: the schedule's id
NEXT_RUNS = 5
RECENT_RUNS = 20
LEASE_S = 60.0
BATCH = 20


def idempotency_key(schedule_id: str, tick: datetime) -> str:
    return f"schedule:{schedule_id}:{tick.isoformat()}"


class JobDoor(Protocol):
    """What a schedule needs of the control plane: its settings and sessions, submit
    and cancel (``services.controlplane.ControlPlane`` is one; this module does not
    import it, which imports this one)."""

    settings: "Settings"
    sessions: Any

    def submit(self, spec: JobSpec, *, project: str, actor: str, idempotency_key: str | None = None,
               audit: Any = None) -> tuple[Any, bool]: ...

    def cancel(self, job_id: str, *, project: str | None, actor: str) -> Any: ...


class Schedules:
    def __init__(self, cp: JobDoor):
        self.cp = cp
        self.sessions = cp.sessions

    # API -------------------------------------------------------------------------

    def create(self, body: ScheduleCreate, *, project: str, actor: str) -> Schedule:
        try:
            rules.check_cron(body.cron)
        except ValueError as e:
            raise Invalid(str(e), field="cron") from None
        try:
            rules.zone(body.timezone)
        except ValueError as e:
            raise Invalid(str(e), field="timezone") from None
        try:
            check_exec_size(body.spec)
        except ValueError as e:
            raise Invalid(str(e), field="spec") from None
        policy.check(body.spec, self.cp.settings, where="spec")
        now = utcnow()
        try:
            first = rules.next_ticks(body.cron, body.timezone, now, 1)[0]
        except ValueError as e:  # croniter's "no such date" (0 0 31 2 *): a cron that never fires
            raise Invalid(f"{body.cron!r} never fires: {e}", field="cron") from None
        row = {"id": "sch_" + secrets.token_hex(8), "project": project, "name": body.name, "cron": body.cron,
               "timezone": body.timezone, "spec": body.spec.model_dump(mode="json", exclude_none=True),
               "overlap": body.overlap, "missed": body.missed, "starting_deadline_s": body.starting_deadline_s,
               "paused": body.paused, "next_at": first,
               "last_job_id": None, "created_at": now, "created_by": actor, "updated_at": now}
        with db.transaction(self.sessions) as s:
            if any(r["name"] == body.name for r in store.list_(s, project=project)):
                raise Conflict(f"project {project} already has a schedule named {body.name}")
            store.create(s, row)
        return self.get(row["id"], project=project)

    def _view(self, row: dict, runs: list[dict]) -> Schedule:
        nxt = [] if row["paused"] else [row["next_at"], *rules.next_ticks(row["cron"], row["timezone"],
                                                                          max(row["next_at"], utcnow()), NEXT_RUNS - 1)]
        return Schedule(**{k: v for k, v in row.items() if k in Schedule.model_fields},
                        next_runs=sorted(set(nxt))[:NEXT_RUNS], recent_runs=[ScheduleRun(**r) for r in runs])

    def get(self, schedule_id: str, *, project: str | None) -> Schedule:
        with db.read(self.sessions) as s:
            row = store.get(s, schedule_id, project=project)
            if row is None:
                raise NotFound(f"schedule {schedule_id} not found")
            return self._view(row, store.runs(s, schedule_id, limit=RECENT_RUNS))

    def list(self, *, project: str | None) -> list[Schedule]:
        with db.read(self.sessions) as s:
            return [self._view(r, []) for r in store.list_(s, project=project)]

    def delete(self, schedule_id: str, *, project: str | None) -> None:
        with db.transaction(self.sessions) as s:
            if store.get(s, schedule_id, project=project) is None:
                raise NotFound(f"schedule {schedule_id} not found")
            store.delete_(s, schedule_id)

    def pause(self, schedule_id: str, *, project: str | None, paused: bool) -> Schedule:
        """Pause, or resume: a resumed schedule runs from its next tick after now (the
        ticks of a pause are not missed runs; nobody wanted them)."""
        now = utcnow()
        with db.transaction(self.sessions) as s:
            row = store.get(s, schedule_id, project=project)
            if row is None:
                raise NotFound(f"schedule {schedule_id} not found")
            resume_at = rules.next_ticks(row["cron"], row["timezone"], now, 1)[0] if row["paused"] and not paused \
                else None
            store.set_paused(s, schedule_id, paused, next_at=resume_at, now=now)
        return self.get(schedule_id, project=project)

    # The scheduler's pass ---------------------------------------------------------

    def run_due(self, *, owner: str, now: datetime | None = None) -> int:
        """Handle every due schedule this replica can lease; the number of jobs made."""
        now = now or utcnow()
        with db.read(self.sessions) as s:
            ids = store.due_ids(s, now=now, limit=BATCH)
        made = 0
        for sid in ids:
            with db.transaction(self.sessions) as s:
                row = store.claim(s, sid, owner=owner, now=now, lease_until=now + timedelta(seconds=LEASE_S))
            if row is None:
                continue  # another replica has it
            try:
                made += self._handle(row, owner=owner, now=now)
            except Exception:
                log.exception("schedule %s: pass failed; its lease expires and a pass tries again", sid)
        return made

    def _handle(self, row: dict, *, owner: str, now: datetime) -> int:
        p = rules.plan(row["cron"], row["timezone"], next_at=row["next_at"], now=now, missed=row["missed"],
                       starting_deadline_s=row["starting_deadline_s"])
        last_job = row["last_job_id"]
        next_at, made = p.next_at, 0
        outcomes: list[tuple[datetime, str | None, str, str | None]] = [
            (t, None, "skipped", f"missed: older than {row['starting_deadline_s']:g} s when a control plane "
                                 f"next looked (missed policy {row['missed']})") for t in p.skipped]
        for tick in p.run:
            with db.read(self.sessions) as s:
                previous = store.job_status(s, last_job)
            active = previous is not None and previous not in {st.value for st in TERMINAL}
            if active and row["overlap"] == "skip":
                outcomes.append((tick, None, "skipped", f"job {last_job} still {previous} (overlap policy skip)"))
                continue
            if active and row["overlap"] == "queue":
                next_at = tick  # held: handled again once that job has ended
                break
            if active and row["overlap"] == "replace":
                try:
                    self.cp.cancel(last_job, project=row["project"], actor=f"schedule {row['name']}")
                except (Conflict, NotFound):
                    pass  # it ended meanwhile
            try:
                job = self._submit(row, tick)
            except RaylaneError as e:  # a policy or quota changed since the schedule was made
                outcomes.append((tick, None, "skipped", f"submit refused: {e}"))
                continue
            outcomes.append((tick, job, "created", None))
            last_job, made = job, made + 1
        with db.transaction(self.sessions) as s:
            for tick, job, outcome, reason in outcomes:
                store.record(s, row["id"], tick, job_id=job, outcome=outcome, reason=reason, now=now,
                             project=row["project"])
            if not store.advance(s, row["id"], owner=owner, next_at=next_at, last_job_id=last_job, now=now):
                log.warning("schedule %s: lease lost during a pass; another replica redoes its ticks", row["id"])
        return made

    def _submit(self, row: dict, tick: datetime) -> str:
        spec = JobSpec.model_validate(row["spec"])
        spec = spec.model_copy(update={"labels": {**spec.labels, SCHEDULE_LABEL: row["id"]}})
        job, _ = self.cp.submit(spec, project=row["project"], actor=f"schedule {row['name']}",
                                idempotency_key=idempotency_key(row["id"], tick))
        return job.id
