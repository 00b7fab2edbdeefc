"""The job spec: the one schema shared by the API, the SDK, the CLI and ``jobs/``.

Words used here:

- *spec*: what a user asks for (``JobSpec``). It never changes after submit.
- *kind*: which runner in ``jobs/`` executes it (training, sweep, ...).
- *entrypoint*: an import path ``pkg.module:function`` for every kind but
  ``command``, where it is a shell command, as with ``ray job submit -- ...``.
- *placement hint*: what the user says about where to run (``auto`` lets the
  router decide); the router's decision is a ``routing.Placement``.

Every string and number of a spec, free-form ``args`` and sweep choices
included, obeys the input rule (``inputs``: UTF-8, no NUL, bounded, finite,
bounded depth); a spec that would not fit on the driver's command line is
refused at submit (``check_exec_size``).

This module imports pydantic and yaml only, so the light client install can use it.
"""

from __future__ import annotations

import json
import math
import re
from enum import Enum
from pathlib import Path
from typing import Any, ClassVar, Literal

import yaml
from pydantic import ConfigDict, Field, field_validator, model_validator

from raylane.orchestrator.domain.inputs import STORED, InputRule

from raylane.orchestrator.domain.kinds import KINDS, sections, traits

# Bounds with reasons. Each keeps one spec small enough to store, log and show.
MAX_NAME_LEN = 128  # fits a dashboard column and a Kubernetes-style name
MAX_ENTRYPOINT_LEN = 8192  # a long shell line, not a script; scripts go in working_dir
MAX_LABELS = 64  # labels are for filtering, not a data store
MAX_LABEL_KEY_LEN = 63  # the Kubernetes label-name limit
MAX_LABEL_VALUE_LEN = 256
MAX_ENV_VARS = 256
MAX_PIP_PACKAGES = 256
MAX_SEARCH_PARAMS = 64
MAX_CHOICES = 1024
MAX_WORKERS = 4096
MAX_SPEC_DOCUMENT_BYTES = 256 * 1024  # a YAML/JSON spec file, comments included
# Linux's MAX_ARG_STRLEN: the most one exec argument (the driver's shell command,
# which carries the spec base64-encoded) or one environment string may hold.
MAX_EXEC_STRING_BYTES = 128 * 1024
# The spec's share of that string as it travels: base64 makes 80 KiB into 107 KiB,
# leaving 21 KiB for the placement and the runner's other inputs.
MAX_SPEC_BYTES = 80 * 1024

# What a required section must hold, for the message that asks for it.
SECTION_NEEDS = {"sweep": "with a search_space", "batch": "with an input_uri"}
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
IMPORT_PATH_RE = re.compile(r"^[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*:[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*$")
LABEL_KEY_RE = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9._/-]*[A-Za-z0-9])?$")
ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class JobKind(str, Enum):
    """Which runner in ``jobs/`` executes a job; its traits are its row in ``kinds.KINDS``."""

    # What each is and does: its row's summary and traits.
    TRAINING = "training"
    SWEEP = "sweep"
    BATCH_INFERENCE = "batch_inference"
    SERVICE = "service"
    COMMAND = "command"
    FUNCTION = "function"


class _Model(InputRule):
    # Unknown fields are refused: a typo in a spec must not silently do nothing.
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class RuntimeEnv(_Model):
    """The subset of Ray's runtime_env that Raylane passes through."""

    working_dir: str | None = Field(None, max_length=4096)
    pip: list[str] = Field(default_factory=list, max_length=MAX_PIP_PACKAGES)
    env_vars: dict[str, str] = Field(default_factory=dict)
    py_modules: list[str] = Field(default_factory=list, max_length=64)

    @field_validator("env_vars")
    @classmethod
    def _env_vars(cls, v: dict[str, str]) -> dict[str, str]:
        if len(v) > MAX_ENV_VARS:
            raise ValueError(f"at most {MAX_ENV_VARS} variables")
        for k, val in v.items():
            if not ENV_NAME_RE.match(k):
                raise ValueError(f"{k[:64]!r} is not a valid environment variable name")
            if len(val) > 32768:
                raise ValueError(f"value of {k} is longer than 32768 characters")
        return v

    @field_validator("pip")
    @classmethod
    def _pip(cls, v: list[str]) -> list[str]:
        for p in v:
            if not p or len(p) > 512:
                raise ValueError("each pip requirement must be 1..512 characters")
        return v


class _Frozen(_Model):
    """A section of scalars that never changes once made: hashable, so the spec's
    default is one shared instance (pydantic copies an unhashable default for
    every spec; building the three defaults was ~2 us of a batch job's ~55)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=True)


class Resources(_Frozen):
    """What each worker of a job needs. A worker is an actor, a trial or a replica."""

    num_workers: int = Field(1, ge=1, le=MAX_WORKERS)
    cpus_per_worker: float = Field(1.0, ge=0, le=1024)
    gpus_per_worker: float = Field(0.0, ge=0, le=64)
    memory_gb_per_worker: float | None = Field(None, gt=0, le=16384)
    accelerator_type: str | None = Field(None, max_length=64)
    # What the driver (the Ray job's entrypoint process) needs; small by default
    # so a burst of drivers does not crowd the node it lands on.
    driver_cpus: float = Field(0.1, ge=0, le=64)

    @field_validator("gpus_per_worker")
    @classmethod
    def _gpus(cls, v: float) -> float:
        # Fractions share one GPU; above one, a worker owns whole GPUs.
        if v > 1 and not float(v).is_integer():
            raise ValueError("more than one GPU per worker must be a whole number")
        return v

    @property
    def total_gpus(self) -> float:
        return self.num_workers * self.gpus_per_worker

    @property
    def total_cpus(self) -> float:
        return self.num_workers * self.cpus_per_worker


class PlacementHint(_Frozen):
    """What the user says about where a job runs. ``auto`` lets the router decide."""

    node_group: str = Field("auto", min_length=1, max_length=64)
    colocate: bool | None = None  # None: the router decides (yes for multi-GPU training)
    market: Literal["auto", "SPOT", "ON_DEMAND"] = "auto"
    # In a fleet (docs/fleet.md): one cluster by name, or one tier; checked against
    # the fleet when the job is placed (``domain/placement.py``).
    cluster: str = Field("auto", min_length=1, max_length=32, pattern=r"^(auto|[a-z][a-z0-9-]{0,31})$")
    tier: Literal["auto", "owned", "rented"] = "auto"


class RetryPolicy(_Frozen):
    """How failed attempts are retried. Causes are ``states.FailureCause``."""

    max_attempts: int = Field(3, ge=1, le=100)
    # Application errors are the user's bug; retrying them by default wastes GPUs.
    retry_app_errors: bool = False
    backoff_s: float = Field(2.0, ge=0, le=3600)
    max_backoff_s: float = Field(300.0, ge=0, le=86400)
    # After this many preemptions the next attempt goes to on-demand nodes.
    spot_fallback_after: int = Field(2, ge=0, le=100)


class PreemptionSpec(_Frozen):
    """Whether Raylane may preempt the job for another, and how long it then has to
    checkpoint (docs/sharing.md). None: the kind's trait and the server's setting."""

    # None: the kind's (``kinds.KindTraits.preemptible``: yes but for services).
    # False on a kind that may be preempted needs RAYLANE_POLICY_PREEMPTION_OPT_OUT.
    preemptible: bool | None = None
    # None: RAYLANE_PREEMPT_GRACE_S; more than RAYLANE_PREEMPT_MAX_GRACE_S is refused (403).
    grace_s: float | None = Field(None, ge=0, le=86400)


class Domain(_Model):
    """One search-space dimension: exactly one of the fields is set."""

    uniform: list[float] | None = None
    loguniform: list[float] | None = None
    randint: list[int] | None = None
    choice: list[Any] | None = None
    grid: list[Any] | None = None

    @model_validator(mode="after")
    def _one(self) -> "Domain":
        set_ = [k for k in ("uniform", "loguniform", "randint", "choice", "grid") if getattr(self, k) is not None]
        if len(set_) != 1:
            raise ValueError("give exactly one of uniform, loguniform, randint, choice, grid")
        kind = set_[0]
        val = getattr(self, kind)
        if kind in ("uniform", "loguniform", "randint"):
            if len(val) != 2:
                raise ValueError(f"{kind} takes [low, high]")
            lo, hi = val
            if not (math.isfinite(lo) and math.isfinite(hi)) or lo >= hi:
                raise ValueError(f"{kind} needs finite low < high, got [{lo}, {hi}]")
            if kind == "loguniform" and lo <= 0:
                raise ValueError("loguniform needs low > 0")
        else:
            if not val:
                raise ValueError(f"{kind} needs at least one value")
            if len(val) > MAX_CHOICES:
                raise ValueError(f"{kind} takes at most {MAX_CHOICES} values")
        return self

    @property
    def kind(self) -> str:
        return next(k for k in ("uniform", "loguniform", "randint", "choice", "grid") if getattr(self, k) is not None)


class SweepSpec(_Model):
    """A hyperparameter sweep run by Ray Tune."""

    metric: str = Field(..., min_length=1, max_length=128)
    mode: Literal["min", "max"] = "min"
    num_samples: int = Field(10, ge=1, le=100_000)
    max_concurrent_trials: int | None = Field(
        None, ge=1, le=10_000, description="Most trials at once; unset: what the group holds. Trials so short that all but one "
        "end before a trial actor starts run one at a time once their length is known (Tune would start actors only "
        "to discard them)")
    scheduler: Literal["fifo", "asha"] = "fifo"
    search_space: dict[str, Domain] = Field(..., min_length=1)
    # ASHA's bound on the training iterations a trial may report.
    max_t: int = Field(100, ge=1, le=1_000_000)
    grace_period: int = Field(1, ge=1, le=1_000_000)
    max_trial_failures: int = Field(3, ge=-1, le=1000)

    @property
    def num_trials(self) -> int:
        """The trials Tune runs: ``num_samples`` of each combination of the grid
        dimensions (Tune's ``grid_search`` multiplies, it does not sample)."""
        n = self.num_samples
        for d in self.search_space.values():
            if d.grid is not None:
                n *= len(d.grid)
        return n

    @field_validator("search_space")
    @classmethod
    def _space(cls, v: dict[str, Domain]) -> dict[str, Domain]:
        if len(v) > MAX_SEARCH_PARAMS:
            raise ValueError(f"at most {MAX_SEARCH_PARAMS} parameters")
        for k in v:
            if not k or len(k) > 128:
                raise ValueError("parameter names must be 1..128 characters")
        return v


class BatchSpec(_Model):
    """Batch inference: a predictor class mapped over an input dataset by Ray Data."""

    input_uri: str = Field(..., min_length=1, max_length=4096)
    # A URI or an absolute path; a relative path, or none ("output"), is taken
    # inside the job's storage, which every node and later attempt can reach.
    output_uri: str | None = Field(None, min_length=1, max_length=4096)
    format: Literal["parquet", "jsonl", "csv"] | None = None  # None: from the extension
    batch_size: int = Field(256, ge=1, le=1_000_000)
    concurrency: int | None = Field(None, ge=1, le=10_000)  # actor pool size


class AutoscalingSpec(_Model):
    min_replicas: int = Field(1, ge=0, le=1000)
    max_replicas: int = Field(1, ge=1, le=1000)
    target_ongoing_requests: float = Field(2.0, gt=0, le=10_000)

    @model_validator(mode="after")
    def _order(self) -> "AutoscalingSpec":
        if self.min_replicas > self.max_replicas:
            raise ValueError("min_replicas must be <= max_replicas")
        return self


class ServiceSpec(_Model):
    """An online service: a Ray Serve application."""

    replicas: int = Field(1, ge=1, le=1000)
    route_prefix: str = Field("/", max_length=256, pattern=r"^/[A-Za-z0-9._~/-]*$")
    autoscaling: AutoscalingSpec | None = None


MAX_ARRAY_SIZE = 10_000
ARRAY_LABEL = "raylane.array"  # on each member of an array: the array's id
ARRAY_INDEX_LABEL = "raylane.array.index"  # ... and the member's index


class ArraySpec(_Model):
    """One spec, ``size`` members (``sbatch --array=0-N%K``): member ``i`` sees
    ``RAYLANE_ARRAY_INDEX=i``; at most ``max_parallel`` members run at once."""

    size: int = Field(..., ge=1, le=MAX_ARRAY_SIZE)
    max_parallel: int | None = Field(None, ge=1, le=MAX_ARRAY_SIZE,
                                     description="Most members admitted at once; unset: no limit beyond the cluster's")


MAX_DEPENDENCIES = 64


class Dependency(_Model):
    """A parent this job waits for (Slurm's ``--dependency=afterok:ID``)."""

    job: str = Field(..., min_length=1, max_length=128,
                     description="The parent's job id; in a batch, also the name of another spec of the batch")
    on: Literal["succeeded", "failed", "finished"] = Field(
        "succeeded", description="What the parent must end as: SUCCEEDED, FAILED, or either (or CANCELLED)")

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, v: Any) -> Any:
        return {"job": v} if isinstance(v, str) else v


class JobSpec(_Model):
    """A job as submitted. The three specs of DESIGN.md are accepted as written."""

    @classmethod
    def from_stored(cls, data: Any) -> "JobSpec":
        """A spec read back from the database: validated as a spec, but not held
        to the input rule again (a row stored before a rule tightened still loads)."""
        return cls.model_validate(data, context={STORED: True})

    name: str = Field(..., min_length=1, max_length=MAX_NAME_LEN)
    kind: JobKind
    entrypoint: str = Field(..., min_length=1, max_length=MAX_ENTRYPOINT_LEN)
    project: str | None = Field(None, min_length=1, max_length=64, pattern=r"^[a-z0-9][a-z0-9-]*$")
    runtime_env: RuntimeEnv = Field(default_factory=RuntimeEnv)
    resources: Resources = Resources()
    placement: PlacementHint = PlacementHint()
    priority: int = Field(50, ge=0, le=100)
    retry: RetryPolicy = RetryPolicy()
    preemption: PreemptionSpec = PreemptionSpec()
    timeout_s: float | None = Field(None, gt=0, le=30 * 86400)
    labels: dict[str, str] = Field(default_factory=dict)
    sweep: SweepSpec | None = None
    batch: BatchSpec | None = None
    service: ServiceSpec | None = None
    # An array of this spec (POST /v1/arrays); members are plain jobs without it.
    array: ArraySpec | None = None
    # Parents: this job is queued only once each has ended as its condition says;
    # one that ends otherwise cancels it (docs/workflows.md).
    depends_on: list[Dependency] = Field(default_factory=list, max_length=MAX_DEPENDENCIES)
    # Free-form arguments handed to the user's function (JSON-serialisable).
    args: dict[str, Any] = Field(default_factory=dict)
    # auto: a small job may run in a warm lane (docs/fast-lane.md); isolated: always a Ray job of its own.
    lane: Literal["auto", "isolated"] = "auto"

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not NAME_RE.match(v):
            raise ValueError("use letters, digits, '.', '_' and '-', starting with a letter or digit")
        return v

    @field_validator("labels")
    @classmethod
    def _labels(cls, v: dict[str, str]) -> dict[str, str]:
        if len(v) > MAX_LABELS:
            raise ValueError(f"at most {MAX_LABELS} labels, got {len(v)}")
        for k, val in v.items():
            if len(k) > MAX_LABEL_KEY_LEN or not LABEL_KEY_RE.match(k):
                raise ValueError(f"label key {k[:80]!r} must be 1..{MAX_LABEL_KEY_LEN} of [A-Za-z0-9._/-]")
            if len(val) > MAX_LABEL_VALUE_LEN:
                raise ValueError(f"label {k!r} value is longer than {MAX_LABEL_VALUE_LEN}")
        return v

    @field_validator("args")
    @classmethod
    def _args(cls, v: dict[str, Any]) -> dict[str, Any]:
        if len(json.dumps(v, default=str)) > 64 * 1024:
            raise ValueError("args must serialise to at most 64 KiB of JSON")
        return v

    @model_validator(mode="after")
    def _kind_sections(self) -> "JobSpec":
        row = traits(self.kind)
        if row.runner and not IMPORT_PATH_RE.match(self.entrypoint):
            raise ValueError(
                f"entrypoint: a {row.name} job's entrypoint must be an import path "
                f"'package.module:function', got {self.entrypoint[:80]!r}"
            )
        if row.section and row.section_required and getattr(self, row.section) is None:
            raise ValueError(f"{row.section}: a {row.name} job needs a '{row.section}' section "
                             f"{SECTION_NEEDS.get(row.section, '')}".rstrip())
        # Which sections are set first (none, for most specs): sections() is
        # worked out from the table, which a test may change, so only when needed.
        present = [s for s in JobSpec._section_fields if getattr(self, s) is not None]
        foreign = [s for s in present if s != row.section and s in sections()] if present else []
        if foreign:
            section = min(foreign)  # the same one whatever the set's order
            owners = " or ".join(t.name for t in KINDS.values() if t.section == section)
            raise ValueError(f"{section}: only a {owners} job takes a '{section}' section")
        return self

    # Every field that is some kind's section (kinds.sections()): optional and a model.
    _section_fields: ClassVar[tuple[str, ...]] = ("sweep", "batch", "service")

    @property
    def effective_service(self) -> ServiceSpec:
        return self.service or ServiceSpec()

    # Loading ---------------------------------------------------------------

    @classmethod
    def from_yaml(cls, text: str, source: str | None = None) -> "JobSpec":
        return cls.model_validate(load_spec_document(text, source))

    @classmethod
    def from_file(cls, path: str | Path) -> "JobSpec":
        return cls.from_yaml(Path(path).read_text(), source=str(path))


def exec_size(spec: JobSpec, text: str | None = None) -> int:
    """Bytes the spec takes on the driver's command line before base64: its JSON as
    a JSON string, as the dispatcher writes it (non-ASCII escaped, ``\\uXXXX``).
    ``text``: the spec's ``model_dump_json(exclude_none=True)``, if the caller has it."""
    return len(json.dumps(spec.model_dump_json(exclude_none=True) if text is None else text))


# json.dumps writes one character as at most 12 (a character beyond the BMP as
# two \uXXXX escapes): a text this short cannot go over, whatever it holds.
_ALWAYS_FITS = (MAX_SPEC_BYTES - 2) // 12


def check_exec_size(spec: JobSpec) -> str:
    """Refuse a spec whose job could never start: Linux refuses to exec it. Returns
    the JSON text it measured (``model_dump_json(exclude_none=True)``, what the
    store keeps), so a caller that stores the spec need not encode it again.

    Checked at submit, not by the model: a spec stored before this bound must still load.
    """
    text = spec.model_dump_json(exclude_none=True)
    if len(text) <= _ALWAYS_FITS:  # most specs: not encoded again to be measured
        return text
    size = exec_size(spec, text)
    if size > MAX_SPEC_BYTES:
        raise ValueError(f"the spec takes {size} bytes on the driver's command line; at most {MAX_SPEC_BYTES} "
                         f"fit in one exec string (Linux's {MAX_EXEC_STRING_BYTES}-byte limit, after base64). "
                         f"Pass large inputs by URI (a working_dir, an input_uri) instead")
    return text


class SpecLoadError(ValueError):
    """A spec document that is not YAML/JSON, or is too big or too nested to load."""


MAX_YAML_NODES = 100_000  # a YAML bomb expands aliases far beyond this


def _yaml_problem(e: yaml.YAMLError, source: str | None) -> str:
    """A YAML error in one line that names the file and line, not PyYAML's "<unicode string>"."""
    mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
    what = " ".join(x for x in (getattr(e, "context", None), getattr(e, "problem", None)) if x) or str(e)
    if mark is None:
        return f"{source + ': ' if source else ''}not valid YAML or JSON: {what}"
    return f"{source or 'the spec'}, line {mark.line + 1}, column {mark.column + 1}: not valid YAML or JSON: {what}"


def load_spec_document(text: str, source: str | None = None) -> dict[str, Any]:
    """Parse YAML or JSON text into a dict, refusing bombs and oversized documents.

    ``source`` (a file name) is what a syntax error names, with its line.

    JSON is YAML, so one parser serves both. Aliases are expanded by the safe
    loader; we count the nodes of the composed tree first so a billion-laughs
    document is refused before it is expanded.
    """
    if len(text.encode("utf-8", "replace")) > MAX_SPEC_DOCUMENT_BYTES:
        raise SpecLoadError(f"spec is larger than {MAX_SPEC_DOCUMENT_BYTES} bytes")
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as e:
        raise SpecLoadError(_yaml_problem(e, source)) from None
    if node is None:
        raise SpecLoadError("the spec is empty")
    _count_nodes(node)
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:  # pragma: no cover - compose succeeded above
        raise SpecLoadError(_yaml_problem(e, source)) from None
    if not isinstance(data, dict):
        raise SpecLoadError("a spec must be a mapping (name: ..., kind: ..., entrypoint: ...)")
    return data


def _count_nodes(root: yaml.Node) -> None:
    # Walk with aliases expanded (the same node object reached twice counts twice),
    # which is exactly the size safe_load would build.
    count = 0
    stack: list[tuple[yaml.Node, int]] = [(root, 0)]
    while stack:
        node, depth = stack.pop()
        count += 1
        if count > MAX_YAML_NODES:
            raise SpecLoadError(f"spec expands to more than {MAX_YAML_NODES} nodes (a YAML alias bomb?)")
        if depth > 64:
            raise SpecLoadError("spec is nested deeper than 64 levels")
        if isinstance(node, yaml.MappingNode):
            for k, v in node.value:
                stack.append((k, depth + 1))
                stack.append((v, depth + 1))
        elif isinstance(node, yaml.SequenceNode):
            for v in node.value:
                stack.append((v, depth + 1))
