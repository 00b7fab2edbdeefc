"""A fresh clone's first batch: `make run` as it ships, then 200 trivial commands in
one batch, against 20 of the same straight through Ray's Jobs API on the same
cluster, in one run (issue 47's Show).

Starts ``raylane-server serve --local-cluster`` (what `make run` runs) in a new
data directory with no setting changed: the fast lane, admission, the rate
limits and SQLite's durability are the defaults. Only the port (a free one)
and the data directory are the bench's; the admin token is the one the
server wrote at its first start, as a user copies it. The local cluster gets
explicit free ports (localcluster.py), so Redis on 6379 is never in the way.

Each pair runs both, the order flipped every pair (the lane first in the first
pair: its host starts cold there, as a new user meets it):
- lane: one POST /v1/jobs/batch of --lane specs ``{"kind": "command",
  "entrypoint": "true"}`` (a newcomer's spec: every resource its default), then
  the queue read until none is unfinished; jobs/s from the POST to the last.
- direct: --direct ``JobSubmissionClient.submit_job`` of the same command with
  the same CPUs and node-group selector as the router gave the lane's jobs,
  submitted one after another, then polled; jobs/s from the first submit to
  the last SUCCEEDED.
The ratio lane/direct of each pair, their median and range, and the load.

    python bench/fresh_clone.py [--lane 200] [--direct 20] [--pairs 2]
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

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import _server  # noqa: E402

SPEC = {"name": "trivial", "kind": "command", "entrypoint": "true"}
UNFINISHED = ["PENDING", "DISPATCHING", "RUNNING", "RETRYING", "CANCELLING"]
START_S = 900  # the server answers once its local cluster (five nodes) is up: minutes on a loaded 2-core machine
STOP_S = 300  # a clean stop takes the local cluster down with it
BURST_S = 1800  # one burst, at most: 20 Ray jobs took ~100 s on a quiet day here


def start(work: Path) -> tuple:
    """`make run` in ``work``: (process, URL, admin token, ClusterState)."""
    from raylane.orchestrator.tooling.localcluster import ClusterState

    # What the Makefile's `run` target exports besides (local working_dirs under the checkout).
    proc, url = _server.start_server(work, {"RAYLANE_POLICY_WORKING_DIR_ROOTS": json.dumps([str(ROOT)])},
                                     timeout=START_S, args=("serve", "--local-cluster"), clean_env=True)
    token = (work / "admin_token").read_text().strip()
    return proc, url, token, ClusterState.load(work / "cluster")


def stop(proc) -> None:
    _server.stop_server(proc, STOP_S)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lane", type=int, default=200, help="trivial commands in the one batch")
    ap.add_argument("--direct", type=int, default=20, help="the same straight through Ray's Jobs API")
    ap.add_argument("--pairs", type=int, default=2)
    args = ap.parse_args()

    from ray.job_submission import JobSubmissionClient

    work = Path(tempfile.mkdtemp(prefix="raylane-fresh-"))
    t0 = time.perf_counter()
    proc, url, token, state = start(work)
    started_s = time.perf_counter() - t0
    print(f"make run: ready in {started_s:.0f} s (log: {work}/server.log)", file=sys.stderr, flush=True)
    http = httpx.Client(base_url=url, timeout=120, headers={"Authorization": f"Bearer {token}"})
    ray = JobSubmissionClient(state.dashboard_url, headers={"Authorization": f"Bearer {state.token}"})
    placement: dict = {}

    def lane(n: int) -> float:
        run = uuid.uuid4().hex[:8]
        t = time.perf_counter()
        r = http.post("/v1/jobs/batch", json={"jobs": [{**SPEC, "labels": {"bench": run}}] * n})
        assert r.status_code == 201, r.text[:500]
        deadline = t + BURST_S
        while http.get("/v1/jobs", params=[("label", f"bench={run}"), ("limit", 1)]
                       + [("status", s) for s in UNFINISHED]).json()["items"]:
            assert time.perf_counter() < deadline, f"the batch has not finished after {BURST_S} s"
            time.sleep(0.05)
        took = time.perf_counter() - t
        done = http.get("/v1/jobs", params=[("label", f"bench={run}"), ("status", "SUCCEEDED"), ("limit", 1)]).json()
        job = http.get(f"/v1/jobs/{done['items'][0]['id']}").json()
        placement.update(job["placement"])
        failed = http.get("/v1/jobs", params=[("label", f"bench={run}"), ("status", "FAILED"), ("limit", 5)]).json()
        assert not failed["items"], failed["items"]
        return took

    def direct(n: int) -> float:
        # The same CPUs and node group as the router gave the lane's jobs.
        cpus = placement["worker_resources"].get("CPU", 1.0)
        t = time.perf_counter()
        pending = {ray.submit_job(entrypoint=SPEC["entrypoint"], submission_id=f"direct-{uuid.uuid4().hex}",
                                  entrypoint_num_cpus=cpus, entrypoint_label_selector=placement["label_selector"])
                   for _ in range(n)}
        deadline = t + BURST_S
        while pending:
            for sid in list(pending):
                st = str(ray.get_job_status(sid))
                assert "FAILED" not in st and "STOPPED" not in st, (sid, st)
                if "SUCCEEDED" in st:
                    pending.discard(sid)
            assert time.perf_counter() < deadline, f"{len(pending)} Ray jobs unfinished after {BURST_S} s"
            time.sleep(0.2)
        return time.perf_counter() - t

    out = []
    try:
        for i in range(args.pairs):
            order = ["lane", "direct"] if i % 2 == 0 else ["direct", "lane"]
            took = {}
            for which in order:
                took[which] = lane(args.lane) if which == "lane" else direct(args.direct)
                print(f"pair {i + 1} {which}: {took[which]:.1f} s", file=sys.stderr, flush=True)
            r = {"pair": i + 1, "first": order[0], "lane_s": took["lane"], "direct_s": took["direct"],
                 "lane_jobs_per_s": args.lane / took["lane"], "direct_jobs_per_s": args.direct / took["direct"],
                 "load": os.getloadavg()}
            r["ratio"] = r["lane_jobs_per_s"] / r["direct_jobs_per_s"]
            out.append(r)
            print(f"pair {r['pair']} ({r['first']} first, load {'/'.join(f'{x:.1f}' for x in r['load'])}): "
                  f"{args.lane} in one batch {r['lane_s']:.1f} s = {r['lane_jobs_per_s']:.1f} jobs/s; {args.direct} "
                  f"straight to Ray {r['direct_s']:.1f} s = {r['direct_jobs_per_s']:.2f} jobs/s; "
                  f"ratio {r['ratio']:.1f}x", flush=True)
    finally:
        http.close()
        stop(proc)
    ratios = [r["ratio"] for r in out]
    print(f"lane / Ray's Jobs API, jobs/s: median {statistics.median(ratios):.1f}x (range {min(ratios):.1f}-"
          f"{max(ratios):.1f}, {len(ratios)} pairs; goal >= 30), load {min(r['load'][0] for r in out):.1f}-"
          f"{max(r['load'][0] for r in out):.1f}, lane placement {placement.get('lane')!r} on "
          f"{placement.get('node_group')!r}, make run ready in {started_s:.0f} s")
    print(json.dumps({"pairs": out, "placement": placement, "started_s": started_s, "cpus": os.cpu_count()}))


if __name__ == "__main__":
    main()
