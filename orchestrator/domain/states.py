"""Job statuses, the arrows allowed between them, and failure causes.

This is the one place that says which status changes are legal. The only code
that writes a job's status is ``raylane.orchestrator.store.transitions.transition``,
which turns the table below into a compare-and-set
(``UPDATE jobs SET status=:to WHERE id=:id AND status IN (:allowed_from)``)
and writes an event row for every change.

Arrows (every one the code takes)::

    PENDING      -> DISPATCHING   admitted by the scheduler, claimed by a dispatcher
    PENDING      -> CANCELLED     cancelled before it ran
    PENDING      -> FAILED        can never run (e.g. its node group left the profile)
    DISPATCHING  -> RUNNING       Ray accepted the attempt and its driver started
    DISPATCHING  -> RETRYING      the submission failed in a way worth retrying
    DISPATCHING  -> FAILED        the submission failed and no attempt is left
    DISPATCHING  -> CANCELLING    cancel requested while being submitted
    RUNNING      -> SUCCEEDED     the attempt finished cleanly
    RUNNING      -> RETRYING      the attempt failed; the retry policy allows another
    RUNNING      -> FAILED        the attempt failed; no retry allowed or left
    RUNNING      -> CANCELLING    cancel requested; Ray is told to stop the attempt
    RETRYING     -> DISPATCHING   backoff over, admitted again
    RETRYING     -> CANCELLED     cancelled while waiting for the next attempt
    RETRYING     -> FAILED        can never run again
    CANCELLING   -> CANCELLED     Ray confirmed the attempt stopped (or it never started)

Nomenclature: an *attempt* is one Ray job (one dispatch); a job has one or more.
*Active* statuses hold or may soon hold cluster capacity; *terminal* ones never change.
"""

from __future__ import annotations

from enum import Enum


class JobStatus(str, Enum):
    """The status a user sees."""

    PENDING = "PENDING"  # accepted, waiting for admission; status_reason says why
    DISPATCHING = "DISPATCHING"  # claimed; being submitted to Ray
    RUNNING = "RUNNING"  # Ray runs the current attempt
    RETRYING = "RETRYING"  # an attempt failed; the next waits for backoff and admission
    CANCELLING = "CANCELLING"  # cancel requested; waiting for Ray to stop the attempt
    SUCCEEDED = "SUCCEEDED"  # finished cleanly (terminal)
    FAILED = "FAILED"  # failed with no retry left (terminal)
    CANCELLED = "CANCELLED"  # stopped by a user or timeout (terminal)

    def is_terminal(self) -> bool:
        return self in TERMINAL


class FailureCause(str, Enum):
    """Why an attempt ended badly. The retry policy acts on this."""

    PREEMPTED = "PREEMPTED"  # its spot node was reclaimed or drained
    NODE_LOST = "NODE_LOST"  # an on-demand node died under it
    APP_ERROR = "APP_ERROR"  # the user's code exited non-zero or raised
    OOM = "OOM"  # killed by Ray's memory monitor or the kernel
    RUNTIME_ENV = "RUNTIME_ENV"  # the runtime_env could not be set up
    TIMEOUT = "TIMEOUT"  # ran past the spec's timeout_s
    CANCELLED = "CANCELLED"  # a user cancelled it
    LOST = "LOST"  # Ray forgot the attempt (head restarted without GCS FT)
    SUBMIT_ERROR = "SUBMIT_ERROR"  # Ray refused or could not be reached at submit
    UNSCHEDULABLE = "UNSCHEDULABLE"  # can never fit the cluster profile


ALLOWED: dict[JobStatus, frozenset[JobStatus]] = {
    JobStatus.PENDING: frozenset({JobStatus.DISPATCHING, JobStatus.CANCELLED, JobStatus.FAILED}),
    JobStatus.DISPATCHING: frozenset(
        {JobStatus.RUNNING, JobStatus.RETRYING, JobStatus.FAILED, JobStatus.CANCELLING}
    ),
    JobStatus.RUNNING: frozenset(
        {JobStatus.SUCCEEDED, JobStatus.RETRYING, JobStatus.FAILED, JobStatus.CANCELLING}
    ),
    JobStatus.RETRYING: frozenset({JobStatus.DISPATCHING, JobStatus.CANCELLED, JobStatus.FAILED}),
    JobStatus.CANCELLING: frozenset({JobStatus.CANCELLED}),
    JobStatus.SUCCEEDED: frozenset(),
    JobStatus.FAILED: frozenset(),
    JobStatus.CANCELLED: frozenset(),
}

TERMINAL = frozenset({JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED})
# Waiting for admission: the scheduler's queue.
QUEUED = frozenset({JobStatus.PENDING, JobStatus.RETRYING})
# Holding (or about to hold) cluster capacity.
ACTIVE = frozenset({JobStatus.DISPATCHING, JobStatus.RUNNING, JobStatus.CANCELLING})

# Causes that are the cluster's fault, not the job's: retried without counting
# against the application-error budget.
INFRASTRUCTURE_CAUSES = frozenset(
    {FailureCause.PREEMPTED, FailureCause.NODE_LOST, FailureCause.LOST, FailureCause.SUBMIT_ERROR}
)


def allowed_from(to: JobStatus) -> frozenset[JobStatus]:
    """Every status from which ``to`` may be reached."""
    return frozenset(src for src, dsts in ALLOWED.items() if to in dsts)


def _check_table() -> None:
    assert set(ALLOWED) == set(JobStatus), "every status needs a row"
    for s in TERMINAL:
        assert not ALLOWED[s], f"terminal {s} must have no exits"


_check_table()
