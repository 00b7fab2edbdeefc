"""A job's status change runs the registered after-effects (``store.effects``),
in order, in its transaction: the policy lists tallies, the webhook outbox,
arrays and dependents; a new rule is a registration, not an edit of
``transition``; and no change is written without the policy loaded."""

from __future__ import annotations

import pytest

from raylane.orchestrator.domain.specs import JobSpec
from raylane.orchestrator.domain.states import JobStatus
from raylane.orchestrator.store import db, effects, jobs as store, policy
from raylane.orchestrator.store.transitions import transition

SPEC = JobSpec(name="t", kind="command", entrypoint="true")


def test_the_policy_registers_each_rule_once_in_order():
    assert [e.name for e in effects.rules()] == ["tallies", "outbox", "arrays", "dependencies"]
    assert [m.__name__.rsplit(".", 1)[-1] for m in policy.RULE_MODULES] == ["tallies", "webhooks", "arrays",
                                                                           "dependencies"]
    # An end's rules: all four; a move between live statuses: the two that count and notify.
    assert [e.name for e in effects.rules(JobStatus.FAILED)] == ["tallies", "outbox", "arrays", "dependencies"]
    assert [e.name for e in effects.rules(JobStatus.RUNNING)] == ["tallies", "outbox"]


def test_a_registered_rule_runs_in_the_changes_transaction_after_the_others(cp, monkeypatch):
    seen: list[tuple[str, str, str, bool]] = []
    monkeypatch.setattr(effects, "_RULES", dict(effects._RULES))  # the registry as it was, after the test
    monkeypatch.setattr(effects, "_ORDERED", effects._ORDERED)
    effects.register(effects.Effect("audit", 99, lambda m: seen.append(
        (m.job_id, m.src.value, m.to.value, m.event_id is not None)), to=frozenset({JobStatus.CANCELLING})))
    with db.transaction(cp.sessions) as s:
        jid = store.submit(s, SPEC)[0]
        transition(s, jid, JobStatus.DISPATCHING, reason="admitted", actor="test")
        assert seen == []  # not a status it acts on
        transition(s, jid, JobStatus.CANCELLING, reason="stop", actor="test")
    assert seen == [(jid, "DISPATCHING", "CANCELLING", True)]
    assert [e.name for e in effects.rules()][-1] == "audit"


def test_no_change_is_written_without_the_policy(cp, monkeypatch):
    with db.transaction(cp.sessions) as s:
        jid = store.submit(s, SPEC)[0]
    monkeypatch.setattr(effects, "installed", False)
    with pytest.raises(RuntimeError, match="store.policy"):
        with db.transaction(cp.sessions) as s:
            transition(s, jid, JobStatus.DISPATCHING, reason="admitted", actor="test")
