"""``--set key=value``: changes to a job spec given on the command line (``raylane
submit --set``, ``raylane resubmit --set``, ``Client.resubmit(overrides=)``).

Words used here:

- *path*: dotted field names into the spec, ``resources.gpus_per_worker``. Each
  name must be a field of ``JobSpec`` (or of the section it is in), so a typo is
  refused here with the names that exist, before anything is sent. Below a
  free-form mapping (``labels``, ``args``, ``runtime_env.env_vars``) any key goes.
- *value*: parsed as YAML (``2`` an int, ``true`` a bool, ``null`` None,
  ``[a, b]`` a list); what is not YAML stays the string given, and so does
  every value of a text field (``name=123``, ``labels.run=7``).

Pure: pydantic and PyYAML only, as the client install has. The server still
validates the result, as it does every spec.
"""

from __future__ import annotations

import copy
import difflib
import types
import typing
from typing import Any, Iterable, Mapping, Union

from pydantic import BaseModel

from raylane.orchestrator.domain.specs import JobSpec

__all__ = ["OverrideError", "apply_overrides", "parse_assignment"]


class OverrideError(ValueError):
    """A ``--set`` that cannot apply: not ``key=value``, or a path the spec does not have."""


class _Raw(str):
    """A value as typed on a command line, parsed once its field is known."""


def parse_assignment(item: str) -> tuple[str, Any]:
    """``"resources.gpus_per_worker=2"`` -> ``("resources.gpus_per_worker", "2")``: the
    value is parsed by ``apply_overrides``, which knows the field's type."""
    path, sep, raw = item.partition("=")
    path = path.strip()
    if not sep or not path:
        raise OverrideError(f"{item!r} is not key=value (e.g. resources.gpus_per_worker=2)")
    return path, _Raw(raw)


def _value(raw: str) -> Any:
    import yaml

    try:
        value = yaml.safe_load(raw) if raw.strip() else raw
    except yaml.YAMLError:
        return raw
    if isinstance(value, str):
        # YAML 1.1 (PyYAML) reads 1e-3 as a string; a learning rate typed so is a number.
        try:
            return float(value) if value.strip().lower() not in ("nan", "inf", "-inf", "infinity") else value
        except ValueError:
            return value
    return value


def _is_text(annotation: Any) -> bool | str:
    """A str field: its value is kept as typed. ``"optional"`` for Optional[str],
    where ``null`` still means none."""
    if typing.get_origin(annotation) in (Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        return "optional" if len(args) == 1 and _is_text(args[0]) else False
    return annotation is str


def _model_in(annotation: Any) -> type[BaseModel] | None | bool:
    """The model a field holds (also inside Optional), True for a free-form mapping, None for a leaf."""
    origin = typing.get_origin(annotation)
    if origin in (Union, types.UnionType):
        for arg in typing.get_args(annotation):
            found = _model_in(arg)
            if found is not None:
                return found
        return None
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if origin in (dict, Mapping, typing.Mapping) or annotation in (dict, Any):
        return True
    return None


def _check_path(parts: list[str], path: str) -> bool | str:
    """Refuse a path the spec has no field for; say whether its value is text."""
    model: Any = JobSpec
    mapping_values: Any = None
    for i, name in enumerate(parts):
        if model is True:
            # A free-form mapping: any key below it; dict[str, str] (labels, env_vars) holds text.
            return i == len(parts) - 1 and mapping_values is str
        if model is None:
            where = ".".join(parts[:i])
            raise OverrideError(f"--set {path}: {where} is a value, not a section (set {where}=... instead)")
        fields = {f.alias or n: f for n, f in model.model_fields.items()} | dict(model.model_fields)
        if name not in fields:
            where = ".".join(parts[:i]) or "the spec"
            close = difflib.get_close_matches(name, list(fields), n=1)
            hint = f"; did you mean {close[0]}?" if close else f"; it has {', '.join(sorted(model.model_fields))}"
            raise OverrideError(f"--set {path}: {where} has no field {name!r}{hint}")
        annotation = fields[name].annotation
        model = _model_in(annotation)
        mapping_values = (typing.get_args(annotation) or (None, None))[-1] if model is True else None
    return _is_text(annotation)


def apply_overrides(spec: Mapping[str, Any], overrides: Mapping[str, Any] | Iterable[str]) -> dict[str, Any]:
    """A copy of the spec body with each override applied, in order.

    Args:
        spec: a spec as a dict (``spec_body``'s output, or a stored job's spec).
        overrides: ``{"path": value}``, or ``"path=value"`` strings as typed on
            a command line (values parsed as YAML).

    Returns:
        The new spec dict; sections missing on the way are created.

    Raises:
        OverrideError: a malformed item or a path the spec has no field for,
            with the fields that exist.

    Example::

        apply_overrides(body, ["resources.gpus_per_worker=2", "args.lr=1e-4"])
    """
    items = overrides.items() if isinstance(overrides, Mapping) else map(parse_assignment, overrides)
    out = copy.deepcopy(dict(spec))
    for path, value in items:
        parts = path.split(".")
        if any(not p for p in parts):
            raise OverrideError(f"--set {path}: an empty name between dots")
        text = _check_path(parts, path)
        if isinstance(value, _Raw):
            if text == "optional" and value.strip() in ("null", "~"):
                value = None
            else:
                value = str(value) if text else _value(value)
        node = out
        for i, name in enumerate(parts[:-1]):
            child = node.get(name)
            if child is None:
                child = node[name] = {}
            elif not isinstance(child, dict):
                raise OverrideError(f"--set {path}: {'.'.join(parts[:i + 1])} is {child!r}, not a section")
            node = child
        node[parts[-1]] = value
    return out
