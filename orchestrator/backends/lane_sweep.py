"""The warm lanes' sweeps of Ray's key-value store: what attempts that ended
long ago left there (a claim kept as a tombstone, a status or log tail a failed
forget left) and the records in Ray's dashboard past its tail. One of
``LaneBackend``'s three jobs (beside its hosts and its attempts), called by the
reconciler through it; a bounded pass each (``SWEEP_BUDGET_S``), from a mark in
Ray's store that every control plane shares (``lanes.SWEEP_MARK_KEY``,
``lanes.RECORDS_MARK_KEY``)."""

from __future__ import annotations

import logging
import time
from datetime import datetime
from typing import Any, Callable

from raylane.orchestrator.domain import lanes

log = logging.getLogger(__name__)

SWEEP_BUDGET_S = 0.05  # the most one sweep deletes for (``sweep``): the reconciler's pass waits on it


class LaneSweep:
    """The sweeps, over ``kv(op, *args)``: a call of Ray's GCS client by name
    (``LaneBackend._kv``: a GCS failure is ``RayUnavailable``)."""

    def __init__(self, kv: Callable[..., Any]):
        self._kv = kv

    def sweep_mark(self, key: str = lanes.SWEEP_MARK_KEY) -> tuple[datetime, int] | None:
        """How far the sweep got (``lanes.SWEEP_MARK_KEY``; the records sweep's:
        ``lanes.RECORDS_MARK_KEY``), by any control plane."""
        value = self._kv("kv_get", key)
        if not value:
            return None
        try:
            at, row = value.decode().split("|")
            return datetime.fromisoformat(at), int(row)
        except ValueError:
            log.warning("lane sweep mark %s=%r is unreadable: sweeping from the first ended attempt", key, value[:80])
            return None

    def sweep(self, ended: list[dict[str, Any]]) -> int:
        """Delete what is left in Ray's store of attempts that ended long ago (rows
        of ``lifecycle.ended_attempts``, oldest first): the claim, a tombstone no
        late redispatch can need any more, and any status, log tail, stop request
        or re-put todo item a failed or raced forget left, and a record in Ray's
        dashboard a host wrote after ``sweep_records`` passed (a Ray job's own
        record stays). The group is the one
        the attempt ran in and the env its spec's, not its job's placement now (a
        retry may have gone elsewhere). One read finds what is left: an attempt
        of a Ray job has nothing, one of a lane its claim, usually alone. Its todo
        item goes before its claim (an item left without its claim would be run
        by the next host that lists it). Stops after ``SWEEP_BUDGET_S`` (the reconciler
        waits on it) and moves the mark past the last row it swept. Returns the
        rows swept, from the first."""
        if not ended:
            return 0
        t0 = time.monotonic()
        keys: list[list[str]] = []  # per row: the keys to delete, claim last
        for r in ended:
            sid, group = r["submission_id"], r["node_group"]
            todos = []
            if group:
                todos.append(lanes.todo_key(group, sid))
                try:
                    env = lanes.env_key_of_stored(r["spec"])
                except ValueError:  # a spec stored under older rules: its default lane's item only
                    env = None
                if env:
                    todos.append(lanes.todo_key(group, sid, env))
            keys.append([*todos, lanes.stop_key(sid), lanes.status_key(sid), lanes.logs_key(sid),
                         lanes.claim_key(sid)])
        left = self._kv("kv_multi_get", [k for row in keys for k in row])
        records = self._lane_records(ended)  # written late, after the records sweep passed
        done = 0
        for r, row in zip(ended, keys):
            if done and time.monotonic() - t0 > SWEEP_BUDGET_S:
                break
            sid = r["submission_id"]
            for key in row[:-3]:
                if key in left:
                    self._kv("kv_del", key)
            if lanes.status_key(sid) in left or lanes.logs_key(sid) in left:
                self._kv("kv_del", lanes.attempt_prefix(sid), prefix=True)
            if sid in records:
                self._kv("delete_job_record", sid)
            if lanes.claim_key(sid) in left:
                self._kv("kv_del", lanes.claim_key(sid))
            done += 1
        last = ended[done - 1]
        self._kv("kv_put", lanes.SWEEP_MARK_KEY, f"{last['ended_at'].isoformat()}|{last['id']}".encode())
        return done

    def _lane_records(self, ended: list[dict[str, Any]]) -> set[str]:
        """Which of these attempts have a lane host's record in Ray's job store, in
        one read: never a Ray job's own record, which stays Ray's."""
        return {sid for sid, v in self._kv("job_records", [r["submission_id"] for r in ended]).items()
                if lanes.is_lane_record(v)}

    def sweep_records(self, ended: list[dict[str, Any]]) -> int:
        """Delete the records in Ray's dashboard (``lanes.dashboard_record``) of
        attempts past the dashboard's tail (rows of ``lifecycle.ended_attempts``,
        oldest first, the reconciler's ``_sweep_records`` says which): Ray's job
        list keeps live lane attempts and the newest ended ones, not every one.
        One read of their records; a Ray job's own record is never deleted (it is
        Ray's, and Raylane's history links to it). A host that writes a record
        after this (one Ray counted lost that ran on) leaves it to the tombstone
        sweep (``sweep``, a day later). Stops
        after ``SWEEP_BUDGET_S`` and moves ``lanes.RECORDS_MARK_KEY`` past the last
        row it swept. Returns the rows swept, from the first."""
        if not ended:
            return 0
        t0 = time.monotonic()
        records = self._lane_records(ended)
        done = 0
        for r in ended:
            if done and time.monotonic() - t0 > SWEEP_BUDGET_S:
                break
            if r["submission_id"] in records:
                self._kv("delete_job_record", r["submission_id"])
            done += 1
        last = ended[done - 1]
        self._kv("kv_put", lanes.RECORDS_MARK_KEY, f"{last['ended_at'].isoformat()}|{last['id']}".encode())
        return done
