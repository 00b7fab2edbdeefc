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
    from raylane.orchestrator.settings import Settings
    from raylane.orchestrator.store import migrate

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
    from raylane.orchestrator.tooling import deploy_render
    from raylane.orchestrator.domain.profile import Profile
    from raylane.orchestrator.settings import Settings

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


# Client commands -------------------------------------------------------------------
#
# Every command below talks to the API through ``raylane.client.sdk`` only (no Ray, no
# SQLAlchemy, no FastAPI), except ``cluster up|down|status``, which drives the
# local Ray cluster and imports it lazily. Exit codes (docs/cli.md):

import functools  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from datetime import datetime, timedelta, timezone  # noqa: E402
from enum import Enum  # noqa: E402
from typing import List  # noqa: E402

from raylane.orchestrator.domain.specs import JobKind  # noqa: E402  (pure pydantic, as the client install has)
from raylane.orchestrator.domain.states import JobStatus  # noqa: E402

EXIT_OK = 0  # done; with --wait: the job SUCCEEDED
EXIT_FAILED = 1  # the job FAILED or was CANCELLED, or the server refused (not found, conflict, ...)
EXIT_USAGE = 2  # bad options or arguments, unreadable file, spec refused by validation
EXIT_TIMEOUT = 3  # --wait --timeout ran out; the job keeps running
EXIT_UNREACHABLE = 4  # the server could not be reached (after the SDK's retries)
EXIT_INTERRUPTED = 130  # Ctrl-C; a job being waited on keeps running


class Output(str, Enum):
    text = "text"
    json = "json"


_OUTPUT = typer.Option(Output.text, "--output", "-o", case_sensitive=False, help="text (tables) or json.")


@dataclass
class _Conn:
    url: Optional[str] = None
    token: Optional[str] = None


_conn = _Conn()


@app.callback()
def _global_options(
    url: Optional[str] = typer.Option(None, "--url", envvar="RAYLANE_URL", show_envvar=True,
                                      help="Raylane API URL (default http://127.0.0.1:8000)."),
    token: Optional[str] = typer.Option(None, "--token", envvar="RAYLANE_TOKEN", show_envvar=True,
                                        help="API token, sent as 'Authorization: Bearer <token>'."),
) -> None:
    _conn.url, _conn.token = url, token


def _client():
    from raylane.client.sdk import Client

    return Client(_conn.url, token=_conn.token)


def _console(stderr: bool = False):
    from rich.console import Console

    # Width from COLUMNS or the terminal; highlighting off so ids and numbers stay
    # plain. Messages on stderr are not wrapped, so they stay whole for grep.
    return Console(stderr=stderr, highlight=False, soft_wrap=stderr)


def _fail(message: str, code: int) -> "typer.Exit":
    from rich.markup import escape

    _console(stderr=True).print(f"[bold red]Error:[/] {escape(message)}")
    return typer.Exit(code)


def _client_command(fn):
    """Turn the SDK's typed errors into a message and an exit code, never a traceback."""

    @functools.wraps(fn)
    def run(*args, **kwargs):
        from raylane.client.sdk import ConnectionFailed, RaylaneError, ValidationFailed, WaitTimeout

        try:
            return fn(*args, **kwargs)
        except ConnectionFailed as e:
            raise _fail(str(e), EXIT_UNREACHABLE) from None
        except WaitTimeout as e:
            raise _fail(str(e), EXIT_TIMEOUT) from None
        except ValidationFailed as e:
            from rich.markup import escape

            err = _console(stderr=True)
            if e.status_code is None or not e.errors:
                err.print(f"[bold red]Error:[/] {escape(str(e))}")
            else:
                err.print("[bold red]Error:[/] the server refused the request:")
                for where, msg in e.fields.items():
                    err.print(f"  [bold]{escape(where)}[/]: {escape(msg)}")
            raise typer.Exit(EXIT_USAGE) from None
        except RaylaneError as e:
            raise _fail(str(e), EXIT_FAILED) from None
        except (FileNotFoundError, IsADirectoryError, PermissionError) as e:
            raise _fail(f"{e.strerror}: {e.filename}", EXIT_USAGE) from None

    return run


def _print_json(value) -> None:
    from pydantic import BaseModel

    def plain(v):
        if isinstance(v, BaseModel):
            return v.model_dump(mode="json")
        if isinstance(v, list):
            return [plain(x) for x in v]
        return v

    sys.stdout.write(json.dumps(plain(value), indent=2) + "\n")


_STATUS_STYLE = {"PENDING": "yellow", "DISPATCHING": "cyan", "RUNNING": "bold cyan", "RETRYING": "magenta",
                 "CANCELLING": "magenta", "SUCCEEDED": "bold green", "FAILED": "bold red", "CANCELLED": "bold yellow"}


def _styled(status, width: int = 0) -> str:
    s = getattr(status, "value", status)
    return f"[{_STATUS_STYLE.get(s, 'white')}]{s:<{width}}[/]"


def _ago(at: Optional[datetime]) -> str:
    if at is None:
        return "-"
    secs = max(0, int((datetime.now(timezone.utc) - at).total_seconds()))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if secs >= size:
            return f"{secs // size}{unit} ago"
    return f"{secs}s ago"


def _duration(secs: float) -> str:
    secs = int(secs)
    if secs >= 3600:
        return f"{secs // 3600}h{secs % 3600 // 60:02d}m"
    if secs >= 60:
        return f"{secs // 60}m{secs % 60:02d}s"
    return f"{secs}s"


def _res(d: dict) -> str:
    return ", ".join(f"{k} {v:g}" if isinstance(v, (int, float)) else f"{k} {v}" for k, v in sorted(d.items())) or "-"


def _exit_for(job) -> int:
    return EXIT_OK if job.status.value == "SUCCEEDED" else EXIT_FAILED


def _final_line(job) -> str:
    from rich.markup import escape

    took = ""
    if job.finished_at is not None:
        took = f" after {_duration((job.finished_at - (job.started_at or job.created_at)).total_seconds())}"
    why = ""
    if job.status.value != "SUCCEEDED":
        parts = [job.failure_cause.value] if job.failure_cause and job.failure_cause.value != job.status.value else []
        parts += [job.status_reason] if job.status_reason else []
        why = f" ({escape(': '.join(parts))})" if parts else ""
    return f"Job {job.id} {_styled(job.status)}{took}{why}"


def _interrupted(job_id: str, status: str) -> "typer.Exit":
    _console(stderr=True).print(
        f"\n[yellow]Stopped waiting.[/] Job {job_id} was not cancelled and goes on without you (now {status}); "
        f"see it with `raylane status {job_id}`, stop it with `raylane cancel {job_id}`.")
    return typer.Exit(EXIT_INTERRUPTED)


class _Elapsed:
    """The spinner's text: the current status and the time since waiting began."""

    def __init__(self, job_id: str, status: str):
        self.job_id, self.status, self.start = job_id, status, time.monotonic()

    def __rich__(self) -> str:
        return f"job {self.job_id} {_styled(self.status)} ({_duration(time.monotonic() - self.start)})"


def _wait_with_progress(client, job_id: str, timeout: Optional[float]):
    """Wait for the job, printing each status change (and a spinner on a terminal)."""
    from rich.markup import escape

    err = _console(stderr=True)
    spinner = _Elapsed(job_id, "PENDING")

    def on_event(e) -> None:
        spinner.status = e.to_status.value
        said = e.attempt is None or f"attempt {e.attempt}" in (e.reason or "")
        attempt = "" if said else f" [dim](attempt {e.attempt})[/]"
        err.print(f"{e.at.astimezone():%H:%M:%S}  {_styled(e.to_status, 11)}  {escape(e.reason or '')}{attempt}")

    try:
        with err.status(spinner):
            return client.wait(job_id, timeout=timeout, on_event=on_event)
    except KeyboardInterrupt:
        raise _interrupted(job_id, spinner.status) from None


# With --follow, once the job has ended the server sends the log's last part and
# closes the stream; this long is allowed for that before giving up on the tail.
LOG_TAIL_WAIT_S = 10.0


def _stream_logs(job_id: str, problems: list) -> None:
    """Copy the job's followed log to stdout (runs in a thread beside the waiting)."""
    from raylane.client.sdk import Client, RaylaneError

    try:
        with Client(_conn.url, token=_conn.token) as c:
            for chunk in c.logs(job_id, follow=True):
                sys.stdout.write(chunk)
                sys.stdout.flush()
    except RaylaneError as e:
        problems.append(e)


@app.command()
@_client_command
def submit(
    file: Path = typer.Argument(..., exists=True, dir_okay=False, readable=True, help="Job spec file (YAML or JSON)."),
    wait: bool = typer.Option(False, "--wait", "-w", help="Wait for the job to end, showing each status change; "
                              "the exit code says how it ended."),
    follow: bool = typer.Option(False, "--follow", "-f", help="Also stream the job's log to stdout (implies --wait)."),
    idempotency_key: Optional[str] = typer.Option(
        None, "--idempotency-key", help="Submitting again with the same key returns the same job (default: a new "
        "key per run; the retries inside one run are always safe)."),
    timeout: Optional[float] = typer.Option(None, "--timeout", min=0, help="With --wait/--follow: give up after "
                                            "this many seconds (exit 3); the job keeps running."),
    output: Output = _OUTPUT,
) -> None:
    """Submit the job in FILE; with --wait or --follow, stay until it ends."""
    from rich.markup import escape

    with _client() as c:
        job = c.submit(file, idempotency_key=idempotency_key)
        if output is Output.json and not (wait or follow):
            _print_json(job)
            return
        if output is Output.text:
            where = f" on {job.placement.node_group} ({job.placement.market})" if job.placement else ""
            # Progress goes to stderr when stdout carries the log.
            _console(stderr=follow).print(
                f"Submitted job [bold]{job.id}[/] ({escape(job.name)}, {job.kind.value}){where}: "
                f"{_styled(job.status)}, {escape(job.status_reason or '')}", soft_wrap=True)
        if not (wait or follow):
            return
        streamer, problems = None, []
        if follow:
            streamer = threading.Thread(target=_stream_logs, args=(job.id, problems), daemon=True)
            streamer.start()
        done = _wait_with_progress(c, job.id, timeout)
        if streamer is not None:
            streamer.join(LOG_TAIL_WAIT_S)
            for e in problems:
                _console(stderr=True).print(f"[yellow]Log stream:[/] {escape(str(e))}")
        if output is Output.json:
            _print_json(done)
        else:
            _console(stderr=True).print(_final_line(done))
        raise typer.Exit(_exit_for(done))


@app.command("wait")
@_client_command
def wait_cmd(
    job_id: str = typer.Argument(..., help="Job id."),
    timeout: Optional[float] = typer.Option(None, "--timeout", min=0, help="Give up after this many seconds (exit 3)."),
    output: Output = _OUTPUT,
) -> None:
    """Wait for a job to end, showing each status change; exit 0 if it SUCCEEDED, 1 if not."""
    with _client() as c:
        done = _wait_with_progress(c, job_id, timeout)
    if output is Output.json:
        _print_json(done)
    else:
        _console(stderr=True).print(_final_line(done))
    raise typer.Exit(_exit_for(done))


def _when_option(value: Optional[str], name: str) -> Optional[datetime]:
    """ISO 8601 (a time without zone is local time) or a span back from now: 30m, 2h, 7d."""
    if value is None:
        return None
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
    v = value.strip()
    if len(v) > 1 and v[-1] in units and v[:-1].replace(".", "", 1).isdigit():
        return datetime.now(timezone.utc) - timedelta(seconds=float(v[:-1]) * units[v[-1]])
    try:
        at = datetime.fromisoformat(v.replace("Z", "+00:00"))
    except ValueError:
        raise typer.BadParameter(f"{value!r}: use ISO 8601 (2026-01-31T12:00) or a span like 30m, 2h, 7d",
                                 param_hint=name) from None
    return at if at.tzinfo else at.astimezone()


@app.command()
@_client_command
def ls(
    status: Optional[List[JobStatus]] = typer.Option(None, "--status", "-s", case_sensitive=False,
                                                     help="Only these statuses (repeat for several)."),
    kind: Optional[List[JobKind]] = typer.Option(None, "--kind", "-k", case_sensitive=False, help="Only these kinds."),
    node_group: Optional[str] = typer.Option(None, "--node-group", "-g", help="Only jobs routed to this group."),
    label: Optional[List[str]] = typer.Option(None, "--label", "-l", help="key=value; repeat to require several."),
    name_prefix: Optional[str] = typer.Option(None, "--name", "--name-prefix", help="Names starting with this."),
    created_after: Optional[str] = typer.Option(None, "--created-after", "--since",
                                                help="ISO time or span back from now (2h, 7d)."),
    created_before: Optional[str] = typer.Option(None, "--created-before", "--until",
                                                 help="ISO time or span back from now."),
    project: Optional[str] = typer.Option(None, "--project", help="Only this project."),
    limit: int = typer.Option(50, "--limit", "-n", min=1, max=10_000, help="Show at most this many (newest first)."),
    output: Output = _OUTPUT,
) -> None:
    """List jobs, newest first."""
    from rich.markup import escape
    from rich.table import Table

    labels = {}
    for item in label or []:
        k, sep, v = item.partition("=")
        if not sep or not k:
            raise typer.BadParameter(f"{item!r} is not key=value", param_hint="--label")
        labels[k] = v
    after, before = _when_option(created_after, "--created-after"), _when_option(created_before, "--created-before")
    with _client() as c:
        jobs = list(c.iter_jobs(status=status, kind=kind, node_group=node_group, labels=labels,
                                name_prefix=name_prefix, created_after=after, created_before=before, project=project,
                                page_size=min(limit + 1, 500), max_items=limit + 1))
    more, jobs = len(jobs) > limit, jobs[:limit]
    if output is Output.json:
        _print_json(jobs)
        return
    out = _console()
    if not jobs:
        out.print("No jobs match.")
        return
    t = Table(box=None, pad_edge=False, header_style="bold")
    t.add_column("ID", no_wrap=True)
    t.add_column("NAME", overflow="fold")
    t.add_column("KIND", no_wrap=True)
    t.add_column("STATUS", no_wrap=True)
    t.add_column("GROUP", no_wrap=True)
    t.add_column("CREATED", no_wrap=True)
    t.add_column("REASON", overflow="ellipsis", no_wrap=True, max_width=40)
    for j in jobs:
        t.add_row(j.id, escape(j.name), j.kind.value, _styled(j.status), j.placement.node_group if j.placement else "-",
                  _ago(j.created_at), escape(j.status_reason or ""))
    out.print(t)
    if more:
        out.print(f"[dim]Showing the newest {limit}; --limit shows more.[/]")


@app.command()
@_client_command
def status(job_id: str = typer.Argument(..., help="Job id."), output: Output = _OUTPUT) -> None:
    """Show one job: status and why, placement and why, attempts, result."""
    from rich.markup import escape
    from rich.table import Table

    with _client() as c:
        job = c.get_job(job_id)
    if output is Output.json:
        _print_json(job)
        return
    t = Table.grid(padding=(0, 2))
    t.add_column(style="bold", no_wrap=True)
    t.add_column(overflow="fold")
    t.add_row("Job", f"{job.id}  {escape(job.name)}")
    t.add_row("Kind", job.kind.value)
    t.add_row("Status", f"{_styled(job.status)}  {escape(job.status_reason or '')}")
    if job.failure_cause:
        t.add_row("Cause", job.failure_cause.value)
    t.add_row("Project", f"{job.project}   priority {job.priority}")
    t.add_row("Attempts", f"{job.attempts} of {job.max_attempts}" + (f", {job.preemptions} preempted"
                                                                      if job.preemptions else ""))
    t.add_row("Created", f"{job.created_at.astimezone():%Y-%m-%d %H:%M:%S} ({_ago(job.created_at)})")
    if job.started_at:
        t.add_row("Started", f"{job.started_at.astimezone():%Y-%m-%d %H:%M:%S}")
    if job.finished_at:
        t.add_row("Finished", f"{job.finished_at.astimezone():%Y-%m-%d %H:%M:%S}")
    if job.labels:
        t.add_row("Labels", escape(", ".join(f"{k}={v}" for k, v in job.labels.items())))
    p = job.placement
    if p:
        t.add_row("Node group", f"{p.node_group} ({p.market}), {p.strategy}, {p.num_workers} x {_res(p.worker_resources)}")
        for r in p.reasons:
            t.add_row("", f"[dim]- {escape(r)}[/]")
    if job.dashboard_url:
        t.add_row("Ray", job.dashboard_url)
    if job.result is not None:
        text = json.dumps(job.result, default=str)
        t.add_row("Result", escape(text if len(text) <= 400 else text[:400] + "..."))
    _console().print(t)


@app.command()
@_client_command
def logs(
    job_id: str = typer.Argument(..., help="Job id."),
    follow: bool = typer.Option(False, "--follow", "-f", help="Keep streaming until the job ends."),
    attempt: Optional[int] = typer.Option(None, "--attempt", min=1, help="Attempt number (default: the latest)."),
) -> None:
    """Print the job's driver log (Ray's), of its latest or a given attempt."""
    with _client() as c:
        if not follow:
            sys.stdout.write(c.logs(job_id, attempt=attempt))
            return
        try:
            for chunk in c.logs(job_id, attempt=attempt, follow=True):
                sys.stdout.write(chunk)
                sys.stdout.flush()
        except KeyboardInterrupt:
            raise typer.Exit(EXIT_INTERRUPTED) from None


@app.command()
@_client_command
def cancel(job_id: str = typer.Argument(..., help="Job id."), output: Output = _OUTPUT) -> None:
    """Cancel a job (a no-op if it is already cancelled)."""
    with _client() as c:
        r = c.cancel(job_id)
    if output is Output.json:
        _print_json(r)
        return
    _console().print(f"Job {r.job.id}: {r.message}; now {_styled(r.job.status)}", soft_wrap=True)


@app.command()
@_client_command
def events(job_id: str = typer.Argument(..., help="Job id."), output: Output = _OUTPUT) -> None:
    """Show the job's status changes, oldest first."""
    from rich.markup import escape
    from rich.table import Table

    with _client() as c:
        evs = c.events(job_id)
    if output is Output.json:
        _print_json(evs)
        return
    t = Table(box=None, pad_edge=False, header_style="bold")
    for col in ("TIME", "FROM", "TO", "REASON", "BY", "ATTEMPT"):
        t.add_column(col, no_wrap=col != "REASON", overflow="fold")
    for e in evs:
        t.add_row(f"{e.at.astimezone():%Y-%m-%d %H:%M:%S}", e.from_status.value if e.from_status else "-",
                  _styled(e.to_status), escape(e.reason or ""), escape(e.actor), str(e.attempt or "-"))
    _console().print(t)


@app.command()
@_client_command
def trials(
    job_id: str = typer.Argument(..., help="Id of a sweep job."),
    sort_by: Optional[str] = typer.Option(None, "--sort-by", help="Metric to order by (default: the sweep's)."),
    mode: Optional[str] = typer.Option(None, "--mode", help="min or max for --sort-by (default: the sweep's)."),
    output: Output = _OUTPUT,
) -> None:
    """Show a sweep's trials, best first by the sweep's metric."""
    from rich.markup import escape
    from rich.table import Table

    if mode not in (None, "min", "max"):
        raise typer.BadParameter("min or max", param_hint="--mode")
    with _client() as c:
        job = c.get_job(job_id)
        if job.spec.sweep is None:
            raise _fail(f"job {job_id} is a {job.kind.value} job, not a sweep; it has no trials", EXIT_FAILED)
        ts = c.trials(job_id, sort_by=sort_by, mode=mode)  # the server orders them, best first
    if output is Output.json:
        _print_json(ts)
        return
    out = _console()
    if not ts:
        out.print(f"No trials yet (job {job_id} is {_styled(job.status)}; a sweep reports its trials when it ends).",
                  soft_wrap=True)
        return
    metric = sort_by or job.spec.sweep.metric
    params = sorted({k for tr in ts for k in tr.config})
    out.print(f"{len(ts)} trials of {job_id}, best first by {metric} ({mode or job.spec.sweep.mode})", soft_wrap=True)
    t = Table(box=None, pad_edge=False, header_style="bold")
    t.add_column("#", justify="right")
    t.add_column(metric.upper(), justify="right")
    for p in params:
        t.add_column(p.upper(), justify="right", overflow="fold")
    t.add_column("STATUS")
    t.add_column("GROUP")
    t.add_column("ERROR", overflow="ellipsis", max_width=30)

    def cell(v) -> str:
        return escape(f"{v:.4g}" if isinstance(v, float) else str(v))

    for i, tr in enumerate(ts, 1):
        v = tr.metrics.get(metric)
        t.add_row(str(i), f"{v:.6g}" if isinstance(v, (int, float)) else "-",
                  *[cell(tr.config.get(p, "-")) for p in params], tr.status, tr.node_group or "-",
                  escape(tr.error or ""))
    out.print(t)


@app.command()
@_client_command
def plan(
    file: Path = typer.Argument(..., exists=True, dir_okay=False, readable=True, help="Job spec file (YAML or JSON)."),
    output: Output = _OUTPUT,
) -> None:
    """Show where the router would place the job in FILE, and why, without submitting it."""
    from rich.markup import escape
    from rich.table import Table

    with _client() as c:
        p = c.plan(file)
    if output is Output.json:
        _print_json(p)
        return
    t = Table.grid(padding=(0, 2))
    t.add_column(style="bold", no_wrap=True)
    t.add_column(overflow="fold")
    t.add_row("Node group", f"[bold]{p.node_group}[/] ({p.market})")
    t.add_row("Strategy", f"{p.strategy}" + (", co-located" if p.colocate else ""))
    t.add_row("Workers", f"{p.num_workers} x {_res(p.worker_resources)}")
    t.add_row("Total", _res(p.total))
    t.add_row("Driver", _res(p.driver_resources))
    if p.fallback_node_groups:
        t.add_row("Fallback", ", ".join(p.fallback_node_groups))
    t.add_row("Selector", escape(", ".join(f"{k}={v}" for k, v in p.label_selector.items()) or "-"))
    out = _console()
    out.print(t)
    out.print("[bold]Why:[/]")
    for r in p.reasons:
        out.print(f"  - {escape(r)}")


@app.command()
@_client_command
def nodes(output: Output = _OUTPUT) -> None:
    """Show the node groups with their capacity and what Raylane's jobs use of it."""
    from rich.table import Table

    with _client() as c:
        groups = c.node_groups()
    if output is Output.json:
        _print_json(groups)
        return

    def used(g, res: str) -> str:
        cap = g.capacity.get(res, 0.0)
        if not cap and not g.used_by_raylane.get(res):
            return "-"
        return f"{g.used_by_raylane.get(res, 0.0):g}/{cap:g}"

    t = Table(box=None, pad_edge=False, header_style="bold")
    for col in ("GROUP", "MARKET", "ACCELERATOR", "NODES", "CPU USED", "GPU USED", "JOBS", "$/H"):
        t.add_column(col, no_wrap=True, justify="right" if col in ("CPU USED", "GPU USED", "JOBS", "$/H") else "left")
    for g in groups:
        acc = f"{g.accelerator.get('count')} x {g.accelerator.get('type')}" if g.accelerator else "-"
        t.add_row(g.name + (" (head)" if g.role == "head" else ""), g.market, acc,
                  f"{g.alive_nodes} up ({g.min_nodes}-{g.max_nodes})" + (f", {g.draining_nodes} draining"
                                                                       if g.draining_nodes else ""),
                  used(g, "CPU"), used(g, "GPU"), f"{g.active_jobs} run, {g.queued_jobs} queued",
                  f"{g.price_per_hour:.2f}")
    _console().print(t)


@app.command()
@_client_command
def report(
    since: str = typer.Option("7d", "--since", help="Window start: a span back from now (24h, 7d, 30d) or ISO 8601."),
    until: Optional[str] = typer.Option(None, "--until", help="Window end (default now): a span back or ISO 8601."),
    project: Optional[str] = typer.Option(None, "--project", "-p", help="Admins: one project (default all)."),
    output: Output = _OUTPUT,
) -> None:
    """Own or rent: GPU utilisation against the break-even, costs, and jobs that could have run cheaper."""
    from rich.markup import escape
    from rich.table import Table

    from raylane.client.sdk import _Call

    params = [("start", _when_option(since, "--since").isoformat())]
    if until:
        params.append(("end", _when_option(until, "--until").isoformat()))
    if project:
        params.append(("project", project))
    with _client() as c:
        rep = c._call(_Call("GET", "/v1/report", parse=lambda r: r.json(), params=params))
    if output is Output.json:
        _print_json(rep)
        return
    out = _console()
    tot = rep["total"]
    out.print(f"[bold]Window[/] {rep['window']['start'][:16]} .. {rep['window']['end'][:16]} UTC"
              + (f"  project {escape(rep['project'])}" if rep.get("project") else ""))
    out.print(f"[bold]Cost[/] ${tot['cost']:.2f}   on demand ${tot['on_demand_cost']:.2f}   "
              f"spot savings ${tot['spot_savings']:.2f}   {tot['attempts']} attempts of {tot['jobs']} jobs")
    t = Table(box=None, pad_edge=False, header_style="bold", title="GPU groups: own or rent?", title_justify="left")
    for col in ("GROUP", "FLEET", "GPU-H USED", "UTILISATION", "BREAK-EVEN", "VERDICT", "COST"):
        t.add_column(col, no_wrap=True, justify="right" if col in ("GPU-H USED", "UTILISATION", "BREAK-EVEN", "COST") else "left")
    for g in rep["gpu_groups"]:
        acc = g["accelerator"]
        verdict = "[bold green]own[/]" if g["verdict"] == "own" else "[bold yellow]rent[/]"
        t.add_row(g["node_group"], f"{g['nodes']} x {acc['count']} {acc['type']} ({g['basis']})",
                  f"{g['gpu_hours_used']:.1f}/{g['gpu_hours_available']:.0f}", f"{g['utilisation']:.1%}",
                  f"{g['break_even']:.0%}", verdict, f"${g['cost']:.2f}")
    out.print(t if rep["gpu_groups"] else "No GPU group in the profile.")
    for g in rep["gpu_groups"]:
        out.print(f"  - {escape(g['advice'])}")
    cheaper = rep["cheaper_placements"]
    if not cheaper:
        out.print("No job's placement looks like it could have been cheaper.")
        return
    t = Table(box=None, pad_edge=False, header_style="bold", title="Placements that could have been cheaper",
              title_justify="left")
    for col in ("JOB", "NAME", "RAN ON", "COST", "CHEAPER ON", "SAVING", "WHY"):
        t.add_column(col, no_wrap=col != "WHY", overflow="fold", justify="right" if col in ("COST", "SAVING") else "left")
    for x in cheaper:
        t.add_row(f"{x['job_id']}#{x['attempt']}", escape(x["name"]), f"{x['node_group']} ({x['market']})",
                  f"${x['cost']:.2f}", x["cheaper_node_group"], f"${x['saving']:.2f}", escape(x["reason"]))
    out.print(t)


cluster_app = typer.Typer(help="The local multi-node Ray cluster of the profile (RAYLANE_PROFILE): simulated GPU, "
                               "spot and on-demand node groups on this machine. Needs the server install.",
                          no_args_is_help=True)
app.add_typer(cluster_app, name="cluster")


def _local_cluster():
    # Imported here: the bare client install has no Ray and no pydantic-settings.
    try:
        from raylane.orchestrator.tooling.localcluster import LocalCluster
        from raylane.orchestrator.domain.profile import Profile
        from raylane.orchestrator.settings import Settings
    except ImportError as e:
        raise _fail(f"`raylane cluster` needs the server install (pip install 'raylane[server]'); "
                    f"missing {e.name}", EXIT_USAGE) from None
    settings = Settings()
    if not Path(sys.executable).with_name("ray").exists():
        raise _fail(f"no `ray` next to {sys.executable}; install 'raylane[server]'", EXIT_USAGE)
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

    out = _console()
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
def cluster_up(output: Output = _OUTPUT) -> None:
    """Start the local cluster (one node after another); a no-op if it is up."""
    cluster = _local_cluster()
    if not cluster.is_up():
        groups = ", ".join(f"{g.name} x{g.local_nodes}" for g in cluster.profile.workers)
        _console(stderr=True).print(f"Starting the local Ray cluster (profile {cluster.profile.name}: head, {groups})...")
        try:
            cluster.up()
        except (RuntimeError, TimeoutError) as e:
            raise _fail(str(e), EXIT_FAILED) from None
    view = _cluster_view(cluster)
    if output is Output.json:
        _print_json(view)
        return
    _print_cluster(view)
    _console().print("Run the API on it with `raylane serve --local-cluster` (it attaches to this cluster).")


@cluster_app.command("down")
def cluster_down() -> None:
    """Stop every node of the local cluster."""
    cluster = _local_cluster()
    if cluster.state is None:
        _console().print("No local cluster is running.")
        return
    cluster.down()
    _console().print("Local Ray cluster stopped.")


@cluster_app.command("status")
def cluster_status(output: Output = _OUTPUT) -> None:
    """Show the local cluster's nodes; exit 1 when it is not running."""
    cluster = _local_cluster()
    view = _cluster_view(cluster)
    if output is Output.json:
        _print_json(view)
    else:
        _print_cluster(view)
    if not view["up"]:
        raise typer.Exit(EXIT_FAILED)


def _running_cluster():
    cluster = _local_cluster()
    if not cluster.is_up():
        raise _fail("no local cluster is running (`raylane cluster up`)", EXIT_FAILED)
    return cluster


def _node_name(cluster, name: str) -> str:
    names = [n.name for n in cluster.state.nodes]
    if name not in names:
        raise _fail(f"no node {name!r} in the local cluster; its nodes: {', '.join(names)}", EXIT_USAGE)
    if name == f"{cluster.profile.head.name}-0":
        raise _fail("that is the head node: use `raylane cluster restart-head`", EXIT_USAGE)
    return name


@cluster_app.command("drain")
def cluster_drain(
    node: str = typer.Argument(..., help="Node name from `raylane cluster status`, e.g. spot-cpu-0."),
    deadline_s: int = typer.Option(120, "--deadline-s", min=1, help="Seconds until the node is gone."),
    message: str = typer.Option("spot termination notice", "--message", help="Ray's drain reason message."),
) -> None:
    """Send a node Ray's preemption notice (`ray drain-node`), as a spot-termination
    watcher would: Ray and Raylane stop placing work there and Raylane asks the
    jobs on it to checkpoint. The node leaves when idle (or `kill` it)."""
    cluster = _running_cluster()
    name = _node_name(cluster, node)
    try:
        cluster.drain_node(name, message=message, deadline_s=deadline_s)
    except RuntimeError as e:
        raise _fail(str(e), EXIT_FAILED) from None
    _console().print(f"Node {name} is draining (deadline {deadline_s}s).")


@cluster_app.command("kill")
def cluster_kill(node: str = typer.Argument(..., help="Node name from `raylane cluster status`.")) -> None:
    """SIGKILL one worker node's processes: a spot reclaim without notice."""
    cluster = _running_cluster()
    name = _node_name(cluster, node)
    cluster.kill_node(name)
    _console().print(f"Node {name} killed; `raylane cluster add {name.rsplit('-', 1)[0]}` replaces it.")


@cluster_app.command("add")
def cluster_add(group: str = typer.Argument(..., help="Node group of the profile, e.g. spot-cpu.")) -> None:
    """Start one more node of a group (e.g. to replace a killed spot node)."""
    cluster = _running_cluster()
    try:
        node = cluster.add_node(group)
    except ValueError as e:
        raise _fail(str(e), EXIT_USAGE) from None
    except (RuntimeError, TimeoutError) as e:
        raise _fail(str(e), EXIT_FAILED) from None
    _console().print(f"Node {node.name} is up.")


@cluster_app.command("restart-head")
def cluster_restart_head() -> None:
    """Kill the head and start it again on the same ports. Without GCS fault
    tolerance Ray forgets everything: the worker nodes are replaced and running
    attempts come back as LOST, retried by Raylane."""
    cluster = _running_cluster()
    try:
        cluster.restart_head()
    except (RuntimeError, TimeoutError) as e:
        raise _fail(str(e), EXIT_FAILED) from None
    _console().print("Head restarted.")


def main() -> None:
    try:
        app()
    except KeyboardInterrupt:
        sys.exit(130)


if __name__ == "__main__":
    main()
