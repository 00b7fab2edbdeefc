"""What of Ray's dashboard a caller may read through ``/ray``: the rules, apart
from the plumbing (``api.rayproxy``).

Words:

- *path*: the part after ``/ray/``, as Ray's dashboard names it (``api/jobs/``,
  ``nodes``, ``static/js/main.js``). Ray's single-page app asks for everything
  relative to its page, so under ``/ray/`` it asks Raylane.
- *shell*: the app itself (``index.html``, ``static/``) and the answers it needs
  to start. Ray serves them without a token; so does Raylane.
- *shape*: the cluster's shape, which every role sees: nodes (summary view),
  autoscaler status, cluster metadata.
- *scoped*: jobs and what hangs off a job (its driver log, its tasks). An admin
  sees all; a member or viewer only jobs whose Ray metadata names one of their
  project (``raylane_project``, set by the dispatcher); another project's is
  "not found", as in ``/v1``.
- *cluster-wide*: actors, placement groups, workers, objects, every node's log
  files, Serve and Data pages, events: admins only (docs/auth.md says why).

Invariants: only GET and HEAD pass, and only to a path listed here; whatever
acts (submit, stop, delete, uploads, Serve deploys, profilers and tracebacks,
which run py-spy on a node) is refused (403) for every role, admins included.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum

from raylane.orchestrator.services.access import Caller

PROJECT_KEY = "raylane_project"  # the dispatcher's metadata on each Ray job
READ_METHODS = frozenset({"GET", "HEAD"})

SHELL_EXACT = frozenset({"", "index.html", "favicon.ico", "api/authentication_mode"})
SHELL_PREFIXES = ("static/",)
# Answers the app asks for on every page: versions, time zone, whether Grafana,
# Prometheus or profiling exist. Nothing of any job.
STARTUP = frozenset({"timezone", "api/version", "api/grafana_health", "api/prometheus_health",
                     "api/profiling_enabled", "api/v0/runtime_env_redaction", "api/gcs_healthz"})
SHAPE = frozenset({"api/cluster_status", "api/v0/cluster_metadata"})
# Admin-only reads: cluster-wide lists and every object of every job.
ADMIN_EXACT = frozenset({"nodes", "logical/actors", "events", "api/serve/applications/", "api/v0/logs",
                         "api/v0/actors", "api/v0/placement_groups", "api/v0/nodes", "api/v0/workers",
                         "api/v0/objects", "api/v0/runtime_envs", "api/v0/platform_events",
                         "api/v0/cluster_events", "api/v0/tasks/timeline", "api/data/datasets/"})
ADMIN_PATTERNS = (re.compile(r"^nodes/[0-9a-f]+$"), re.compile(r"^logical/actors/[0-9a-f]+$"),
                  re.compile(r"^api/v0/(actors|placement_groups|nodes|workers)/[0-9a-zA-Z_-]+$"))
# GETs that act on a node's processes (py-spy, memray): refused whoever asks.
ACTING_GET = re.compile(r"^(worker|task)/(traceback|cpu_profile|gpu_profile)|^memory_profile|^api/v0/.*profile")

JOB_ID = r"[A-Za-z0-9_.-]{1,128}"
JOB = re.compile(rf"^api/jobs/(?P<job>{JOB_ID})$")
JOB_LOGS = re.compile(rf"^api/jobs/(?P<job>{JOB_ID})/logs$")
LOG_READS = frozenset({"api/v0/logs/file", "api/v0/logs/stream"})
TASK_READS = frozenset({"api/v0/tasks", "api/v0/tasks/summarize"})
DRIVER_LOG = re.compile(rf"^job-driver-(?P<sid>{JOB_ID})\.log$")
# Query keys a member's log read may carry: which file, how much of it. No
# actor, task or pid: those name another process's log.
MEMBER_LOG_KEYS = frozenset({"node_id", "node_ip", "filename", "submission_id", "lines", "timeout", "interval",
                             "filter_ansi_code", "download_filename"})


class Kind(str, Enum):
    PASS = "pass"  # forward as is
    REFUSE = "refuse"  # answer ``status`` with ``reason``, never ask Ray
    LIST_JOBS = "list_jobs"  # forward, then keep only the caller's projects' jobs
    JOB = "job"  # forward if Ray's job ``job`` (a submission or job id) is the caller's
    AUTH_MODE = "auth_mode"  # answered by Raylane: the app must never ask for Ray's token


@dataclass(frozen=True)
class Decision:
    kind: Kind
    status: int = 200
    reason: str = ""
    job: str | None = None  # for Kind.JOB
    stream: bool = False  # a long answer (a followed log): the stream cap, not the request timeout

    @property
    def refused(self) -> bool:
        return self.kind is Kind.REFUSE


def refuse(status: int, reason: str) -> Decision:
    return Decision(Kind.REFUSE, status=status, reason=reason)


PASS = Decision(Kind.PASS)
READ_ONLY = ("Ray's dashboard is read-only through Raylane: submit, stop and cancel jobs with /v1; "
             "nothing else that acts on Ray passes")
CLUSTER_WIDE = ("a {role} sees their projects' jobs and the cluster's shape; this page is cluster-wide "
                "(admins only, docs/auth.md)")
NOT_FOUND = "no such job in your projects"


def is_shell(method: str, path: str) -> bool:
    """The app's own files: public, like Ray's own."""
    return (method in READ_METHODS and ".." not in path
            and (path in SHELL_EXACT or path.startswith(SHELL_PREFIXES)))


def decide(method: str, path: str, query: dict[str, list[str]], caller: Caller) -> Decision:
    """What to do with one request; ``query`` as ``urllib.parse.parse_qs`` gives it."""
    if method not in READ_METHODS or ACTING_GET.search(path) or ".." in path:
        return refuse(403, READ_ONLY)
    if path == "api/authentication_mode":
        return Decision(Kind.AUTH_MODE)
    if path in SHELL_EXACT or path.startswith(SHELL_PREFIXES) or path in STARTUP or path in SHAPE:
        return PASS
    admin = caller.project is None
    if path == "nodes" and query.get("view") == ["summary"]:
        return PASS  # the shape: each node's resources and use, no process list
    if path == "api/jobs/":
        return PASS if admin else Decision(Kind.LIST_JOBS)
    m = JOB.match(path) or JOB_LOGS.match(path)
    if m:
        return PASS if admin else Decision(Kind.JOB, job=m["job"])
    if path in LOG_READS:
        return _log_read(path, query, admin)
    if path in TASK_READS:
        return _task_read(query, admin)
    if path in ADMIN_EXACT or any(p.match(path) for p in ADMIN_PATTERNS):
        return PASS if admin else refuse(403, CLUSTER_WIDE.format(role=caller.role))
    return refuse(403, f"{READ_ONLY}; {path[:120]!r} is not one of the reads that pass")


def _one(query: dict[str, list[str]], key: str) -> str | None:
    values = query.get(key) or []
    return values[0] if len(values) == 1 else None


def _log_read(path: str, query: dict[str, list[str]], admin: bool) -> Decision:
    stream = path.endswith("/stream")
    if admin:
        return Decision(Kind.PASS, stream=stream)
    if set(query) - MEMBER_LOG_KEYS or any(len(v) != 1 for v in query.values()):
        return refuse(404, NOT_FOUND + ": a member reads a job's driver log (filename=job-driver-<id>.log "
                                       "or submission_id=<id>), not an actor's, a task's or a process's")
    sid = _one(query, "submission_id")
    filename = _one(query, "filename")
    if filename is not None:
        m = DRIVER_LOG.match(filename)
        if not m or (sid is not None and sid != m["sid"]):
            return refuse(404, NOT_FOUND)
        sid = m["sid"]
    if sid is None:
        return refuse(404, NOT_FOUND)
    return Decision(Kind.JOB, job=sid, stream=stream)


def _task_read(query: dict[str, list[str]], admin: bool) -> Decision:
    if admin:
        return PASS
    # The app asks for one job's tasks with filter_keys=job_id&filter_predicates=%3D&filter_values=<job hex id>.
    keys, preds, values = (query.get(k) or [] for k in ("filter_keys", "filter_predicates", "filter_values"))
    if keys != ["job_id"] or preds != ["="] or len(values) != 1:
        return refuse(404, NOT_FOUND + ": a member lists the tasks of one of their jobs "
                                       "(filter_keys=job_id&filter_predicates==&filter_values=<job id>)")
    return Decision(Kind.JOB, job=values[0])


def job_visible(job: dict, caller: Caller) -> bool:
    """Whether a job as Ray's Jobs API shows it belongs to the caller's projects."""
    if caller.project is None:
        return True
    return ((job.get("metadata") or {}).get(PROJECT_KEY)) == caller.project
