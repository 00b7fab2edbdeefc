"""Job-kind traits: one row per kind, the only place a kind's behaviour is written.

Routing, admission, accounting, the reconciler, policy, spec validation, the
runner and the UI (through ``GET /v1/kinds``) read a kind's row; none of them
tests a kind's name. A new kind is one row here, one ``JobKind`` member (the
spec's schema; a test keeps the two equal) and one runner module.

Words used here:

- *runner*: the module under ``raylane.jobs`` whose ``run(ctx)`` the driver
  (``python -m raylane.jobs.run``) calls, its entrypoint an import path. None
  for a kind whose entrypoint is a shell command that is the driver itself.
- *elastic*: independent workers that scale into what is free, so admission
  needs one worker's room. Not elastic is a *gang*: all workers or none.
- *spot-first*: without GPUs, routed to a spot group first, on-demand as the
  soft fallback.
- *checkpoints*: asked to checkpoint when a node it runs on drains.
- *serves*: long-running, answering on a route the reconciler records.
- *strategy*: the placement-group strategy of its workers. ``STRICT_PACK``
  co-locates a multi-worker GPU gang on one node; without GPUs or with one
  worker such a kind packs (``PACK``).
- *section*: the ``JobSpec`` field that belongs to this kind: only it may carry
  it, and it must unless *section_required* is False (a service without one
  takes the defaults).
- *cost basis*: what accounting measures its cost against to suggest a cheaper
  placement: ``held`` (only what it held), ``spot`` (independent work: its
  on-demand hours priced on the spot twin), ``entrypoint`` (a GPU held by a
  shell command that names no GPU framework was probably unused).

The table is keyed by the kind's name; ``traits`` takes a ``JobKind`` or a
name, so a kind that exists only as a row (a test's) is read the same way.
This module imports nothing of Raylane's: the client, the runner inside Ray and
the control plane all read it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Literal

Strategy = Literal["STRICT_PACK", "PACK", "SPREAD"]
CostBasis = Literal["held", "spot", "entrypoint"]


@dataclass(frozen=True)
class KindTraits:
    name: str
    summary: str  # one line for a user choosing a kind
    runner: str | None
    elastic: bool
    spot_first: bool
    checkpoints: bool
    serves: bool
    strategy: Strategy
    section: str | None
    cost_basis: CostBasis
    section_required: bool = True
    # Raylane may stop it for a job within its guarantee or of higher priority, after
    # a grace period to checkpoint (docs/sharing.md); a service answers requests and is never.
    preemptible: bool = True

    @property
    def entrypoint(self) -> str:
        """What the spec's entrypoint is: an import path for a runner, else a shell command."""
        return "import path" if self.runner else "shell command"

    def public(self) -> dict[str, Any]:
        """The traits a user choosing a kind cares about (``GET /v1/kinds``)."""
        out = asdict(self)
        del out["runner"]
        out["entrypoint"] = self.entrypoint
        return out


# Why the rows say what they say: training functions and sweep trials can save a
# checkpoint when asked; a batch run rewrites its output and a command or a service
# has none. Sweep trials and inference batches are independent (elastic, SPREAD,
# cheaper on spot); a training gang is tightly coupled (STRICT_PACK co-locates its
# GPUs). A service tolerates losing a replica, so it starts on spot too.
KINDS: dict[str, KindTraits] = {t.name: t for t in (
    KindTraits("training", "N workers x G GPUs, gang-scheduled and tightly coupled",
               runner="raylane.jobs.training", elastic=False, spot_first=False, checkpoints=True, serves=False,
               strategy="STRICT_PACK", section=None, cost_basis="held"),
    KindTraits("sweep", "Ray Tune trials: independent and interruptible",
               runner="raylane.jobs.sweep", elastic=True, spot_first=True, checkpoints=True, serves=False,
               strategy="SPREAD", section="sweep", cost_basis="spot"),
    KindTraits("batch_inference", "Ray Data map over batches of an input dataset",
               runner="raylane.jobs.batch_inference", elastic=True, spot_first=True, checkpoints=False,
               serves=False, strategy="SPREAD", section="batch", cost_basis="spot"),
    KindTraits("service", "a Ray Serve application, long-running",
               runner="raylane.jobs.service", elastic=False, spot_first=True, checkpoints=False, serves=True,
               strategy="PACK", section="service", cost_basis="held", section_required=False,
               preemptible=False),
    KindTraits("command", "any shell entrypoint, like `ray job submit -- ...`",
               runner=None, elastic=False, spot_first=False, checkpoints=False, serves=False,
               strategy="PACK", section=None, cost_basis="entrypoint"),
    KindTraits("function", "one call of a Python function with the spec's args; its return value is the result",
               runner="raylane.jobs.function", elastic=False, spot_first=False, checkpoints=False, serves=False,
               strategy="PACK", section=None, cost_basis="held"),
)}


class UnknownKind(LookupError):
    """A kind with no row: refused where it enters, never guessed."""


def traits(kind: str) -> KindTraits:
    """The row of ``kind`` (a ``JobKind`` or its name). Raises ``UnknownKind``."""
    row = KINDS.get(getattr(kind, "value", kind))
    if row is None:
        raise UnknownKind(f"no job kind {str(kind)!r}; kinds are: {', '.join(KINDS)}")
    return row


def sections() -> set[str]:
    """Every spec section some kind requires."""
    return {t.section for t in KINDS.values() if t.section}
