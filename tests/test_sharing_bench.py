"""bench/sharing.py (issue 46): its trace is seeded, two projects' bursts of
valid 1-GPU training specs, and ``--quick`` ends with one JSON object keyed by
policy whose figures are sane (every job finished, no preemption under strict
quotas, utilisation within [0, 1]). No Ray: the bench replays on the in-memory
``FakeRay``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from bench.sharing import PROJECTS, QUICK_WINDOW_S, trace
from raylane.orchestrator.domain.specs import JobSpec

ROOT = Path(__file__).resolve().parent.parent


def test_the_same_seed_gives_the_same_trace_and_another_seed_another():
    a, b = trace(46), trace(46)
    assert [(j.at_s, j.project, j.duration_s, j.spec) for j in a] == [(j.at_s, j.project, j.duration_s, j.spec)
                                                                       for j in b]
    assert [j.at_s for j in trace(47)] != [j.at_s for j in a]


def test_both_projects_send_valid_one_gpu_training_jobs():
    jobs = trace(46)
    assert {j.project for j in jobs} == set(PROJECTS)
    assert all(j.duration_s >= 300 for j in jobs)
    for j in jobs:
        spec = JobSpec.model_validate(j.spec)  # what the bench submits, the API would accept
        assert spec.kind.value == "training" and spec.resources.num_workers == 1
        assert spec.resources.gpus_per_worker == 1


def test_quick_prints_its_figures_as_one_json_object_keyed_by_policy():
    assert trace(46, window_s=QUICK_WINDOW_S)
    # ~5 s alone; the timeout only guards a hang (in CI this tier runs niced beside the cluster
    # tests, where fleet_trace's --quick once took 7x as long as alone)
    out = subprocess.run([sys.executable, "bench/sharing.py", "--quick"], cwd=ROOT, capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    res = json.loads(out.stdout.strip().splitlines()[-1])
    assert {"strict", "sharing", "ratios", "goals"} <= set(res)
    for policy in ("strict", "sharing"):
        f = res[policy]
        assert f["finished"] == f["jobs"] > 0
        assert 0 < f["gpu_util"] <= 1 and 0 < f["gpu_util_useful"] <= f["gpu_util"]
        assert f["wait_s"]["p95"] is not None and f["wait_within_guarantee_s"]["n"] >= 1
        assert f["gpu_s_lost"] >= 0 and f["preemptions"] >= 0
    # Strict quotas never preempt, lose nothing, and hold one GPU per project at most.
    assert res["strict"]["preemptions"] == res["strict"]["gpu_s_lost"] == res["strict"]["retried"] == 0
    # The same work both ways: GPU-seconds differ only by what preemption lost.
    assert abs(res["sharing"]["gpu_s"] - res["sharing"]["gpu_s_lost"] - res["strict"]["gpu_s"]) < 1.0
    assert set(res["goals"]) == {"sharing_gpu_util_vs_strict", "sharing_gpu_util_while_waiting_vs_strict",
                                 "sharing_p95_wait_within_guarantee_s"}
    assert res["ratios"]["gpu_util"] > 1  # borrowing an idle GPU never makes the makespan longer here
