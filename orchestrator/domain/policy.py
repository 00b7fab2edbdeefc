"""Policy: what a job may run on the cluster, checked at submit (and plan) before
anything is stored or routed. Settings ``RAYLANE_POLICY_*`` set the rules.

A job runs arbitrary code, but only through the doors listed here:

- ``pip``: ``runtime_env.pip`` may be switched off, or limited to an allowlist of
  package names: then each entry must parse as one PEP 508 requirement
  (``packaging``) naming an allowed package, so URLs, VCS links and pip options
  are refused too. An entry never holds a line break (Ray writes one entry a line);
- ``working_dir``: a local directory is zipped *on the control plane* and shipped
  to Ray (``backends.ray_jobs``), so it must be an absolute path without ``..``
  under one of the allowed roots, and never inside the control plane's own state
  (``data_dir``: the database, the admin token; job storage lies outside it); a URI
  must use an allowed scheme. ``raylane://packages/<sha256>``, a package the
  client uploaded (``domain.packages``), is always allowed: uploading is the
  door for code from a laptop, and whether it exists is checked at submit.
  ``py_modules`` entries follow the same rules;
- ``env_vars``: names Raylane or Ray read (``RAYLANE_*``, ``RAY_*``) are refused,
  so a job cannot override its own job id, project or storage, or Ray's settings;
- resources: most GPUs, CPUs and workers one job may hold.

A rule that refuses a valid spec raises ``PolicyViolation`` (403); an input that
is malformed for the rule (a relative path, ``..``) raises ``Invalid`` (422).
Either names the rule, e.g. ``policy.working_dir.roots``.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from raylane.orchestrator.domain.errors import Forbidden, Invalid
from raylane.orchestrator.domain.kinds import traits
from raylane.orchestrator.domain.packages import is_package_uri, package_sha
from raylane.orchestrator.settings import Settings
from raylane.orchestrator.domain.specs import JobSpec

URI_RE = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")


class PolicyViolation(Forbidden):
    """A valid spec that a policy rule refuses; ``rule`` names the rule."""

    def __init__(self, message: str, *, rule: str, field: str | None = None):
        super().__init__(f"{message} [{rule}]", field=field)
        self.rule = rule


class PolicyInvalid(Invalid):
    """A spec field malformed for a policy rule (e.g. '..' in a path)."""

    def __init__(self, message: str, *, rule: str, field: str | None = None):
        super().__init__(f"{message} [{rule}]", field=field)
        self.rule = rule


@dataclass(frozen=True)
class JobTotals:
    workers: int
    gpus: float
    cpus: float


def totals(spec: JobSpec) -> JobTotals:
    """What one job holds at most: the same worker count the router uses."""
    r = spec.resources
    workers = r.num_workers
    if spec.sweep is not None:
        workers = min(spec.sweep.max_concurrent_trials or spec.sweep.num_trials, spec.sweep.num_trials)
    return JobTotals(workers=workers, gpus=workers * r.gpus_per_worker,
                     cpus=workers * r.cpus_per_worker + r.driver_cpus)


def check(spec: JobSpec, settings: Settings, *, where: str = "") -> None:
    """Raise if a rule refuses the spec. ``where`` prefixes the message (a batch index)."""
    try:
        _check_pip(spec, settings)
        _check_sources(spec, settings)
        _check_env(spec, settings)
        _check_resources(spec, settings)
        _check_preemption(spec, settings)
    except (PolicyViolation, PolicyInvalid) as e:
        if where:
            e.message = f"{where}: {e.message}"
            e.args = (e.message,)
        raise


def _check_pip(spec: JobSpec, settings: Settings) -> None:
    pkgs = spec.runtime_env.pip
    if not pkgs:
        return
    if not settings.policy_allow_pip:
        raise PolicyViolation("runtime_env.pip is not allowed on this cluster (RAYLANE_POLICY_ALLOW_PIP=false)",
                              rule="policy.pip.allowed", field="runtime_env.pip")
    for req in pkgs:
        # Ray writes the list one entry a line into a requirements file: a line
        # break inside an entry would add lines (a second index, -r another file).
        if any(ch in req for ch in "\r\n\f\v\x85\u2028\u2029"):
            raise PolicyInvalid(f"pip requirement {req[:120]!r} holds a line break; give one requirement per "
                                f"entry", rule="policy.pip.one_requirement", field="runtime_env.pip")
    allowed = {canonicalize_name(p) for p in settings.policy_pip_allowlist}
    if not allowed:
        return
    for req in pkgs:
        name = allowlisted_name(req)
        if name is None:
            raise PolicyViolation(f"pip requirement {req[:120]!r} is not a plain package requirement (options, "
                                  f"URLs and VCS links are refused); only packages in RAYLANE_POLICY_PIP_ALLOWLIST "
                                  f"may be installed", rule="policy.pip.allowlist", field="runtime_env.pip")
        if name not in allowed:
            raise PolicyViolation(f"pip package {name!r} is not in RAYLANE_POLICY_PIP_ALLOWLIST",
                                  rule="policy.pip.allowlist", field="runtime_env.pip")


def allowlisted_name(entry: str) -> str | None:
    """The canonical package name of a PEP 508 requirement that pip installs from its
    index by name (extras, versions and markers allowed), or None: an option such as
    ``--index-url``, a URL or path (``name @ url``, ``git+https://...``), or not a
    requirement at all. Each of those would install something the allowlist never saw."""
    text = entry.strip()
    if not text or text.startswith("-"):
        return None
    try:
        req = Requirement(text)
    except InvalidRequirement:
        return None
    if req.url:
        return None
    return canonicalize_name(req.name)


def _check_sources(spec: JobSpec, settings: Settings) -> None:
    env = spec.runtime_env
    if not env.working_dir and not env.py_modules:
        return
    items = ([("runtime_env.working_dir", env.working_dir)] if env.working_dir else []) + \
        [("runtime_env.py_modules", m) for m in env.py_modules]
    for field, value in items:
        if is_package_uri(value):
            if package_sha(value) is None:
                raise PolicyInvalid(f"{field} {value[:200]!r} is not a package URI: raylane://packages/ and the "
                                    f"package's sha256 (64 lower-case hex digits)",
                                    rule="policy.working_dir.package", field=field)
            continue
        m = URI_RE.match(value)
        if m:
            scheme = m.group(1).lower()
            if scheme not in {s.lower() for s in settings.policy_working_dir_uri_schemes}:
                raise PolicyViolation(
                    f"{field} URI scheme {scheme!r} is not allowed (allowed: "
                    f"{', '.join(settings.policy_working_dir_uri_schemes) or 'none'})",
                    rule="policy.working_dir.uri_scheme", field=field)
            continue
        _check_local_dir(field, value, settings)


def _check_local_dir(field: str, value: str, settings: Settings) -> None:
    pure = PurePosixPath(value)
    if ".." in pure.parts:
        raise PolicyInvalid(f"{field} must not contain '..'", rule="policy.working_dir.traversal", field=field)
    if not pure.is_absolute():
        raise PolicyInvalid(f"{field} must be an absolute path or a URI, got {value[:200]!r}",
                            rule="policy.working_dir.absolute", field=field)
    roots = [Path(r).resolve() for r in settings.policy_working_dir_roots]
    if not roots:
        raise PolicyViolation(f"{field}: local directories are not allowed on this server; use a URI "
                              f"({', '.join(settings.policy_working_dir_uri_schemes)}) or ask an admin to set "
                              f"RAYLANE_POLICY_WORKING_DIR_ROOTS", rule="policy.working_dir.roots", field=field)
    # Symlinks resolved: a link inside an allowed root must not lead out of it.
    real = Path(os.path.realpath(value))
    if not any(real == r or r in real.parents for r in roots):
        raise PolicyViolation(f"{field} {value[:200]!r} is not under an allowed root "
                              f"({', '.join(str(r) for r in roots)})", rule="policy.working_dir.roots", field=field)
    # Inside the state directory: refused. Above it (a project root holding
    # .raylane/): allowed, and the dispatcher excludes the state from the upload.
    state = settings.data_dir.resolve()
    if real == state or state in real.parents:
        raise PolicyViolation(f"{field} {value[:200]!r} holds the control plane's own state ({state})",
                              rule="policy.working_dir.protected", field=field)


def _check_env(spec: JobSpec, settings: Settings) -> None:
    if not spec.runtime_env.env_vars:
        return
    prefixes = [p.upper() for p in settings.policy_reserved_env_prefixes]
    for name in spec.runtime_env.env_vars:
        hit = next((p for p in prefixes if name.upper().startswith(p)), None)
        if hit:
            raise PolicyViolation(f"runtime_env.env_vars: {name} is reserved ({hit}* variables are set by "
                                  f"Raylane or read by Ray)", rule="policy.env_vars.reserved",
                                  field="runtime_env.env_vars")


def _check_resources(spec: JobSpec, settings: Settings) -> None:
    t = totals(spec)
    for value, cap, label, rule in (
        (t.gpus, settings.policy_max_gpus_per_job, "GPUs", "policy.resources.max_gpus_per_job"),
        (t.cpus, settings.policy_max_cpus_per_job, "CPUs", "policy.resources.max_cpus_per_job"),
        (t.workers, settings.policy_max_workers_per_job, "workers", "policy.resources.max_workers_per_job"),
    ):
        if cap is not None and value > cap + 1e-9:
            raise PolicyViolation(f"the job asks for {value:g} {label}; at most {cap:g} per job are allowed",
                                  rule=rule, field="resources")


def _check_preemption(spec: JobSpec, settings: Settings) -> None:
    p = spec.preemption
    if p.preemptible is False and traits(spec.kind).preemptible and not settings.policy_preemption_opt_out:
        raise PolicyViolation(f"preemption.preemptible false: a {spec.kind.value} job may be preempted on this "
                              f"server (for a job within its project's guaranteed share, or of higher priority); "
                              f"ask an admin to set RAYLANE_POLICY_PREEMPTION_OPT_OUT",
                              rule="policy.preemption.opt_out", field="preemption.preemptible")
    if p.grace_s is not None and p.grace_s > settings.preempt_max_grace_s + 1e-9:
        raise PolicyViolation(f"preemption.grace_s {p.grace_s:g} is more than this server allows "
                              f"({settings.preempt_max_grace_s:g} s, RAYLANE_PREEMPT_MAX_GRACE_S)",
                              rule="policy.preemption.max_grace_s", field="preemption.grace_s")


def state_excludes(spec: JobSpec, data_dir: Path) -> list[str]:
    """Ray ``excludes`` patterns keeping the control plane's state directory out of
    a local working_dir / py_modules upload that contains it (a project root
    with ``.raylane/`` in it, as with ``make run``)."""
    state = Path(data_dir).resolve()
    env = spec.runtime_env
    out: list[str] = []
    for value in ([env.working_dir] if env.working_dir else []) + list(env.py_modules):
        if URI_RE.match(value):
            continue
        real = Path(os.path.realpath(value))
        if real in state.parents:
            pattern = "/" + state.relative_to(real).as_posix() + "/"
            if pattern not in out:
                out.append(pattern)
    return out
