"""CPU per job of the loops' writes: a job's whole observed life through the
store's lifecycle functions (admitted, submitted, running, succeeded), in one
process on a real database, no server and no Ray. What the dispatcher and the
reconciler spend in SQLAlchemy per job, measured as process CPU time, so a
busy machine moves it less than wall time.

    python bench/lifecycle_cpu.py [--db sqlite|postgresql] [--jobs 2000] [--rounds 3]
    python bench/lifecycle_cpu.py --before ../main    # that tree's store against this one's, alternated

Each round submits ``--jobs`` jobs in one transaction (not measured), then
measures the life of each in transactions of 200 (the reconciler's
``WRITE_BATCH``): admit (the job's first attempt), submitted, running, succeeded.
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

BATCH = 200


def one_round(db_url: str, n: int) -> float:
    """Process CPU ms per job for ``n`` jobs' lives on ``db_url`` (a fresh database)."""
    from datetime import timedelta

    from raylane.orchestrator.domain.profile import default_profile
    from raylane.orchestrator.domain.routing import route
    from raylane.orchestrator.domain.specs import JobSpec
    from raylane.orchestrator.loops.dispatcher import Dispatcher  # noqa: F401 (imports as the server does)
    from raylane.orchestrator.services.controlplane import ControlPlane
    from raylane.orchestrator.settings import Settings
    from raylane.orchestrator.store import db, jobs as store, lifecycle, migrate, queue
    from raylane.orchestrator.store.transitions import utcnow

    migrate.upgrade(db_url)
    settings = Settings(database_url=db_url, loops_enabled=False, auto_migrate=False,
                        data_dir=tempfile.mkdtemp(prefix="raylane-lc-"))
    cp = ControlPlane(settings)
    try:
        spec = JobSpec(name="bench", kind="command", entrypoint="true")
        placement = route(spec, default_profile())
        with db.transaction(cp.sessions) as s:
            ids = [store.submit(s, spec, placement=placement)[0] for _ in range(n)]
        now = utcnow()
        t0 = time.process_time()
        for i in range(0, n, BATCH):
            chunk = ids[i:i + BATCH]
            with db.transaction(cp.sessions) as s:
                heads = {q.id: q for q in queue.queued(s, now=now, limit=BATCH)}
                # As the dispatcher's pass does (admit_many), or one job at a time where this tree has no such path.
                if hasattr(queue, "admit_many"):
                    queue.admit_many(s, [queue.Admission(heads[jid], placement, []) for jid in chunk], owner="bench",
                                     now=now, lease_until=now + timedelta(seconds=60))
                else:
                    for jid in chunk:
                        queue.admit(s, heads[jid], placement, passed_over=[], owner="bench", now=now,
                                    lease_until=now + timedelta(seconds=60))
            with db.transaction(cp.sessions) as s:
                for jid in chunk:
                    lifecycle.attempt_submitted(s, jid, 1, owner="bench", note="submitted to Ray")
            with db.transaction(cp.sessions) as s:
                for jid in chunk:
                    lifecycle.attempt_running(s, jid, 1, driver_node_id="n1")
            with db.transaction(cp.sessions) as s:
                for jid in chunk:
                    lifecycle.attempt_succeeded(s, jid, 1, exit_code=0, driver_node_id="n1", result=None)
        return 1000 * (time.process_time() - t0) / n
    finally:
        cp.close()


def fresh_db(kind: str) -> tuple[str, callable]:
    if kind == "sqlite":
        return f"sqlite:///{tempfile.mkdtemp(prefix='raylane-lc-')}/lc.db", lambda: None
    sys.path.insert(0, str(ROOT))
    from bench.submit_throughput import pg_database

    return pg_database()


def child(tree: Path, kind: str, n: int) -> float:
    """One round in a fresh interpreter importing ``tree``'s package."""
    url, drop = fresh_db(kind)
    try:
        env = {**os.environ, "PYTHONPATH": str(tree)}
        out = subprocess.run([sys.executable, str(ROOT / "bench" / "lifecycle_cpu.py"), "--child", url, "--jobs", str(n)],
                             env=env, cwd=tree, capture_output=True, text=True, check=True)
        return float(out.stdout.strip().splitlines()[-1])
    finally:
        drop()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--db", choices=("sqlite", "postgresql"), default="sqlite")
    ap.add_argument("--jobs", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--before", help="another checkout: its store against this one's, alternated")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(one_round(args.child, args.jobs))
        return
    trees = [("after", ROOT)] + ([("before", Path(args.before).resolve())] if args.before else [])
    got: dict[str, list[float]] = {name: [] for name, _ in trees}
    loads = []
    for i in range(args.rounds):
        order = trees if i % 2 == 0 else trees[::-1]
        loads.append(os.getloadavg()[0])
        for name, tree in order:
            got[name].append(child(tree, args.db, args.jobs))
    out = {"db": args.db, "jobs": args.jobs, "load_1min": loads,
           "cpu_ms_per_job": {k: [round(x, 3) for x in v] for k, v in got.items()},
           "median": {k: round(statistics.median(v), 3) for k, v in got.items()}}
    if args.before:
        ratios = sorted(a / b for a, b in zip(got["after"], got["before"]))
        out["ratio_after_before"] = {"median": round(statistics.median(ratios), 3),
                                     "spread": [round(ratios[0], 3), round(ratios[-1], 3)]}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
