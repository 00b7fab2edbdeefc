"""Classify a failed attempt: from what Ray reports, the ``FailureCause`` and a message.

Pure: it reads a ``RayJob`` (None when Ray has no record of the attempt), Ray's
node list and what Raylane itself asked for (a cancel, a stop after
``timeout_s``), and touches neither Ray nor the database. What follows each
cause is ``states.decide``'s call, not this module's.

Words: the *driver's node* is where Ray ran the job's driver (its supervisor);
a *drained* node got Ray's drain notice (a preemption) before it died; the
*tail* is what went wrong in one line.
"""

from __future__ import annotations

import re

from raylane.orchestrator.backends.ray_jobs import RayJob, RayNode
from raylane.orchestrator.domain import lanes, protocol
from raylane.orchestrator.domain.states import FailureCause

LOG_TAIL_CHARS = 4000  # of the driver's message kept as the attempt's message


def classify(rj: RayJob | None, nodes: dict[str, RayNode], *, timed_out: bool = False,
             cancelled: bool = False, driver_market: str | None = None) -> tuple[FailureCause, str]:
    """Why an attempt ended badly, from what Ray reports (``rj`` None: Ray has
    no record of it) and what Raylane asked for (a cancel, a timeout's stop).

    A driver whose node died is PREEMPTED when that node was spot: by its market
    label, or (Ray's node list drops a dead node's labels) by the market of the
    group the driver was placed on."""
    # Raylane's own requests to stop come first: a cancelled or timed-out attempt
    # that Ray has since forgotten was still cancelled or timed out, not lost.
    if cancelled:
        return FailureCause.CANCELLED, "cancelled"
    if timed_out:
        return FailureCause.TIMEOUT, "ran past timeout_s"
    if rj is None:
        return FailureCause.LOST, "Ray has no record of this attempt (its head restarted without GCS fault tolerance?)"
    msg = (rj.message or "").strip()
    node = nodes.get(rj.driver_node_id or "")
    # The job supervisor gone with its node: Ray says "died", or, when the named
    # actor is already gone by the time its job manager looks (often seconds
    # before the node itself is declared dead), "failed to get job supervisor".
    supervisor_lost = rj.error_type == "JOB_SUPERVISOR_ACTOR_DIED" or (
        rj.error_type == "JOB_SUPERVISOR_ACTOR_START_FAILURE" and "failed to get job supervisor" in msg)
    if node is not None and node.state == "DEAD" or supervisor_lost:
        market = (node.market if node is not None else None) or driver_market
        drained = node is not None and (node.drained or (node.death_reason or "").startswith("AUTOSCALER_DRAIN")
                                        or "preempt" in (node.death_message or "").lower())
        node_name = f"node {node.node_id[:12]}" if node is not None else "node"
        if market == "SPOT" or drained:
            what = "drained" if drained and market != "SPOT" else "spot"
            return FailureCause.PREEMPTED, f"driver's {what} {node_name} went away: " \
                                           f"{(node.death_message or node.death_reason or msg) if node else msg or 'node died'}"
        where = node_name if node else "its node"
        return FailureCause.NODE_LOST, f"driver's {where} died: {(node.death_message if node else msg) or msg}"[:2000]
    if rj.error_type == "JOB_SUPERVISOR_ACTOR_START_TIMEOUT":
        # It waited in Ray's queue past RAY_JOB_START_TIMEOUT_SECONDS (a job queued
        # ahead behind long ones): no code of the job ran, so it is retried as lost.
        return FailureCause.LOST, msg or "Ray did not start it in time"
    if rj.error_type == lanes.HOST_LOST:
        # A warm lane's host ended under the attempt with its node alive (the host
        # was killed or stopped): the attempt is lost with it, not the code's fault.
        return FailureCause.LOST, msg or "its lane host ended"
    if rj.driver_exit_code == protocol.EXIT_VERSION_MISMATCH and protocol.VERSION_MISMATCH_MARKER in msg:
        # The nodes' Raylane is not the control plane's: the runner's own line says which is which.
        return FailureCause.RUNTIME_ENV, msg[msg.index(protocol.VERSION_MISMATCH_MARKER):].splitlines()[0]
    if rj.error_type == "RUNTIME_ENV_SETUP_FAILURE" or (
            rj.error_type == "JOB_SUPERVISOR_ACTOR_START_FAILURE" and "runtime" in msg.lower()) or \
            "is not a valid URI" in msg:
        return FailureCause.RUNTIME_ENV, msg[-LOG_TAIL_CHARS:]
    if rj.driver_exit_code in (137, -9) or "OutOfMemoryError" in msg or "out of memory" in msg.lower():
        return FailureCause.OOM, msg[-LOG_TAIL_CHARS:]
    # The driver lived, but the job died of a worker whose node died (a framework
    # that did not recover from it, e.g. a Ray Data actor lost before it started):
    # the cluster's fault, not the code's.
    m = protocol.RAY_NODE_DIED.search(msg)
    if m:
        dead = nodes.get(m.group(1))
        if dead is not None and (dead.market == "SPOT" or dead.drained):
            return FailureCause.PREEMPTED, f"a worker's spot node {m.group(1)[:12]} went away: {_tail(msg)}"
        return FailureCause.NODE_LOST, f"a worker's node {m.group(1)[:12]} died: {_tail(msg)}"
    return FailureCause.APP_ERROR, msg[-LOG_TAIL_CHARS:]


_EXC_LINE = re.compile(r"^(\w+\.)*\w*(Error|Exception|Exit|Interrupt)\b.*")


def _tail(msg: str, n: int = 3, limit: int = 400) -> str:
    """What went wrong, in one line: the exception line of the last traceback in
    the log if there is one (workers' chatter often follows it), else the last lines."""
    lines = [ln for ln in msg.strip().splitlines() if ln.strip()]
    tb = max((i for i, ln in enumerate(lines) if ln.startswith("Traceback (most recent call last)")), default=None)
    if tb is not None:
        exc = [ln for ln in lines[tb + 1:] if _EXC_LINE.match(ln)]
        if exc:
            return exc[-1][:limit]
    return " | ".join(lines[-n:])[-limit:]
