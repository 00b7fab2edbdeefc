"""What a caller may ask of the job store, in the words of the domain: the
project a job belongs to when none is named, and the filter of a job listing.
The routers build these; ``store.job_reads`` turns them into SQL."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from raylane.orchestrator.domain.states import JobStatus

DEFAULT_PROJECT = "default"


@dataclass
class JobFilter:
    project: str | None = DEFAULT_PROJECT  # None: every project (admins)
    status: list[JobStatus] = field(default_factory=list)
    kind: list[str] = field(default_factory=list)
    node_group: str | None = None
    labels: dict[str, str] = field(default_factory=dict)
    name_prefix: str | None = None
    created_after: datetime | None = None
    created_before: datetime | None = None
    id_prefix: str | None = None  # a job id's first characters (the CLI's short ids)
    submitted_by: str | None = None  # the actor of the job's first event: who submitted it
