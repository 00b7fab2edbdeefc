"""What every ``raylane`` command shares: where the server is (the global
options), the SDK client for it, the SDK's errors turned into a message and an
exit code, and how statuses and times are written.

Its own module so that the command groups (``raylane.client.nouns``) and the
main command share one ``conn``, also under ``python -m raylane.client.cli``.
Client dependencies only.
"""

from __future__ import annotations

import functools
import math
import os
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Optional

import typer

from raylane.client.terminal import EXIT_FAILED, EXIT_TIMEOUT, EXIT_UNREACHABLE, EXIT_USAGE, console as _console
from raylane.client.terminal import fail as _fail


@dataclass
class Conn:
    url: Optional[str] = None
    token: Optional[str] = None


conn = Conn()  # set by the global options, read by every command


def client():
    from raylane.client.sdk import Client

    return Client(conn.url, token=conn.token)


def client_command(fn):
    """Turn the SDK's typed errors into a message and an exit code, never a traceback."""

    @functools.wraps(fn)
    def run(*args, **kwargs):
        from raylane.client.sdk import (
            AmbiguousJobId, ConnectionFailed, RaylaneError, Unauthorized, ValidationFailed, WaitTimeout,
        )

        try:
            return fn(*args, **kwargs)
        except AmbiguousJobId as e:
            raise _fail(str(e), EXIT_USAGE) from None
        except Unauthorized as e:
            raise _fail(unauthorized(e), EXIT_FAILED) from None
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


def unauthorized(e) -> str:
    """A 401 in the CLI's words: the SDK's says ``token=``, a CLI user sets RAYLANE_TOKEN or --token."""
    where = conn.url or os.environ.get("RAYLANE_URL") or "the server"
    if not e.token_sent:
        return f"{where} needs an API token and none was given: set RAYLANE_TOKEN or pass --token"
    detail = e.detail if isinstance(e.detail, str) else str(e.detail or "unauthorized")
    return f"{where} refused the token ({detail.split(':')[0]}): check RAYLANE_TOKEN or --token"


STATUS_STYLE = {"PENDING": "yellow", "DISPATCHING": "cyan", "RUNNING": "bold cyan", "RETRYING": "magenta",
                "CANCELLING": "magenta", "SUCCEEDED": "bold green", "FAILED": "bold red", "CANCELLED": "bold yellow"}


def styled(status, width: int = 0) -> str:
    s = getattr(status, "value", status)
    return f"[{STATUS_STYLE.get(s, 'white')}]{s:<{width}}[/]"


def ago(at: Optional[datetime]) -> str:
    if at is None:
        return "-"
    secs = max(0, int((datetime.now(timezone.utc) - at).total_seconds()))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if secs >= size:
            return f"{secs // size}{unit} ago"
    return f"{secs}s ago"


def duration(secs: float) -> str:
    secs = int(secs)
    if secs >= 3600:
        return f"{secs // 3600}h{secs % 3600 // 60:02d}m"
    if secs >= 60:
        return f"{secs // 60}m{secs % 60:02d}s"
    return f"{secs}s"


def when_option(value: Optional[str], name: str) -> Optional[datetime]:
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


def money(amount: float) -> str:
    """Dollars as a user reads them: cents, and below a cent two significant digits
    ($0.0014, not $0.00, which reads as free)."""
    if amount and abs(amount) < 0.01:
        return f"${amount:.{1 - math.floor(math.log10(abs(amount)))}f}"
    return f"${amount:.2f}"


def resources(d: dict) -> str:
    """A resource map as one line: ``CPU 2, GPU 1`` (``-`` when empty)."""
    return ", ".join(f"{k} {v:g}" if isinstance(v, (int, float)) else f"{k} {v}" for k, v in sorted(d.items())) or "-"
