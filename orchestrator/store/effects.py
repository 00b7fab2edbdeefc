"""The after-effects of a job's status change, as an ordered list of rules (in
the spirit of Prefect's ``core_policy``): ``transitions.transition`` writes the
change and its event, then runs every registered rule whose ``to`` set holds the
new status, in ``order``, in the same transaction.

Each rule lives with the table it writes and registers itself here when its
module is imported (``tallies``, the webhook outbox in ``webhooks``, ``arrays``,
``dependencies``); ``store.policy`` imports them all, and ``transition`` refuses
to run without it, so a change is never written without its effects. This
module imports nothing of the store: the rules' modules may call ``transition``
(``dependencies`` cancels a broken chain) without an import circle.

Adding an effect: a function of ``Moved`` in the module whose rows it writes,
``register(Effect(...))`` below it, and its module in ``store.policy``.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Callable

from raylane.orchestrator.domain.states import JobStatus

if TYPE_CHECKING:  # the store alone imports SQLAlchemy; this module needs only the name
    from sqlalchemy.orm import Session


@dataclass(frozen=True)
class Moved:
    """One job's status change, as its effects see it."""

    session: "Session"
    job_id: str
    src: JobStatus
    to: JobStatus
    src_group: str | None
    to_group: str | None
    array_id: str | None
    event_id: int | None  # None in a batch (``transition_many``): the events are written with the commit
    now: datetime
    cascade: bool  # False while ``dependencies`` walks a chain itself


@dataclass(frozen=True)
class Effect:
    name: str
    order: int  # lower runs first
    run: Callable[[Moved], Any]
    to: frozenset[JobStatus] | None = None  # the statuses it acts on; None: every change
    # In a batch of moves (``transition_many``): whether this rule needs each move's
    # own event now (a webhook wants it), which sends the batch one ``transition`` at
    # a time. None: the rule runs in a batch as it is, with ``event_id`` None.
    wants_events: Callable[["Session", set[str], JobStatus], bool] | None = None

    def applies(self, to: JobStatus) -> bool:
        return self.to is None or to in self.to


_RULES: dict[str, Effect] = {}
_ORDERED: tuple[Effect, ...] = ()
installed = False  # set by store.policy once every rule's module is imported


def register(effect: Effect) -> Effect:
    """Add (or replace, by name) a rule."""
    global _ORDERED
    _RULES[effect.name] = effect
    _ORDERED = tuple(sorted(_RULES.values(), key=lambda e: (e.order, e.name)))
    return effect


def rules(to: JobStatus | None = None) -> tuple[Effect, ...]:
    """The rules in order (those acting on ``to``, if given)."""
    if not installed:
        raise RuntimeError("a job's status changed without its effects: import raylane.orchestrator.store.policy")
    return _ORDERED if to is None else tuple(e for e in _ORDERED if e.applies(to))
