"""The SDK's defaults and bounds (URL, retries, waits, pages) and the types its methods take."""

from __future__ import annotations

import os
from typing import Any, Mapping, TypeVar, Union

from raylane.orchestrator.domain.specs import JobKind, JobSpec
from raylane.orchestrator.domain.states import JobStatus


DEFAULT_URL = "http://127.0.0.1:8000"
ENV_URL = "RAYLANE_URL"
ENV_TOKEN = "RAYLANE_TOKEN"

# Five tries, 0.25 / 0.5 / 1 / 2 s apart (with jitter; about 4 s in all), ride out
# a control-plane restart or a load balancer swapping replicas. Past that the
# server is down, and the caller should hear so rather than hang in a loop.
MAX_ATTEMPTS = 5
BACKOFF_BASE_S = 0.25
BACKOFF_MAX_S = 4.0
# A server's Retry-After is honoured, but never longer than this: a wrong header
# must not park a client for an hour.
RETRY_AFTER_MAX_S = 30.0
# A proxy with no healthy upstream (502), a server starting or shedding load
# (503), a proxy timing out (504), a rate limit with its Retry-After (429): the
# server did not act on the request. A 500 is a bug: sending it again repeats it.
RETRY_STATUSES = frozenset({429, 502, 503, 504})
# Of those, the ones that say the server did not act, so even a call that is not
# resendable (a batch) may go again; a 502/504 from a proxy may hide a batch stored.
NOT_ACTED_STATUSES = frozenset({429, 503})
DEFAULT_TIMEOUT_S = 30.0
# wait(): first poll after 0.25 s, slowing to one poll every 2 s: a status change
# shows within 2 s, and a thousand waiting clients cost the server 500 requests/s.
WAIT_POLL_MIN_S = 0.25
WAIT_POLL_MAX_S = 2.0
ITER_PAGE_SIZE = 100  # iter_jobs() page size; the API allows up to 500
JOB_ID_LENGTH = 26  # a ULID (orchestrator/domain/ids.py); shorter is a prefix to resolve
# An ambiguous prefix names this many of its jobs: enough to pick one, short enough to read.
AMBIGUOUS_SHOWN = 10
# Written on a job made by resubmit(): the job it was made from.
RESUBMITTED_FROM_LABEL = "raylane.io/resubmitted-from"

T = TypeVar("T")
SpecLike = Union[JobSpec, Mapping[str, Any], str, "os.PathLike[str]"]
StatusLike = Union[JobStatus, str]
KindLike = Union[JobKind, str]
