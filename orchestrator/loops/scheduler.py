"""The scheduler: every ``schedule_interval_s``, make the jobs of due schedule
ticks (``services.schedules.Schedules.run_due``). Every replica runs one; leases
and per-tick Idempotency-Keys make each tick one job whichever replicas run."""

from __future__ import annotations

import os
import socket

from raylane.orchestrator.loops.base import LoopService


class Scheduler(LoopService):
    name = "scheduler"

    def __init__(self, schedules, interval_s: float, *, owner: str | None = None, wake=None):
        super().__init__(interval_s, wake)
        self.schedules = schedules
        self.owner = owner or f"{socket.gethostname()}:{os.getpid()}:scheduler"

    def run_once(self) -> None:
        self.schedules.run_due(owner=self.owner)
