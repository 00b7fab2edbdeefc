"""One trivial job end to end, and a burst of 200, through Raylane and through
Ray's own JobSubmissionClient, on the same local multi-node cluster, same run.

For each path: submit, then poll for SUCCEEDED every 20 ms (the user's view:
"my job is done"). Raylane's path is REST -> DB -> dispatcher -> Ray Jobs API ->
reconciler -> DB -> REST; the direct path is JobSubmissionClient -> Ray.
Both ask for the same driver resources on the same node group. Paths alternate
so drift on a shared machine hits both alike.

    python bench/dispatch_latency.py [--n 20] [--burst 200] [--pairs 3] [--queue-ahead 8]

Bursts run in --pairs alternated pairs (direct first in odd pairs); the median
ratio and its spread are reported with the machine's load (``--pairs 0``: the
one-job figures only).

Each single job's time is also split into phases (medians in ms), from the
job's events and Ray's own record of the attempt (one machine, one clock):
submit and admission (to the DISPATCHING event), dispatch (to Ray's record of
the submit), in Ray (Ray's start to end time), the reconciler (Ray's end to the
SUCCEEDED event) and the client's poll; the direct path's are Ray's record,
in Ray, and the client's poll. What Raylane adds is where those differ.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
import uuid
from datetime import datetime
from pathlib import Path

import httpx

TOKEN = "rl_bench-admin-token-0123456789"  # auth on, as in production
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import _server  # noqa: E402
from bench.submit_throughput import cpu_s  # noqa: E402

POLL_S = 0.02
ENTRYPOINT = "true"
CPUS = 0.25


def read_group(pgid: int, file: str) -> dict[int, str]:
    """``/proc/<pid>/<file>`` of each live process in the process group."""
    out = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            if os.getpgid(int(pid)) == pgid:
                out[int(pid)] = Path(f"/proc/{pid}/{file}").read_text()
        except (OSError, ProcessLookupError):
            continue
    return out


def rss_of_group(pgid: int) -> int:
    return sum(int(t.split()[1]) * os.sysconf("SC_PAGE_SIZE") for t in read_group(pgid, "statm").values())


def cpu_of_group(pgid: int) -> dict[int, float]:
    """User + system CPU seconds of each live process in the process group."""
    return {pid: sum(map(int, t.rsplit(")", 1)[1].split()[11:13])) / os.sysconf("SC_CLK_TCK")
            for pid, t in read_group(pgid, "stat").items()}


class PeakRSS(threading.Thread):
    def __init__(self, pgid: int):
        super().__init__(daemon=True)
        self.pgid, self.peak, self.stop_ = pgid, 0, threading.Event()

    def run(self):
        while not self.stop_.is_set():
            self.peak = max(self.peak, rss_of_group(self.pgid))
            self.stop_.wait(0.2)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=20)
    ap.add_argument("--burst", type=int, default=200)
    ap.add_argument("--pairs", type=int, default=3, help="bursts per path, alternated (direct first in odd pairs)")
    ap.add_argument("--queue-ahead", type=int, default=8, help="RAYLANE_QUEUE_AHEAD_JOBS of the server")
    ap.add_argument("--tree", help="run the server and the cluster's nodes from another checkout (a before/after "
                                   "comparison: run this once per tree, alternated)")
    ap.add_argument("--profile", metavar="FILE", help="sample the server with py-spy (on-CPU threads, raw "
                                                      "collapsed stacks) during its first burst into FILE")
    args = ap.parse_args()

    from ray.job_submission import JobSubmissionClient

    bench = _server.start_cluster_and_server({
        "RAYLANE_SQLITE_SYNCHRONOUS": "NORMAL", "RAYLANE_MAX_CONCURRENT_DRIVERS": "1000",
        "RAYLANE_ADMIN_TOKEN": TOKEN, "RAYLANE_SUBMIT_RATE_PER_S": "0",
        "RAYLANE_QUEUE_AHEAD_JOBS": str(args.queue_ahead)}, tree=args.tree)
    state, url, head_pgid = bench.state, bench.url, bench.head_pgid
    http = httpx.Client(base_url=url, timeout=30, headers={"Authorization": f"Bearer {TOKEN}"})
    ray = JobSubmissionClient(state.dashboard_url, headers={"Authorization": f"Bearer {state.token}"})
    spec = {"name": "bench", "kind": "command", "entrypoint": ENTRYPOINT, "resources": {"cpus_per_worker": CPUS},
            "placement": {"node_group": "cpu"}}

    def direct_submit() -> str:
        return ray.submit_job(entrypoint=ENTRYPOINT, submission_id=f"direct-{uuid.uuid4().hex}",
                              entrypoint_num_cpus=CPUS, entrypoint_label_selector={"ray.io/node-group": "cpu"})

    def direct_done(sid: str) -> bool:
        st = str(ray.get_job_status(sid))
        assert "FAILED" not in st, st
        return "SUCCEEDED" in st

    def raylane_submit() -> str:
        r = http.post("/v1/jobs", json=spec)
        assert r.status_code == 201, r.text
        return r.json()["id"]

    def raylane_done(jid: str) -> bool:
        st = http.get(f"/v1/jobs/{jid}").json()["status"]
        assert st not in ("FAILED", "CANCELLED"), st
        return st == "SUCCEEDED"

    def one(submit, done, phases=None, of=None) -> float:
        wall0, t = time.time(), time.perf_counter()
        x = submit()
        while not done(x):
            time.sleep(POLL_S)
        took = time.perf_counter() - t
        if phases is not None:
            phases.append(of(x, wall0, wall0 + took))
        return took

    def ray_times(sid: str) -> tuple[float, float]:
        info = ray.get_job_info(sid)
        return info.start_time / 1000, info.end_time / 1000

    def direct_phases(sid: str, t0: float, seen: float) -> dict:
        start, end = ray_times(sid)
        return {"to Ray's record": start - t0, "in Ray": end - start, "end seen by the client": seen - end}

    def raylane_phases(jid: str, t0: float, seen: float) -> dict:
        """Where one job's time went, from the job's events and Ray's record of its
        attempt (one machine, one clock): what Raylane adds is every phase but "in Ray"."""
        job = http.get(f"/v1/jobs/{jid}").json()
        at = {e["to_status"]: datetime.fromisoformat(e["at"]).timestamp()
              for e in http.get(f"/v1/jobs/{jid}/events").json()}
        start, end = ray_times(job["ray_submission_id"])
        return {"submit and admission (to DISPATCHING)": at["DISPATCHING"] - t0,
                "dispatch (to Ray's record)": start - at["DISPATCHING"], "in Ray": end - start,
                "reconciler (Ray's end to SUCCEEDED stored)": at["SUCCEEDED"] - end,
                "end seen by the client": seen - at["SUCCEEDED"]}

    def medians_ms(phases: list[dict]) -> dict:
        return {k: round(statistics.median(p[k] for p in phases) * 1000, 1) for k in phases[0]}

    def outside_ray_ms(phases: list[dict]) -> float:
        """Median of each job's time outside Ray's run of it (its end to end less
        "in Ray"): the start and run of a Ray job vary by ±100 ms from one job to
        the next, more than what the path in front of Ray adds."""
        return round(statistics.median(sum(v for k, v in p.items() if k != "in Ray") for p in phases) * 1000, 1)

    try:
        one(direct_submit, direct_done), one(raylane_submit, raylane_done)  # warm-up
        d, r, dph, rph = [], [], [], []
        for _ in range(args.n):
            d.append(one(direct_submit, direct_done, dph, direct_phases))
            r.append(one(raylane_submit, raylane_done, rph, raylane_phases))
        dp50, rp50 = statistics.median(d), statistics.median(r)
        print(json.dumps({"direct_phases_p50_ms": medians_ms(dph), "raylane_phases_p50_ms": medians_ms(rph)},
                         indent=2), file=sys.stderr)

        # (control plane, this client, the Ray head node's processes) CPU s during each burst
        cpu_use = {"direct": [], "raylane": []}
        in_ray = {"direct": [], "raylane": []}  # ray_spans of each burst

        def burst(submit, done) -> tuple[float, int]:
            mon = PeakRSS(head_pgid)
            mon.start()
            spy = None
            if args.profile and submit is raylane_submit and not cpu_use["raylane"]:
                exe = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
                spy = subprocess.Popen([exe, "record", "-p", str(bench.server.pid), "-r", "100", "--nonblocking",
                                        "--format", "raw", "-o", args.profile], stdout=subprocess.DEVNULL)
            server0, me0, head0 = cpu_s(bench.server.pid), time.process_time(), cpu_of_group(head_pgid)
            wall0, t = time.time(), time.perf_counter()
            ids = [submit() for _ in range(args.burst)]
            pending = set(ids)
            while pending:
                pending = {x for x in pending if not done(x)}
                time.sleep(0.2)
            took = time.perf_counter() - t
            if spy is not None:
                spy.send_signal(signal.SIGINT)  # py-spy writes its samples and exits
                spy.wait(timeout=60)
            mon.stop_.set()
            mon.join()
            head = sum(v - head0.get(p, 0.0) for p, v in cpu_of_group(head_pgid).items())
            path = "raylane" if submit is raylane_submit else "direct"
            cpu_use[path].append((cpu_s(bench.server.pid) - server0, time.process_time() - me0, head))
            in_ray[path].append(ray_spans(ids, wall0, path == "raylane"))
            return took, mon.peak

        def ray_spans(ids: list[str], wall0: float, raylane: bool) -> dict:
            """How the burst used Ray, from Ray's own start and end of each job (read
            after it): the first start and the last end after the first submit, the
            median job's time in Ray, and the jobs in Ray at once on average over
            that span: fewer at once is admission holding work back, longer in Ray
            is contention."""
            spans = []
            for x in ids:
                sid = http.get(f"/v1/jobs/{x}").json()["ray_submission_id"] if raylane else x
                spans.append(ray_times(sid))
            first, last = min(a for a, _ in spans), max(b for _, b in spans)
            return {"first_start_s": round(first - wall0, 2), "last_end_s": round(last - wall0, 2),
                    "in_ray_p50_s": round(statistics.median(b - a for a, b in spans), 3),
                    "in_ray_at_once": round(sum(b - a for a, b in spans) / (last - first), 2)}

        load_before = os.getloadavg()
        pairs = []  # (direct s, raylane s, direct peak RSS, raylane peak RSS), the order flipped every pair
        for i in range(args.pairs):
            if i % 2 == 0:
                bd, bd_mem = burst(direct_submit, direct_done)
                br, br_mem = burst(raylane_submit, raylane_done)
            else:
                br, br_mem = burst(raylane_submit, raylane_done)
                bd, bd_mem = burst(direct_submit, direct_done)
            pairs.append((bd, br, bd_mem, br_mem))
            print(f"pair {i + 1}: direct {bd:.1f} s, raylane {br:.1f} s, ratio {br / bd:.3f}", file=sys.stderr)
        pairs = pairs or [(float("nan"),) * 4]  # --pairs 0: one job only
        ratios = sorted(br / bd for bd, br, _, _ in pairs)
        bd, br = statistics.median(p[0] for p in pairs), statistics.median(p[1] for p in pairs)
        bd_mem, br_mem = max(p[2] for p in pairs), max(p[3] for p in pairs)
        out = {
            "single_n": args.n, "direct_p50_s": dp50, "raylane_p50_s": rp50, "added_p50_ms": (rp50 - dp50) * 1000,
            "ratio_p50": rp50 / dp50,
            "outside_ray_p50_ms": {"direct": outside_ray_ms(dph), "raylane": outside_ray_ms(rph)},
            "added_outside_ray_p50_ms": round(outside_ray_ms(rph) - outside_ray_ms(dph), 1),
            "direct_p90_s": sorted(d)[int(0.9 * len(d))],
            "raylane_p90_s": sorted(r)[int(0.9 * len(r))],
            "burst": args.burst, "pairs": args.pairs, "direct_makespan_s": bd, "raylane_makespan_s": br,
            "burst_ratio_median": statistics.median(ratios), "burst_ratio_min": ratios[0], "burst_ratio_max": ratios[-1],
            "burst_pairs": [{"direct_s": p[0], "raylane_s": p[1], "ratio": p[1] / p[0]} for p in pairs],
            "loadavg_before": load_before, "loadavg_after": os.getloadavg(), "queue_ahead_jobs": args.queue_ahead,
            "direct_phases_p50_ms": medians_ms(dph), "raylane_phases_p50_ms": medians_ms(rph),
            "direct_head_peak_rss_mb": bd_mem / 2**20, "raylane_head_peak_rss_mb": br_mem / 2**20,
            # What the control plane (its server and loops), this client's polling and the
            # Ray head node's processes (its GCS, raylet and dashboard: what answers the
            # polls straight to Ray) took of the 2 cores during each burst.
            "burst_in_ray": in_ray,
            "burst_cpu_s": {path: [{"control_plane": round(a, 2), "client": round(b, 2), "ray_head": round(c, 2)}
                                   for a, b, c in v] for path, v in cpu_use.items()},
        }
        print(json.dumps(out, indent=2))
    finally:
        bench.stop()


if __name__ == "__main__":
    main()
