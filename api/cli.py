"""The ``raylane-server`` command: the server's commands, apart from the user's.

``serve`` runs the control plane; ``db upgrade`` migrates its database;
``profile render`` writes or checks the node-group parts of the deploy files;
``cluster`` drives the local multi-node Ray cluster (dev tooling). The user's
commands (submit, ls, logs, ...) are ``raylane`` in ``raylane.client.cli``.

Needs the server install (``pip install 'raylane[server]'``). The console script
is installed with the client too, so the server's modules (FastAPI, SQLAlchemy,
Ray, the dev tooling) are imported inside each command, after ``main`` has said
clearly what is missing.
"""

from __future__ import annotations

import os
import sys
from enum import Enum
from pathlib import Path
from typing import Optional

import typer

from raylane.orchestrator.terminal import EXIT_FAILED, EXIT_USAGE, OUTPUT, Output, console, fail, print_json

app = typer.Typer(name="raylane-server", help="Raylane's control plane: serve, migrate, render deploy files, "
                  "run a local Ray cluster.", no_args_is_help=True, add_completion=False)

# The server extra's modules these commands import (pyproject.toml, [server]).
SERVER_MODULES = ("fastapi", "uvicorn", "sqlalchemy", "alembic", "pydantic_settings", "ray")


def missing_server_modules() -> list[str]:
    """The server extra's modules this Python cannot import (found, not imported)."""
    from importlib.util import find_spec

    return [m for m in SERVER_MODULES if find_spec(m) is None]


@app.command()
def serve(
    host: Optional[str] = typer.Option(None, help="Bind address (RAYLANE_HOST)."),
    port: Optional[int] = typer.Option(None, help="Port (RAYLANE_PORT)."),
    local_cluster: bool = typer.Option(False, "--local-cluster", help="Start the local multi-node Ray cluster first when no RAYLANE_RAY_ADDRESS is set."),
) -> None:
    """Run the control plane: the REST API, the dispatcher and the reconciler."""
    from raylane.api.server import serve as _serve
    from raylane.orchestrator.settings import Settings

    overrides = {k: v for k, v in (("host", host), ("port", port)) if v is not None}
    settings = Settings(**overrides)
    _serve(settings, local_cluster=local_cluster)


db_app = typer.Typer(help="Database migrations.")
app.add_typer(db_app, name="db")


@db_app.command("upgrade")
def db_upgrade(revision: str = "head") -> None:
    """Apply migrations up to REVISION (default head)."""
    from raylane.orchestrator.services.assembly import migrate_database
    from raylane.orchestrator.settings import Settings

    migrate_database(Settings(), revision)
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
    cluster: Optional[str] = typer.Option(None, "--cluster", help="A cluster of the fleet (--fleet, else "
                                          "RAYLANE_FLEET): render that cluster's node groups (docs/fleet.md)."),
    fleet: Optional[str] = typer.Option(None, "--fleet", help="Fleet file (or local-hybrid): without --cluster, "
                                        "render every cluster of it, one file each (--out)."),
    out: Optional[Path] = typer.Option(None, "--out", help="With --fleet and no --cluster: the directory to write "
                                       "<cluster>-<target>.yaml in (default: print them one after another).",
                                       metavar="DIR"),
) -> None:
    """Print the node-group parts of a deploy file from the cluster profile (or one
    cluster of a fleet, or every cluster of a fleet), or check a file for drift."""
    from raylane.orchestrator.tooling import deploy_render
    from raylane.orchestrator.domain.profile import Profile
    from raylane.orchestrator.settings import Settings

    if fleet is not None and cluster is None:
        if check is not None:
            raise fail("--check compares one file: give --cluster with --fleet", EXIT_USAGE)
        for name, prof, tier in _fleet_profiles(fleet):
            text = f"# Cluster {name} ({tier}) of fleet {fleet}.\n" + deploy_render.render(target.value, prof)
            if out is None:
                typer.echo(text, nl=False)
                continue
            out.mkdir(parents=True, exist_ok=True)
            (out / f"{name}-{target.value}.yaml").write_text(text)
            typer.echo(str(out / f"{name}-{target.value}.yaml"))
        return
    if cluster is not None:
        prof = _fleet_cluster_profile(fleet or Settings().fleet, cluster)
    else:
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


def _fleet_profiles(fleet: str):
    """(name, profile, tier) of every cluster of a fleet; a usage error naming what is wrong."""
    from raylane.orchestrator.domain.errors import Invalid
    from raylane.orchestrator.domain.fleet import Fleet

    try:
        f = Fleet.load(fleet)
    except Invalid as e:
        raise fail(f"{e.field}: {e.message}" if e.field else e.message, EXIT_USAGE) from None
    return [(m.name, m.profile, m.tier) for m in f.members]


def _fleet_cluster_profile(fleet: str | None, cluster: str):
    """The node groups of one cluster of a fleet, as a profile; a usage error naming what is wrong."""
    from raylane.orchestrator.domain.errors import Invalid
    from raylane.orchestrator.domain.fleet import Fleet

    if not fleet:
        raise fail("--cluster names a cluster of a fleet: give --fleet (or set RAYLANE_FLEET)", EXIT_USAGE)
    try:
        f = Fleet.load(fleet)
    except Invalid as e:
        raise fail(f"{e.field}: {e.message}" if e.field else e.message, EXIT_USAGE) from None
    member = f.cluster(cluster)
    if member is None:
        raise fail(f"--cluster: no cluster {cluster!r} in fleet {f.name}; its clusters: {', '.join(f.names)}",
                   EXIT_USAGE)
    return member.profile


cluster_app = typer.Typer(help="The local multi-node Ray cluster of the profile (RAYLANE_PROFILE): simulated GPU, "
                               "spot and on-demand node groups on this machine. Needs the server install.",
                          no_args_is_help=True)
app.add_typer(cluster_app, name="cluster")


FLEET_DIR = "fleet"  # under data_dir: a local fleet's clusters, one directory each


def _local_fleet(fleet: str | None = None, *, recorded_only: bool = False):
    """The local fleet recorded as up in data_dir (when ``fleet`` names none), else
    the one ``fleet`` (or RAYLANE_FLEET) names, else None (a single local cluster).
    ``recorded_only``: the fleet up here, or None."""
    from raylane.orchestrator.domain.errors import Invalid
    from raylane.orchestrator.domain.fleet import Fleet
    from raylane.orchestrator.settings import Settings
    from raylane.orchestrator.tooling.localfleet import LocalFleet

    settings = Settings()
    where = settings.data_dir / FLEET_DIR
    try:
        recorded = LocalFleet.recorded(where)
        if (fleet is None and recorded is not None) or recorded_only:
            return recorded
        name = fleet or settings.fleet
        if name is None:
            return None
        return LocalFleet(Fleet.load(name), where, source=str(Path(name).resolve()) if Path(name).exists() else name)
    except Invalid as e:
        raise fail(f"{e.field}: {e.message}" if e.field else e.message, EXIT_USAGE) from None


def _local_cluster(autoscale: bool = False, cluster: str | None = None):
    # Imported here, as in every command: `raylane-server --help` need not load Ray.
    from raylane.orchestrator.domain.profile import Profile
    from raylane.orchestrator.settings import Settings
    from raylane.orchestrator.tooling.autoscaling import AUTOSCALE_PROFILE, AUTOSCALING_CONFIG, AutoscalingCluster
    from raylane.orchestrator.tooling.localcluster import LocalCluster

    settings = Settings()
    if not Path(sys.executable).with_name("ray").exists():
        raise fail(f"no `ray` next to {sys.executable}; install 'raylane[server]'", EXIT_USAGE)
    fleet = _local_fleet(recorded_only=True) if not autoscale else None
    if fleet is not None:
        names = ", ".join(fleet.clusters)
        if cluster is None:
            raise fail(f"a fleet runs here: name one of its clusters with --cluster ({names})", EXIT_USAGE)
        if cluster not in fleet.clusters:
            raise fail(f"--cluster: no cluster {cluster!r} in fleet {fleet.fleet.name}; its clusters: {names}",
                       EXIT_USAGE)
        return fleet.clusters[cluster]
    if autoscale or (settings.data_dir / "cluster" / AUTOSCALING_CONFIG).exists():  # down/status of one
        # The server must read the same profile (RAYLANE_PROFILE): it is what admission counts.
        return AutoscalingCluster(Profile.load(settings.profile or AUTOSCALE_PROFILE), settings.data_dir / "cluster")
    return LocalCluster(Profile.load(settings.profile), settings.data_dir / "cluster")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _cluster_view(cluster) -> dict:
    st = cluster.state
    up = cluster.is_up()
    view = {"up": up, "profile": cluster.profile.name, "dir": str(cluster.dir),
            "dashboard_url": st.dashboard_url if st else None, "gcs_address": st.gcs_address if st else None,
            "token_path": st.token_path if st else None, "nodes": []}
    if not st:
        return view
    ray_nodes: list[dict] = []
    if up:
        try:
            ray_nodes = [n["raylet"] for n in cluster.nodes()]
        except Exception:  # the dashboard can lag behind a node: show what the processes say
            ray_nodes = []
    from raylane.orchestrator.domain.profile import NODE_GROUP_LABEL

    # Ray's node for each of our processes: by node id where it was recorded at
    # start-up, else the first alive node of the same group not matched yet.
    taken: set = set()
    for n in st.nodes:
        nid = n.ports.get("node_id") if isinstance(n.ports.get("node_id"), str) else None
        match = next((r for r in ray_nodes if r.get("nodeId") == nid), None) if nid else None
        if match is None:
            match = next((r for r in ray_nodes if r.get("nodeId") not in taken and r.get("state") == "ALIVE"
                          and (r.get("labels") or {}).get(NODE_GROUP_LABEL) == n.group), None)
        if match is not None:
            taken.add(match.get("nodeId"))
        view["nodes"].append({"name": n.name, "group": n.group, "pid": n.pid, "process_alive": _pid_alive(n.pid),
                              "node_id": match.get("nodeId") if match else nid,
                              "ray_state": match.get("state") if match else None, "log": n.log_path})
    return view


def _print_cluster(view: dict) -> None:
    from rich.table import Table

    out = console()
    if not view["up"]:
        out.print(f"No local cluster is running (profile {view['profile']}, state in {view['dir']}).")
        return
    out.print(f"Local Ray cluster [bold green]up[/] (profile {view['profile']})")
    out.print(f"  Dashboard: {view['dashboard_url']}   GCS: {view['gcs_address']}   token: {view['token_path']}")
    t = Table(box=None, pad_edge=False, header_style="bold")
    for col in ("NODE", "GROUP", "PID", "RAY STATE"):
        t.add_column(col, no_wrap=True)
    for n in view["nodes"]:
        state = n["ray_state"] or ("ALIVE?" if n["process_alive"] else "DEAD")
        t.add_row(n["name"], n["group"], str(n["pid"]), state)
    out.print(t)


@cluster_app.command("up")
def cluster_up(output: Output = OUTPUT,
               autoscale: bool = typer.Option(False, "--autoscale", help="Ray's autoscaler (v2, fake multi-node "
                                              "provider) starts and stops the worker nodes between each group's "
                                              "min_nodes and max_nodes; without RAYLANE_PROFILE, the "
                                              "local-autoscale profile (gpu and spot-cpu from zero). Serve with "
                                              "the same RAYLANE_PROFILE and RAYLANE_AUTOSCALE_AHEAD_JOBS > 0 (docs/deploy.md)."),
               fleet: Optional[str] = typer.Option(None, "--fleet", help="Start every cluster of a fleet file (or a "
                                                   "shipped fleet: local-hybrid) on this machine, each with its own "
                                                   "head, ports and token (docs/fleet.md). Default: RAYLANE_FLEET.")) -> None:
    """Start the local cluster (one node after another), or a local fleet; a no-op if it is up."""
    local_fleet = None if autoscale else _local_fleet(fleet)
    if local_fleet is not None:
        _fleet_up(local_fleet, output)
        return
    cluster = _local_cluster(autoscale)
    if not cluster.is_up():
        groups = ", ".join(f"{g.name} {g.min_nodes}..{g.max_nodes}" if autoscale else f"{g.name} x{g.local_nodes}"
                           for g in cluster.profile.workers)
        console(stderr=True).print(f"Starting the local Ray cluster (profile {cluster.profile.name}: head, {groups})...")
        try:
            cluster.up()
        except (RuntimeError, TimeoutError) as e:
            raise fail(str(e), EXIT_FAILED) from None
    view = _cluster_view(cluster)
    if output is Output.json:
        print_json(view)
        return
    _print_cluster(view)
    console().print("Run the API on it with `raylane-server serve --local-cluster` (it attaches to this cluster).")


def _fleet_view(local_fleet) -> dict:
    return {"fleet": local_fleet.fleet.name, "dir": str(local_fleet.dir),
            "reach_file": str(local_fleet.reach_file) if local_fleet.reach_file.exists() else None,
            "clusters": [{"name": name, "tier": local_fleet.fleet.cluster(name).tier, **_cluster_view(c)}
                         for name, c in local_fleet.clusters.items()]}


def _print_fleet(view: dict) -> None:
    for c in view["clusters"]:
        console().print(f"[bold]{c['name']}[/] ({c['tier']})")
        _print_cluster(c)
    if view["reach_file"]:
        console().print(f"Fleet file with each cluster's reach: {view['reach_file']} (RAYLANE_FLEET for a server)")


def _fleet_up(local_fleet, output: Output) -> None:
    if not local_fleet.is_up():
        names = ", ".join(f"{m.name} ({m.tier}, {m.spec.local})" for m in local_fleet.fleet.members)
        console(stderr=True).print(f"Starting the local fleet {local_fleet.fleet.name}: {names}...")
        try:
            local_fleet.up()
        except (RuntimeError, TimeoutError) as e:
            raise fail(str(e), EXIT_FAILED) from None
    view = _fleet_view(local_fleet)
    if output is Output.json:
        print_json(view)
        return
    _print_fleet(view)


@cluster_app.command("down")
def cluster_down() -> None:
    """Stop every node of the local cluster (or every cluster of the local fleet)."""
    local_fleet = _local_fleet(recorded_only=True)
    if local_fleet is not None:
        local_fleet.down()
        console().print(f"Local fleet {local_fleet.fleet.name} stopped.")
        return
    cluster = _local_cluster()
    if cluster.state is None:
        console().print("No local cluster is running.")
        return
    cluster.down()
    console().print("Local Ray cluster stopped.")


@cluster_app.command("status")
def cluster_status(output: Output = OUTPUT) -> None:
    """Show the local cluster's nodes (each cluster's, for a fleet); exit 1 when it is not running."""
    local_fleet = _local_fleet(recorded_only=True)
    if local_fleet is not None:
        view = _fleet_view(local_fleet)
        if output is Output.json:
            print_json(view)
        else:
            _print_fleet(view)
        if not all(c["up"] for c in view["clusters"]):
            raise typer.Exit(EXIT_FAILED)
        return
    cluster = _local_cluster()
    view = _cluster_view(cluster)
    if output is Output.json:
        print_json(view)
    else:
        _print_cluster(view)
    if not view["up"]:
        raise typer.Exit(EXIT_FAILED)


ClusterOpt = typer.Option(None, "--cluster", help="Which cluster of the local fleet (when a fleet runs here).")


def _running_cluster(name: str | None = None):
    cluster = _local_cluster(cluster=name)
    if not cluster.is_up():
        raise fail("no local cluster is running (`raylane-server cluster up`)", EXIT_FAILED)
    return cluster


def _node_name(cluster, name: str) -> str:
    names = [n.name for n in cluster.state.nodes]
    if name not in names:
        raise fail(f"no node {name!r} in the local cluster; its nodes: {', '.join(names)}", EXIT_USAGE)
    if name == f"{cluster.profile.head.name}-0":
        raise fail("that is the head node: use `raylane-server cluster restart-head`", EXIT_USAGE)
    return name


@cluster_app.command("drain")
def cluster_drain(
    node: str = typer.Argument(..., help="Node name from `raylane-server cluster status`, e.g. spot-cpu-0."),
    deadline_s: int = typer.Option(120, "--deadline-s", min=1, help="Seconds until the node is gone."),
    message: str = typer.Option("spot termination notice", "--message", help="Ray's drain reason message."),
    cluster_name: Optional[str] = ClusterOpt,
) -> None:
    """Send a node Ray's preemption notice (`ray drain-node`), as a spot-termination
    watcher would: Ray and Raylane stop placing work there and Raylane asks the
    jobs on it to checkpoint. The node leaves when idle (or `kill` it)."""
    cluster = _running_cluster(cluster_name)
    name = _node_name(cluster, node)
    try:
        cluster.drain_node(name, message=message, deadline_s=deadline_s)
    except RuntimeError as e:
        raise fail(str(e), EXIT_FAILED) from None
    console().print(f"Node {name} is draining (deadline {deadline_s}s).")


@cluster_app.command("kill")
def cluster_kill(node: str = typer.Argument(..., help="Node name from `raylane-server cluster status`."),
                 cluster_name: Optional[str] = ClusterOpt) -> None:
    """SIGKILL one worker node's processes: a spot reclaim without notice."""
    cluster = _running_cluster(cluster_name)
    name = _node_name(cluster, node)
    cluster.kill_node(name)
    console().print(f"Node {name} killed; `raylane-server cluster add {name.rsplit('-', 1)[0]}` replaces it.")


@cluster_app.command("add")
def cluster_add(group: str = typer.Argument(..., help="Node group of the profile, e.g. spot-cpu."),
                cluster_name: Optional[str] = ClusterOpt) -> None:
    """Start one more node of a group (e.g. to replace a killed spot node)."""
    cluster = _running_cluster(cluster_name)
    try:
        node = cluster.add_node(group)
    except ValueError as e:
        raise fail(str(e), EXIT_USAGE) from None
    except (RuntimeError, TimeoutError) as e:
        raise fail(str(e), EXIT_FAILED) from None
    console().print(f"Node {node.name} is up.")


@cluster_app.command("restart-head")
def cluster_restart_head(cluster_name: Optional[str] = ClusterOpt) -> None:
    """Kill the head and start it again on the same ports. Without GCS fault
    tolerance Ray forgets everything: the worker nodes are replaced and running
    attempts come back as LOST, retried by Raylane."""
    cluster = _running_cluster(cluster_name)
    try:
        cluster.restart_head()
    except (RuntimeError, TimeoutError) as e:
        raise fail(str(e), EXIT_FAILED) from None
    console().print("Head restarted.")


def main() -> None:
    missing = missing_server_modules()
    if missing:
        fail(f"raylane-server needs the server install (pip install 'raylane[server]'); missing {', '.join(missing)}",
             EXIT_USAGE)
        sys.exit(EXIT_USAGE)
    try:
        app(prog_name="raylane-server")  # also when run as `python -m raylane.api.cli`
    except KeyboardInterrupt:
        sys.exit(130)


if __name__ == "__main__":
    main()
