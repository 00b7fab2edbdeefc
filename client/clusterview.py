"""The ``raylane`` commands that look at the cluster rather than at one job:
``plan`` (where a spec would be placed, and why), ``nodes`` (the node groups,
their capacity and Raylane's use of it) and ``report`` (own or rent, costs, the
fleet's economics). Registered on the main command by ``register``, as
``raylane.client.nouns`` registers its groups. Client dependencies only.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from raylane.client.clikit import client, client_command, money, resources, when_option
from raylane.client.terminal import OUTPUT, Output, console, print_json


@client_command
def plan(
    file: Path = typer.Argument(..., exists=True, dir_okay=False, readable=True, help="Job spec file (YAML or JSON)."),
    output: Output = OUTPUT,
) -> None:
    """Show where the router would place the job in FILE, and why, without submitting it."""
    from rich.markup import escape
    from rich.table import Table

    with client() as c:
        p = c.plan(file)
    if output is Output.json:
        print_json(p)
        return
    t = Table.grid(padding=(0, 2))
    t.add_column(style="bold", no_wrap=True)
    t.add_column(overflow="fold")
    t.add_row("Node group", f"[bold]{p.node_group}[/] ({p.market})")
    t.add_row("Strategy", f"{p.strategy}" + (", co-located" if p.colocate else ""))
    t.add_row("Workers", f"{p.num_workers} x {resources(p.worker_resources)}")
    t.add_row("Total", resources(p.total))
    t.add_row("Driver", resources(p.driver_resources))
    if p.fallback_node_groups:
        t.add_row("Fallback", ", ".join(p.fallback_node_groups))
    t.add_row("Selector", escape(", ".join(f"{k}={v}" for k, v in p.label_selector.items()) or "-"))
    out = console()
    out.print(t)
    out.print("[bold]Why:[/]")
    for r in p.reasons:
        out.print(f"  - {escape(r)}")


@client_command
def nodes(output: Output = OUTPUT) -> None:
    """Show the node groups with their capacity and what Raylane's jobs use of it."""
    from rich.table import Table

    with client() as c:
        groups = c.node_groups()
    if output is Output.json:
        print_json(groups)
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
    console().print(t)


@client_command
def report(
    since: str = typer.Option("7d", "--since", help="Window start: a span back from now (24h, 7d, 30d) or ISO 8601."),
    until: Optional[str] = typer.Option(None, "--until", help="Window end (default now): a span back or ISO 8601."),
    project: Optional[str] = typer.Option(None, "--project", "-p", help="Admins: one project (default all)."),
    output: Output = OUTPUT,
) -> None:
    """Own or rent: GPU utilisation against the break-even, costs, and jobs that could have run cheaper."""
    from rich.markup import escape

    start, end = when_option(since, "--since"), when_option(until, "--until")
    with client() as c:
        rep = c.report(start=start, end=end, project=project).model_dump(mode="json")
    if output is Output.json:
        print_json(rep)
        return
    out = console()
    tot = rep["total"]
    out.print(f"[bold]Window[/] {rep['window']['start'][:16]} .. {rep['window']['end'][:16]} UTC"
              + (f"  project {escape(rep['project'])}" if rep.get("project") else ""))
    out.print(f"[bold]Cost[/] {money(tot['cost'])}   on demand {money(tot['on_demand_cost'])}   "
              f"spot savings {money(tot['spot_savings'])}   {tot['attempts']} attempts of {tot['jobs']} jobs")
    from raylane.client.tables import Col, print_table

    wide = out if output is not Output.wide else console()
    if output is Output.wide:
        wide.width = 10_000
    right = "right"
    if rep["gpu_groups"]:
        out.print("[bold]GPU groups: own or rent?[/]")
        rows = [[g["node_group"], f"{g['nodes']} x {g['accelerator']['count']} {g['accelerator']['type']} ({g['basis']})",
                 f"{g['gpu_hours_used']:.1f}/{g['gpu_hours_available']:.0f}", f"{g['utilisation']:.1%}",
                 f"{g['break_even']:.0%}", "[bold green]own[/]" if g["verdict"] == "own" else "[bold yellow]rent[/]",
                 money(g["cost"])] for g in rep["gpu_groups"]]
        print_table(wide, [Col("GROUP"), Col("FLEET", cut=0, min_width=12), Col("GPU-H USED", cut=1, justify=right),
                           Col("UTILISATION", justify=right), Col("BREAK-EVEN", cut=2, justify=right),
                           Col("VERDICT"), Col("COST", justify=right)], rows)
    else:
        out.print("No GPU group in the profile.")
    for g in rep["gpu_groups"]:
        out.print(f"  - {escape(g['advice'])}", soft_wrap=True)
    print_fleet_economics(out, rep.get("fleet"))
    cheaper = rep["cheaper_placements"]
    if not cheaper:
        out.print("No job's placement looks like it could have been cheaper.")
        return
    out.print("[bold]Placements that could have been cheaper[/]")
    rows = [[f"{x['job_id']}#{x['attempt']}", escape(x["name"]), f"{x['node_group']} ({x['market']})",
             money(x["cost"]), x["cheaper_node_group"], money(x["saving"]), escape(x["reason"])] for x in cheaper]
    print_table(wide, [Col("JOB"), Col("NAME"), Col("RAN ON", cut=1), Col("COST", justify=right),
                       Col("CHEAPER ON", cut=2), Col("SAVING", justify=right), Col("WHY", cut=0, min_width=20)], rows)



def print_fleet_economics(out, fleet: dict | None) -> None:
    """The report's fleet section, when there is a fleet to speak of (an owned cluster, or several)."""
    from rich.markup import escape
    from rich.table import Table

    if not fleet or (len(fleet["clusters"]) < 2 and not fleet["owned_groups"]):
        return
    money = lambda x: "n/a" if x is None else f"${x:.2f}"  # noqa: E731
    c = fleet["cost"]
    out.print(f"[bold]Fleet[/] owned fixed {money(c['owned_fixed'])} + rented {money(c['rented'])} = "
              f"{money(c['total'])}   as all-rented {money(fleet['as_all_rented']['cost'])}   "
              f"as all-owned {money(fleet['as_all_owned']['cost'])}")
    t = Table(box=None, pad_edge=False, header_style="bold", title="Owned groups against the target",
              title_justify="left")
    for col in ("CLUSTER", "GROUP", "USED", "UTILISATION", "TARGET", "VERDICT", "FIXED COST"):
        t.add_column(col, no_wrap=True, justify="right" if col in ("USED", "UTILISATION", "TARGET", "FIXED COST")
                     else "left")
    colour = {"grow": "bold cyan", "keep": "bold green", "shrink": "bold yellow"}
    for g in fleet["owned_groups"]:
        t.add_row(g["cluster"], g["node_group"], f"{g['hours_used']:.1f}/{g['hours_available']:.0f} {g['resource']}-h",
                  f"{g['utilisation']:.1%}", f"{g['target']:.0%}", f"[{colour[g['verdict']]}]{g['verdict']}[/]",
                  money(g["fixed_cost"]))
    if fleet["owned_groups"]:
        out.print(t)
        for g in fleet["owned_groups"]:
            out.print(f"  - {escape(g['advice'])}")
    for r in fleet["rented_spend"]:
        out.print(f"  rented: {r['cluster']} {r['market']}: {money(r['cost'])} over {r['node_hours']:.1f} node-h, "
                  f"{r['attempts']} attempts")



def register(app: typer.Typer) -> None:
    app.command("plan")(plan)
    app.command("nodes")(nodes)
    app.command("report")(report)


__all__ = ["register", "print_fleet_economics"]
