"""Failure classification from what Ray reports (no cluster needed)."""

from __future__ import annotations

from raylane.orchestrator.backends.ray_jobs import RayJob, RayNode
from raylane.orchestrator.loops.classify import _tail, classify
from raylane.orchestrator.domain import protocol
from raylane.orchestrator.domain.states import FailureCause

NID = "f035050c9f16273808ca3ef01e9871cae75a7e3e50337d23b147c710"


def job(msg: str, error_type="JOB_ENTRYPOINT_COMMAND_ERROR", exit_code=1, driver="aa" * 28) -> RayJob:
    return RayJob("raylane-x-1", "FAILED", msg, error_type, 1, 2, driver, exit_code, {})


def node(nid: str, market: str | None, state="DEAD") -> RayNode:
    labels = {"ray.io/market-type": market, "ray.io/node-group": "g"} if market else {}
    return RayNode(nid, state, labels, {}, False, "UNEXPECTED_TERMINATION", "missed heartbeats", False)


def test_worker_lost_with_a_spot_node_is_a_preemption():
    msg = f"Traceback\nThe actor died because its node has died. Node Id: {NID}\n\tthe actor's node was terminated"
    assert classify(job(msg), {NID: node(NID, "SPOT")})[0] is FailureCause.PREEMPTED
    assert classify(job(msg), {NID: node(NID, "ON_DEMAND")})[0] is FailureCause.NODE_LOST


def test_driver_node_death_uses_the_placement_market_when_labels_are_gone():
    d = "bb" * 28
    rj = job("", error_type="JOB_SUPERVISOR_ACTOR_DIED", exit_code=None, driver=d)
    assert classify(rj, {d: node(d, None)}, driver_market="SPOT")[0] is FailureCause.PREEMPTED
    assert classify(rj, {d: node(d, None)}, driver_market="ON_DEMAND")[0] is FailureCause.NODE_LOST


def test_other_causes():
    assert classify(None, {})[0] is FailureCause.LOST
    assert classify(job("x", exit_code=137), {})[0] is FailureCause.OOM
    assert classify(job("boom", error_type="RUNTIME_ENV_SETUP_FAILURE"), {})[0] is FailureCause.RUNTIME_ENV
    assert classify(job("ValueError: bad"), {})[0] is FailureCause.APP_ERROR
    assert classify(job("x"), {}, timed_out=True)[0] is FailureCause.TIMEOUT


def test_an_attempt_raylane_stopped_keeps_its_cause_when_ray_forgot_it():
    """Cancelled (or timed out), then Ray has no record of it: still what Raylane
    asked for, not LOST (the cancel is checked before Ray's silence)."""
    assert classify(None, {}, cancelled=True)[0] is FailureCause.CANCELLED
    assert classify(None, {}, timed_out=True)[0] is FailureCause.TIMEOUT


def test_reason_quotes_the_exception_not_the_chatter_after_it():
    log = "start\nTraceback (most recent call last):\n  File x\nValueError: lr must be > 0\n(trainable pid=1) chatter\n"
    assert _tail(log) == "ValueError: lr must be > 0"


def test_an_on_demand_node_that_was_draining_when_it_died_was_preempted():
    """Ray's drain API warned of it (a preemption notice); a node killed after the
    notice often dies with plain missed heartbeats, so what Raylane saw counts."""
    import dataclasses

    d = "cc" * 28
    rj = job("", error_type="JOB_SUPERVISOR_ACTOR_DIED", exit_code=None, driver=d)
    warned = dataclasses.replace(node(d, "ON_DEMAND"), drained=True)
    cause, msg = classify(rj, {d: warned})
    assert cause is FailureCause.PREEMPTED and "drained node" in msg
    assert classify(rj, {d: node(d, "ON_DEMAND")})[0] is FailureCause.NODE_LOST
    msg = f"The actor died because its node has died. Node Id: {NID}\n"
    assert classify(job(msg), {NID: dataclasses.replace(node(NID, "ON_DEMAND"), drained=True)})[0] \
        is FailureCause.PREEMPTED


def test_a_supervisor_gone_before_its_node_is_declared_dead_is_the_nodes_fault():
    """Ray's job manager may find the supervisor actor gone ("failed to get job
    supervisor", a START_FAILURE) seconds before the GCS marks the node dead."""
    import dataclasses

    d = "dd" * 28
    rj = job("Unexpected error occurred: failed to get job supervisor.",
             error_type="JOB_SUPERVISOR_ACTOR_START_FAILURE", exit_code=None, driver=d)
    alive = node(d, "ON_DEMAND", state="ALIVE")
    assert classify(rj, {d: alive})[0] is FailureCause.NODE_LOST
    assert classify(rj, {d: dataclasses.replace(alive, drained=True)})[0] is FailureCause.PREEMPTED
    assert classify(rj, {d: node(d, "SPOT", state="ALIVE")})[0] is FailureCause.PREEMPTED
    setup_failed = job("runtime env setup failed", error_type="JOB_SUPERVISOR_ACTOR_START_FAILURE")
    assert classify(setup_failed, {})[0] is FailureCause.RUNTIME_ENV


def test_a_runner_of_another_version_is_a_runtime_env_failure_not_the_jobs():
    """The runner refuses a control plane of another version with its own exit
    code and line; a command that happens to exit with the same code is the job's."""
    line = f"{protocol.VERSION_MISMATCH_MARKER} the control plane runs raylane 0.2.0 (protocol 1), this node has ..."
    code = protocol.EXIT_VERSION_MISMATCH
    msg = f"Job entrypoint command failed with exit code {code}, last available logs:\n{line}\n"
    cause, why = classify(job(msg, exit_code=protocol.EXIT_VERSION_MISMATCH), {})
    assert cause is FailureCause.RUNTIME_ENV and why == line
    assert classify(job("exit 78", exit_code=protocol.EXIT_VERSION_MISMATCH), {})[0] is FailureCause.APP_ERROR


def test_a_job_ray_did_not_start_in_time_is_lost_not_an_app_error():
    rj = job("Job supervisor actor failed to start within 900.0 seconds.",
             error_type="JOB_SUPERVISOR_ACTOR_START_TIMEOUT", exit_code=None, driver=None)
    assert classify(rj, {})[0] is FailureCause.LOST
