"""The ``raylane`` command. Server-side commands import the server lazily, so the
client install (no Ray, no FastAPI) still runs every client command."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer

app = typer.Typer(name="raylane", help="Raylane: a job orchestrator in front of Ray.", no_args_is_help=True,
                  add_completion=False)


@app.command()
def serve(
    host: Optional[str] = typer.Option(None, help="Bind address (RAYLANE_HOST)."),
    port: Optional[int] = typer.Option(None, help="Port (RAYLANE_PORT)."),
    local_cluster: bool = typer.Option(False, "--local-cluster", help="Start the local multi-node Ray cluster first when no RAYLANE_RAY_ADDRESS is set."),
) -> None:
    """Run the control plane: the REST API, the dispatcher and the reconciler."""
    from api.server import serve as _serve
    from orchestrator.settings import Settings

    overrides = {k: v for k, v in (("host", host), ("port", port)) if v is not None}
    settings = Settings(**overrides)
    _serve(settings, local_cluster=local_cluster)


db_app = typer.Typer(help="Database migrations.")
app.add_typer(db_app, name="db")


@db_app.command("upgrade")
def db_upgrade(revision: str = "head") -> None:
    """Apply migrations up to REVISION (default head)."""
    from orchestrator.settings import Settings
    from orchestrator.store import migrate

    migrate.upgrade(Settings().resolved_database_url, revision)
    typer.echo(f"database at {revision}")


def main() -> None:
    try:
        app()
    except KeyboardInterrupt:
        sys.exit(130)


if __name__ == "__main__":
    main()
