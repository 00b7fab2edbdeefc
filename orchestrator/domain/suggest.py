""""Did you mean ...?" for a misspelt field of a job spec: the nearest name the
spec's schema has at that place (``entrypiont`` -> ``entrypoint``,
``resources.gpu_per_worker`` -> ``gpus_per_worker``).

Pure: pydantic and difflib. Used where validation errors become words: the
API's 422 (``api/errors.py``), so the SDK and the CLI show the same hint.
"""

from __future__ import annotations

import difflib
import typing
from typing import Any, Iterable

from pydantic import BaseModel

from raylane.orchestrator.domain.specs import JobSpec

# difflib's ratio: 0.6 takes "entrypiont" for "entrypoint" and "gpu" for
# "gpus_per_worker"'s neighbours no more; below it suggestions turn into guesses.
CUTOFF = 0.6


def _model_in(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        found = _model_in(arg)
        if found is not None:
            return found
    return None


def _names(model: type[BaseModel]) -> list[str]:
    out = []
    for name, f in model.model_fields.items():
        out.append(f.alias or name)
    return out


def _walk(model: type[BaseModel], path: list[str]) -> type[BaseModel] | None:
    for part in path:
        fields = {(f.alias or n): f for n, f in model.model_fields.items()}
        f = fields.get(part)
        if f is None:
            return None
        model = _model_in(f.annotation)
        if model is None:
            return None
    return model


def nearest_field(loc: Iterable[Any], root: type[BaseModel] = JobSpec) -> str | None:
    """The valid field name nearest to ``loc``'s last part, at the place ``loc``
    names in ``root`` (a request's spec may sit under a key, e.g. a schedule's
    ``spec``: every suffix of the path is tried). None when nothing is near."""
    parts = [str(p) for p in loc if not isinstance(p, int) and str(p) not in ("body", "query", "path")]
    if not parts:
        return None
    *parent, unknown = parts
    for start in range(len(parent) + 1):
        model = _walk(root, parent[start:])
        if model is None:
            continue
        near = difflib.get_close_matches(unknown, _names(model), n=1, cutoff=CUTOFF)
        if near:
            return near[0]
    return None
