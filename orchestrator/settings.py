"""Settings, all from ``RAYLANE_*`` environment variables (pydantic-settings).

docs/settings.md lists every one; tests/test_settings_doc.py keeps that table
in step with this class.
"""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

MIN_ADMIN_TOKEN_LEN = 16  # shorter is a placeholder, not a secret
# What jobs' runners open through pyarrow.fs (and Tune, Ray Data through it).
STORAGE_SCHEMES = {"s3", "gs", "gcs", "hdfs", "abfs", "abfss", "file"}


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="RAYLANE_", extra="ignore")

    # Where state lives
    database_url: str | None = Field(
        None, description="SQLAlchemy URL. Unset: SQLite (WAL) at <data_dir>/raylane.db."
    )
    data_dir: Path = Field(Path(".raylane"), description="Local state: SQLite file, admin token, local cluster logs. Never job storage.")
    sqlite_synchronous: Literal["OFF", "NORMAL", "FULL"] = Field(
        "FULL", description="SQLite fsync level. FULL: a committed job survives power loss; NORMAL: survives a process crash."
    )
    auto_migrate: bool = Field(True, description="Run `alembic upgrade head` on start.")
    group_commit_max_units: int = Field(
        256, ge=1, description="Single submits made durable by one commit, at most this many, each acknowledged "
        "only after it (SQLite: audit rows too; PostgreSQL: a batch's rows sent as one statement); 1: one commit each.")

    # Job storage (docs/deploy.md#storage): what jobs write that must outlive a node
    storage_uri: str | None = Field(
        None, description="Where checkpoints, Tune experiments and batch outputs go, one prefix per job (<uri>/<project>/<job id>): s3://bucket/prefix, gs://bucket/prefix, or an absolute path every node mounts. Unset: the directory <data_dir>-storage beside data_dir (one machine only)."
    )
    storage_endpoint_url: str | None = Field(
        None, description="S3 endpoint for s3:// storage that is not AWS (MinIO, Ceph, a test server), e.g. http://minio:9000; jobs use it for every s3:// URI they read or write."
    )
    storage_env: dict[str, str] = Field(
        {}, description="Environment variables every job gets to reach its storage (JSON object), e.g. AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_REGION: credentials for jobs, never the control plane's own. Empty: nodes use their own (instance role, workload identity)."
    )

    # HTTP
    host: str = Field("127.0.0.1", description="Address the API binds.")
    port: int = Field(8000, ge=0, le=65535, description="Port the API binds.")
    workers: int = Field(1, ge=1, le=64, description="uvicorn worker processes on the one port. Each is a replica "
                         "with its own loops, as several control planes on one database are; use PostgreSQL for more "
                         "than one (SQLite takes one writer at a time).")
    max_body_bytes: int = Field(8 * 1024 * 1024, ge=1024, description="Larger request bodies get 413.")
    max_batch_jobs: int = Field(1000, ge=1, le=100_000, description="Most specs in one POST /v1/jobs/batch.")
    public_url: str | None = Field(None, description="URL clients use to reach the API (for links).")
    log_level: str = Field("INFO", description="Python log level.")
    log_format: Literal["json", "text"] = Field(
        "json", description="`raylane-server serve` log lines: json (one object a line, with request, job and attempt ids) or text."
    )

    # Followed logs (orchestrator/services/logfollow.py)
    log_follow_poll_s: float = Field(0.5, gt=0, le=60, description="How often a followed job's status and Ray log are read (once per job, whatever the number of streams).")
    log_follow_heartbeat_s: float = Field(15.0, gt=0, le=300, description="A followed stream in NDJSON sends a blank line after this long without log text.")
    log_follow_max_s: float = Field(3600.0, gt=0, description="A followed stream ends after this long; the SDK and CLI reconnect.")
    log_streams_per_token: int = Field(16, ge=1, description="Followed log streams one token may hold open at once (then 429 + Retry-After).")
    log_streams_max: int = Field(1000, ge=1, description="Followed log streams this server process holds open at once (then 429 + Retry-After).")

    # Ray
    ray_address: str | None = Field(None, description="GCS address of an existing Ray cluster (host:port): "
                                    "where Raylane reads jobs' results, sees draining nodes and asks their jobs to "
                                    "checkpoint. Unset: the address the head node was started with "
                                    "(from Ray's node list).")
    dashboard_url: str | None = Field(None, description="Ray dashboard / Jobs API URL of an existing cluster.")
    ray_auth_token: str | None = Field(None, description="Ray token-auth token; unset: read ~/.ray/auth_token when present.")
    profile: Path | None = Field(None, description="Cluster profile YAML. Unset: the shipped local profile.")

    # The fleet: several Ray clusters, owned and rented (docs/fleet.md)
    fleet: str | None = Field(None, description="Fleet YAML file (or the name of a shipped one: local-hybrid) naming "
                              "the Ray clusters behind the queue, their tier, reach, node groups and cost. Unset: one "
                              "cluster, from RAYLANE_PROFILE, RAYLANE_DASHBOARD_URL and RAYLANE_RAY_ADDRESS.")
    fleet_owned_soon_s: float = Field(600.0, ge=0, le=86400, description="An owned cluster without room now is still "
                                      "placed first when its place in the queue is expected to start within this "
                                      "long; past it, rented capacity comes first.")
    fleet_owned_wait_share: float = Field(2.5, ge=0, le=10, description="An owned cluster without room now is "
                                          "also placed first when the job is expected to start there within this "
                                          "share of how long its kind runs there (the median of past runs), when "
                                          "that is longer than RAYLANE_FLEET_OWNED_SOON_S: renting saves the wait "
                                          "but pays for the whole run. The share is for priority 50 and scales "
                                          "with (100 - priority) / 50: 0.4 of it at priority 80, none at 100, 1.6 "
                                          "at 20; at priority 50 or below, it is also multiplied by how much dearer the "
                                          "rented capacity open now is than the cheapest (on demand over spot once "
                                          "spot is full). 0: RAYLANE_FLEET_OWNED_SOON_S alone.")
    fleet_cluster_grace_s: float = Field(60.0, gt=0, le=3600, description="A fleet's cluster unreachable this long "
                                         "(every call failing, a last check included) is lost: its attempts end "
                                         "CLUSTER_LOST and their jobs are placed on another cluster. Shorter outages "
                                         "restart nothing.")
    fleet_renominate_s: float = Field(60.0, gt=0, le=86400, description="A queued job's nomination is judged again "
                                      "this often: when another cluster would start it sooner now (its rented group "
                                      "filled up, owned capacity freed), it moves there.")
    fleet_no_rent_projects: list[str] = Field([], description="Projects whose jobs never run on a rented cluster "
                                              "(JSON list); they wait for owned capacity.")
    fleet_rented_spend_cap: dict[str, float] = Field({}, description="Most a project's running attempts may cost an "
                                                     "hour on rented clusters (JSON object, project to $/h; key `*`: "
                                                     "every other project). A job that would pass it waits for owned "
                                                     "capacity.")

    # Ray's dashboard through Raylane (api/rayproxy.py, docs/auth.md)
    session_secret: SecretStr | None = Field(
        None, description="Key that signs the /ray session cookie of a browser signed in through /ui (16+ characters); the same on every replica. Unset: a random key per process (a browser signs in again after a restart, or on another replica).")
    session_ttl_s: float = Field(3600.0, gt=0, le=7 * 24 * 3600, description="A /ray session cookie expires after this long; the token it was made from is checked again on every request (revoked: refused at once).")
    ray_proxy_timeout_s: float = Field(30.0, gt=0, le=600, description="Ray's dashboard must start answering a proxied request within this long (then 504).")
    ray_proxy_stream_max_s: float = Field(600.0, gt=0, description="A proxied response (a streamed log) is cut after this long.")
    ray_proxy_per_token: int = Field(16, ge=1, description="Proxied requests one token may have in flight at once (then 429 + Retry-After).")
    ray_proxy_max: int = Field(256, ge=1, description="Proxied requests this server process has in flight at once (then 429 + Retry-After).")
    ray_proxy_audit_every: int = Field(20, ge=1, description="One allowed read through /ray in this many is written to the audit trail; refusals and every mutating request always are.")

    # Loops
    dispatch_interval_s: float = Field(1.0, gt=0, description="Dispatcher's polling fallback when not woken.")
    reconcile_interval_s: float = Field(1.0, gt=0, description="How often Ray's view is folded into the DB.")
    lease_s: float = Field(30.0, gt=0, description="How long a claimed job is held by one control plane.")
    max_concurrent_drivers: int = Field(64, ge=1, description="Head-node guard: most Ray drivers at once.")
    starvation_skips: int = Field(20, ge=0, description="Times a big job may be passed over before it reserves capacity.")
    # Sharing (docs/sharing.md)
    preemption: bool = Field(
        True, description="Preempt running jobs for a waiting one: borrowers for a job within its project's "
        "guaranteed share, lower priority for higher. Victims are asked to checkpoint and stopped after their "
        "grace period; their attempts end PREEMPTED_BY_PRIORITY (queued again, not counted against max_attempts).")
    preempt_grace_s: float = Field(
        60.0, ge=0, le=86400, description="How long a preempted job has to checkpoint before it is stopped "
        "(sooner once it has); a spec may ask for more with preemption.grace_s, up to preempt_max_grace_s.")
    preempt_max_grace_s: float = Field(
        600.0, ge=0, le=86400, description="The longest grace period a spec may ask for (policy).")
    preempt_min_run_s: float = Field(
        120.0, ge=0, le=86400, description="A job that has run less than this is never preempted: it has had no "
        "time to do (or checkpoint) anything.")
    preempt_cycle_window_s: float = Field(
        600.0, ge=0, le=86400, description="A job preempted for another may not preempt that one back within "
        "this long (no cycles).")
    fair_share_half_life_s: float = Field(
        86400.0, ge=0, description="Fair share: among queued jobs of equal priority in a node group, the project "
        "with less decayed usage there goes first; usage is GPU-seconds (CPU-seconds in a group without GPUs), each "
        "weighted by 2^(-age / this half-life), as Slurm's PriorityDecayHalfLife. 0: off (oldest first within a "
        "priority).")
    autoscale_ahead_jobs: int = Field(
        0, ge=0, le=1000, description="Per node group, most jobs submitted to Ray ahead of a scale-up (beyond live "
        "capacity, up to what the profile's max_nodes lets Ray's autoscaler or KubeRay add), so that the autoscaler "
        "sees their demand. 0: admission counts live nodes only, as on a static cluster.")
    scale_up_deadline_s: float = Field(
        900.0, gt=0, description="A job submitted ahead of a scale-up whose driver has not started after this long "
        "fails with cause SCALE_UP_TIMEOUT and a reason naming the group.")
    queue_ahead_jobs: int = Field(
        0, ge=0, le=1000, description="Per node group, most command jobs submitted to Ray beyond what fits now "
        "(waiting in Ray's queue for running jobs to end), so that Ray starts the next the moment one ends. Only "
        "commands without GPUs, never past a waiting job of the group, never in a group where warm-lane jobs run, "
        "nor in one the autoscaler may grow. 0: admit only what fits now.")
    fast_lane: bool = Field(
        True, description="Small jobs (a command or function of one worker, at most 1 CPU, no GPU, no local "
        "working_dir/py_modules directory, not `lane: isolated`) run in a warm lane per node group and runtime env "
        "instead of a Ray job each (docs/fast-lane.md). Needs Ray's GCS (ray_address, or found from Ray's node list); "
        "while its address is unknown, small jobs run as Ray jobs. false: every job is a Ray job of its own.")
    lane_idle_s: float = Field(60.0, gt=0, description="A warm lane's host exits after this long without work; the next lane job starts a new one.")
    lane_slots: int = Field(8, ge=1, le=1024, description="Most jobs one lane host runs at once (admission also bounds them by the group's CPUs).")
    lane_max_envs: int = Field(4, ge=1, le=256, description="Runtime envs (a working_dir package, py_modules, pip) of one node group whose warm lanes keep hosts at once; a job of one more retires the hosts of the env used longest ago (they finish what they run).")
    lane_tombstone_keep_s: float = Field(86400.0, ge=60, description="How long a warm-lane attempt's claim (the tombstone that keeps a late redispatch from running it again) stays in Ray's KV store after the attempt ended; then it is deleted with any key of the attempt left over.")
    lane_dashboard_keep: int = Field(1000, ge=0, le=10_000, description="Warm-lane jobs keep their records in Ray's dashboard while they run, then while they are among the newest this many ended attempts (of any job), for an hour at most; the reconciler deletes older ones, so Ray's Jobs page stays small whatever the lane's throughput (a record is about 1 KB, up to 5 KB with a failed job's output tail; docs/fast-lane.md).")
    bench_bare_endpoint: bool = Field(
        False, description="Mount POST /bench/bare-submit: the same auth, middleware and JobSpec validation as "
        "POST /v1/jobs, then 201 without storing anything (bench/submit_throughput.py's reference). For "
        "benchmarks only; never in production.")
    loops_enabled: bool = Field(True, description="Run the dispatcher, the reconciler, the webhook notifier and the scheduler in this process.")
    gc_freeze: bool = Field(True, description="After start-up, move every object alive (imports, the app, the engine) "
                                              "out of the garbage collector's sight (gc.freeze): its full collections "
                                              "then scan what requests make, not the whole server (docs/benchmarks.md).")

    schedule_interval_s: float = Field(1.0, gt=0, le=60, description="How often the scheduler looks for due schedule ticks (docs/schedules.md).")

    # Webhooks (docs/webhooks.md)
    webhook_interval_s: float = Field(1.0, gt=0, description="How often the notifier looks for due webhook deliveries.")
    webhook_timeout_s: float = Field(5.0, gt=0, le=60, description="A receiver that has not answered after this long counts as a failed try.")
    webhook_max_attempts: int = Field(8, ge=1, le=100, description="Tries of one delivery before it is FAILED; between them the wait doubles from 1 s up to 5 minutes.")
    webhook_allow_private: bool = Field(False, description="Let webhook URLs resolve to loopback, private and link-local addresses (receivers inside your network). Off: only public addresses, checked at creation and at every send.")
    webhook_allowed_hosts: list[str] = Field(
        ["*"], description="Host patterns (fnmatch, JSON list) a webhook URL may name, e.g. `[\"hooks.slack.com\", \"*.example.com\"]`. Ray's dashboard is refused whatever this says.")

    # Accounting
    break_even_utilisation: float = Field(
        0.7, gt=0, le=1, description="GPU utilisation above which owning (reserving) nodes beats renting them on "
        "demand; the target the fleet report judges owned groups by."
    )

    # Access (docs/auth.md)
    auth_enabled: bool = Field(
        True, description="Require an API token on every request but /healthz, /readyz, /docs, /openapi.json and /ui. Off: every caller is an admin (development only)."
    )
    admin_token: SecretStr | None = Field(
        None, description="Bootstrap admin token (16+ characters). Unset: one is generated at the first start, printed once and written to <data_dir>/admin_token (0600)."
    )
    submit_rate_per_s: float = Field(20.0, ge=0, description="Submit requests (single or batch) per second per token; 0: unlimited.")
    submit_burst: int = Field(100, ge=1, description="Submit requests a token may make at once before the rate applies (then 429 + Retry-After).")
    rate_limit_storage: str = Field("auto", description="Where submit rate limits are counted: database (a table shared by every replica on it), memory:// (this process), redis://host:6379/0 (shared through Redis), or auto: database on PostgreSQL, memory:// on SQLite (one server).")
    address_rate_per_s: float = Field(20.0, ge=0, description="Requests per second per client address without a token this server has seen valid (checked before authentication, in memory per replica; then 429 + Retry-After); 0: unlimited.")
    address_burst: int = Field(100, ge=1, description="Such requests an address may make at once before address_rate_per_s applies.")

    # Policy: what a job may run (orchestrator/domain/policy.py)
    policy_allow_pip: bool = Field(True, description="Allow runtime_env.pip at all.")
    policy_preemption_opt_out: bool = Field(
        False, description="Allow a spec to set preemption.preemptible false for a kind that may be preempted "
        "(sweeps, batch, commands, training, functions); off: such a spec is refused (403).")
    policy_pip_allowlist: list[str] = Field(
        [], description="Package names runtime_env.pip may install (JSON list); empty: any. When set, URLs and pip options are refused too."
    )
    policy_working_dir_roots: list[Path] = Field(
        [], description="Directories a local working_dir / py_modules must be under (JSON list); empty: local directories are refused, URIs only."
    )
    policy_working_dir_uri_schemes: list[str] = Field(
        ["s3", "gs", "https"], description="URI schemes a remote working_dir / py_modules may use (JSON list)."
    )
    # 100 MiB: Ray's own default cap for a working_dir it zips; a package is held in
    # memory once on upload and once when handed to Ray.
    package_max_bytes: int = Field(100 * 1024 * 1024, ge=1024, description="Largest code package (zipped working_dir) a member may upload to PUT /v1/packages/{sha256}.")
    package_retention_s: float = Field(7 * 24 * 3600, ge=0, description="An uploaded package no live job refers to is deleted once unused this long (seconds since its last upload, submit or dispatch).")
    policy_reserved_env_prefixes: list[str] = Field(
        ["RAYLANE_", "RAY_"], description="runtime_env.env_vars names with these prefixes are refused (JSON list)."
    )
    policy_max_gpus_per_job: float | None = Field(None, ge=0, description="Most GPUs one job may hold; unset: no limit.")
    policy_max_cpus_per_job: float | None = Field(None, ge=0, description="Most CPUs one job may hold, driver included; unset: no limit.")
    policy_max_workers_per_job: int | None = Field(None, ge=1, description="Most workers (or concurrent trials) of one job; unset: no limit.")

    @field_validator("fleet_rented_spend_cap")
    @classmethod
    def _spend_cap(cls, v: dict[str, float]) -> dict[str, float]:
        for project, cap in v.items():
            if not isinstance(cap, (int, float)) or cap != cap or cap < 0 or cap == float("inf"):
                raise ValueError(f"RAYLANE_FLEET_RENTED_SPEND_CAP: {project!r}: a cap is a finite $/h of 0 or more")
        return v

    @field_validator("admin_token")
    @classmethod
    def _admin_token(cls, v: SecretStr | None) -> SecretStr | None:
        if v is not None and not v.get_secret_value().strip():
            return None  # RAYLANE_ADMIN_TOKEN= (empty, as compose passes an unset variable) means unset
        # A short or placeholder secret is worse than a generated one: refuse it.
        if v is not None and len(v.get_secret_value().strip()) < MIN_ADMIN_TOKEN_LEN:
            raise ValueError(f"RAYLANE_ADMIN_TOKEN must be at least {MIN_ADMIN_TOKEN_LEN} characters")
        return v

    @field_validator("session_secret")
    @classmethod
    def _session_secret(cls, v: SecretStr | None) -> SecretStr | None:
        if v is not None and not v.get_secret_value().strip():
            return None
        if v is not None and len(v.get_secret_value().strip()) < MIN_ADMIN_TOKEN_LEN:
            raise ValueError(f"RAYLANE_SESSION_SECRET must be at least {MIN_ADMIN_TOKEN_LEN} characters")
        return v

    @field_validator("storage_uri")
    @classmethod
    def _storage_uri(cls, v: str | None) -> str | None:
        if v is None or not v.strip():
            return None
        v = v.strip()
        if "://" in v:
            scheme = v.split("://", 1)[0].lower()
            if scheme not in STORAGE_SCHEMES:
                raise ValueError(f"RAYLANE_STORAGE_URI: scheme {scheme!r} is not one of {sorted(STORAGE_SCHEMES)}")
            if scheme != "file" and not v.split("://", 1)[1].strip("/"):
                raise ValueError("RAYLANE_STORAGE_URI: names no bucket")
        elif not Path(v).is_absolute():
            # A relative path means a different directory for every process that resolves it.
            raise ValueError("RAYLANE_STORAGE_URI: a path must be absolute")
        return v

    @field_validator("storage_env")
    @classmethod
    def _storage_env(cls, v: dict[str, str]) -> dict[str, str]:
        for name in v:
            if not name or name.upper().startswith(("RAYLANE_", "RAY_")):
                raise ValueError(f"RAYLANE_STORAGE_ENV: {name!r} is a name Raylane or Ray reads, not a storage credential")
        return v

    @model_validator(mode="after")
    def _storage_outside_state(self) -> "Settings":
        local = self.storage_local_root
        state = self.data_dir.resolve()
        if local is not None and (local == state or state in local.parents):
            raise ValueError(f"RAYLANE_STORAGE_URI: {local} is inside data_dir {state}; jobs must never reach the "
                             "control plane's state")
        return self

    @property
    def resolved_storage_uri(self) -> str:
        """The root of every job's storage. The default sits beside data_dir, not in
        it: it lasts as long as data_dir does (unlike a temp directory, which a reboot
        may clear under a resumable checkpoint), yet a job given its own storage path
        holds no path into the 0700 tree with the database and the admin token."""
        if self.storage_uri:
            return self.storage_uri
        state = self.data_dir.resolve()
        return str(state.with_name(state.name + "-storage"))

    @property
    def storage_local_root(self) -> Path | None:
        """The storage root as a local path, when it is one (None for object storage)."""
        uri = self.resolved_storage_uri
        if uri.startswith("file://"):
            return Path(uri[len("file://"):]).resolve()
        return None if "://" in uri else Path(uri).resolve()

    @property
    def resolved_database_url(self) -> str:
        if self.database_url:
            return self.database_url
        path = private_dir(self.data_dir) / "raylane.db"
        # Created before SQLite opens it: SQLite gives a new file the umask's mode
        # (0644: job env values and token hashes readable by any local user), and
        # its -wal and -shm files copy the database file's mode.
        os.close(os.open(path, os.O_RDWR | os.O_CREAT, 0o600))
        os.chmod(path, 0o600)
        return f"sqlite:///{path.resolve()}"


def private_dir(path: Path) -> Path:
    """``path`` created if missing and made 0700: it holds the database, the admin token
    and the local cluster's files, for the server's user alone."""
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(path, 0o700)  # mkdir's mode applies only to a new directory, and passes through the umask
    return path


@lru_cache
def get_settings() -> Settings:
    return Settings()
