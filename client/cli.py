"""The ``raylane`` command: the user's commands (submit, run, resubmit, ls, status,
logs, wait, cancel, events, trials; plan, nodes and report are in
``raylane.client.clusterview``; arrays, schedules and costs in ``raylane.client.nouns``), each a call of ``raylane.client.sdk``.
Wherever a job id is taken, a unique start of one does (the server resolves it,
within what the token may see).

It imports the client's dependencies only (typer, rich, httpx, pydantic, pyyaml;
never Ray, SQLAlchemy or FastAPI). The server's commands are ``raylane-server``
(``raylane.api.cli``); ``raylane serve|db|cluster|profile`` hands its arguments
over to it in a new process, or says the server install is missing.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import List, Optional

import typer

from raylane.client import clusterview, nouns
from raylane.client.clikit import (
    ago as _ago, client as _client, client_command as _client_command, conn as _conn, duration as _duration,
    resources as _res, styled as _styled, when_option as _when_option,
)
from raylane.client.terminal import (  # noqa: F401  (EXIT_* are documented here, in docs/cli.md)
    EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK, EXIT_TIMEOUT, EXIT_UNREACHABLE, EXIT_USAGE, OUTPUT as _OUTPUT, Output,
    console as _console, fail as _fail, print_json as _print_json,
)
from raylane.orchestrator.domain.specs import JobKind  # pure pydantic, as the client install has
from raylane.orchestrator.domain.states import JobStatus

# add_completion: typer's --install-completion / --show-completion (bash, zsh, fish, PowerShell).
app = typer.Typer(name="raylane", help="Raylane: a job orchestrator in front of Ray.", no_args_is_help=True,
                  add_completion=True,
                  epilog="The server's commands (serve, db, cluster, profile) are `raylane-server`.")
PROG = "raylane"  # also under `python -m raylane.client.cli`: completion keys on this name


def _show_version(value: bool) -> None:
    if value:
        from raylane import __version__

        typer.echo(f"raylane {__version__}")
        raise typer.Exit(EXIT_OK)


@app.callback()
def _global_options(
    url: Optional[str] = typer.Option(None, "--url", envvar="RAYLANE_URL", show_envvar=True,
                                      help="Raylane API URL (default http://127.0.0.1:8000)."),
    token: Optional[str] = typer.Option(None, "--token", envvar="RAYLANE_TOKEN", show_envvar=True,
                                        help="API token, sent as 'Authorization: Bearer <token>'."),
    version: bool = typer.Option(False, "--version", is_eager=True, callback=_show_version,
                                 help="Print the client's version and exit."),
) -> None:
    _conn.url, _conn.token = url, token


def _full_id(c, job_id: str) -> str:
    """The whole id for a unique start of one (``raylane ls`` ids are long to type)."""
    if nouns.is_array_id(job_id):
        raise _fail(f"{job_id} is an array's id, not a job's: `raylane arrays status {job_id}` shows it, "
                    f"`raylane ls --label raylane.array={job_id}` its members", EXIT_USAGE)
    return c.resolve_job_id(job_id)


def _overridden(spec: dict, sets: Optional[List[str]]) -> dict:
    from raylane.client.overrides import OverrideError, apply_overrides

    if not sets:
        return spec
    try:
        return apply_overrides(spec, sets)
    except OverrideError as e:
        raise _fail(str(e), EXIT_USAGE) from None


_JOB_ID = typer.Argument(..., help="Job id (or a unique start of one).")
_SET_HELP = ("Change the spec: a dotted path and a YAML value, e.g. resources.gpus_per_worker=2 or "
             "args.lr=1e-4 (repeatable; an unknown path is refused).")

def _exit_for(job) -> int:
    return EXIT_OK if job.status.value == "SUCCEEDED" else EXIT_FAILED


def _final_line(job) -> str:
    from rich.markup import escape

    took = ""
    if job.finished_at is not None:
        # Since submit: what the user waited, queue and start-up included (the run
        # alone is `raylane status`'s Started .. Finished).
        took = f" after {_duration((job.finished_at - job.created_at).total_seconds())}"
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
        self.reason = ""  # the latest event's: why a job waits ("Ray cluster unreachable since ...") stays in sight

    def __rich__(self) -> str:
        from rich.markup import escape

        why = f": {escape(self.reason)}" if self.reason else ""
        return f"job {self.job_id} {_styled(self.status)} ({_duration(time.monotonic() - self.start)}){why}"


def _wait_with_progress(client, job_id: str, timeout: Optional[float]):
    """Wait for the job, printing each status change (and a spinner on a terminal)."""
    from rich.markup import escape

    err = _console(stderr=True)
    spinner = _Elapsed(job_id, "PENDING")

    def on_event(e) -> None:
        spinner.status, spinner.reason = e.to_status.value, e.reason or ""
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


_WORKING_DIR_HELP = ("A local directory to run the job in: zipped here (.gitignore honoured), uploaded unless the "
                     "server has the same tree already, and set as runtime_env.working_dir.")
_EXCLUDE_HELP = "With --working-dir: leave out files matching this .gitignore-style pattern (repeatable)."


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
    working_dir: Optional[Path] = typer.Option(None, "--working-dir", file_okay=False, help=_WORKING_DIR_HELP),
    exclude: Optional[List[str]] = typer.Option(None, "--exclude", help=_EXCLUDE_HELP),
    sets: Optional[List[str]] = typer.Option(None, "--set", help=_SET_HELP),
    output: Output = _OUTPUT,
) -> None:
    """Submit the job in FILE; with --wait or --follow, stay until it ends."""
    from raylane.client.sdk import spec_body

    _submit_and_watch(_overridden(spec_body(file), sets), wait=wait, follow=follow, idempotency_key=idempotency_key,
                      timeout=timeout, working_dir=working_dir, exclude=exclude or [], output=output)


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
@_client_command
def run(
    command: List[str] = typer.Argument(..., help="The command to run, after `--`: a command job's entrypoint."),
    working_dir: Optional[Path] = typer.Option(None, "--working-dir", file_okay=False, help=_WORKING_DIR_HELP),
    exclude: Optional[List[str]] = typer.Option(None, "--exclude", help=_EXCLUDE_HELP),
    name: Optional[str] = typer.Option(None, "--name", help="Job name (default: the command's first word)."),
    wait: Optional[bool] = typer.Option(None, "--wait/--no-wait", "-w", help="--wait: show status changes until the "
                                        "job ends, without its log; --no-wait: submit and return at once."),
    follow: Optional[bool] = typer.Option(None, "--follow/--no-follow", "-f", help="Stream the job's log to stdout "
                                          "until it ends (the default, as `ray job submit` does); --no-follow "
                                          "waits without the log."),
    timeout: Optional[float] = typer.Option(None, "--timeout", min=0, help="Give up waiting after this many seconds "
                                            "(exit 3); the job keeps running."),
    output: Output = _OUTPUT,
) -> None:
    """Run a command as a job, like `ray job submit`: raylane run --working-dir . -- python train.py --lr 1e-3"""
    import shlex

    if not command:
        raise _fail("give the command to run after `--`", EXIT_USAGE)
    base = Path(command[0]).name or "command"
    spec = {"name": name or base[:128], "kind": "command", "entrypoint": shlex.join(command)}
    if wait is False:  # --no-wait: submit and return, whatever else was said
        wait, follow = False, False
    elif follow is None:
        # Like `ray job submit`: the log streams unless asked otherwise. `--wait`
        # alone keeps its old meaning (status lines only), and `-o json` alone
        # keeps printing the submitted job at once, for scripts.
        follow, wait = not wait and output is not Output.json, bool(wait)
    else:  # --follow streams (and waits); --no-follow waits without the log
        wait = True
    _submit_and_watch(spec, wait=wait, follow=follow, idempotency_key=None, timeout=timeout, working_dir=working_dir,
                      exclude=exclude or [], output=output)


@app.command()
@_client_command
def resubmit(
    job_id: str = typer.Argument(..., help="The job to copy (id or a unique start of one), in any status."),
    sets: Optional[List[str]] = typer.Option(None, "--set", help=_SET_HELP),
    wait: bool = typer.Option(False, "--wait", "-w", help="Wait for the new job to end (the exit code says how)."),
    follow: bool = typer.Option(False, "--follow", "-f", help="Also stream its log to stdout (implies --wait)."),
    timeout: Optional[float] = typer.Option(None, "--timeout", min=0, help="With --wait/--follow: give up after "
                                            "this many seconds (exit 3); the job keeps running."),
    output: Output = _OUTPUT,
) -> None:
    """Submit a new job from an old job's spec, with --set changes; it is labelled raylane.io/resubmitted-from."""
    with _client() as c:
        job = c.resubmit(_full_id(c, job_id), overrides=sets or [])
        _show_and_watch(c, job, wait=wait, follow=follow, timeout=timeout, output=output)


def _submit_and_watch(spec: dict, *, wait: bool, follow: bool, idempotency_key: Optional[str],
                      timeout: Optional[float], working_dir: Optional[Path], exclude: List[str],
                      output: Output) -> None:
    from rich.markup import escape

    from raylane.client.sdk import PackageTooLarge

    with _client() as c:
        if working_dir is not None:
            try:
                pkg = c.upload_package(working_dir, excludes=exclude)
            except (PackageTooLarge, NotADirectoryError) as e:
                raise _fail(str(e), EXIT_USAGE) from None
            spec = {**spec, "runtime_env": {**(spec.get("runtime_env") or {}), "working_dir": pkg.uri}}
            what = "uploaded" if pkg.sent else "already on the server, nothing sent"
            _console(stderr=True).print(
                f"Working dir {escape(str(working_dir))}: {pkg.files} files, {pkg.size_bytes} bytes, package "
                f"{pkg.sha256[:12]} ({what})", soft_wrap=True)
        if spec.get("array") is not None:
            if follow:
                raise _fail("--follow streams one job's log; with an array, --wait waits for all its members "
                            "(`raylane logs` shows a member's)", EXIT_USAGE)
            arr = c.submit_array(spec)
            if output is Output.json and not wait:
                _print_json(arr)
            elif output is not Output.json:
                _console(stderr=wait).print(
                    f"Submitted array [bold]{arr.id}[/] ({escape(arr.name)}): {arr.size} members"
                    + (f", {arr.held} held by max_parallel" if arr.held else "") + "; list them with "
                    f"`raylane ls --label raylane.array={arr.id}`", soft_wrap=True)
            if wait:
                raise typer.Exit(nouns.array_outcome(nouns.wait_array(c, arr.id, timeout), output))
            return
        job = c.submit(spec, idempotency_key=idempotency_key)
        _show_and_watch(c, job, wait=wait, follow=follow, timeout=timeout, output=output)


def _show_and_watch(c, job, *, wait: bool, follow: bool, timeout: Optional[float], output: Output) -> None:
    """Say what was submitted; with --wait/--follow stay until it ends (the exit code says how)."""
    from rich.markup import escape

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
    job_id: str = _JOB_ID,
    timeout: Optional[float] = typer.Option(None, "--timeout", min=0, help="Give up after this many seconds (exit 3)."),
    output: Output = _OUTPUT,
) -> None:
    """Wait for a job to end, showing each status change; exit 0 if it SUCCEEDED, 1 if not."""
    with _client() as c:
        done = _wait_with_progress(c, _full_id(c, job_id), timeout)
    if output is Output.json:
        _print_json(done)
    else:
        _console(stderr=True).print(_final_line(done))
    raise typer.Exit(_exit_for(done))


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

    labels = _labels_option(label)
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
    from raylane.client.tables import Col, print_table, unique_prefixes

    ids = [j.id for j in jobs] if output is Output.wide else unique_prefixes([j.id for j in jobs])
    rows = [[i, escape(j.name), j.kind.value, _styled(j.status), j.placement.node_group if j.placement else "-",
             _ago(j.created_at), escape(j.status_reason or "")] for i, j in zip(ids, jobs)]
    cols = [Col("ID"), Col("NAME"), Col("KIND", cut=2), Col("STATUS"), Col("GROUP", cut=1), Col("CREATED"),
            Col("REASON", cut=0, min_width=12)]
    if output is Output.wide:
        out.width = 10_000
    print_table(out, cols, rows)
    if more:
        out.print(f"[dim]Showing the newest {limit}; --limit shows more.[/]")


@app.command()
@_client_command
def status(job_id: str = _JOB_ID, output: Output = _OUTPUT) -> None:
    """Show one job (or, for an arr_ id, an array): status and why, placement and why, attempts, result."""
    from rich.markup import escape
    from rich.table import Table

    if nouns.is_array_id(job_id):
        return nouns.show_array(job_id, output)

    with _client() as c:
        job = c.get_job(_full_id(c, job_id))
    if output is Output.json:
        _print_json(job)
        return
    def grid():
        g = Table.grid(padding=(0, 2))
        g.add_column(style="bold", no_wrap=True, min_width=10)
        g.add_column(overflow="fold")
        return g

    out = _console()
    t = grid()
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
        # A URL split over two lines cannot be clicked or copied: one line, however long.
        out.print(t)
        out.print(f"[bold]{'Ray':<10}[/]  {escape(job.dashboard_url)}", soft_wrap=True)
        t = grid()
    if job.result is not None:
        text = json.dumps(job.result, default=str)
        t.add_row("Result", escape(text if len(text) <= 400 else text[:400] + "..."))
    out.print(t)


@app.command()
@_client_command
def logs(
    job_id: str = _JOB_ID,
    follow: bool = typer.Option(False, "--follow", "-f", help="Keep streaming until the job ends."),
    attempt: Optional[int] = typer.Option(None, "--attempt", min=1, help="Attempt number (default: the latest)."),
    tail: Optional[int] = typer.Option(None, "--tail", "-n", min=0, help="Only the last N lines (with --follow: "
                                       "then everything new)."),
) -> None:
    """Print the job's driver log (Ray's), of its latest or a given attempt."""
    with _client() as c:
        job_id = _full_id(c, job_id)
        if not follow:
            sys.stdout.write(c.logs(job_id, attempt=attempt, tail=tail))
            return
        try:
            for chunk in c.logs(job_id, attempt=attempt, follow=True, tail=tail):
                sys.stdout.write(chunk)
                sys.stdout.flush()
        except KeyboardInterrupt:
            raise typer.Exit(EXIT_INTERRUPTED) from None


# A bulk cancel sends one request per job; past this many, narrow the selection
# (or cancel in rounds) rather than fire thousands of requests from one command.
BULK_CANCEL_MAX = 1000
BULK_LISTED = 20  # jobs named before the confirmation; the rest are counted


def _labels_option(items: Optional[List[str]]) -> dict:
    labels = {}
    for item in items or []:
        k, sep, v = item.partition("=")
        if not sep or not k:
            raise typer.BadParameter(f"{item!r} is not key=value", param_hint="--label")
        labels[k] = v
    return labels


@app.command()
@_client_command
def cancel(
    job_ids: Optional[List[str]] = typer.Argument(None, help="Job ids (or unique starts of them)."),
    label: Optional[List[str]] = typer.Option(None, "--label", "-l", help="Instead of ids: the unfinished jobs "
                                              "with this key=value label (repeat to require several)."),
    mine: bool = typer.Option(False, "--mine", help="Instead of ids: the unfinished jobs this token's owner "
                              "submitted (with --label: those of them)."),
    yes: bool = typer.Option(False, "--yes", "-y", help="With --label/--mine: do not ask before cancelling."),
    output: Output = _OUTPUT,
) -> None:
    """Cancel jobs: by id (several at once), or all unfinished ones with --label and/or --mine.

    Cancelling a cancelled job is a no-op. With --label/--mine the jobs are listed
    and confirmed first (--yes skips that). Exit 1 if any job could not be cancelled."""
    from rich.markup import escape

    from raylane.client.sdk import RaylaneError, Unauthorized

    labels = _labels_option(label)
    if job_ids and (labels or mine):
        raise _fail("give job ids, or --label/--mine to choose jobs, not both", EXIT_USAGE)
    if not job_ids and not (labels or mine):
        raise _fail("give the job ids to cancel, or --label key=value / --mine to choose jobs", EXIT_USAGE)
    err = _console(stderr=True)
    arrays = [x for x in job_ids or [] if nouns.is_array_id(x)]
    if arrays and len(arrays) == len(job_ids):  # `raylane cancel arr_...`: every unfinished member
        for a in arrays:
            nouns.cancel_array(a, output)
        raise typer.Exit(EXIT_OK)
    if arrays:
        raise _fail("give job ids or array ids (arr_...), not both", EXIT_USAGE)
    with _client() as c:
        if job_ids:
            targets, problems = [], 0
            for given in job_ids:
                try:
                    targets.append(_full_id(c, given))
                except Unauthorized:
                    raise
                except RaylaneError as e:
                    err.print(f"[bold red]Error:[/] {escape(str(e))}")
                    problems += 1
        else:
            targets, problems = _chosen(c, labels, mine, yes), 0
        done = []
        for job_id in targets:
            try:
                r = c.cancel(job_id)
            except Unauthorized:
                raise
            except RaylaneError as e:
                err.print(f"[bold red]Error:[/] job {job_id}: {escape(str(e))}")
                problems += 1
                continue
            done.append(r)
            if output is Output.text:
                _console().print(f"Job {r.job.id}: {r.message}; now {_styled(r.job.status)}", soft_wrap=True)
    if output is Output.json:
        # One id gives one object, as before several were allowed; otherwise a list.
        _print_json(done[0] if len(job_ids or []) == 1 and len(done) == 1 else done)
    if len(done) + problems > 1:
        err.print(f"Cancelled {len(done)} of {len(done) + problems} jobs.")
    raise typer.Exit(EXIT_FAILED if problems else EXIT_OK)


def _chosen(c, labels: dict, mine: bool, yes: bool) -> list:
    """The unfinished jobs --label/--mine select, confirmed unless --yes."""
    from rich.markup import escape

    unfinished = [s for s in JobStatus if not s.is_terminal() and s is not JobStatus.CANCELLING]
    me = c.whoami().name if mine else None
    jobs = list(c.iter_jobs(status=unfinished, labels=labels, submitted_by=me, page_size=500,
                            max_items=BULK_CANCEL_MAX + 1))
    what = " and ".join([f"labelled {', '.join(f'{k}={v}' for k, v in labels.items())}"] * bool(labels)
                        + [f"submitted by {me}"] * bool(me))
    err = _console(stderr=True)
    if not jobs:
        err.print(f"No unfinished jobs {escape(what)}; nothing to cancel.")
        raise typer.Exit(EXIT_OK)
    if len(jobs) > BULK_CANCEL_MAX:
        raise _fail(f"more than {BULK_CANCEL_MAX} unfinished jobs {what}: narrow it with --label "
                    f"(or cancel in rounds)", EXIT_USAGE)
    err.print(f"{len(jobs)} unfinished job{'s' * (len(jobs) != 1)} {escape(what)}:")
    for j in jobs[:BULK_LISTED]:
        err.print(f"  {j.id}  {escape(j.name)}  {_styled(j.status)}")
    if len(jobs) > BULK_LISTED:
        err.print(f"  ... and {len(jobs) - BULK_LISTED} more")
    if not yes:
        try:
            sure = typer.confirm(f"Cancel {'these' if len(jobs) > 1 else 'this'} {len(jobs)}?", err=True)
        except typer.Abort:  # no answer (stdin closed)
            sure = False
        if not sure:
            err.print("Nothing cancelled (pass --yes to cancel without asking).")
            raise typer.Exit(EXIT_FAILED)
    return [j.id for j in jobs]


@app.command()
@_client_command
def events(job_id: str = _JOB_ID, output: Output = _OUTPUT) -> None:
    """Show the job's status changes, oldest first."""
    from rich.markup import escape

    with _client() as c:
        job_id = _full_id(c, job_id)
        evs = c.events(job_id)
    if output is Output.json:
        _print_json(evs)
        return
    from raylane.client.tables import Col, print_table

    # One line per event: a reason is cut to the terminal (-o wide or -o json for all of it).
    cols = [Col("TIME"), Col("FROM"), Col("TO"), Col("REASON", cut=0, min_width=12), Col("BY", cut=1),
            Col("ATTEMPT", cut=2)]
    rows = [[f"{e.at.astimezone():%Y-%m-%d %H:%M:%S}", e.from_status.value if e.from_status else "-",
             _styled(e.to_status), escape(e.reason or ""), escape(e.actor), str(e.attempt or "-")] for e in evs]
    out = _console()
    if output is Output.wide:
        out.width = 10_000
    print_table(out, cols, rows)


@app.command()
@_client_command
def trials(
    job_id: str = typer.Argument(..., help="Id of a sweep job (or a unique start of one)."),
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
        job_id = _full_id(c, job_id)
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


clusterview.register(app)  # plan, nodes, report
nouns.register(app)  # arrays, schedules, costs


# `raylane serve` and friends, as they were before the split: handed over whole to
# `raylane-server`, so this module never imports the server's code.
SERVER_COMMANDS = frozenset({"serve", "db", "cluster", "profile"})


def _hand_over_to_server(args: list[str]) -> None:
    """Run ``raylane-server ARGS`` in place of this process (it does not return)."""
    from importlib.util import find_spec

    # Only found, not imported: the server's own `main` names every missing module.
    if find_spec("fastapi") is None or find_spec("sqlalchemy") is None:
        _fail(f"`raylane {args[0]}` is a server command (raylane-server) and needs the server install: "
              "pip install 'raylane[server]'", EXIT_USAGE)
        sys.exit(EXIT_USAGE)
    sys.stdout.flush()
    os.execv(sys.executable, [sys.executable, "-m", "raylane.api.cli", *args])


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] in SERVER_COMMANDS:
        _hand_over_to_server(sys.argv[1:])
    try:
        app(prog_name=PROG)
    except KeyboardInterrupt:
        sys.exit(EXIT_INTERRUPTED)


if __name__ == "__main__":
    main()
