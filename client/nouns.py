"""The ``raylane`` command groups beside jobs: ``arrays`` (status, wait, cancel,
retry), ``schedules`` (ls, create, next, pause, resume, delete) and ``costs``.
Each is a call of ``raylane.client.sdk``; ``raylane.client.cli`` adds them to
the main command, and sends ``status``/``cancel`` of an ``arr_`` id here.

Client dependencies only (typer, rich, the SDK).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Optional

import typer

from raylane.client.clikit import ago, client, client_command, duration, money, styled, when_option
from raylane.client.tables import Col, print_table
from raylane.client.terminal import (
    EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK, EXIT_TIMEOUT, OUTPUT, Output, console, print_json,
)

ARRAY_PREFIX = "arr_"
TERMINAL = ("SUCCEEDED", "FAILED", "CANCELLED")
# An array's members are counted by the server in one query; polling it every
# second or so is cheap, and slower as the wait grows (a 1000-member array can
# run for hours).
ARRAY_POLL_MIN_S = 0.5
ARRAY_POLL_MAX_S = 5.0

arrays_app = typer.Typer(name="arrays", help="Job arrays: one spec, many member jobs.", no_args_is_help=True)
schedules_app = typer.Typer(name="schedules", help="Schedules: a job spec submitted at each tick of a cron "
                            "expression.", no_args_is_help=True)

_ARRAY_ID = typer.Argument(..., help="Array id (arr_...).")
_SCHEDULE_ID = typer.Argument(..., help="Schedule id (sch_...).")


def is_array_id(value: str) -> bool:
    return value.lower().startswith(ARRAY_PREFIX)


# Arrays -------------------------------------------------------------------------


def _counts(arr) -> str:
    parts = [f"{n} {styled(s)}" for s, n in sorted(arr.counts.items(), key=lambda kv: -kv[1]) if n]
    held = f" ({arr.held} of them held back by max_parallel)" if arr.held else ""
    return (", ".join(parts) or "no members yet") + held


def _finished(arr) -> int:
    return sum(arr.counts.get(s, 0) for s in TERMINAL)


def show_array(array_id: str, output: Output) -> None:
    with client() as c:
        arr = c.get_array(array_id)
    if output is Output.json:
        print_json(arr)
        return
    out = console()
    par = f", at most {arr.max_parallel} at once" if arr.max_parallel else ""
    out.print(f"Array [bold]{arr.id}[/] ({arr.name}): {arr.size} members{par}; project {arr.project}, "
              f"created {ago(arr.created_at)} by {arr.created_by}", soft_wrap=True)
    out.print(f"  {_counts(arr)}", soft_wrap=True)
    out.print(f"  members: raylane ls --label raylane.array={arr.id}", soft_wrap=True)


def cancel_array(array_id: str, output: Output) -> int:
    with client() as c:
        r = c.cancel_array(array_id)
    if output is Output.json:
        print_json(r)
    else:
        console().print(f"Array {r.array.id}: cancelled {len(r.jobs)} unfinished member(s); now {_counts(r.array)}",
                        soft_wrap=True)
    return EXIT_OK


def wait_array(c, array_id: str, timeout: Optional[float]):
    """Wait until every member has ended, printing the counts when they change;
    the exit code is 0 only if every member SUCCEEDED."""
    err = console(stderr=True)
    start, last, pause = time.monotonic(), None, ARRAY_POLL_MIN_S
    try:
        while True:
            arr = c.get_array(array_id)
            said = _counts(arr)
            if said != last:
                err.print(f"{time.strftime('%H:%M:%S')}  {_finished(arr)}/{arr.size} ended: {said}", soft_wrap=True)
                last, pause = said, ARRAY_POLL_MIN_S
            if _finished(arr) >= arr.size and not arr.held:
                return arr
            if timeout is not None and time.monotonic() - start >= timeout:
                err.print(f"[bold red]Error:[/] array {array_id}: {_finished(arr)} of {arr.size} members ended "
                          f"after {duration(timeout)}; the rest keep running")
                raise typer.Exit(EXIT_TIMEOUT)
            time.sleep(pause)
            pause = min(ARRAY_POLL_MAX_S, pause * 1.5)
    except KeyboardInterrupt:
        err.print(f"\n[yellow]Stopped waiting.[/] Array {array_id} was not cancelled and goes on without you; "
                  f"see it with `raylane arrays status {array_id}`.")
        raise typer.Exit(EXIT_INTERRUPTED) from None


def array_outcome(arr, output: Output) -> int:
    ok = arr.counts.get("SUCCEEDED", 0) == arr.size
    if output is Output.json:
        print_json(arr)
    else:
        console(stderr=True).print(f"Array {arr.id} {'[bold green]SUCCEEDED[/]' if ok else '[bold red]FAILED[/]'}: "
                                   f"{_counts(arr)}", soft_wrap=True)
    return EXIT_OK if ok else EXIT_FAILED


@arrays_app.command("status")
@client_command
def arrays_status(array_id: str = _ARRAY_ID, output: Output = OUTPUT) -> None:
    """Show an array: its size and its members counted per status."""
    show_array(array_id, output)


@arrays_app.command("wait")
@client_command
def arrays_wait(array_id: str = _ARRAY_ID,
                timeout: Optional[float] = typer.Option(None, "--timeout", min=0, help="Give up after this many "
                                                        "seconds (exit 3); the members keep running."),
                output: Output = OUTPUT) -> None:
    """Wait until every member has ended; exit 0 if all SUCCEEDED, 1 if not."""
    with client() as c:
        arr = wait_array(c, array_id, timeout)
    raise typer.Exit(array_outcome(arr, output))


@arrays_app.command("cancel")
@client_command
def arrays_cancel(array_id: str = _ARRAY_ID, output: Output = OUTPUT) -> None:
    """Cancel every unfinished member of an array."""
    raise typer.Exit(cancel_array(array_id, output))


@arrays_app.command("retry")
@client_command
def arrays_retry(array_id: str = _ARRAY_ID,
                 failed_only: bool = typer.Option(False, "--failed-only", help="Retry FAILED members only, not "
                                                  "CANCELLED ones."),
                 output: Output = OUTPUT) -> None:
    """Submit a new job for each member whose newest job failed (or was cancelled)."""
    with client() as c:
        r = c.retry_array(array_id, failed_only=failed_only)
    if output is Output.json:
        print_json(r)
        return
    console().print(f"Array {r.array.id}: {len(r.jobs)} member(s) submitted again; now {_counts(r.array)}",
                    soft_wrap=True)


# Schedules ----------------------------------------------------------------------


def _when(at) -> str:
    return f"{at.astimezone():%Y-%m-%d %H:%M:%S}" if at else "-"


def _schedule_rows(items) -> list:
    return [[s.id, s.name, s.cron, s.timezone, "paused" if s.paused else "active",
             _when(s.next_runs[0]) if s.next_runs else "-", s.last_job_id or "-"] for s in items]


_SCHEDULE_COLS = [Col("ID"), Col("NAME"), Col("CRON"), Col("TIMEZONE", cut=1), Col("STATE"), Col("NEXT RUN"),
                  Col("LAST JOB", cut=0, min_width=12)]


@schedules_app.command("ls")
@client_command
def schedules_ls(output: Output = OUTPUT) -> None:
    """List the schedules of your projects, with each one's next run."""
    with client() as c:
        items = c.list_schedules()
    if output is Output.json:
        print_json(items)
        return
    if not items:
        console().print("No schedules.")
        return
    out = console()
    if output is Output.wide:
        out.width = 10_000
    print_table(out, _SCHEDULE_COLS, _schedule_rows(items))


def _show_schedule(s, output: Output, said: str) -> None:
    if output is Output.json:
        print_json(s)
        return
    out = console()
    out.print(f"Schedule [bold]{s.id}[/] ({s.name}){' ' + said if said else ''}: `{s.cron}` in {s.timezone}, overlap {s.overlap}, "
              f"missed {s.missed}", soft_wrap=True)
    if s.paused:
        out.print("  paused: no job until `raylane schedules resume " + s.id + "`", soft_wrap=True)
    for at in s.next_runs:
        out.print(f"  next  {_when(at)}")


@schedules_app.command("create")
@client_command
def schedules_create(
    name: str = typer.Argument(..., help="The schedule's name (unique in its project)."),
    cron: str = typer.Argument(..., help="Cron expression: 5 fields (minute hour day month weekday), a 6th for "
                               "seconds AFTER them (`* * * * * 30`), or @hourly, @daily, ..."),
    file: Path = typer.Argument(..., exists=True, dir_okay=False, readable=True, help="Job spec file (YAML/JSON)."),
    tz: str = typer.Option("UTC", "--timezone", "--tz", help="IANA time zone the cron fields are read in."),
    overlap: str = typer.Option("skip", "--overlap", help="A tick while the previous job runs: skip, queue or "
                                "replace."),
    missed: str = typer.Option("run_once", "--missed", help="Ticks missed while no server ran: skip, run_once or "
                               "run_all."),
    deadline: float = typer.Option(60.0, "--starting-deadline-s", min=0, help="How late a tick may run."),
    paused: bool = typer.Option(False, "--paused", help="Create it paused."),
    output: Output = OUTPUT,
) -> None:
    """Create a schedule: the job in FILE, submitted at each tick of CRON."""
    with client() as c:
        s = c.create_schedule(name, cron, file, timezone=tz, overlap=overlap, missed=missed,
                              starting_deadline_s=deadline, paused=paused)
    _show_schedule(s, output, "created")


@schedules_app.command("next")
@client_command
def schedules_next(schedule_id: str = _SCHEDULE_ID, output: Output = OUTPUT) -> None:
    """Show a schedule's next runs and its recent ticks (the job each made, or why none)."""
    with client() as c:
        s = c.get_schedule(schedule_id)
    _show_schedule(s, output, "")
    if output is not Output.json:
        for run in s.recent_runs[:10]:
            what = f"job {run.job_id}" if run.job_id else f"{run.outcome}: {run.reason or ''}"
            console().print(f"  tick  {_when(run.tick)}  {what}", soft_wrap=True)


def _pause(schedule_id: str, paused: bool, output: Output) -> None:
    with client() as c:
        s = c.pause_schedule(schedule_id) if paused else c.resume_schedule(schedule_id)
    _show_schedule(s, output, "paused" if paused else "resumed")


@schedules_app.command("pause")
@client_command
def schedules_pause(schedule_id: str = _SCHEDULE_ID, output: Output = OUTPUT) -> None:
    """Pause a schedule: no job until it is resumed."""
    _pause(schedule_id, True, output)


@schedules_app.command("resume")
@client_command
def schedules_resume(schedule_id: str = _SCHEDULE_ID, output: Output = OUTPUT) -> None:
    """Resume a schedule from its next tick after now (the paused ticks are not run)."""
    _pause(schedule_id, False, output)


@schedules_app.command("delete")
@client_command
def schedules_delete(schedule_id: str = _SCHEDULE_ID) -> None:
    """Delete a schedule; the jobs it made stay."""
    with client() as c:
        c.delete_schedule(schedule_id)
    console().print(f"Schedule {schedule_id} deleted; the jobs it made stay.")


# Costs --------------------------------------------------------------------------


@client_command
def costs(
    by: str = typer.Option("project", "--by", help="Group by project, node_group or kind."),
    since: str = typer.Option("7d", "--since", help="Window start: a span back from now (24h, 7d) or ISO 8601."),
    until: Optional[str] = typer.Option(None, "--until", help="Window end (default now)."),
    project: Optional[str] = typer.Option(None, "--project", "-p", help="Admins: one project (default all)."),
    output: Output = OUTPUT,
) -> None:
    """What the attempts in a window cost, per project, node group or kind (spot savings beside)."""
    if by not in ("project", "node_group", "kind"):
        raise typer.BadParameter("project, node_group or kind", param_hint="--by")
    with client() as c:
        b = c.costs(group_by=by, start=when_option(since, "--since"), end=when_option(until, "--until"),
                    project=project)
    if output is Output.json:
        print_json(b)
        return
    out = console()
    out.print(f"[bold]Window[/] {b.start.astimezone():%Y-%m-%d %H:%M} .. {b.end.astimezone():%Y-%m-%d %H:%M}   "
              f"total {money(b.total.cost)} ({_n(b.total.jobs, 'job')}, {_n(b.total.attempts, 'attempt')}), spot savings "
              f"{money(b.total.spot_savings)}", soft_wrap=True)
    if not b.rows:
        out.print("No attempts in this window.")
        return
    cols = [Col(by.upper().replace("_", " ")), Col("JOBS", justify="right"), Col("ATTEMPTS", cut=2, justify="right"),
            Col("CPU-H", cut=1, justify="right"), Col("GPU-H", cut=0, justify="right"), Col("COST", justify="right"),
            Col("ON DEMAND", cut=3, justify="right"), Col("SAVED", cut=4, justify="right")]
    rows = [[r.key, str(r.jobs), str(r.attempts), f"{r.cpu_hours:.2f}", f"{r.gpu_hours:.2f}", money(r.cost),
             money(r.on_demand_cost), money(r.spot_savings)] for r in b.rows]
    if output is Output.wide:
        out.width = 10_000
    print_table(out, cols, rows)
    if b.unpriced_attempts:
        out.print(f"[dim]{b.unpriced_attempts} attempt(s) on groups without a price are not counted.[/]")


def _n(count: int, word: str) -> str:
    return f"{count} {word}{'' if count == 1 else 's'}"


def register(app: typer.Typer) -> None:
    app.add_typer(arrays_app)
    app.add_typer(schedules_app)
    app.command("costs")(costs)


__all__ = ["register", "is_array_id", "show_array", "cancel_array", "wait_array", "array_outcome"]
