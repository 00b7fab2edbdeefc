"""Trivial `command` jobs through Raylane's fast lane (issue #16) against the
same jobs straight through Ray's Jobs API (JobSubmissionClient), on one local
multi-node cluster, in one run.

- single: one lane job at a time on a warm lane, submit -> SUCCEEDED as a user
  sees it (POST /v1/jobs, then GET every 10 ms); p50 and p90.
- throughput: --lane command jobs and --functions function jobs
  (``json:dumps``) through the lane (one POST /v1/jobs/batch, then the
  queue watched until every job is SUCCEEDED), and --direct jobs straight to
  Ray (submitted one after another, then polled); jobs/s each and the ratio.
- the head node's peak RSS during each burst and at idle before.

Both paths ask for the same CPU share on the same node group (cpu). The
server runs with RAYLANE_FAST_LANE=true. The direct baseline is the `true`
command for both ratios: a function as a Ray job of its own costs at least that
(a Python start besides), so the function ratio is not flattered.

    python bench/small_jobs.py [--lane 1000] [--direct 100] [--single 30]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import uuid
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import _server  # noqa: E402
from bench.dispatch_latency import PeakRSS, rss_of_group  # noqa: E402

TOKEN = "rl_bench-admin-token-0123456789"  # auth on, as in production
ENTRYPOINT = "true"
CPUS = 0.25
POLL_S = 0.01
UNFINISHED = ["PENDING", "DISPATCHING", "RUNNING", "RETRYING", "CANCELLING"]


def machine_busy_seconds() -> float:
    """CPU seconds the whole machine spent busy so far, all cores (/proc/stat)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle, iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """A process's CPU time so far, its reaped children's included (/proc/<pid>/stat)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return sum(int(x) for x in fields[11:15]) / os.sysconf("SC_CLK_TCK")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lane", type=int, default=1000)
    ap.add_argument("--functions", type=int, default=1000)
    ap.add_argument("--direct", type=int, default=100)
    ap.add_argument("--single", type=int, default=30)
    ap.add_argument("--slots", type=int, default=16)
    ap.add_argument("--profile", metavar="FILE",
                    help="sample the server with py-spy (GIL holders, raw) during the function burst into FILE")
    ap.add_argument("--tree", type=Path, help="run the server and the nodes from another checkout (before/after)")
    args = ap.parse_args()

    from ray.job_submission import JobSubmissionClient

    bench = _server.start_cluster_and_server({
        "RAYLANE_FAST_LANE": "true", "RAYLANE_LANE_SLOTS": str(args.slots), "RAYLANE_SQLITE_SYNCHRONOUS": "NORMAL",
        "RAYLANE_ADMIN_TOKEN": TOKEN, "RAYLANE_SUBMIT_RATE_PER_S": "0"}, gcs=True, tree=args.tree)
    state, url, head_pgid = bench.state, bench.url, bench.head_pgid
    http = httpx.Client(base_url=url, timeout=60, headers={"Authorization": f"Bearer {TOKEN}"})
    ray = JobSubmissionClient(state.dashboard_url, headers={"Authorization": f"Bearer {state.token}"})
    run = uuid.uuid4().hex[:8]
    spec = {"name": "bench", "kind": "command", "entrypoint": ENTRYPOINT, "resources": {"cpus_per_worker": CPUS},
            "labels": {"bench": run}}
    fn_spec = {**spec, "name": "bench-fn", "kind": "function", "entrypoint": "json:dumps", "args": {"obj": [1]}}

    def lane_one() -> float:
        t = time.perf_counter()
        r = http.post("/v1/jobs", json=spec)
        assert r.status_code == 201 and r.json()["placement"]["lane"] == "cpu", r.text
        jid = r.json()["id"]
        while (st := http.get(f"/v1/jobs/{jid}").json()["status"]) != "SUCCEEDED":
            assert st not in ("FAILED", "CANCELLED"), st
            time.sleep(POLL_S)
        return time.perf_counter() - t

    def unfinished() -> bool:
        # One row is enough to know the burst is not done: a page of 500 every
        # 50 ms cost the server more than the lane did (a profile showed 38% of its CPU).
        page = http.get("/v1/jobs", params=[("label", f"bench={run}"), ("limit", 1)]
                        + [("status", s) for s in UNFINISHED]).json()["items"]
        return bool(page)

    def lane_burst(n: int, one: dict | None = None) -> float:
        t = time.perf_counter()
        for i in range(0, n, 1000):
            r = http.post("/v1/jobs/batch", json={"jobs": [one or spec] * min(1000, n - i)})
            assert r.status_code == 201, r.text
        while unfinished():
            time.sleep(0.05)
        return time.perf_counter() - t

    def direct_burst(n: int) -> float:
        t = time.perf_counter()
        sids = [ray.submit_job(entrypoint=ENTRYPOINT, submission_id=f"direct-{uuid.uuid4().hex}",
                               entrypoint_num_cpus=CPUS, entrypoint_label_selector={"ray.io/node-group": "cpu"})
                for _ in range(n)]
        pending = set(sids)
        while pending:
            for sid in list(pending):
                st = str(ray.get_job_status(sid))
                assert "FAILED" not in st and "STOPPED" not in st, st
                if "SUCCEEDED" in st:
                    pending.discard(sid)
            time.sleep(0.2)
        return time.perf_counter() - t

    cpu: dict[str, float] = {}  # "<burst> server" / "<burst> host" -> CPU seconds the burst cost that process

    def lane_host_pid() -> int | None:
        for d in Path("/proc").iterdir():
            try:
                if d.name.isdigit() and b"-m\0raylane.jobs.lane\0" in (d / "cmdline").read_bytes() \
                        and not (d / "cmdline").read_bytes().startswith(b"/bin/sh"):  # Ray's shell around it
                    return int(d.name)
            except OSError:
                continue
        return None

    def pid_of(needle: bytes) -> int | None:
        for d in Path("/proc").iterdir():
            try:
                if d.name.isdigit() and needle in (d / "cmdline").read_bytes().split(b"\0")[0]:
                    return int(d.name)
            except OSError:
                continue
        return None

    def measured(fn, n, name=None):
        mon = PeakRSS(head_pgid)
        mon.start()
        # The GCS too: every lane job is a few calls to Ray's KV store, on the head node's CPU.
        procs = {"server": bench.server.pid, "host": lane_host_pid(), "gcs": pid_of(b"gcs_server")} if name else {}
        before = {k: cpu_seconds(p) for k, p in procs.items() if p}
        machine0 = machine_busy_seconds() if name else 0.0
        try:
            return fn(n), mon
        finally:
            mon.stop_.set()
            mon.join()
            for k, t in before.items():
                cpu[f"{name} {k}"] = cpu_seconds(procs[k]) - t
            if name:  # every process of the machine: the client, Ray's daemons and whatever else runs here
                cpu[f"{name} machine"] = machine_busy_seconds() - machine0

    try:
        lane_one()  # starts the lane's host: the figures below are on a warm lane
        idle_rss = rss_of_group(head_pgid)
        single = [lane_one() for _ in range(args.single)]
        lane_s, lane_mon = measured(lane_burst, args.lane, "commands")
        spy = None
        if args.profile:
            import shutil
            import subprocess

            exe = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
            spy = subprocess.Popen([exe, "record", "-p", str(bench.server.pid), "-r", "100", "--gil", "--nonblocking",
                                    "--format", "raw", "-o", args.profile], stdout=subprocess.DEVNULL)
        fn_s, fn_mon = measured(lambda n: lane_burst(n, fn_spec), args.functions, "functions")
        if spy is not None:
            spy.send_signal(2)  # py-spy writes its samples on SIGINT
            spy.wait(timeout=60)
        failed = http.get("/v1/jobs", params=[("label", f"bench={run}"), ("status", "FAILED"), ("limit", 500)]).json()
        assert not failed["items"], failed["items"][:3]
        direct_s, direct_mon = measured(direct_burst, args.direct)
        load = os.getloadavg()

        def rate(n, s):  # a part left out (--lane 0, --direct 0: a profiling run) has none
            return n / s if n and s > 0 else None

        direct_rate = rate(args.direct, direct_s)
        out = {
            "lane_jobs": args.lane, "lane_s": lane_s, "lane_jobs_per_s": rate(args.lane, lane_s),
            "function_jobs": args.functions, "function_s": fn_s, "function_jobs_per_s": rate(args.functions, fn_s),
            "direct_jobs": args.direct, "direct_s": direct_s, "direct_jobs_per_s": direct_rate,
            "throughput_ratio": rate(args.lane, lane_s) / direct_rate if args.lane and direct_rate else None,
            "function_ratio": rate(args.functions, fn_s) / direct_rate if args.functions and direct_rate else None,
            "single_n": args.single, "lane_p50_ms": statistics.median(single) * 1000 if single else None,
            "lane_p90_ms": sorted(single)[int(0.9 * len(single))] * 1000 if single else None,
            "head_idle_rss_mb": idle_rss / 2**20, "head_peak_rss_lane_mb": lane_mon.peak / 2**20,
            "head_peak_rss_function_mb": fn_mon.peak / 2**20, "head_peak_rss_direct_mb": direct_mon.peak / 2**20, "slots": args.slots,
            # CPU per job, robust to a busy machine where wall time is not: the
            # server's (its loops and the bench's polling) and the lane host's (with
            # its reaped children: the forks and shells that ran the jobs).
            "cpu_ms_per_job": {k: 1000 * v / n for k, v in cpu.items()
                               if (n := args.lane if k.startswith("commands") else args.functions)},
            "loadavg_after": load, "cpus": os.cpu_count(),
        }
        print(json.dumps(out, indent=2))
    finally:
        bench.stop()


if __name__ == "__main__":
    main()
