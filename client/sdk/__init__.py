"""The Raylane Python SDK: ``Client`` and ``AsyncClient`` over the REST API, typed
errors, and ``job``, a decorator that turns a function into a job.

Words used here:

- *call*: one API operation as the SDK sees it (``_Call``): method, path, body,
  how to read the answer, and whether it is safe to send twice.
- *try*: one HTTP exchange of a call. A call takes up to ``MAX_ATTEMPTS`` tries
  (tenacity runs them, ``_retry_policy`` says when and how far apart) when the
  connection fails or the answer is 429/502/503/504.
- *resendable*: a call the server may receive twice without harm. Reads are; a
  submit is, because it carries an ``Idempotency-Key`` (the server returns the
  job it created the first time); a batch submit is not (the API takes no key
  for it), so it is only retried when the request never left this machine.

This module imports pydantic, yaml and the pure-pydantic ``raylane.orchestrator.domain.specs``,
``states`` and ``resources`` (and ``packages``), and ``raylane.client.packaging``
(the standard library's zip) for working dirs sent from this machine; httpx is
imported when a client is made. Never Ray,
SQLAlchemy or FastAPI: ``pip install raylane`` must stay light.

The package, by idea: ``errors``; ``models`` (answers read leniently);
``constants``; ``transport`` (one call over HTTP and its retries); ``calls``
(the call table both clients share); ``sync`` and ``sync_resources``
(``Client``); ``aio`` (``AsyncClient``); ``functions`` (``@job``). Every name
is importable from ``raylane.client.sdk`` as before the split.
"""


from __future__ import annotations

from raylane.client.sdk.constants import (  # noqa: F401
    AMBIGUOUS_SHOWN, BACKOFF_BASE_S, BACKOFF_MAX_S, DEFAULT_TIMEOUT_S, DEFAULT_URL, ENV_TOKEN, ENV_URL, ITER_PAGE_SIZE,
    JOB_ID_LENGTH, KindLike, MAX_ATTEMPTS, NOT_ACTED_STATUSES, RESUBMITTED_FROM_LABEL, RETRY_AFTER_MAX_S,
    RETRY_STATUSES, SpecLike, StatusLike, T, WAIT_POLL_MAX_S, WAIT_POLL_MIN_S,
)
from raylane.client.sdk.errors import (  # noqa: F401
    AmbiguousJobId, Conflict, ConnectionFailed, Forbidden, NotFound, RateLimited, RaylaneError, ServerError,
    Unauthorized, ValidationFailed, WaitTimeout, _content_type, _error_from, _loc_str, _not_raylane, _request_of,
    _spec_error, _validation_message, _where,
)
from raylane.client.sdk.models import (  # noqa: F401
    AttemptCost, ClusterInfo, ClusterNode, Fleet, FleetCluster, CostBreakdown, CostRow, CostTotal, Health, JobCost, KindInfo,
    NodeGroupStatus, ReadyPart, Report, UploadedPackage, _Open,
)
from raylane.client.sdk.transport import (  # noqa: F401
    NDJSON, _AnswerWorthRetrying, _Call, _adapter, _asleep, _backoff, _connection_failed, _headers, _is_ndjson,
    _list_of, _log_text, _model, _never_sent, _parsed, _reason, _resolve, _retry_policy, _skip_seen, _worth_retrying,
)
from raylane.client.sdk.calls import (  # noqa: F401
    _Api, _enum_values, _last_lines, _list_params, _local_working_dir, _looks_short, _looks_whole, _resolved,
    _resubmit_body, _schedule_body, _wait_timeout, _when, _window, _with_working_dir, spec_body,
)
from raylane.client.sdk.sync_resources import _ClientResources  # noqa: F401
from raylane.client.sdk.sync import Client  # noqa: F401
from raylane.client.sdk.aio import AsyncClient  # noqa: F401
from raylane.client.sdk.functions import JobFunction, _JOB_OPTIONS, _import_path, job  # noqa: F401
from raylane.client import packaging  # noqa: F401  (the working dirs a client uploads)
# What the single module imported, importable from it then: named here still.
from raylane.orchestrator.domain import views  # noqa: F401
from raylane.orchestrator.domain.packages import package_uri  # noqa: F401
from raylane.orchestrator.domain.specs import JobKind, JobSpec, SpecLoadError, load_spec_document  # noqa: F401
from raylane.orchestrator.domain.states import JobStatus  # noqa: F401
from raylane.orchestrator.domain.views import (  # noqa: F401
    ArrayAction, Attempt, AuditPage, BatchSubmitResponse, CancelResponse, Job, JobArray, JobEvent, JobPage, NewToken,
    NewWebhook, Placement, Project, ProjectQuota, Schedule, Token, Trial, Webhook, WebhookDelivery, Whoami,
)
from raylane.client.packaging import PackageTooLarge  # noqa: F401
from raylane.client.sdk import functions as _functions

_functions.default_client = Client

__all__ = [
    "Client", "AsyncClient", "job", "JobFunction",
    "RaylaneError", "NotFound", "Conflict", "ValidationFailed", "Unauthorized", "Forbidden", "RateLimited",
    "ServerError", "ConnectionFailed", "WaitTimeout", "AmbiguousJobId",
    "NodeGroupStatus", "ClusterInfo", "ClusterNode", "Fleet", "FleetCluster", "Health", "Trial", "KindInfo",
    "CostBreakdown", "JobCost", "Report",
    "DEFAULT_URL", "MAX_ATTEMPTS", "PackageTooLarge", "UploadedPackage",
]
