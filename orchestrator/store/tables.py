"""Tables. Each index says which query it serves."""

from __future__ import annotations

from datetime import timezone

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Column,
    DateTime,
    Float,
    ForeignKey,
    ForeignKeyConstraint,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Table,
    Text,
    TypeDecorator,
    UniqueConstraint,
    false,
)

class UTCDateTime(TypeDecorator):
    """Timezone-aware UTC datetimes on every backend (SQLite stores naive text)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value, dialect):
        if value is not None and value.tzinfo is None:
            raise ValueError("naive datetime given to the store; use datetime.now(timezone.utc)")
        if value is not None and dialect.name == "sqlite":
            return value.astimezone(timezone.utc).replace(tzinfo=None)
        return value

    def process_result_value(self, value, dialect):
        if value is not None and value.tzinfo is None:
            return value.replace(tzinfo=timezone.utc)
        return value


metadata = MetaData(
    naming_convention={
        "ix": "ix_%(table_name)s_%(column_0_N_name)s",
        "uq": "uq_%(table_name)s_%(column_0_N_name)s",
        "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
        "pk": "pk_%(table_name)s",
    }
)

jobs = Table(
    "jobs",
    metadata,
    Column("id", String(26), primary_key=True),  # time-ordered (ids.new_job_id)
    Column("project", String(64), nullable=False),
    Column("name", String(128), nullable=False),
    Column("kind", String(32), nullable=False),
    Column("status", String(16), nullable=False),
    Column("status_reason", Text, nullable=True),
    Column("priority", Integer, nullable=False),
    Column("spec", JSON, nullable=False),
    Column("node_group", String(64), nullable=True),  # set once routed
    Column("placement", JSON, nullable=True),
    Column("attempts", Integer, nullable=False, default=0),  # attempts started so far
    Column("max_attempts", Integer, nullable=False),
    Column("preemptions", Integer, nullable=False, default=0),
    Column("failure_cause", String(32), nullable=True),
    Column("idempotency_key", String(255), nullable=True),
    Column("request_hash", String(64), nullable=True),
    Column("cancel_requested", Boolean, nullable=False, default=False),
    Column("not_before", UTCDateTime(), nullable=True),  # retry backoff
    Column("skips", Integer, nullable=False, default=0),  # admission passes it lost (anti-starvation)
    Column("lease_owner", String(64), nullable=True),
    Column("lease_expires_at", UTCDateTime(), nullable=True),
    Column("created_at", UTCDateTime(), nullable=False),
    Column("updated_at", UTCDateTime(), nullable=False),
    Column("started_at", UTCDateTime(), nullable=True),
    Column("finished_at", UTCDateTime(), nullable=True),
    # A member of an array (store.arrays): which, its index, and whether it is held
    # back (not queued) until a running member of its array ends (max_parallel).
    Column("array_id", String(32), nullable=True),
    Column("array_index", Integer, nullable=True),
    Column("array_held", Boolean, nullable=False, default=False, server_default=false()),
    # Parents not yet ended as this job needs (store.dependencies); queued only at 0.
    Column("deps_waiting", Integer, nullable=False, default=0, server_default="0"),
    # A fleet's nominee (docs/fleet.md): the one cluster whose dispatcher may admit the
    # job now. NULL: the deployment's one (attached) cluster; TO_PLACE (store.fleet):
    # to be placed again (its cluster was lost, or its scale-up there timed out).
    Column("cluster", String(32), nullable=True),
    # When the placer last nominated the job, or judged its nomination still the best.
    Column("nominated_at", UTCDateTime(), nullable=True),
    # A retried submit with the same key returns the same job (per project).
    UniqueConstraint("project", "idempotency_key"),
)
# GET /v1/jobs: a project's jobs newest first, cursor = id.
Index("ix_jobs_project_id", jobs.c.project, jobs.c.id)
# The scheduler's queue scan: queued jobs by priority (high first) then age, one
# status at a time, read in index order (100,000 queued jobs are not sorted).
Index("ix_jobs_status_priority_id", jobs.c.status, jobs.c.priority.desc(), jobs.c.id)
# Capacity accounting: active jobs per node group; filter by node group; and
# /metrics' oldest queued job per group (created_at: one index step, not a scan).
Index("ix_jobs_node_group_status_created_at", jobs.c.node_group, jobs.c.status, jobs.c.created_at)
# GET /v1/jobs?status= across projects (admins): newest first within a status,
# instead of sorting every job in it (550 ms for PENDING at 1M stored).
Index("ix_jobs_status_id", jobs.c.status, jobs.c.id)
# A fleet's placer, every pass: the jobs to be placed (jobs.cluster = TO_PLACE), and
# the queued ones whose nomination is due to be judged again (store.fleet): a seek
# each, not a walk of the whole queue.
Index("ix_jobs_cluster_status", jobs.c.cluster, jobs.c.status)
Index("ix_jobs_status_nominated_at", jobs.c.status, jobs.c.nominated_at)
# Filter by name prefix within a project.
Index("ix_jobs_project_name", jobs.c.project, jobs.c.name)
# An array's members: its counts, and the next held member to release.
Index("ix_jobs_array_id_array_held", jobs.c.array_id, jobs.c.array_held)

job_labels = Table(
    "job_labels",
    metadata,
    Column("job_id", String(26), ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True),
    Column("key", String(63), primary_key=True),
    Column("value", String(256), nullable=False),
)
# GET /v1/jobs?label=k=v
Index("ix_job_labels_key_value", job_labels.c.key, job_labels.c.value)

attempts = Table(
    "attempts",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("job_id", String(26), ForeignKey("jobs.id", ondelete="CASCADE"), nullable=False),
    Column("number", Integer, nullable=False),
    Column("submission_id", String(64), nullable=False, unique=True),  # Ray's job id for it
    Column("node_group", String(64), nullable=True),
    Column("market", String(16), nullable=True),
    Column("status", String(16), nullable=False),  # Ray's view: PENDING/RUNNING/SUCCEEDED/FAILED/STOPPED/LOST
    Column("resources", JSON, nullable=True),  # what it held, for accounting
    Column("driver_node_id", String(64), nullable=True),
    Column("created_at", UTCDateTime(), nullable=False),
    Column("started_at", UTCDateTime(), nullable=True),
    Column("ended_at", UTCDateTime(), nullable=True),
    Column("cause", String(32), nullable=True),
    Column("message", Text, nullable=True),
    Column("exit_code", Integer, nullable=True),
    # The Ray job it ran in when that is not its own submission id: a warm lane's host.
    Column("ray_job", String(128), nullable=True),
    # The fleet's cluster it was placed on (docs/fleet.md); NULL: the deployment's one cluster.
    Column("cluster", String(32), nullable=True),
    # An attempt given up with its cluster (CLUSTER_LOST) is stopped there when the
    # cluster answers again, before its dispatcher submits anything: when that was done.
    Column("fenced_at", UTCDateTime(), nullable=True),
    # Preemption (docs/sharing.md): the waiting job this attempt is being preempted
    # for, and when it is stopped at the latest (its grace period's end).
    Column("preempt_for", String(26), nullable=True),
    Column("preempt_deadline", UTCDateTime(), nullable=True),
    UniqueConstraint("job_id", "number"),
)
# The reconciler's scan: attempts Ray still runs.
Index("ix_attempts_status", attempts.c.status)
# /v1/costs and /v1/report: attempts that had not ended before the window's start
# (ended_at >= :start, or NULL: still live), not every attempt ever made.
Index("ix_attempts_ended_at", attempts.c.ended_at)
# Preemption's reads each dispatcher pass (store.sharing): the few attempts being
# (or lately) preempted, never a scan of every attempt ever made.
Index("ix_attempts_preempt_for", attempts.c.preempt_for)

events = Table(
    "events",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("job_id", String(26), ForeignKey("jobs.id", ondelete="CASCADE"), nullable=False),
    Column("at", UTCDateTime(), nullable=False),
    Column("from_status", String(16), nullable=True),
    Column("to_status", String(16), nullable=False),
    Column("reason", Text, nullable=True),
    Column("actor", String(128), nullable=False),
    Column("attempt", Integer, nullable=True),
)
# GET /v1/jobs/{id}/events in order.
Index("ix_events_job_id_id", events.c.job_id, events.c.id)

results = Table(
    "results",
    metadata,
    Column("job_id", String(26), ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True),
    Column("attempt", Integer, nullable=True),
    Column("result", JSON, nullable=False),
    Column("updated_at", UTCDateTime(), nullable=False),
)

trials = Table(
    "trials",
    metadata,
    Column("job_id", String(26), ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True),
    Column("trial_id", String(64), primary_key=True),
    Column("attempt", Integer, nullable=True),
    Column("status", String(16), nullable=False),  # TERMINATED / ERROR / RUNNING
    Column("config", JSON, nullable=False),
    Column("metrics", JSON, nullable=False),
    Column("node_id", String(64), nullable=True),
    Column("node_group", String(64), nullable=True),
    Column("error", Text, nullable=True),
    Column("updated_at", UTCDateTime(), nullable=False),
)

# Access (raylane.orchestrator.services.access): projects, API tokens, quotas, the audit trail.

projects = Table(
    "projects",
    metadata,
    Column("name", String(64), primary_key=True),
    Column("description", Text, nullable=True),
    Column("created_at", UTCDateTime(), nullable=False),
    Column("created_by", String(128), nullable=False),
)

api_tokens = Table(
    "api_tokens",
    metadata,
    Column("id", String(32), primary_key=True),  # public handle ("tok_..."), shown in lists and audit rows
    # sha256 of the secret: the secret itself is shown once and never stored.
    Column("token_hash", String(64), nullable=False, unique=True),
    Column("name", String(128), nullable=False),  # the user (or robot) it belongs to
    Column("project", String(64), ForeignKey("projects.name"), nullable=True),  # None: an admin of every project
    Column("role", String(16), nullable=False),
    Column("created_at", UTCDateTime(), nullable=False),
    Column("created_by", String(128), nullable=False),
    Column("expires_at", UTCDateTime(), nullable=True),
    Column("revoked_at", UTCDateTime(), nullable=True),
    Column("revoked_by", String(128), nullable=True),
    Column("last_used_at", UTCDateTime(), nullable=True),
)
# GET /v1/tokens?project=
Index("ix_api_tokens_project", api_tokens.c.project)

# One row (id 1): a number that triggers on api_tokens raise with every change to
# a token's identity or liveness (migration 0012). A replica keeps verified tokens
# in memory tagged with the number it read before verifying; a request reads the
# number (one primary-key read) and uses a kept token only while it is unchanged
# (store.tokens, services.access).
auth_epoch = Table(
    "auth_epoch",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=False),
    Column("n", BigInteger, nullable=False),
)

quotas = Table(
    "quotas",
    metadata,
    Column("project", String(64), ForeignKey("projects.name", ondelete="CASCADE"), primary_key=True),
    Column("node_group", String(64), primary_key=True),
    Column("max_gpus", Float, nullable=True),  # None: no limit on this resource
    Column("max_cpus", Float, nullable=True),
    Column("max_concurrent_jobs", Integer, nullable=True),
    # Sharing (docs/sharing.md): max_gpus / max_cpus are the project's guaranteed share;
    # borrow_*: how much more it may use while others leave theirs idle (None: none,
    # a hard cap as before); lend_*: how much of its idle share others may borrow
    # (None: all of it).
    Column("borrow_gpus", Float, nullable=True),
    Column("borrow_cpus", Float, nullable=True),
    Column("lend_gpus", Float, nullable=True),
    Column("lend_cpus", Float, nullable=True),
    Column("updated_at", UTCDateTime(), nullable=False),
    Column("updated_by", String(128), nullable=False),
)

audit_log = Table(
    "audit_log",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),  # GET /v1/audit pages newest first by id
    Column("at", UTCDateTime(), nullable=False),
    Column("actor", String(128), nullable=False),  # token owner's name; "anonymous" without a valid token
    Column("token_id", String(32), nullable=True),
    Column("role", String(16), nullable=True),
    Column("project", String(64), nullable=True),  # the caller's scope; None: every project
    Column("action", String(128), nullable=False),  # the endpoint's name, e.g. submit_job
    Column("method", String(8), nullable=False),
    Column("path", String(512), nullable=False),
    Column("target", String(512), nullable=True),  # the object acted on (job id, token id, project)
    Column("status_code", Integer, nullable=False),
    Column("client", String(128), nullable=True),  # the client's address as the server saw it
    # Requests this row stands for: 1, or refusals without a valid token from one
    # client in one minute, counted in memory and added here (api.auth).
    Column("count", Integer, nullable=False, server_default="1"),
)
# GET /v1/audit?actor=
Index("ix_audit_log_actor_id", audit_log.c.actor, audit_log.c.id)

# Rate limits shared by every replica on this database (store.ratelimits): one
# row per key and fixed window, pruned once the window can no longer count.
rate_windows = Table(
    "rate_windows",
    metadata,
    Column("key", String(255), primary_key=True),  # "<namespace>:<window_s>:<who>"
    Column("window_start", Integer, primary_key=True),  # epoch seconds, a multiple of the window
    Column("n", Integer, nullable=False),  # hits taken in this window
)
# The prune: DELETE ... WHERE window_start < :before
Index("ix_rate_windows_window_start", rate_windows.c.window_start)

# Code packages (raylane.orchestrator.store.packages): zipped working dirs uploaded by
# clients, named by the sha256 of their bytes. In the database, not on one
# replica's disk: any replica's dispatcher hands any package to Ray.
packages = Table(
    "packages",
    metadata,
    Column("sha256", String(64), primary_key=True),
    Column("size_bytes", Integer, nullable=False),
    Column("data", LargeBinary, nullable=False),
    Column("project", String(64), nullable=True),  # the uploader's project (None: an admin of every project)
    Column("created_by", String(128), nullable=False),
    Column("created_at", UTCDateTime(), nullable=False),
    Column("last_used_at", UTCDateTime(), nullable=False),  # upload, submit or dispatch
)
# The sweep: packages unused since a cutoff.
Index("ix_packages_last_used_at", packages.c.last_used_at)

# Webhooks (raylane.orchestrator.store.webhooks): a project's subscriptions to its
# jobs' status changes, and one delivery row per (hook, event), written in the
# transaction that writes the event, so no status change is lost between them.
webhooks = Table(
    "webhooks",
    metadata,
    Column("id", String(32), primary_key=True),  # public handle ("wh_...")
    Column("project", String(64), nullable=False),
    Column("url", String(2048), nullable=False),
    # The HMAC key of its signatures: shown once at creation, kept to sign (like a
    # provider's webhook secret), never returned again.
    Column("secret", String(128), nullable=False),
    # ",SUCCEEDED,FAILED," : the statuses it wants, matched with LIKE in the enqueue.
    Column("statuses", String(256), nullable=False),
    # ",schedule.created,schedule.skipped," : the schedule events it wants; None: none.
    Column("events", String(256), nullable=True),
    Column("description", String(256), nullable=True),
    Column("created_at", UTCDateTime(), nullable=False),
    Column("created_by", String(128), nullable=False),
)
# The enqueue: hooks of the job's project.
Index("ix_webhooks_project", webhooks.c.project)

webhook_deliveries = Table(
    "webhook_deliveries",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),  # sent as Raylane-Delivery: receivers dedupe by it
    Column("hook_id", String(32), ForeignKey("webhooks.id", ondelete="CASCADE"), nullable=False),
    # Of a job's status change (event_id, job_id), or of a schedule's handled tick
    # (schedule_id, tick: its schedule_runs row, deleted with the schedule).
    Column("event_id", Integer, ForeignKey("events.id", ondelete="CASCADE"), nullable=True),
    Column("job_id", String(26), nullable=True),
    Column("schedule_id", String(32), nullable=True),
    Column("tick", UTCDateTime(), nullable=True),
    Column("status", String(16), nullable=False),  # PENDING, DELIVERED, FAILED (gave up)
    Column("attempts", Integer, nullable=False, server_default="0"),
    Column("next_at", UTCDateTime(), nullable=False),  # due from then (retry backoff)
    Column("lease_owner", String(64), nullable=True),  # the replica sending it now
    Column("lease_expires_at", UTCDateTime(), nullable=True),
    Column("last_status_code", Integer, nullable=True),
    Column("last_error", String(512), nullable=True),
    Column("created_at", UTCDateTime(), nullable=False),
    Column("delivered_at", UTCDateTime(), nullable=True),
    UniqueConstraint("hook_id", "event_id"),  # one delivery per hook and event
    UniqueConstraint("hook_id", "schedule_id", "tick"),  # ... and per hook and tick
    ForeignKeyConstraint(["schedule_id", "tick"], ["schedule_runs.schedule_id", "schedule_runs.tick"],
                         ondelete="CASCADE"),
)
# The notifier's claim: due PENDING deliveries, oldest first.
Index("ix_webhook_deliveries_status_next_at", webhook_deliveries.c.status, webhook_deliveries.c.next_at)
# GET /v1/webhooks/{id}/deliveries, newest first.
Index("ix_webhook_deliveries_hook_id_id", webhook_deliveries.c.hook_id, webhook_deliveries.c.id)

# Schedules (raylane.orchestrator.store.schedules): a spec run at the ticks of a
# cron expression. ``next_at`` is the first tick not yet handled; a replica that
# handles it moves it on with a compare-and-set, so each tick is handled once.
schedules = Table(
    "schedules",
    metadata,
    Column("id", String(32), primary_key=True),  # public handle ("sch_...")
    Column("project", String(64), nullable=False),
    Column("name", String(128), nullable=False),
    Column("cron", String(256), nullable=False),
    Column("timezone", String(64), nullable=False),
    Column("spec", JSON, nullable=False),  # the job's spec, as submitted (JobSpec JSON)
    Column("overlap", String(16), nullable=False),  # skip / queue / replace
    Column("missed", String(16), nullable=False),  # skip / run_once / run_all
    Column("starting_deadline_s", Float, nullable=False),
    Column("paused", Boolean, nullable=False, default=False),
    Column("next_at", UTCDateTime(), nullable=False),
    Column("last_job_id", String(26), nullable=True),  # the overlap policy looks at it
    # The replica handling its due ticks now; a lease that expires (a replica died
    # mid-pass) lets another redo them: jobs are keyed by tick, so none is made twice.
    Column("lease_owner", String(64), nullable=True),
    Column("lease_expires_at", UTCDateTime(), nullable=True),
    Column("created_at", UTCDateTime(), nullable=False),
    Column("created_by", String(128), nullable=False),
    Column("updated_at", UTCDateTime(), nullable=False),
    UniqueConstraint("project", "name"),
)
# The scheduler's pass: schedules due now.
Index("ix_schedules_paused_next_at", schedules.c.paused, schedules.c.next_at)

# One row per handled tick: the job it made, or why none (skipped: missed or overlap).
schedule_runs = Table(
    "schedule_runs",
    metadata,
    Column("schedule_id", String(32), ForeignKey("schedules.id", ondelete="CASCADE"), primary_key=True),
    Column("tick", UTCDateTime(), primary_key=True),
    Column("job_id", String(26), nullable=True),
    Column("outcome", String(16), nullable=False),  # created / skipped
    Column("reason", String(256), nullable=True),
    Column("at", UTCDateTime(), nullable=False),
)

# Arrays (raylane.orchestrator.store.arrays): one spec, ``size`` member jobs. At
# most ``max_parallel`` members are unheld and unfinished at once: a member that
# ends releases the next held one, in the transaction of its end.
arrays = Table(
    "arrays",
    metadata,
    Column("id", String(32), primary_key=True),  # public handle ("arr_...")
    Column("project", String(64), nullable=False),
    Column("name", String(128), nullable=False),
    Column("size", Integer, nullable=False),
    Column("max_parallel", Integer, nullable=True),  # None: no limit
    Column("spec", JSON, nullable=False),  # the array's spec (members: its copy without ``array``)
    Column("created_at", UTCDateTime(), nullable=False),
    Column("created_by", String(128), nullable=False),
)

# A job's parents (spec.depends_on), one row each: ``state`` waiting until the
# parent ends, then met or broken (a broken one cancels the child).
job_dependencies = Table(
    "job_dependencies",
    metadata,
    Column("child_id", String(26), ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True),
    Column("parent_id", String(26), primary_key=True),
    Column("condition", String(16), nullable=False),  # succeeded / failed / finished
    Column("state", String(16), nullable=False),  # waiting / met / broken
)
# A parent's end: its waiting children.
Index("ix_job_dependencies_parent_id_state", job_dependencies.c.parent_id, job_dependencies.c.state)

# Counts /metrics reads instead of scanning jobs and attempts (store.tallies):
# one row per tally and shard, moved in the transaction that moves what it counts.
tallies = Table(
    "tallies",
    metadata,
    Column("name", String(32), primary_key=True),
    Column("label1", String(64), primary_key=True),
    Column("label2", String(64), primary_key=True),
    Column("shard", Integer, primary_key=True),  # PostgreSQL: one of store.tallies.SHARDS; SQLite: 0
    Column("value", Float, nullable=False),
)

# What accounting reads of each attempt (store.usage): its keys, resources and
# held span, one row per attempt, written by the attempt's writers (store.queue's
# admit, store.transitions) in their transactions. /v1/costs and /v1/report sum
# a window's rows in SQL instead of decoding and pricing each attempt in Python.
attempt_usage = Table(
    "attempt_usage",
    metadata,
    Column("job_id", String(26), ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True),
    Column("number", Integer, primary_key=True),
    Column("project", String(64), nullable=False),
    Column("kind", String(32), nullable=False),
    Column("node_group", String(64), nullable=True),
    Column("market", String(16), nullable=True),
    Column("cpu", Float, nullable=False),
    Column("gpu", Float, nullable=False),
    # domain.costs.review: which cheaper-placement finding it could give; None: none.
    Column("review", String(8), nullable=True),
    # domain.costs.held_span in microseconds since 1970 (integers: sums are exact on
    # both backends); from NULL: held nothing (yet); to NULL: still holding.
    Column("held_from", BigInteger, nullable=True),
    Column("held_to", BigInteger, nullable=True),
    # The latest held_to of the job's earlier attempts (by number), and of those on
    # the same node group; NULL: none ended holding. A window counts a job (per node
    # group) at its first attempt there whose earlier ones all stopped before the
    # window (store.usage), so distinct jobs are a SUM beside the held seconds.
    Column("prev_held_to", BigInteger, nullable=True),
    Column("prev_group_held_to", BigInteger, nullable=True),
    # store.usage_rows.key_id of (project, kind, node_group, market, cpu, gpu): the key
    # costs are summed by, as one integer.
    Column("key_id", BigInteger, nullable=False),
)
# A window's attempts, key by key: for each key (found by a seek per key), one range
# of those still holding (NULL) and one of those that stopped after its start.
# Covering, and in key order: the sums need no sort (store.usage.sums).
Index("ix_attempt_usage_window", attempt_usage.c.key_id, attempt_usage.c.held_to, attempt_usage.c.held_from,
      attempt_usage.c.prev_held_to, attempt_usage.c.prev_group_held_to)
# The report's candidates for a cheaper placement, by window.
Index("ix_attempt_usage_review_held_to", attempt_usage.c.review, attempt_usage.c.held_to)
# Fair share's lookback (store.fairshare): the rows still holding (NULL) or that stopped
# within it, not a year of history; covering, so the sums read the index alone
# (500,000 rows over a year, SQLite: 15-30 ms, against 65 ms scanning the table).
Index("ix_attempt_usage_fair_share", attempt_usage.c.held_to, attempt_usage.c.held_from, attempt_usage.c.project,
      attempt_usage.c.node_group, attempt_usage.c.cpu, attempt_usage.c.gpu)

# A warm lane's attempt's output, the last ``domain.lanes.MAX_LOG_BYTES`` of it,
# moved here from Ray's KV store with the attempt's outcome (``loops.reconciler``):
# Ray's store then holds only live lane attempts, and the log outlives the lane's node.
lane_logs = Table(
    "lane_logs",
    metadata,
    Column("job_id", String(26), ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True),
    Column("number", Integer, primary_key=True),
    Column("tail", Text, nullable=False),
)
