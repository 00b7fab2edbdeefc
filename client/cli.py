"""The ``raylane`` command. Server-side commands import the server lazily, so the
client install (no Ray, no FastAPI) still runs every client command."""

from __future__ import annotations

import sys
from enum import Enum
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


profile_app = typer.Typer(help="Cluster profiles: the node groups the deploy files carry.")
app.add_typer(profile_app, name="profile")


class DeployTarget(str, Enum):
    compose = "compose"
    kuberay = "kuberay"
    aws = "aws"


@profile_app.command("render")
def profile_render(
    target: DeployTarget = typer.Option(..., "--target", help="Which deploy file: compose, kuberay or aws."),
    check: Optional[Path] = typer.Option(None, "--check", help="Compare FILE (a KubeRay base directory too) with the profile instead of printing; exit 1 on drift.", metavar="FILE"),
    profile: Optional[Path] = typer.Option(None, "--profile", help="Cluster profile YAML (default: RAYLANE_PROFILE, else the shipped one)."),
) -> None:
    """Print the node-group parts of a deploy file from the cluster profile, or check a file for drift."""
    from orchestrator import deploy_render
    from orchestrator.profile import Profile
    from orchestrator.settings import Settings

    prof = Profile.load(profile or Settings().profile)
    if check is None:
        typer.echo(deploy_render.render(target.value, prof), nl=False)
        return
    drift = deploy_render.check(target.value, check, prof)
    for line in drift:
        typer.echo(f"{check}: {line}", err=True)
    if drift:
        raise typer.Exit(1)
    typer.echo(f"{check}: node groups match profile '{prof.name}'")


def main() -> None:
    try:
        app()
    except KeyboardInterrupt:
        sys.exit(130)


if __name__ == "__main__":
    main()
