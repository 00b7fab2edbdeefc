"""The driver entrypoint of every non-command job: ``python -m raylane.jobs.run``.

Reads the job from the environment the dispatcher set
(``raylane.orchestrator.domain.protocol``), refuses inputs from a control plane
of another version, runs the runner of its kind, and leaves the result in Ray's
key-value store for the reconciler."""

from __future__ import annotations

import importlib
import json
import logging
import os
import shutil
import sys
import time

_T0 = time.time()  # this module imported: the interpreter is up (before Raylane's and the user's imports)

from raylane.jobs.base import RunContext, load_callable, report_result
from raylane.jobs.storage import scratch_dir
from raylane.jobs.metrics import JobMetrics
from raylane.orchestrator.domain import protocol
from raylane.orchestrator.domain.kinds import KINDS


def process_started_at() -> float | None:
    """When this process started (Linux: /proc), so the timing line counts Python's own start too."""
    try:
        with open("/proc/self/stat") as f:
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/stat") as f:
            boot = next(int(x.split()[1]) for x in f if x.startswith("btime "))
        return boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, StopIteration):
        return None


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s raylane.%(name)s: %(message)s")
    try:
        ctx = RunContext.from_env()
    except protocol.VersionMismatchError as e:
        # Before any user code or cluster resource: the reconciler reads this
        # exit code and message as RUNTIME_ENV, not as the job's own error.
        print(e, file=sys.stderr, flush=True)
        return protocol.EXIT_VERSION_MISMATCH
    row = KINDS.get(ctx.spec.kind.value)
    if row is None or row.runner is None:
        print(f"raylane: no runner for kind {ctx.spec.kind.value!r} in this version", file=sys.stderr)
        return 2
    marks = {"start": process_started_at() or _T0, "python": _T0}
    runner = importlib.import_module(row.runner)
    # Import the user's code before ray.init(): in a Ray job driver, ray.init()
    # can replace the extracted working_dir that is this process's cwd (seen with
    # Ray 2.60), after which imports from it fail. Importing first also turns a
    # bad entrypoint into a clear error before any cluster resources are taken.
    load_callable(ctx.spec.entrypoint)
    marks["imports"] = time.time()
    # ... and leave that directory: even later, Ray may delete it under a
    # running driver, and anything that resolves a relative path (Tune's
    # results, os.path.abspath) then fails. Workers get the working_dir from the
    # job's runtime_env, not from our cwd, so this changes nothing for them.
    # A node-local directory: the job's storage may be a bucket, and what a
    # driver writes by relative path is scratch, not storage.
    scratch = scratch_dir(ctx.submission_id)
    os.chdir(scratch)
    try:
        import ray

        # Where several Ray nodes share a host (the local cluster), the node names its
        # own address: without it Ray attaches a driver to the head's raylet, wherever
        # its job supervisor runs. On a real cluster it is unset and Ray decides.
        ray.init(log_to_driver=True, _node_ip_address=os.environ.get(protocol.Env.NODE_IP) or None)
        marks["ray_init"] = time.time()
        progress = JobMetrics.start(ctx)  # Ray custom metrics tagged with the job (jobs/metrics.py)
        marks["metrics"] = time.time()
        result = runner.run(ctx)
        marks["run"] = time.time()
        progress.finish(result or {})
        report_result(ctx.submission_id, result or {})
        marks["report"] = time.time()
        print_timing(marks)
        return 0
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def print_timing(marks: dict[str, float]) -> None:
    """One log line with the seconds of each phase of this driver (bench/sweep_vs_tune.py
    reads it): where a job's own overhead goes, next to the user's code in ``run``."""
    names = list(marks)
    phases = {b: round(marks[b] - marks[a], 3) for a, b in zip(names, names[1:])}
    print("raylane: timing " + json.dumps(phases), flush=True)


if __name__ == "__main__":
    sys.exit(main())
