"""The input rule: one check for every string and number the API stores or filters by.

Words used here:

- *text*: a string from a caller. It is valid UTF-8 (JSON's escape ``"\\ud800"``
  decodes to a lone surrogate, which neither a database nor an exec'd process
  can take: stored, it made every later listing fail), holds no NUL (PostgreSQL's
  text refuses it and no command line or environment can carry it), and is at
  most ``MAX_TEXT_CHARS`` characters.
- *number*: finite. JSON has no NaN or Infinity; Python's parser accepts them and
  they were stored as null, silently.
- *value*: a text, a number, a bool, null, or a list or mapping of values nested
  at most ``MAX_DEPTH`` levels, whose mapping keys are texts too (free-form
  ``args``, sweep choices).
- *date*: a datetime inside ``[DATE_MIN, DATE_MAX)``; at the edges of the
  calendar, window arithmetic (``end - 7 days``) overflows.
- *where*: the dotted path of a value as the caller wrote it (``env_vars.HOME``,
  ``args.layers[3]``); every refusal names it.

A refusal is a ``ValueError`` whose message starts with *where*: pydantic turns
it into a 422 with the field's ``loc``, so nothing is stored. ``InputRule`` is
the base of every request model that applies the rule to each of its fields.
This module imports pydantic only, so the light client install can use it.
"""

from __future__ import annotations

import functools
import math
import types
import typing
from datetime import datetime
from typing import Any

from pydantic import BaseModel, ValidationInfo, field_validator

# Larger than any one field's own bound (an entrypoint is 8 KiB, an env value 32 KiB),
# so a field with its own bound answers with it; this one holds for free-form values.
MAX_TEXT_CHARS = 65_536
# Deeper than any config a person writes; shallow enough that walking, storing
# (PostgreSQL's jsonb) and exec'ing a spec never meets a recursion limit.
MAX_DEPTH = 32
# Nothing in Raylane predates the epoch (accounting's EPOCH); the upper edge is far
# enough for any window and far from datetime.max, so window arithmetic cannot overflow.
STORED = "stored"  # validation context key: the value comes from the database
DATE_MIN = datetime(1970, 1, 1)
DATE_MAX = datetime(3000, 1, 1)


def check_text(s: str, where: str, *, max_chars: int | None = MAX_TEXT_CHARS) -> str:
    if "\x00" in s:
        raise ValueError(f"{where}: NUL characters are not allowed")
    try:
        if not s.isascii():  # ASCII has no surrogates: no need to encode it
            s.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ValueError(f"{where}: not valid UTF-8 (a lone surrogate \\u{ord(s[e.start]):04x} "
                         f"at character {e.start})") from None
    if max_chars is not None and len(s) > max_chars:
        raise ValueError(f"{where}: longer than {max_chars} characters ({len(s)})")
    return s


def check_value(value: Any, where: str) -> Any:
    """Check every text and number inside ``value``; iterative, so depth cannot overflow the stack.
    A value's path is kept as links (parent, separator, key) and written out only for a refusal."""
    stack: list[tuple[Any, Any, int]] = [(value, where, 0)]
    while stack:
        v, at, depth = stack.pop()
        if isinstance(v, str):
            if "\x00" in v or not v.isascii() or len(v) > MAX_TEXT_CHARS:  # else nothing to refuse
                check_text(v, _path(at))
        elif isinstance(v, float):
            if not math.isfinite(v):
                raise ValueError(f"{_path(at)}: numbers must be finite, got {v}")
        elif isinstance(v, (dict, list, tuple)):
            if depth >= MAX_DEPTH:
                raise ValueError(f"{_path(at)}: nested deeper than {MAX_DEPTH} levels")
            if isinstance(v, dict):
                for k, item in v.items():
                    if isinstance(k, str) and ("\x00" in k or not k.isascii() or len(k) > MAX_TEXT_CHARS):
                        check_text(k, f"{_path(at)} (a key)")
                    stack.append((item, (at, ".", k), depth + 1))
            else:
                stack.extend((item, (at, "[", i), depth + 1) for i, item in enumerate(v))
    return value


def _path(at: Any) -> str:
    """``env_vars.HOME``, ``args.layers[3]``: a path ``check_value`` kept as links."""
    parts = []
    while isinstance(at, tuple):
        at, sep, key = at
        parts.append(f"[{key}]" if sep == "[" else f".{key[:64] if isinstance(key, str) else key}")
    return at + "".join(reversed(parts))


def check_date(d: datetime, where: str) -> datetime:
    # Compared without the offset: converting 0001-01-01T00:00+01:00 to UTC itself overflows.
    if not DATE_MIN <= d.replace(tzinfo=None) < DATE_MAX:
        raise ValueError(f"{where}: must be between {DATE_MIN.date()} and {DATE_MAX.date()}, got {d.isoformat()}")
    return d


def text(s: str) -> str:
    """``check_text`` for a parameter whose name pydantic puts in the error's loc."""
    return check_text(s, "the value")


def date(d: datetime) -> datetime:
    return check_date(d, "the date")


def _holds_model(annotation: Any) -> bool:
    """A field typed as a model (or an optional one): that model checks its own fields."""
    if isinstance(annotation, type):
        return issubclass(annotation, BaseModel)
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return any(_holds_model(a) for a in typing.get_args(annotation) if a is not type(None))
    return False


class InputRule(BaseModel):
    """A request model whose every field is checked by the input rule before its own validation."""

    @field_validator("*", mode="before")
    @classmethod
    def _input_rule(cls, v: Any, info: ValidationInfo) -> Any:
        if info.context and info.context.get(STORED):
            # Read back from the database: a row stored before this rule existed
            # must still list and run; the rule guards what comes in, at submit.
            return v
        if isinstance(v, str):
            # A string field has its own max_length, whose message is the more precise one.
            check_text(v, info.field_name, max_chars=None)
        elif v is not None and not (isinstance(v, dict) and _field_holds_model(cls, info.field_name)):
            check_value(v, info.field_name)
        return v


@functools.cache
def _field_holds_model(cls: type[BaseModel], name: str) -> bool:
    """``_holds_model`` of a field's annotation, worked out once per class and field."""
    return _holds_model(cls.model_fields[name].annotation)
