"""Scale: the control plane's reads with many stored jobs.

Stores N jobs directly through the store's tables (bulk inserts, not the API:
a million submits would take longer than the measurement), spread over a year:
half finished (SUCCEEDED or FAILED, one attempt each, four events), the newest
``--pending`` waiting for admission (PENDING, one event), the rest cancelled
before dispatch (two events). The tallies /metrics reads and the attempt_usage
rows costs and the report sum are then rebuilt from the tables once
(``tallies.rebuild``, ``usage_rows.rebuild``: what migrations 0010 and 0011 do
on an existing database). A real `raylane-server serve` (auth on, loops off) then answers, one
request at a time, round-robin so the machine's noise falls on all alike:

- list: ``GET /v1/jobs?limit=50`` (the newest page) and ``?status=PENDING``;
- get: ``GET /v1/jobs/{id}`` of a random job; events: ``/v1/jobs/{id}/events``;
- ``GET /metrics``; ``GET /v1/costs`` and ``GET /v1/report`` (default window: 7 days);

and, in this process, admission passes (``Dispatcher.claim``) over the pending
queue (the first, which also compiles its statements, apart from the rest; the connection is opened before it, as a server does at start). Also timed in this process: the full-scan counts the scrape ran before
the tallies (``tallies.recount``: the same GROUP BYs), and a week's costs priced
attempt by attempt as the endpoint did before attempt_usage (``load_usage`` +
``costs.costs``). Server RSS is read from /proc before and after.

    python bench/scale.py --jobs 1000000 --pending 100000 [--samples 200] [--db sqlite|postgresql]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
import uuid
from datetime import datetime, timedelta, timezone
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import _server  # noqa: E402

TOKEN = "rl_bench-admin-token-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
CHUNK = 20_000  # jobs per insert transaction
SPAN = timedelta(days=365)


def _specs():
    from raylane.orchestrator.domain.profile import default_profile
    from raylane.orchestrator.domain.routing import route
    from raylane.orchestrator.domain.specs import JobSpec

    profile = default_profile()
    specs = [
        JobSpec(name="etl-nightly", kind="command", entrypoint="python etl.py", labels={"team": "data"}),
        JobSpec.model_validate({"name": "train-resnet", "kind": "command", "entrypoint": "python train.py",
                                "resources": {"gpus_per_worker": 1, "cpus_per_worker": 2}}),
        JobSpec.model_validate({"name": "embed", "kind": "command", "entrypoint": "python embed.py",
                                "resources": {"cpus_per_worker": 1}}),
    ]
    return [(s, route(s, profile)) for s in specs]


def generate(url: str, n: int, pending: int) -> float:
    """Store ``n`` jobs; return the seconds it took."""
    from sqlalchemy import insert

    from raylane.orchestrator.domain.ids import new_job_id, submission_id
    from raylane.orchestrator.store import db
    from raylane.orchestrator.store.jobs import _job_row
    from raylane.orchestrator.store.tables import attempts, events, job_labels, jobs

    t0 = time.perf_counter()
    engine = db.make_engine(url, sqlite_synchronous="OFF")  # generation only; the server runs FULL
    templates = _specs()
    now = datetime.now(timezone.utc)
    start = now - SPAN
    step = SPAN / n
    rnd = random.Random(7)
    first_pending = n - 2 * pending  # the newest 2*pending: every other one PENDING
    for lo in range(0, n, CHUNK):
        jrows, arows, erows, lrows = [], [], [], []
        for i in range(lo, min(n, lo + CHUNK)):
            spec, placement = templates[i % len(templates)]
            created = start + step * i
            jid = new_job_id(int(created.timestamp() * 1000))
            row = _job_row(spec, project="default", job_id=jid, now=created, placement=placement,
                           idempotency_key=None, reason=None)
            row.update(started_at=None, finished_at=None, failure_cause=None)  # one shape for executemany
            group = placement.node_group
            ev = [{"job_id": jid, "at": created, "from_status": None, "to_status": "PENDING",
                   "reason": f"submitted; routed to {group}", "actor": "api", "attempt": None}]
            if i % 2 == 0:  # finished, with its attempt
                ok = rnd.random() < 0.9
                disp = created + timedelta(seconds=rnd.uniform(0.1, 30))
                run = disp + timedelta(seconds=rnd.uniform(0.5, 5))
                end = run + timedelta(seconds=rnd.uniform(5, 3600))
                status = "SUCCEEDED" if ok else "FAILED"
                row.update(status=status, status_reason="attempt 1 " + ("succeeded" if ok else "ended: APP_ERROR"),
                           attempts=1, started_at=run, finished_at=end, updated_at=end,
                           failure_cause=None if ok else "APP_ERROR")
                arows.append({"job_id": jid, "number": 1, "submission_id": submission_id(jid, 1),
                              "node_group": group, "market": placement.market,
                              "status": status, "resources": placement.total, "driver_node_id": "n" * 20,
                              "created_at": disp, "started_at": run, "ended_at": end,
                              "cause": None if ok else "APP_ERROR", "message": None if ok else "exit 1",
                              "exit_code": 0 if ok else 1})
                for at, frm, to, why in ((disp, "PENDING", "DISPATCHING", f"admitted to {group}; attempt 1"),
                                         (run, "DISPATCHING", "RUNNING", "attempt 1 running on Ray"),
                                         (end, "RUNNING", status, row["status_reason"])):
                    ev.append({"job_id": jid, "at": at, "from_status": frm, "to_status": to, "reason": why,
                               "actor": "reconciler", "attempt": 1})
            elif i < first_pending:  # cancelled while queued
                end = created + timedelta(seconds=rnd.uniform(1, 600))
                row.update(status="CANCELLED", status_reason="cancelled by user", cancel_requested=True,
                           finished_at=end, updated_at=end, failure_cause="CANCELLED")
                ev.append({"job_id": jid, "at": end, "from_status": "PENDING", "to_status": "CANCELLED",
                           "reason": "cancelled by user", "actor": "api", "attempt": None})
            jrows.append(row)
            erows.extend(ev)
            lrows.extend({"job_id": jid, "key": k, "value": v} for k, v in spec.labels.items())
        with engine.begin() as conn:
            conn.execute(insert(jobs), jrows)
            if arows:
                conn.execute(insert(attempts), arows)
            conn.execute(insert(events), erows)
            if lrows:
                conn.execute(insert(job_labels), lrows)
        print(f"  stored {min(n, lo + CHUNK):,} jobs ({time.perf_counter() - t0:.0f} s)", file=sys.stderr, flush=True)
    if engine.dialect.name == "postgresql":
        # A database that grew over a year has been vacuumed; one just bulk-loaded has
        # not: the first read of each new row then writes its hint bits, and the planner
        # has no statistics. Without this, the first admission pass over the generated
        # queue measured 96-138 ms at 100k jobs; after it, 43-48 ms (the same pass).
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.exec_driver_sql("VACUUM ANALYZE")
    engine.dispose()
    return time.perf_counter() - t0


def recount_and_rebuild(url: str) -> tuple[float, float, float]:
    """(seconds of the old full-scan counts, of rebuilding the tallies, of rebuilding attempt_usage)."""
    from raylane.orchestrator.store import db, tallies, usage_rows

    engine = db.make_engine(url)
    sessions = db.make_sessionmaker(engine)
    t0 = time.perf_counter()
    with db.transaction(sessions) as s:
        tallies.recount(s)
    scan = time.perf_counter() - t0
    t0 = time.perf_counter()
    with db.transaction(sessions) as s:
        tallies.rebuild(s)
    rebuild = time.perf_counter() - t0
    t0 = time.perf_counter()
    with db.transaction(sessions) as s:
        usage_rows.rebuild(s)
    usage_s = time.perf_counter() - t0
    if url.startswith("postgresql"):
        from sqlalchemy import text

        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.execute(text("VACUUM ANALYZE"))
    engine.dispose()
    return scan, rebuild, usage_s


def old_costs_ms(url: str, runs: int = 5) -> float:
    """Median ms of a week's costs priced attempt by attempt (the endpoint before attempt_usage)."""
    from raylane.orchestrator.domain import costs
    from raylane.orchestrator.domain.profile import default_profile
    from raylane.orchestrator.store import db
    from raylane.orchestrator.store.usage import load_usage

    engine = db.make_engine(url)
    sessions = db.make_sessionmaker(engine)
    profile = default_profile()
    times = []
    for _ in range(runs):
        end = datetime.now(timezone.utc)
        start = end - timedelta(days=7)
        t = time.perf_counter()
        with db.transaction(sessions) as s:
            usages = load_usage(s, start=start, end=end, with_spec=False)
        costs.breakdown(costs.costs(usages, profile, start=start, end=end, now=end), "project")
        times.append((time.perf_counter() - t) * 1000)
    engine.dispose()
    return statistics.median(times)


def rss_mb(pid: int) -> tuple[float, float]:
    """(VmRSS, VmHWM) of ``pid`` in MB."""
    vals = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        k, _, v = line.partition(":")
        if k in ("VmRSS", "VmHWM"):
            vals[k] = int(v.split()[0]) / 1024
    return vals["VmRSS"], vals["VmHWM"]


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(len(xs) * p))]


def measure_http(url: str, ids: list[str], finished: list[str], samples: int) -> dict[str, list[float]]:
    endpoints = {
        "list (newest 50)": lambda: "/v1/jobs?limit=50",
        "list (PENDING, 50)": lambda: "/v1/jobs?limit=50&status=PENDING",
        "get": lambda: f"/v1/jobs/{random.choice(ids)}",
        "events": lambda: f"/v1/jobs/{random.choice(finished)}/events",
        "/metrics": lambda: "/metrics",
        "/v1/costs": lambda: "/v1/costs",
        "/v1/report": lambda: "/v1/report",
    }
    out: dict[str, list[float]] = {k: [] for k in endpoints}
    with httpx.Client(base_url=url, headers=AUTH, timeout=120) as c:
        for path in endpoints.values():  # warm-up: one of each
            assert c.get(path()).status_code == 200
        for _ in range(samples):
            for name, path in endpoints.items():
                p = path()
                t = time.perf_counter()
                r = c.get(p)
                out[name].append((time.perf_counter() - t) * 1000)
                assert r.status_code == 200, (p, r.status_code, r.text[:300])
    return out


def measure_admission(url: str, passes: int) -> tuple[list[float], int]:
    from raylane.orchestrator.domain.profile import default_profile
    from raylane.orchestrator.domain.routing import GroupState
    from raylane.orchestrator.loops.dispatcher import Dispatcher
    from raylane.orchestrator.settings import Settings
    from raylane.orchestrator.store import db

    GiB = 1024**3
    view = {
        "gpu": GroupState(alive_nodes=1, total={"CPU": 8, "GPU": 4, "memory": 32 * GiB}),
        "spot-cpu": GroupState(alive_nodes=2, total={"CPU": 16.0, "memory": 32 * GiB}),
        "cpu": GroupState(alive_nodes=1, total={"CPU": 8.0, "memory": 16 * GiB}),
    }
    settings = Settings(database_url=url, auto_migrate=False, loops_enabled=False, admin_token=TOKEN)
    engine = db.make_engine(url)
    d = Dispatcher(settings, db.make_sessionmaker(engine), backend=None, profile=default_profile())
    # The pool's first connection, opened apart: a server opens it at start (its
    # readiness and migration checks), before its dispatcher's first pass.
    t = time.perf_counter()
    db.ping(engine)
    connect_ms = (time.perf_counter() - t) * 1000
    print(f"  the pool's first connection: {connect_ms:.1f} ms", file=sys.stderr, flush=True)
    times, admitted = [], 0
    for _ in range(passes):
        t = time.perf_counter()
        admitted += len(d.claim(view))
        times.append((time.perf_counter() - t) * 1000)
    engine.dispose()
    return times, admitted


def sample_ids(url: str, k: int) -> tuple[list[str], list[str]]:
    from sqlalchemy import select

    from raylane.orchestrator.store import db
    from raylane.orchestrator.store.tables import jobs

    engine = db.make_engine(url)
    with engine.connect() as conn:
        ids = [r[0] for r in conn.execute(select(jobs.c.id))]
    engine.dispose()
    rnd = random.Random(11)
    # Even positions are the finished ones (generate's i % 2 == 0); ids sort by creation.
    return rnd.sample(ids, k), rnd.sample(ids[::2], k)


def pg_database():
    import psycopg

    name = f"raylane_bench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect("postgresql://postgres@127.0.0.1:5432/postgres", autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')

    def drop():
        with psycopg.connect("postgresql://postgres@127.0.0.1:5432/postgres", autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    return f"postgresql+psycopg://postgres@127.0.0.1:5432/{name}", drop


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=1_000_000)
    ap.add_argument("--pending", type=int, default=100_000)
    ap.add_argument("--samples", type=int, default=200)
    ap.add_argument("--passes", type=int, default=30)
    ap.add_argument("--db", choices=("sqlite", "postgresql"), default="sqlite")
    ap.add_argument("--keep", help="SQLite file to create, or reuse when it exists (skips generation)")
    args = ap.parse_args()
    from raylane.orchestrator.store import migrate

    drop = None
    gen_s = 0.0
    if args.db == "postgresql":
        url, drop = pg_database()
    else:
        path = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="raylane-scale-")) / "scale.db"
        url = f"sqlite:///{path}"
        reuse = path.exists()
    try:
        if args.db == "postgresql" or not reuse:
            migrate.upgrade(url)
            gen_s = generate(url, args.jobs, args.pending)
        scan_s, rebuild_s, usage_s = recount_and_rebuild(url)
        old_costs = old_costs_ms(url)
        ids, finished = sample_ids(url, 1000)
        work = Path(tempfile.mkdtemp(prefix="raylane-scale-srv-"))
        proc, base = _server.start_server(work, {
            "RAYLANE_DATABASE_URL": url, "RAYLANE_LOOPS_ENABLED": "false", "RAYLANE_ADMIN_TOKEN": TOKEN,
            "RAYLANE_SUBMIT_RATE_PER_S": "0"}, timeout=120)
        try:
            rss0 = rss_mb(proc.pid)
            http = measure_http(base, ids, finished, args.samples)
            rss1 = rss_mb(proc.pid)
        finally:
            _server.stop_server(proc)
        adm, admitted = measure_admission(url, args.passes)
    finally:
        if drop:
            drop()
    # The first pass of a fresh process compiles its statements and, on PostgreSQL,
    # fills the new backend's catalog caches: once per server start, shown apart.
    rows = {**http, "admission pass, a fresh process's first": adm[:1]}
    if adm[1:]:
        rows["admission pass, the next"] = adm[1:]
    print(f"\n{args.db}: {args.jobs:,} jobs ({args.pending:,} pending); generated in {gen_s:.0f} s; "
          f"old full-scan counts {scan_s * 1000:.0f} ms; tallies rebuilt in {rebuild_s:.1f} s; "
          f"attempt_usage rebuilt in {usage_s:.1f} s; old per-attempt costs {old_costs:.0f} ms; "
          f"admitted {admitted} jobs in {args.passes} passes")
    print("| what | n | p50 ms | p99 ms | max ms |")
    print("|---|---:|---:|---:|---:|")
    for name, xs in rows.items():
        print(f"| {name} | {len(xs)} | {statistics.median(xs):.1f} | {pct(xs, 0.99):.1f} | {max(xs):.1f} |")
    print(f"server RSS: {rss0[0]:.0f} MB after start, {rss1[0]:.0f} MB after the reads (peak {rss1[1]:.0f} MB)")
    print(json.dumps({"db": args.db, "jobs": args.jobs, "pending": args.pending, "generate_s": gen_s,
                      "old_scan_ms": scan_s * 1000, "rebuild_s": rebuild_s,
                      "usage_rebuild_s": usage_s, "old_costs_ms": old_costs, "rss_mb": [rss0, rss1],
                      "p50_ms": {k: statistics.median(v) for k, v in rows.items()},
                      "p99_ms": {k: pct(v, 0.99) for k, v in rows.items()}}))


if __name__ == "__main__":
    main()
