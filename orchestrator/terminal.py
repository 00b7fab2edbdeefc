"""What both command lines (``raylane`` and ``raylane-server``) say on a terminal:
exit codes, the ``--output`` option, the console, error lines and JSON.

Client dependencies only (typer, rich, pydantic), so the server CLI can share it
and the client install still runs it. Exit codes (docs/cli.md):
"""

from __future__ import annotations

import json
import sys
from enum import Enum

import typer

EXIT_OK = 0  # done; with --wait: the job SUCCEEDED
EXIT_FAILED = 1  # the job FAILED or was CANCELLED, or the server refused (not found, conflict, ...)
EXIT_USAGE = 2  # bad options or arguments, unreadable file, spec refused by validation
EXIT_TIMEOUT = 3  # --wait --timeout ran out; the job keeps running
EXIT_UNREACHABLE = 4  # the server could not be reached (after the SDK's retries)
EXIT_INTERRUPTED = 130  # Ctrl-C; a job being waited on keeps running


def _flags_without_type() -> None:
    """Help shows ``--wait`` alone, not ``--wait <bool>``: a flag takes no value.

    Typer (0.2x) prints every option's type in the rich help, flags included, and
    has no setting for it; this is the one place its display is changed."""
    from typer.core import TyperOption

    shown = TyperOption.display_type_rich
    if getattr(shown, "_raylane", False):
        return

    def display_type_rich(self, ctx):
        return None if self.is_flag else shown(self, ctx)

    display_type_rich._raylane = True
    TyperOption.display_type_rich = display_type_rich


_flags_without_type()


class Output(str, Enum):
    text = "text"
    json = "json"
    wide = "wide"  # tables with whole ids and nothing cut, however wide the terminal


OUTPUT = typer.Option(Output.text, "--output", "-o", case_sensitive=False,
                      help="text (tables fitted to the terminal), wide (nothing cut) or json.")


def console(stderr: bool = False):
    from rich.console import Console

    # Width from COLUMNS or the terminal; highlighting off so ids and numbers stay
    # plain. Messages on stderr are not wrapped, so they stay whole for grep.
    return Console(stderr=stderr, highlight=False, soft_wrap=stderr)


def fail(message: str, code: int) -> "typer.Exit":
    from rich.markup import escape

    console(stderr=True).print(f"[bold red]Error:[/] {escape(message)}")
    return typer.Exit(code)


def print_json(value) -> None:
    from pydantic import BaseModel

    def plain(v):
        if isinstance(v, BaseModel):
            return v.model_dump(mode="json")
        if isinstance(v, list):
            return [plain(x) for x in v]
        return v

    sys.stdout.write(json.dumps(plain(value), indent=2) + "\n")
