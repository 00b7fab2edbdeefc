"""Small value rules shared by the domain, the store and the API: how an amount
is written in a message, and that a time given by a caller carries its timezone.

An *amount* is a count of CPUs, GPUs or GB: whole numbers print bare ("2"),
fractions with at most two decimals ("0.5", "1.25").
"""

from __future__ import annotations

from datetime import datetime

from raylane.orchestrator.domain.errors import Invalid


def fmt_amount(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:.2f}".rstrip("0").rstrip(".")


def require_timezone(name: str, value: datetime | None) -> None:
    """A naive time is refused: the server cannot know which zone the caller meant."""
    if value is not None and value.tzinfo is None:
        raise Invalid(f"{name} needs a timezone (e.g. 2026-01-01T00:00:00Z)", field=name)
