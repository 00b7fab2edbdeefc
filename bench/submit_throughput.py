"""Submit throughput: jobs durably stored per second through a real server.

Starts `raylane-server serve` (uvicorn, one process) on SQLite and on PostgreSQL, then
measures, from one asyncio client process on the same machine:
  - single submits: POST /v1/jobs with C concurrent connections for D seconds
  - batches: POST /v1/jobs/batch of 1,000 specs, several in flight
Every count is checked against the database afterwards (GET /v1/jobs paging is
too slow for 100k rows, so we count rows directly).

    python bench/submit_throughput.py [--seconds 10] [--concurrency 32]
    python bench/submit_throughput.py --before ../main --pairs 3   # this tree against another, alternated

With ``--before TREE``, each database runs ``--pairs`` pairs of (that tree's
server, this tree's server), the order flipped every pair, each on a fresh
database, and prints each pair and the median ratio after/before.

    python bench/submit_throughput.py --bare-pairs 4 --seconds 5   # against the framework's ceiling

With ``--bare-pairs N``, one server per database (RAYLANE_BENCH_BARE_ENDPOINT=true)
runs N pairs of (POST /bench/bare-submit, POST /v1/jobs) single submits, the
order flipped every pair, then batches: the ratios real / bare and batch jobs/s /
bare singles/s, each pair's, their median and range, with the load average. The
bare endpoint takes the same body through the same auth, middleware and JobSpec
validation and stores nothing: what is left of the ratio is the store's cost,
on whatever machine runs it (docs/benchmarks.md's goals: >= 0.5 and >= 5).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import _server  # noqa: E402

SPEC = {"name": "bench", "kind": "command", "entrypoint": "true", "labels": {"bench": "1"}}
# Auth stays on (its token lookup is part of every request's cost); the rate limit is off.
TOKEN = "rl_bench-admin-token-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
BARE = "/bench/bare-submit"  # api/routers/bench.py: validates, answers 201, stores nothing


def start_server(db_url: str, data_dir: str, tree: Path | None = None,
                 env: dict[str, str] | None = None) -> tuple[subprocess.Popen, str]:
    return _server.start_server(Path(data_dir), {
        "RAYLANE_DATABASE_URL": db_url, "RAYLANE_LOOPS_ENABLED": "false", "RAYLANE_ADMIN_TOKEN": TOKEN,
        "RAYLANE_SUBMIT_RATE_PER_S": "0", **(env or {})}, timeout=60, tree=tree)


async def singles(url: str, seconds: float, concurrency: int, client: str = "raw",
                  rate: float = 0, path: str = "/v1/jobs") -> tuple[int, float, list[float]]:
    """``concurrency`` connections each submitting one job after another for ``seconds``:
    (acknowledged, seconds, latencies). ``client="raw"``: HTTP/1.1 written and read
    on asyncio streams, ~0.1 ms of client CPU a request; httpx spent ~3.7 ms, a whole
    core at 260 submits/s on 2, so its latencies were mostly its own queue.
    ``rate``: open loop at that many submits a second (``paced_singles``). ``path``:
    another route taking the same body (the raw client only: ``BARE``)."""
    if rate:
        return await paced_singles(url, seconds, rate, concurrency)
    if client == "raw":
        return await raw_singles(url, seconds, concurrency, path)
    assert path == "/v1/jobs", "--client httpx submits to /v1/jobs only"
    return await httpx_singles(url, seconds, concurrency)


async def raw_singles(url: str, seconds: float, concurrency: int,
                      path: str = "/v1/jobs") -> tuple[int, float, list[float]]:
    from urllib.parse import urlsplit

    host, port = urlsplit(url).hostname, urlsplit(url).port
    body = json.dumps(SPEC).encode()
    request = (f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nAuthorization: {AUTH['Authorization']}\r\n"
               f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode() + body
    done = 0
    lat: list[float] = []
    stop = time.perf_counter() + seconds

    async def worker():
        nonlocal done
        reader, writer = await asyncio.open_connection(host, port)
        try:
            while time.perf_counter() < stop:
                t = time.perf_counter()
                writer.write(request)
                head = await reader.readuntil(b"\r\n\r\n")
                status = int(head[9:12])
                length = next(int(line.split(b":", 1)[1]) for line in head.lower().split(b"\r\n")
                              if line.startswith(b"content-length:"))
                answer = await reader.readexactly(length)
                assert status == 201, (status, answer[:300])
                lat.append(time.perf_counter() - t)
                done += 1
        finally:
            writer.close()

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return done, time.perf_counter() - t0, lat


async def paced_singles(url: str, seconds: float, rate: float, connections: int) -> tuple[int, float, list[float]]:
    """Open loop: a submit due every ``1/rate`` s, sent on the first free one of
    ``connections`` raw connections. Each latency runs from when its submit was
    due, not sent: a server that falls behind shows it as a growing wait (no
    coordinated omission), and the bench asserts every due submit was sent."""
    from urllib.parse import urlsplit

    host, port = urlsplit(url).hostname, urlsplit(url).port
    body = json.dumps(SPEC).encode()
    request = (f"POST /v1/jobs HTTP/1.1\r\nHost: {host}:{port}\r\nAuthorization: {AUTH['Authorization']}\r\n"
               f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode() + body
    due: asyncio.Queue = asyncio.Queue()
    lat: list[float] = []
    total = int(seconds * rate)

    async def connection():
        reader, writer = await asyncio.open_connection(host, port)
        try:
            while True:
                at = await due.get()
                if at is None:
                    return
                writer.write(request)
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(int(line.split(b":", 1)[1]) for line in head.lower().split(b"\r\n")
                              if line.startswith(b"content-length:"))
                answer = await reader.readexactly(length)
                assert int(head[9:12]) == 201, (head[:12], answer[:300])
                lat.append(time.perf_counter() - at)
        finally:
            writer.close()

    conns = [asyncio.create_task(connection()) for _ in range(connections)]
    t0 = time.perf_counter()
    sent = 0
    while sent < total:
        now = time.perf_counter()
        while sent < total and t0 + sent / rate <= now:
            due.put_nowait(t0 + sent / rate)
            sent += 1
        await asyncio.sleep(max(0.0, t0 + sent / rate - time.perf_counter()))
    for _ in conns:
        due.put_nowait(None)
    await asyncio.gather(*conns)
    assert len(lat) == total
    return total, time.perf_counter() - t0, lat


async def httpx_singles(url: str, seconds: float, concurrency: int) -> tuple[int, float, list[float]]:
    done = 0
    lat: list[float] = []
    stop = time.perf_counter() + seconds
    async with httpx.AsyncClient(base_url=url, timeout=30, headers=AUTH, limits=httpx.Limits(max_connections=concurrency)) as c:
        async def worker():
            nonlocal done
            while time.perf_counter() < stop:
                t = time.perf_counter()
                r = await c.post("/v1/jobs", json=SPEC)
                assert r.status_code == 201, r.text
                lat.append(time.perf_counter() - t)
                done += 1

        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return done, time.perf_counter() - t0, lat


async def batches(url: str, n_batches: int, size: int, inflight: int) -> tuple[int, float]:
    body = json.dumps({"jobs": [SPEC] * size}).encode()
    sem = asyncio.Semaphore(inflight)
    async with httpx.AsyncClient(base_url=url, timeout=120, headers=AUTH) as c:
        async def one():
            async with sem:
                r = await c.post("/v1/jobs/batch", content=body, headers={"content-type": "application/json"})
                assert r.status_code == 201, r.text[:300]
                return r.json()["count"]

        t0 = time.perf_counter()
        counts = await asyncio.gather(*(one() for _ in range(n_batches)))
        return sum(counts), time.perf_counter() - t0


def count_rows(db_url: str) -> int:
    from sqlalchemy import create_engine, text

    from raylane.orchestrator.store.db import normalise_url

    eng = create_engine(normalise_url(db_url))
    with eng.connect() as conn:
        n = conn.execute(text("SELECT count(*) FROM jobs")).scalar()
    eng.dispose()
    return n


def pg_database() -> tuple[str, callable]:
    import psycopg

    name = f"raylane_bench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect("postgresql://postgres@127.0.0.1:5432/postgres", autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')

    def drop():
        with psycopg.connect("postgresql://postgres@127.0.0.1:5432/postgres", autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    return f"postgresql+psycopg://postgres@127.0.0.1:5432/{name}", drop


def fresh_database(db: str) -> tuple[str, callable | None]:
    """(URL, drop or None): a new PostgreSQL database, or a SQLite file in a new directory."""
    if db == "postgresql":
        return pg_database()
    return f"sqlite:///{tempfile.mkdtemp(prefix='raylane-bench-')}/bench.db", None


def cpu_s(pid: int) -> float:
    """User + system CPU seconds ``pid`` and its live children (uvicorn's workers) have used (Linux /proc)."""
    total = 0.0
    for p in [pid, *children(pid)]:
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def children(pid: int) -> list[int]:
    try:
        return [int(k) for k in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def compare_workers(args) -> None:
    """RAYLANE_WORKERS=1 against =N on each of ``args.db``, alternated, ``args.pairs`` pairs."""
    import statistics

    out = []
    for db, i in [(db, i) for db in args.db for i in range(args.pairs)]:
        order = [1, args.workers] if i % 2 == 0 else [args.workers, 1]
        pair = {}
        for w in order:
            os.environ["RAYLANE_WORKERS"] = str(w)
            url, drop = fresh_database(db)
            try:
                pair[w] = run(f"{db} workers={w}", url, args)
            finally:
                if drop:
                    drop()
        os.environ.pop("RAYLANE_WORKERS", None)
        load = os.getloadavg()[0]
        one, many = pair[1], pair[args.workers]
        out.append({"db": db, "pair": i + 1, "first": order[0], "load": load, "one": one, "many": many})
        print(f"{db} pair {i + 1} ({order[0]} first, load {load:.1f}): singles/s {one['single_per_s']:.0f} -> "
              f"{many['single_per_s']:.0f}, p50 {one['single_p50_ms']:.0f} -> {many['single_p50_ms']:.0f} ms, "
              f"p99 {one['single_p99_ms']:.0f} -> {many['single_p99_ms']:.0f} ms, batch jobs/s "
              f"{one['batch_jobs_per_s']:.0f} -> {many['batch_jobs_per_s']:.0f}", flush=True)
    for db in args.db:
        for key, what in (("single_per_s", "single submits/s"), ("batch_jobs_per_s", "batch jobs/s")):
            ratios = [r["many"][key] / r["one"][key] for r in out if r["db"] == db]
            print(f"{db}: workers={args.workers} / workers=1, {what}: median {statistics.median(ratios):.2f} "
                  f"(range {min(ratios):.2f}-{max(ratios):.2f}, {len(ratios)} pairs)")
    print(json.dumps(out))


def compare_databases(args) -> None:
    """PostgreSQL against SQLite (synchronous=FULL), the same tree, alternated
    (SQLite first in odd pairs), ``args.db_pairs`` pairs: the ratio of each pair."""
    import statistics

    out = []
    for i in range(args.db_pairs):
        order = ["sqlite", "postgresql"] if i % 2 == 0 else ["postgresql", "sqlite"]
        pair = {}
        for db in order:
            url, drop = fresh_database(db)
            try:
                pair[db] = run(db, url, args)
            finally:
                if drop:
                    drop()
        sq, pg = pair["sqlite"], pair["postgresql"]
        out.append({"pair": i + 1, "first": order[0], "load": os.getloadavg()[0], **pair})
        print(f"pair {i + 1} ({order[0]} first, load {out[-1]['load']:.1f}): singles/s SQLite {sq['single_per_s']:.0f}, "
              f"PostgreSQL {pg['single_per_s']:.0f}; batch jobs/s {sq['batch_jobs_per_s']:.0f}, "
              f"{pg['batch_jobs_per_s']:.0f}", flush=True)
    print("| pair (first) | load | singles/s SQLite / PostgreSQL | ratio | p50 ms | p99 ms | server CPU ms a submit "
          "| batch jobs/s | ratio |")
    print("|---|---:|---|---:|---|---|---|---|---:|")
    for r in out:
        sq, pg = r["sqlite"], r["postgresql"]
        print(f"| {r['pair']} ({r['first']}) | {r['load']:.1f} | {sq['single_per_s']:.0f} / {pg['single_per_s']:.0f} "
              f"| {pg['single_per_s'] / sq['single_per_s']:.2f} | {sq['single_p50_ms']:.0f} / {pg['single_p50_ms']:.0f} "
              f"| {sq['single_p99_ms']:.0f} / {pg['single_p99_ms']:.0f} | {sq['server_cpu_ms_per_submit']:.2f} / "
              f"{pg['server_cpu_ms_per_submit']:.2f} | {sq['batch_jobs_per_s']:.0f} / {pg['batch_jobs_per_s']:.0f} "
              f"| {pg['batch_jobs_per_s'] / sq['batch_jobs_per_s']:.2f} |")
    for key, what in (("single_per_s", "single submits/s"), ("batch_jobs_per_s", "batch jobs/s")):
        ratios = [r["postgresql"][key] / r["sqlite"][key] for r in out]
        print(f"PostgreSQL / SQLite, {what}: median {statistics.median(ratios):.2f} "
              f"(range {min(ratios):.2f}-{max(ratios):.2f}, {len(ratios)} pairs)")
    print(json.dumps(out))


def run(label: str, db_url: str, args, tree: Path | None = None) -> dict:
    data_dir = tempfile.mkdtemp(prefix="raylane-bench-")
    proc, url = start_server(db_url, data_dir, tree)
    print(f"{label}: server log in {data_dir}/server.log", file=sys.stderr)
    try:
        asyncio.run(singles(url, 1.0, 4, args.client))  # warm-up
        base = count_rows(db_url)
        cpu0, own0 = cpu_s(proc.pid), time.process_time()
        n, dt, lat = asyncio.run(singles(url, args.seconds, args.concurrency, args.client, args.rate))
        # The server's CPU per submit: what a shared machine's load distorts least.
        cpu_ms = (cpu_s(proc.pid) - cpu0) * 1000 / max(n, 1)
        client_ms = (time.process_time() - own0) * 1000 / max(n, 1)
        assert count_rows(db_url) - base == n, "stored count differs from acknowledged submits"
        lat.sort()
        base = count_rows(db_url)
        cpu0 = cpu_s(proc.pid)
        bn, bdt = asyncio.run(batches(url, args.batches, 1000, args.batch_inflight))
        batch_cpu_us = (cpu_s(proc.pid) - cpu0) * 1e6 / max(bn, 1)
        assert count_rows(db_url) - base == bn
        return {"database": label, "single_per_s": n / dt, "single_p50_ms": lat[len(lat) // 2] * 1000,
                "single_p99_ms": lat[int(len(lat) * 0.99)] * 1000, "batch_jobs_per_s": bn / bdt,
                "single_n": n, "batch_n": bn, "server_cpu_ms_per_submit": cpu_ms, "client_cpu_ms_per_submit": client_ms,
                "batch_server_cpu_us_per_job": batch_cpu_us,
                "load": os.getloadavg()[0]}
    finally:
        _server.stop_server(proc)


def compare(args) -> None:
    """Pairs of (before, after) per database, alternating which runs first."""
    import statistics

    before = Path(args.before).resolve()
    out = []
    for db in args.db:
        for i in range(args.pairs):
            order = [("before", before), ("after", None)]
            if i % 2:
                order.reverse()
            pair = {}
            for which, tree in order:
                url, drop = fresh_database(db)
                try:
                    pair[which] = run(f"{db} {which}", url, args, tree)
                finally:
                    if drop:
                        drop()
            load = os.getloadavg()[0]
            out.append({"db": db, "pair": i + 1, "first": order[0][0], "load": load, **pair})
            b, a = pair["before"], pair["after"]
            print(f"{db} pair {i + 1} ({order[0][0]} first, load {load:.1f}): singles/s {b['single_per_s']:.0f} -> "
                  f"{a['single_per_s']:.0f}, server CPU/submit {b['server_cpu_ms_per_submit']:.2f} -> "
                  f"{a['server_cpu_ms_per_submit']:.2f} ms, p50 {b['single_p50_ms']:.0f} -> {a['single_p50_ms']:.0f} ms, "
                  f"p99 {b['single_p99_ms']:.0f} -> {a['single_p99_ms']:.0f} ms, batch jobs/s "
                  f"{b['batch_jobs_per_s']:.0f} -> {a['batch_jobs_per_s']:.0f}, server CPU/batch job "
                  f"{b['batch_server_cpu_us_per_job']:.0f} -> {a['batch_server_cpu_us_per_job']:.0f} us", flush=True)
    print("| database | pair (first) | load | before/s | after/s | ratio | server CPU ms/submit before/after "
          "| p50 ms before/after | p99 ms before/after | batch jobs/s before/after |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in out:
        b, a = r["before"], r["after"]
        print(f"| {r['db']} | {r['pair']} ({r['first']}) | {r['load']:.1f} | {b['single_per_s']:.0f} | "
              f"{a['single_per_s']:.0f} | {a['single_per_s'] / b['single_per_s']:.2f} | "
              f"{b['server_cpu_ms_per_submit']:.2f} / {a['server_cpu_ms_per_submit']:.2f} | {b['single_p50_ms']:.0f} / "
              f"{a['single_p50_ms']:.0f} | {b['single_p99_ms']:.0f} / {a['single_p99_ms']:.0f} | "
              f"{b['batch_jobs_per_s']:.0f} / {a['batch_jobs_per_s']:.0f} |")
    for db in args.db:
        ratios = [r["after"]["single_per_s"] / r["before"]["single_per_s"] for r in out if r["db"] == db]
        cpu = [r["after"]["server_cpu_ms_per_submit"] / r["before"]["server_cpu_ms_per_submit"]
               for r in out if r["db"] == db]
        print(f"{db}: median ratio after/before {statistics.median(ratios):.2f} "
              f"(range {min(ratios):.2f}-{max(ratios):.2f}, {len(ratios)} pairs); server CPU per submit "
              f"after/before {statistics.median(cpu):.2f} (range {min(cpu):.2f}-{max(cpu):.2f})")
        bcpu = [r["after"]["batch_server_cpu_us_per_job"] / r["before"]["batch_server_cpu_us_per_job"]
                for r in out if r["db"] == db]
        print(f"{db}: batches' server CPU per job after/before {statistics.median(bcpu):.2f} "
              f"(range {min(bcpu):.2f}-{max(bcpu):.2f})")
    print(json.dumps(out))


def against_bare(args) -> None:
    """Per database in ``args.db``: one server with the bare endpoint on, a fresh
    database, ``args.bare_pairs`` pairs of bare and real single submits (bare
    first in odd pairs), each pair followed by the batches."""
    import statistics

    out = []
    for db in args.db:
        db_url, drop = fresh_database(db)
        data_dir = tempfile.mkdtemp(prefix="raylane-bench-")
        proc, url = start_server(db_url, data_dir, env={"RAYLANE_BENCH_BARE_ENDPOINT": "true"})
        print(f"{db}: server log in {data_dir}/server.log", file=sys.stderr)
        try:
            for path in (BARE, "/v1/jobs"):  # warm-up, both routes
                asyncio.run(singles(url, 1.0, 4, path=path))

            def measure(path: str) -> dict:
                rows0, cpu0 = count_rows(db_url), cpu_s(proc.pid)
                n, dt, lat = asyncio.run(singles(url, args.seconds, args.concurrency, path=path))
                stored = count_rows(db_url) - rows0
                assert stored == (0 if path == BARE else n), f"{path}: {stored} rows stored for {n} acknowledged"
                lat.sort()
                return {"per_s": n / dt, "n": n, "p50_ms": lat[len(lat) // 2] * 1000,
                        "server_cpu_ms": (cpu_s(proc.pid) - cpu0) * 1000 / max(n, 1)}

            for i in range(args.bare_pairs):
                order = ["bare", "real"] if i % 2 == 0 else ["real", "bare"]
                pair = {which: measure(BARE if which == "bare" else "/v1/jobs") for which in order}
                rows0 = count_rows(db_url)
                bn, bdt = asyncio.run(batches(url, args.batches, 1000, args.batch_inflight))
                assert count_rows(db_url) - rows0 == bn
                bare, real = pair["bare"], pair["real"]
                r = {"db": db, "pair": i + 1, "first": order[0], "load": os.getloadavg(), **pair,
                     "batch_jobs_per_s": bn / bdt, "single_ratio": real["per_s"] / bare["per_s"],
                     "batch_ratio": bn / bdt / bare["per_s"]}
                out.append(r)
                print(f"{db} pair {r['pair']} ({r['first']} first, load {r['load'][0]:.1f}): bare {bare['per_s']:.0f}/s "
                      f"(server CPU {bare['server_cpu_ms']:.2f} ms), real {real['per_s']:.0f}/s "
                      f"({real['server_cpu_ms']:.2f} ms) = {r['single_ratio']:.2f}x; batches "
                      f"{r['batch_jobs_per_s']:.0f} jobs/s = {r['batch_ratio']:.1f}x bare singles", flush=True)
        finally:
            _server.stop_server(proc)
            if drop:
                drop()
    print("| database | pair (first) | load 1/5/15 min | bare /s | real /s | real / bare "
          "| server CPU ms bare / real | batch jobs/s | batch / bare |")
    print("|---|---|---|---:|---:|---:|---|---:|---:|")
    for r in out:
        print(f"| {r['db']} | {r['pair']} ({r['first']}) | {'/'.join(f'{x:.1f}' for x in r['load'])} "
              f"| {r['bare']['per_s']:.0f} | {r['real']['per_s']:.0f} | {r['single_ratio']:.2f} "
              f"| {r['bare']['server_cpu_ms']:.2f} / {r['real']['server_cpu_ms']:.2f} "
              f"| {r['batch_jobs_per_s']:.0f} | {r['batch_ratio']:.1f} |")
    for db in args.db:
        mine = [r for r in out if r["db"] == db]
        for key, what, goal in (("single_ratio", "single submits / bare endpoint", 0.5),
                                ("batch_ratio", "batch jobs/s / bare endpoint's singles/s", 5)):
            v = [r[key] for r in mine]
            print(f"{db}: {what}: median {statistics.median(v):.2f} (range {min(v):.2f}-{max(v):.2f}, "
                  f"{len(v)} pairs; goal >= {goal}), load {min(r['load'][0] for r in mine):.1f}-"
                  f"{max(r['load'][0] for r in mine):.1f}")
    print(json.dumps(out))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=10)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--batches", type=int, default=20)
    ap.add_argument("--before", help="another checkout to compare against (its server, alternated with this one's)")
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--client", choices=("raw", "httpx"), default="raw",
                    help="the single submits' client: raw HTTP/1.1 on asyncio streams, or httpx (client-bound here)")
    ap.add_argument("--rate", type=float, default=0,
                    help="single submits at this fixed rate (open loop, on --concurrency connections) instead of "
                         "as fast as --concurrency connections go; latency counted from when each was due")
    ap.add_argument("--db", nargs="+", choices=("sqlite", "postgresql"), default=["sqlite", "postgresql"],
                    help="with --before: the databases to compare on")
    ap.add_argument("--workers", type=int, default=0, help="compare RAYLANE_WORKERS=1 with this many (on --db)")
    ap.add_argument("--batch-inflight", type=int, default=2, help="batches in flight at once")
    ap.add_argument("--db-pairs", type=int, default=0,
                    help="PostgreSQL against SQLite: this many alternated pairs, the same tree")
    ap.add_argument("--bare-pairs", type=int, default=0,
                    help="on each --db: this many alternated pairs of single submits to the bare endpoint and to "
                         "POST /v1/jobs, each followed by batches; ratios to the bare endpoint")
    args = ap.parse_args()
    if args.bare_pairs:
        against_bare(args)
        return
    if args.db_pairs:
        compare_databases(args)
        return
    if args.workers:
        compare_workers(args)
        return
    if args.before:
        compare(args)
        return
    rows = []
    tmp = tempfile.mkdtemp(prefix="raylane-bench-sqlite-")
    for sync in ("FULL", "NORMAL"):
        os.environ["RAYLANE_SQLITE_SYNCHRONOUS"] = sync
        rows.append(run(f"SQLite (WAL, synchronous={sync})", f"sqlite:///{tmp}/{sync}.db", args))
    os.environ.pop("RAYLANE_SQLITE_SYNCHRONOUS")
    pg_url, drop = pg_database()
    try:
        rows.append(run("PostgreSQL 15 (local)", pg_url, args))
    finally:
        drop()
    print("| database | single submits/s | p50 ms | p99 ms | server / client CPU ms a submit | batch jobs/s | load |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['database']} | {r['single_per_s']:.0f} | {r['single_p50_ms']:.1f} | {r['single_p99_ms']:.1f} "
              f"| {r['server_cpu_ms_per_submit']:.2f} / {r['client_cpu_ms_per_submit']:.2f} "
              f"| {r['batch_jobs_per_s']:.0f} | {r['load']:.1f} |")
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
