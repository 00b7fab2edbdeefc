"""The lane host alone (issue #16): how fast one host starts trivial jobs, and
what each costs its own CPU, with the store faked in memory (no Ray, no control
plane), this tree's host against the one at a base commit.

    python bench/lane_host.py [--n 2000] [--pairs 3] [--slots 8] [--base <git ref>]

Each trial is a fresh process that imports one tree's ``raylane.jobs.lane``,
loads ``ray._raylet`` as the real host has it loaded (its RSS is printed: the
real one is ~170 MB with its GCS client), queues ``--n`` items of one kind —
function jobs ``json:dumps`` or command jobs ``true`` — and runs a ``Host``
until every item has ended. Base and this tree alternate, ``--pairs`` times per
kind. Reported per trial: jobs/s (first start to last end), the host's own CPU
per job (user + system of the host process: the forks, the polling, the
store), and the CPU of everything per job (the host, its commands, and this
tree's fork server and workers, read from /proc before they are closed).
The machine's load average is printed before each trial: a shared machine
moves these numbers, which is why the two trees alternate.

Where the base's function jobs were forks of the host, the fork server here is
started before ``ray._raylet`` is loaded, as ``lane.main`` starts it before
the GCS client.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


class BenchStore:
    """Ray's KV store as the host uses it, with its two listings indexed (the host
    lists todo items and stop requests every pass; a scan of every key would
    make the fake store the cost being measured)."""

    def __init__(self, n: int, listed: tuple[str, ...]):
        self.d: dict[str, bytes] = {}
        self.listed: dict[str, dict[str, None]] = {p: {} for p in listed}
        self.lock = threading.Lock()
        self.n, self.ended, self.failed = n, 0, 0
        self.last_end: float | None = None

    def get(self, key):
        return self.d.get(key)

    def put(self, key, value, *, overwrite=True):
        with self.lock:
            if not overwrite and key in self.d:
                return False
            self.d[key] = value
            for p, keys in self.listed.items():
                if key.startswith(p):
                    keys[key] = None
        if "/status" in key:  # lane/a/<sid>/status (lane/status/<sid> in older trees)
            status = json.loads(value)["status"]
            if status in ("SUCCEEDED", "FAILED", "STOPPED"):
                self.ended += 1
                self.failed += status != "SUCCEEDED"
                if self.ended == self.n:
                    self.last_end = time.perf_counter()
        return True

    def delete(self, key):
        self.d.pop(key, None)
        for keys in self.listed.values():
            keys.pop(key, None)

    # Ray's job records (namespace "job" there), which a host writes per item since session 13.
    def put_job_info(self, sid, value):
        self.d[f"job-info/{sid}"] = value

    def job_info(self, sid):
        value = self.d.get(f"job-info/{sid}")
        return json.loads(value) if value else None

    def keys(self, prefix):
        keys = self.listed.get(prefix)
        return list(keys) if keys is not None else [k for k in list(self.d) if k.startswith(prefix)]


def _proc_cpu(pid: int) -> float:
    """User + system seconds of a live process."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except FileNotFoundError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def one(kind: str, n: int, slots: int) -> dict:
    """A trial, in this process: the tree on sys.path is the one measured."""
    from raylane.jobs import lane
    from raylane.orchestrator.domain import lanes

    workers = None
    if hasattr(lane, "Workers"):
        workers = lane.Workers(slots)
        workers.start()  # before Ray's libraries, as in lane.main
    import ray._raylet  # noqa: F401 (the host's size: grpc and Ray's core are loaded there)

    store = BenchStore(n, (lanes.todo_prefix("cpu"), "lane/stop/"))  # the measured tree's keys
    for i in range(n):
        sid = f"b{i:05d}"
        item = (lanes.encode_item(sid, "json:dumps", {}, args={"obj": [i]}) if kind == "function"
                else lanes.encode_item(sid, "true", {}))
        store.put(lanes.todo_key("cpu", sid), item)
    workdir = Path(tempfile.mkdtemp(prefix="raylane-bench-lane-"))
    host = lane.Host(store, "cpu", "raylane-lane-cpu-bench", slots=slots, idle_s=0.2, workdir=workdir)
    if workers is not None:
        host.workers = workers
        close = workers.close

        def measured_close():
            # Live workers are killed, never reaped by the fork server: read their CPU now. The
            # fork server's own (and its reaped workers') reaches RUSAGE_CHILDREN once close() reaps it.
            pool_cpu[0] = sum(_proc_cpu(p) for p in workers.pids())
            close()

        workers.close = measured_close
    pool_cpu = [0.0]
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    r0, c0 = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    host.run()
    r1, c1 = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    shutil.rmtree(workdir, ignore_errors=True)
    assert store.ended == n and store.last_end is not None, (store.ended, n)
    host_cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    children_cpu = (c1.ru_utime - c0.ru_utime) + (c1.ru_stime - c0.ru_stime)
    return {"jobs_s": n / (store.last_end - t0), "host_ms": 1e3 * host_cpu / n,
            "all_ms": 1e3 * (host_cpu + children_cpu + pool_cpu[0]) / n, "failed": store.failed, "rss_mb": rss_mb}


def trial(tree: Path, kind: str, n: int, slots: int) -> dict:
    load = os.getloadavg()
    out = subprocess.run([sys.executable, __file__, "--one", kind, "--n", str(n), "--slots", str(slots)],
                         cwd=tree, env={**os.environ, "PYTHONPATH": str(tree)}, capture_output=True, text=True,
                         timeout=900)
    if out.returncode != 0:
        raise RuntimeError(out.stderr[-3000:])
    return {**json.loads(out.stdout.strip().splitlines()[-1]), "load1": load[0]}


def base_tree(ref: str) -> Path:
    d = Path(tempfile.mkdtemp(prefix="raylane-bench-base-"))
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", ref], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(d)], input=archive, check=True)
    return d


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--n", type=int, default=2000)
    p.add_argument("--pairs", type=int, default=3)
    p.add_argument("--slots", type=int, default=8)
    p.add_argument("--base", default=None, help="git ref of the host to compare with (default: merge-base with main)")
    p.add_argument("--kinds", default="function,command")
    p.add_argument("--one", choices=("function", "command"), help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.one:
        import logging

        logging.disable(logging.INFO)  # the host logs a line per job
        print(json.dumps(one(a.one, a.n, a.slots)))
        return
    ref = a.base or subprocess.run(["git", "-C", str(ROOT), "merge-base", "HEAD", "main"], check=True,
                                   capture_output=True, text=True).stdout.strip()
    base = base_tree(ref)
    print(f"base {ref[:10]} in {base}; this tree {ROOT}; n={a.n} slots={a.slots}; uptime: "
          f"{subprocess.run(['uptime'], capture_output=True, text=True).stdout.strip()}", flush=True)
    for kind in a.kinds.split(","):
        rows: dict[str, list[dict]] = {"base": [], "this": []}
        for i in range(a.pairs):
            for name, tree in (("base", base), ("this", ROOT)) if i % 2 == 0 else (("this", ROOT), ("base", base)):
                r = trial(tree, kind, a.n, a.slots)
                rows[name].append(r)
                print(f"{kind:8} {name:4} pair {i + 1}: {r['jobs_s']:7.1f} jobs/s, host CPU {r['host_ms']:.3f} ms/job, "
                      f"all CPU {r['all_ms']:.3f} ms/job, failed {r['failed']}, host RSS {r['rss_mb']:.0f} MB, "
                      f"load {r['load1']:.2f}", flush=True)
        for name, rs in rows.items():
            for key, what in (("jobs_s", "jobs/s"), ("host_ms", "host CPU ms/job"), ("all_ms", "all CPU ms/job")):
                v = [r[key] for r in rs]
                print(f"{kind:8} {name:4} {what:16} median {statistics.median(v):8.3f}  "
                      f"range {min(v):.3f}-{max(v):.3f}", flush=True)
    print(f"uptime: {subprocess.run(['uptime'], capture_output=True, text=True).stdout.strip()}")
    shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
