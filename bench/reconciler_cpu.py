"""CPU of the reconciler's passes while many attempts run (issue #16): what
Raylane's own polling costs the head node it shares with the jobs during a burst.

    python bench/reconciler_cpu.py [--live 60] [--passes 500] [--rounds 3] [--before ../main]

A head-only Ray node is started on free ports (its GCS is real: the pass reads
Ray's job records over gRPC as in a deployment). Each round, in a fresh
interpreter importing one tree's package: a fresh SQLite database gets
``--live`` command jobs, each with its attempt RUNNING as the lifecycle
functions leave it, and Ray's store gets a job record for each (Ray's own
``JobInfo``, RUNNING, with the metadata and runtime env the dispatcher gives a
command job); then ``--passes`` reconciler passes run back to back, nothing
changing between them, as in the middle of a burst. Reported per round: the
pass's process CPU in ms (user + system of the control plane's process; the
GCS's own CPU is reported beside it, read from /proc). With ``--before`` the
other checkout's reconciler alternates with this one's, and the median ratio
of their CPU per pass is printed with its spread and the machine's load.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _proc_cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def one_round(gcs_address: str, token: str, gcs_pid: int, live: int, passes: int) -> dict:
    from datetime import timedelta

    from ray.dashboard.modules.job.common import JobInfo, JobStatus as RayJobStatus

    from raylane.orchestrator.backends.ray_jobs import RayJobsBackend
    from raylane.orchestrator.domain.ids import submission_id
    from raylane.orchestrator.domain.profile import default_profile
    from raylane.orchestrator.domain.routing import route
    from raylane.orchestrator.domain.specs import JobSpec
    from raylane.orchestrator.domain.states import JobStatus
    from raylane.orchestrator.loops.reconciler import Reconciler
    from raylane.orchestrator.services.controlplane import ControlPlane
    from raylane.orchestrator.settings import Settings
    from raylane.orchestrator.store import db, jobs as store, lifecycle, migrate, queue
    from raylane.orchestrator.store.transitions import utcnow

    url = f"sqlite:///{tempfile.mkdtemp(prefix='raylane-rc-')}/rc.db"
    migrate.upgrade(url)
    settings = Settings(database_url=url, loops_enabled=False, auto_migrate=False,
                        data_dir=tempfile.mkdtemp(prefix="raylane-rc-"), ray_address=gcs_address)
    cp = ControlPlane(settings)
    from raylane.orchestrator.backends.ray_gcs import RayGcs

    backend = RayJobsBackend("http://127.0.0.1:1", token, gcs=RayGcs(gcs_address, token))
    try:
        spec = JobSpec(name="bench", kind="command", entrypoint="python -c pass")
        placement = route(spec, default_profile())
        with db.transaction(cp.sessions) as s:
            ids = [store.submit(s, spec, placement=placement)[0] for _ in range(live)]
        now = utcnow()
        with db.transaction(cp.sessions) as s:
            heads = {q.id: q for q in queue.queued(s, now=now, limit=live)}
            queue.admit_many(s, [queue.Admission(heads[jid], placement, []) for jid in ids], owner="bench",
                             now=now, lease_until=now + timedelta(seconds=600))
        with db.transaction(cp.sessions) as s:
            for jid in ids:
                lifecycle.attempt_submitted(s, jid, 1, owner="bench", note="submitted to Ray")
                lifecycle.attempt_running(s, jid, 1, driver_node_id="ab" * 28)
        for jid in ids:
            sid = submission_id(jid, 1)
            env = {f"RAYLANE_{k}": v for k, v in (("JOB_ID", jid), ("ATTEMPT", "1"), ("PROJECT", "default"),
                                                   ("NODE_GROUP", placement.node_group), ("KIND", "command"),
                                                   ("STORAGE", f"/var/lib/raylane/storage/default/{jid}"),
                                                   ("SUBMISSION_ID", sid))}
            info = JobInfo(status=RayJobStatus.RUNNING, entrypoint=spec.entrypoint, start_time=int(time.time() * 1000),
                           metadata={"raylane_job_id": jid, "raylane_project": "default", "raylane_kind": "command",
                                     "raylane_node_group": placement.node_group, "raylane_attempt": "1",
                                     "raylane_name": spec.name},
                           runtime_env={"env_vars": env}, entrypoint_num_cpus=0.1, driver_node_id="ab" * 28,
                           driver_agent_http_address="http://127.0.0.1:52365")
            backend.gcs.put_job_record(sid, json.dumps(info.to_json()).encode())
        rec = Reconciler(settings, cp.sessions, backend)
        rec.run_once()  # warm: the first pass writes nothing either (they are RUNNING already)
        with db.read(cp.sessions) as s:
            assert all(r["job_status"] == JobStatus.RUNNING.value for r in lifecycle.live_attempts(s))
        g0, t0, w0 = _proc_cpu_s(gcs_pid), time.process_time(), time.perf_counter()
        for _ in range(passes):
            rec.run_once()
        cpu, wall, gcs = time.process_time() - t0, time.perf_counter() - w0, _proc_cpu_s(gcs_pid) - g0
        with db.read(cp.sessions) as s:
            still = len(lifecycle.live_attempts(s))
        assert still == live, f"{still} of {live} attempts still live: the passes changed something"
        for jid in ids:
            backend.gcs.delete_job_record(submission_id(jid, 1))
        return {"cpu_ms_per_pass": 1000 * cpu / passes, "wall_ms_per_pass": 1000 * wall / passes,
                "gcs_cpu_ms_per_pass": 1000 * gcs / passes}
    finally:
        backend.close()
        cp.close()


def child(tree: Path, args, gcs_address: str, token: str, gcs_pid: int) -> dict:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "reconciler_cpu.py"), "--child",
                          json.dumps([gcs_address, token, gcs_pid]), "--live", str(args.live),
                          "--passes", str(args.passes)],
                         env=env, cwd=tree, capture_output=True, text=True)
    if out.returncode:
        raise SystemExit(f"round in {tree} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _gcs_pid(temp_dir: str) -> int:
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                cmd = (p / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if cmd and cmd[0].endswith(b"gcs_server") and any(temp_dir.encode() in c for c in cmd):
                return int(p.name)
    raise SystemExit("the head's gcs_server process was not found")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--live", type=int, default=60)
    ap.add_argument("--passes", type=int, default=500)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--before", help="another checkout: its reconciler against this one's, alternated")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(one_round(*json.loads(args.child), args.live, args.passes)))
        return
    from raylane.orchestrator.domain.profile import Profile, default_profile
    from raylane.orchestrator.tooling.localcluster import LocalCluster

    cluster = LocalCluster(Profile(name="head-only", groups=[default_profile().head]),
                           tempfile.mkdtemp(prefix="raylane-bench-rc-"))
    state = cluster.up()
    try:
        token = Path(state.token_path).read_text().strip()
        gcs_pid = _gcs_pid(state.temp_dir)
        trees = [("after", ROOT)] + ([("before", Path(args.before).resolve())] if args.before else [])
        got: dict[str, list[dict]] = {name: [] for name, _ in trees}
        loads = []
        for i in range(args.rounds):
            loads.append(round(os.getloadavg()[0], 2))
            for name, tree in (trees if i % 2 == 0 else trees[::-1]):
                got[name].append(child(tree, args, state.gcs_address, token, gcs_pid))
    finally:
        cluster.down()
    out = {"live": args.live, "passes": args.passes, "load_1min": loads,
           **{name: {k: [round(r[k], 3) for r in rows] for k in rows[0]} for name, rows in got.items()},
           "median_cpu_ms_per_pass": {k: round(statistics.median(r["cpu_ms_per_pass"] for r in v), 3)
                                      for k, v in got.items()}}
    if args.before:
        ratios = sorted(a["cpu_ms_per_pass"] / b["cpu_ms_per_pass"] for a, b in zip(got["after"], got["before"]))
        out["ratio_after_before"] = {"median": round(statistics.median(ratios), 3),
                                     "spread": [round(ratios[0], 3), round(ratios[-1], 3)]}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
