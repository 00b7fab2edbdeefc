"""Job and attempt statuses, the arrows allowed between them, and what follows
each failure cause.

This is the one place that says which status changes are legal and what comes
after an attempt fails. The only code that writes a job's status is
``raylane.orchestrator.store.transitions.transition``, and the only code that
writes an attempt's is ``transitions.set_attempt``; both turn the tables below
into a compare-and-set
(``UPDATE ... SET status=:to WHERE id=:id AND status IN (:allowed_from)``).
The loops report what they observed (``store.lifecycle``); ``decide`` says what
the job does next.

Job arrows (every one the code takes)::

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

Attempt arrows (an attempt is one Ray job; its status is Raylane's record of
what Ray said, plus CLAIMED before Ray heard of it and LOST when Ray forgot it)::

    CLAIMED    -> SUBMITTED   Ray accepted the submission (or already had it)
    CLAIMED    -> FAILED      Ray refused the submission (SUBMIT_ERROR)
    CLAIMED    -> STOPPED     cancelled before the submission reached Ray
    SUBMITTED  -> PENDING     Ray holds it, the driver has not started
    SUBMITTED  -> RUNNING     the driver started (PENDING may pass unseen)
    PENDING    -> RUNNING     the driver started
    SUBMITTED, PENDING, RUNNING -> SUCCEEDED | FAILED | STOPPED   as Ray reports it
    SUBMITTED, PENDING, RUNNING -> LOST        Ray has no record of it any more

Nomenclature: an *attempt* is one Ray job (one dispatch); a job has one or more.
*Active* statuses hold or may soon hold cluster capacity; *terminal* ones never
change; *live* attempts are the ones Ray may be running. A *cause* is why an
attempt ended badly; its *rule* says whether it is retried, whether it spends
one of the spec's ``max_attempts`` (infrastructure causes do not), its backoff
and its bound.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from raylane.orchestrator.domain.specs import RetryPolicy


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

    def __str__(self) -> str:  # print(job.status) says PENDING, as Ray's JobStatus does
        return self.value

    def is_terminal(self) -> bool:
        return self in TERMINAL


class AttemptStatus(str, Enum):
    """One attempt's status. The values after CLAIMED are Ray's own job statuses
    (stored as they are; costs read them), LOST is Raylane's."""

    CLAIMED = "CLAIMED"  # admitted and leased; not yet accepted by Ray
    SUBMITTED = "SUBMITTED"  # Ray accepted it
    PENDING = "PENDING"  # Ray waits to start its driver
    RUNNING = "RUNNING"  # its driver runs
    SUCCEEDED = "SUCCEEDED"  # the driver exited 0 (terminal)
    FAILED = "FAILED"  # the driver failed, or Ray refused the submission (terminal)
    STOPPED = "STOPPED"  # stopped: by Raylane, by someone in Ray, or before it reached Ray (terminal)
    LOST = "LOST"  # Ray has no record of it (its head restarted without GCS FT) (terminal)

    def __str__(self) -> str:
        return self.value

    def is_terminal(self) -> bool:
        return self in ATTEMPT_TERMINAL


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
    SCALE_UP_TIMEOUT = "SCALE_UP_TIMEOUT"  # submitted ahead of a scale-up that did not come in time
    CLUSTER_LOST = "CLUSTER_LOST"  # its fleet cluster was unreachable past the grace (docs/fleet.md)
    # stopped after its grace period for a job within its guarantee or of higher priority (docs/sharing.md)
    PREEMPTED_BY_PRIORITY = "PREEMPTED_BY_PRIORITY"


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

_ENDS = frozenset({AttemptStatus.SUCCEEDED, AttemptStatus.FAILED, AttemptStatus.STOPPED, AttemptStatus.LOST})
ATTEMPT_ALLOWED: dict[AttemptStatus, frozenset[AttemptStatus]] = {
    # LOST: claimed for a fleet's cluster that was lost before Raylane knew whether it took it (CLUSTER_LOST).
    AttemptStatus.CLAIMED: frozenset({AttemptStatus.SUBMITTED, AttemptStatus.FAILED, AttemptStatus.STOPPED,
                                      AttemptStatus.LOST}),
    AttemptStatus.SUBMITTED: frozenset({AttemptStatus.PENDING, AttemptStatus.RUNNING}) | _ENDS,
    AttemptStatus.PENDING: frozenset({AttemptStatus.RUNNING}) | _ENDS,
    AttemptStatus.RUNNING: _ENDS,
    AttemptStatus.SUCCEEDED: frozenset(),
    AttemptStatus.FAILED: frozenset(),
    AttemptStatus.STOPPED: frozenset(),
    AttemptStatus.LOST: frozenset(),
}
ATTEMPT_TERMINAL = _ENDS
# The attempts Ray may be running: the reconciler asks Ray about each.
ATTEMPT_LIVE = frozenset({AttemptStatus.SUBMITTED, AttemptStatus.PENDING, AttemptStatus.RUNNING})

# Infrastructure failures are retried without spending max_attempts; this many
# beyond max_attempts a job gives up all the same, so a broken cluster (a spot
# group reclaimed over and over, a head that keeps restarting) cannot loop a job
# forever.
MAX_INFRA_RETRIES = 10


class Backoff(str, Enum):
    NONE = "none"  # not retried, so no wait
    EXPONENTIAL = "exponential"  # retry.backoff_s * 2^(n-1), at most retry.max_backoff_s


class Bound(str, Enum):
    NONE = "none"  # not retried
    MAX_ATTEMPTS = "max_attempts"  # counted against the spec's retry.max_attempts
    INFRA = "max_attempts + MAX_INFRA_RETRIES"  # all attempts, of any cause


@dataclass(frozen=True)
class CauseRule:
    """What follows an attempt that ended with one cause."""

    retried: bool
    spends_attempt: bool  # counts against retry.max_attempts
    backoff: Backoff
    bound: Bound
    only_if: str | None = None  # the RetryPolicy switch that must be on for a retry
    why: str = ""


_INFRA = dict(retried=True, spends_attempt=False, backoff=Backoff.EXPONENTIAL, bound=Bound.INFRA)
_NEVER = dict(retried=False, spends_attempt=True, backoff=Backoff.NONE, bound=Bound.NONE)

CAUSES: dict[FailureCause, CauseRule] = {
    FailureCause.PREEMPTED: CauseRule(**_INFRA, why="the cluster's fault; resumes from its checkpoint"),
    FailureCause.NODE_LOST: CauseRule(**_INFRA, why="the cluster's fault; resumes from its checkpoint"),
    FailureCause.LOST: CauseRule(**_INFRA, why="Ray forgot the attempt; resumes from its checkpoint"),
    FailureCause.APP_ERROR: CauseRule(retried=True, spends_attempt=True, backoff=Backoff.EXPONENTIAL,
                                      bound=Bound.MAX_ATTEMPTS, only_if="retry_app_errors",
                                      why="the user's bug; retrying by default wastes GPUs"),
    FailureCause.OOM: CauseRule(**_NEVER, why="the same job runs out of memory again"),
    FailureCause.RUNTIME_ENV: CauseRule(**_NEVER, why="the same runtime_env fails again"),
    FailureCause.TIMEOUT: CauseRule(**_NEVER, why="timeout_s is the user's limit"),
    FailureCause.CANCELLED: CauseRule(**_NEVER, why="someone asked it to stop"),
    FailureCause.SUBMIT_ERROR: CauseRule(retried=False, spends_attempt=False, backoff=Backoff.NONE,
                                         bound=Bound.NONE,
                                         why="Ray refused it; an unreachable Ray is no error (the same "
                                             "attempt is submitted again once its lease expires)"),
    FailureCause.UNSCHEDULABLE: CauseRule(**_NEVER, why="it can never fit the cluster profile"),
    FailureCause.SCALE_UP_TIMEOUT: CauseRule(**_NEVER, why="the autoscaler did not add the node in time; "
                                             "another attempt would wait for the same node (on a fleet, "
                                             "the job moves to its next cluster instead)"),
    FailureCause.CLUSTER_LOST: CauseRule(retried=True, spends_attempt=False, backoff=Backoff.NONE,
                                         bound=Bound.INFRA, why="its cluster is gone, not the job: placed again on "
                                         "another cluster at once, resuming from its checkpoint"),
    FailureCause.PREEMPTED_BY_PRIORITY: CauseRule(
        retried=True, spends_attempt=False, backoff=Backoff.NONE, bound=Bound.INFRA,
        why="Raylane stopped it for a job within its guarantee or of higher priority: queued again at once, "
            "resuming from its checkpoint (on a fleet, on rented capacity if its policy allows)"),
}

# Retried at once, placed again (on a fleet: on another cluster when one can take
# it): nothing is known to be wrong with the job or where it ran.
MOVES_AT_ONCE = frozenset({FailureCause.CLUSTER_LOST, FailureCause.PREEMPTED_BY_PRIORITY})
# Causes that are the cluster's fault, not the job's: they do not spend max_attempts.
INFRASTRUCTURE_CAUSES = frozenset(c for c, rule in CAUSES.items() if not rule.spends_attempt)


@dataclass(frozen=True)
class Decision:
    """What a job does after an attempt ended badly."""

    status: JobStatus  # RETRYING, FAILED or CANCELLED
    reason: str
    delay_s: float = 0.0  # before the next attempt may be admitted


def backoff(policy: RetryPolicy, n: int) -> float:
    """The wait before attempt ``n + 1``: exponential in the attempts made, capped."""
    return min(policy.backoff_s * (2 ** max(0, n - 1)), policy.max_backoff_s)


def decide(cause: FailureCause, policy: RetryPolicy, *, attempts_done: int, app_attempts: int,
           cancelling: bool = False, elsewhere: bool = False) -> Decision:
    """The job's next status after an attempt ended with ``cause``.

    ``attempts_done`` counts every attempt made, this one included;
    ``app_attempts`` those that spent ``max_attempts`` (this one included if it
    does). A job being cancelled ends CANCELLED whatever the cause. ``elsewhere``:
    the job is on a fleet of several clusters, where a scale-up that did not come
    in time moves it to its next candidate instead of failing it (the fleet's
    placer fails it once no candidate is left).
    """
    if cancelling:
        return Decision(JobStatus.CANCELLED, "Ray stopped the attempt")
    if elsewhere and cause is FailureCause.SCALE_UP_TIMEOUT:
        # A fleet (``elsewhere``): the nomination moves to the job's next candidate cluster.
        return Decision(JobStatus.RETRYING, "SCALE_UP_TIMEOUT: its nomination moves to the next cluster of its "
                                            "candidates (not counted against max_attempts)")
    rule = CAUSES[cause]
    if not rule.retried:
        return Decision(JobStatus.FAILED, f"{cause.value} is not retried")
    if rule.only_if and not getattr(policy, rule.only_if):
        return Decision(JobStatus.FAILED, f"{cause.value} is not retried: retry.{rule.only_if} is off")
    if rule.bound is Bound.INFRA:
        if attempts_done >= policy.max_attempts + MAX_INFRA_RETRIES:
            return Decision(JobStatus.FAILED, f"{attempts_done} attempts; giving up on infrastructure failures")
        why = f"{cause.value}: retrying (infrastructure failures do not count against max_attempts)"
    else:
        if app_attempts >= policy.max_attempts:
            return Decision(JobStatus.FAILED, f"{app_attempts} of {policy.max_attempts} attempts used")
        why = f"{cause.value}: attempt {app_attempts} of {policy.max_attempts} failed; retrying"
    delay = backoff(policy, attempts_done) if rule.backoff is Backoff.EXPONENTIAL else 0.0
    return Decision(JobStatus.RETRYING, why, delay)


def cause_table_markdown() -> str:
    """The cause rules as the markdown table docs/reliability.md shows."""
    yes = {True: "yes", False: "no"}
    bounds = {Bound.NONE: "—", Bound.MAX_ATTEMPTS: "`max_attempts` of such attempts",
              Bound.INFRA: f"`max_attempts` + {MAX_INFRA_RETRIES} attempts in all (`MAX_INFRA_RETRIES`)"}
    backoffs = {Backoff.NONE: "—", Backoff.EXPONENTIAL: "`backoff_s` × 2^(n−1), at most `max_backoff_s`"}
    lines = ["| Cause | Retried | Spends `max_attempts` | Backoff | Bound | Why |", "|---|---|---|---|---|---|"]
    for cause, r in CAUSES.items():
        retried = f"only with `retry.{r.only_if}`" if r.only_if else yes[r.retried]
        lines.append(f"| `{cause.value}` | {retried} | {yes[r.spends_attempt]} | {backoffs[r.backoff]} | "
                     f"{bounds[r.bound]} | {r.why} |")
    return "\n".join(lines) + "\n"


def allowed_from(to: JobStatus) -> frozenset[JobStatus]:
    """Every status from which ``to`` may be reached."""
    return frozenset(src for src, dsts in ALLOWED.items() if to in dsts)


def attempt_allowed_from(to: AttemptStatus) -> frozenset[AttemptStatus]:
    """Every attempt status from which ``to`` may be reached."""
    return frozenset(src for src, dsts in ATTEMPT_ALLOWED.items() if to in dsts)


def _check_table() -> None:
    assert set(ALLOWED) == set(JobStatus), "every status needs a row"
    for s in TERMINAL:
        assert not ALLOWED[s], f"terminal {s} must have no exits"
    assert set(ATTEMPT_ALLOWED) == set(AttemptStatus), "every attempt status needs a row"
    for a in ATTEMPT_TERMINAL:
        assert not ATTEMPT_ALLOWED[a], f"terminal attempt status {a} must have no exits"
    assert set(CAUSES) == set(FailureCause), "every failure cause needs a rule"
    for c, r in CAUSES.items():
        assert (r.bound is Bound.NONE) == (not r.retried), f"{c}: a bound exactly when retried"
        # ... and a backoff when retried, but for a cause that moves the job to another cluster at once
        assert (r.backoff is Backoff.NONE) == (not r.retried or c in MOVES_AT_ONCE), \
            f"{c}: a backoff exactly when retried"
        assert not r.retried or (r.bound is Bound.INFRA) == (not r.spends_attempt), \
            f"{c}: a retry that spends no attempt needs the infrastructure bound"


_check_table()
