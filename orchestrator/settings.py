"""Settings, all from ``RAYLANE_*`` environment variables (pydantic-settings).

docs/settings.md lists every one; tests/test_settings_doc.py keeps that table
in step with this class.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="RAYLANE_", extra="ignore")

    # Where state lives
    database_url: str | None = Field(
        None, description="SQLAlchemy URL. Unset: SQLite (WAL) at <data_dir>/raylane.db."
    )
    data_dir: Path = Field(Path(".raylane"), description="Local state: SQLite file, local cluster logs, job storage.")
    sqlite_synchronous: Literal["OFF", "NORMAL", "FULL"] = Field(
        "FULL", description="SQLite fsync level. FULL: a committed job survives power loss; NORMAL: survives a process crash."
    )
    auto_migrate: bool = Field(True, description="Run `alembic upgrade head` on start.")

    # HTTP
    host: str = Field("127.0.0.1", description="Address the API binds.")
    port: int = Field(8000, ge=0, le=65535, description="Port the API binds.")
    max_body_bytes: int = Field(8 * 1024 * 1024, ge=1024, description="Larger request bodies get 413.")
    max_batch_jobs: int = Field(1000, ge=1, le=100_000, description="Most specs in one POST /v1/jobs/batch.")
    public_url: str | None = Field(None, description="URL clients use to reach the API (for links).")
    log_level: str = Field("INFO", description="Python log level.")
    log_format: Literal["json", "text"] = Field(
        "json", description="`raylane serve` log lines: json (one object a line, with request, job and attempt ids) or text."
    )

    # Ray
    ray_address: str | None = Field(None, description="GCS address of an existing Ray cluster (host:port).")
    dashboard_url: str | None = Field(None, description="Ray dashboard / Jobs API URL of an existing cluster.")
    ray_auth_token: str | None = Field(None, description="Ray token-auth token; unset: read ~/.ray/auth_token when present.")
    profile: Path | None = Field(None, description="Cluster profile YAML. Unset: the shipped local profile.")

    # Loops
    dispatch_interval_s: float = Field(1.0, gt=0, description="Dispatcher's polling fallback when not woken.")
    reconcile_interval_s: float = Field(1.0, gt=0, description="How often Ray's view is folded into the DB.")
    lease_s: float = Field(30.0, gt=0, description="How long a claimed job is held by one control plane.")
    max_concurrent_drivers: int = Field(64, ge=1, description="Head-node guard: most Ray drivers at once.")
    starvation_skips: int = Field(20, ge=0, description="Times a big job may be passed over before it reserves capacity.")
    loops_enabled: bool = Field(True, description="Run the dispatcher and reconciler in this process.")

    # Accounting
    break_even_utilisation: float = Field(
        0.7, gt=0, le=1, description="GPU utilisation above which owning (reserving) nodes beats renting them on demand."
    )

    @property
    def resolved_database_url(self) -> str:
        if self.database_url:
            return self.database_url
        self.data_dir.mkdir(parents=True, exist_ok=True)
        return f"sqlite:///{(self.data_dir / 'raylane.db').resolve()}"


@lru_cache
def get_settings() -> Settings:
    return Settings()
