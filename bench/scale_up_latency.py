"""Submit to RUNNING for a job that needs a scale-up: through Raylane and through
Ray's own JobSubmissionClient, on the same autoscaling local cluster (Ray's
autoscaler v2, fake multi-node provider), same run.

The job: a command holding 1 GPU and 1 CPU on the `gpu` group (0..1 nodes), so
each submit finds the group at zero and Ray's autoscaler must add a node. The
direct path submits it with the same label selector and resources Raylane's
dispatcher sends. Each path: submit, poll every 20 ms until RUNNING (the user's
view: "my job started"), wait for SUCCEEDED, then wait until the autoscaler has
removed the idle node (idle timeout shortened to IDLE_S for this). Pairs
alternate their order (direct first, then Raylane first, ...) so drift on a
shared machine hits both alike. The machine's load is printed before and after.

    python bench/scale_up_latency.py [--pairs 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

import httpx

TOKEN = "rl_bench-admin-token-0123456789"  # auth on, as in production
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import _server  # noqa: E402

POLL_S = 0.02
GROUP = "gpu"
ENTRYPOINT = "sleep 2"
RESOURCES = {"cpus_per_worker": 1, "gpus_per_worker": 1}
IDLE_S = 6  # the autoscaler removes an idle node after this (Ray's default is 60 s; 1 minute here otherwise)
SCALE_DOWN_TIMEOUT_S = 180


def load() -> str:
    return Path("/proc/loadavg").read_text().strip()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pairs", type=int, default=3)
    args = ap.parse_args()

    from ray.job_submission import JobSubmissionClient

    from raylane.orchestrator.domain.profile import Profile
    from raylane.orchestrator.tooling.autoscaling import AUTOSCALE_PROFILE, AutoscalingCluster

    print(f"load before: {load()} ({os.cpu_count()} cores)", file=sys.stderr)
    work = Path(tempfile.mkdtemp(prefix="raylane-bench-"))
    cluster = AutoscalingCluster(Profile.load(AUTOSCALE_PROFILE), work / "cluster", idle_timeout_min=IDLE_S / 60)
    state = cluster.up()
    try:
        server, url = _server.start_server(work, {
            "RAYLANE_DASHBOARD_URL": state.dashboard_url, "RAYLANE_RAY_AUTH_TOKEN": state.token,
            "RAYLANE_RAY_ADDRESS": state.gcs_address, "RAYLANE_PROFILE": str(AUTOSCALE_PROFILE),
            "RAYLANE_AUTOSCALE_AHEAD_JOBS": "1", "RAYLANE_ADMIN_TOKEN": TOKEN, "RAYLANE_SUBMIT_RATE_PER_S": "0"})
    except BaseException:
        cluster.down()
        raise
    http = httpx.Client(base_url=url, timeout=30, headers={"Authorization": f"Bearer {TOKEN}"})
    ray = JobSubmissionClient(state.dashboard_url, headers={"Authorization": f"Bearer {state.token}"})
    spec = {"name": "bench", "kind": "command", "entrypoint": ENTRYPOINT, "resources": RESOURCES,
            "placement": {"node_group": GROUP}}

    def gpu_nodes() -> int:
        return sum(1 for n in cluster.nodes() if n["raylet"]["state"] == "ALIVE"
                   and n["raylet"].get("labels", {}).get("ray.io/node-group") == GROUP)

    def direct_submit() -> str:
        return ray.submit_job(entrypoint=ENTRYPOINT, submission_id=f"direct-{uuid.uuid4().hex}",
                              entrypoint_num_cpus=RESOURCES["cpus_per_worker"],
                              entrypoint_num_gpus=RESOURCES["gpus_per_worker"],
                              entrypoint_label_selector={"ray.io/node-group": GROUP})

    def direct_status(sid: str) -> str:
        return str(ray.get_job_status(sid).value)

    def raylane_submit() -> str:
        r = http.post("/v1/jobs", json=spec)
        assert r.status_code == 201, r.text
        return r.json()["id"]

    def raylane_status(jid: str) -> str:
        return http.get(f"/v1/jobs/{jid}").json()["status"]

    def one(submit, status) -> float:
        deadline = time.monotonic() + SCALE_DOWN_TIMEOUT_S
        while gpu_nodes():  # every run starts from zero
            assert time.monotonic() < deadline, "the gpu node was not removed"
            time.sleep(0.5)
        t = time.perf_counter()
        x = submit()
        while (st := status(x)) != "RUNNING":
            assert st not in ("SUCCEEDED", "FAILED", "STOPPED", "CANCELLED"), st  # RUNNING is longer than a poll
            time.sleep(POLL_S)
        took = time.perf_counter() - t
        while (st := status(x)) != "SUCCEEDED":
            assert st not in ("FAILED", "STOPPED", "CANCELLED"), st
            time.sleep(0.2)
        return took

    try:
        d, r = [], []
        for i in range(args.pairs):
            if i % 2 == 0:
                d.append(one(direct_submit, direct_status))
                r.append(one(raylane_submit, raylane_status))
            else:
                r.append(one(raylane_submit, raylane_status))
                d.append(one(direct_submit, direct_status))
            print(f"pair {i + 1}: direct {d[-1]:.2f} s, raylane {r[-1]:.2f} s, load {load()}", file=sys.stderr)
        dm, rm = statistics.median(d), statistics.median(r)
        print(json.dumps({"pairs": args.pairs, "direct_s": d, "raylane_s": r, "direct_median_s": dm,
                          "raylane_median_s": rm, "ratio_median": rm / dm,
                          "ratios": [b / a for a, b in zip(d, r)], "load_after": load()}, indent=2))
    finally:
        _server.stop_server(server)
        cluster.down()


if __name__ == "__main__":
    main()
