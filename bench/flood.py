"""Flood: a healthy client's latency while ~1,000 req/s arrive without a token.

Starts one `raylane-server serve` (SQLite, auth on, loops off, submit limit off,
the address gate at its defaults) and runs, alternating in the same server,
``--pairs`` pairs of phases of ``--seconds`` each:

  idle   the healthy client alone: submit one job, list 20 jobs, again, one
         request at a time, with a token (measured: each request's latency)
  flood  the same, while a flooder process sends ``--rate`` POST /v1/jobs per
         second without a token over 16 keep-alive connections (raw HTTP/1.1,
         so the flooder's own CPU stays small)

It reports each phase's p50/p99, the ratio of each flood p99 to the idle p99 of
its pair, their median and spread, the flooder's achieved rate and answers, the
audit rows the flood left (the anonymous rows and the requests they count), and
the machine's load average (os.getloadavg) before and after. Goal: median ratio
of p99 <= 3.

    python bench/flood.py [--seconds 10] [--pairs 3] [--rate 1000]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from urllib.parse import urlparse

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import _server  # noqa: E402
from tests.helpers import wait_for  # noqa: E402

TOKEN = "rl_bench-admin-token-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
SPEC = {"name": "healthy", "kind": "command", "entrypoint": "true"}
FLOOD_CONNECTIONS = 16


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p * len(xs)))] * 1000


async def healthy(url: str, seconds: float) -> list[float]:
    lat: list[float] = []
    stop = time.perf_counter() + seconds
    async with httpx.AsyncClient(base_url=url, headers=AUTH, timeout=60) as c:
        while time.perf_counter() < stop:
            for call in (lambda: c.post("/v1/jobs", json=SPEC), lambda: c.get("/v1/jobs", params={"limit": 20})):
                t = time.perf_counter()
                r = await call()
                lat.append(time.perf_counter() - t)
                assert r.status_code in (200, 201), r.text
    return lat


async def flooder(url: str, rate: float, seconds: float) -> dict:
    """Send ``rate`` requests/s without a token; return what came back."""
    u = urlparse(url)
    request = (f"POST /v1/jobs HTTP/1.1\r\nHost: {u.hostname}\r\nContent-Type: application/json\r\n"
               f"Content-Length: 2\r\n\r\n{{}}").encode()
    codes: Counter[str] = Counter()
    per_conn = rate / FLOOD_CONNECTIONS
    conns = [await asyncio.open_connection(u.hostname, u.port) for _ in range(FLOOD_CONNECTIONS)]
    print("flooding", flush=True)  # the measured phase starts once the flood does
    t0 = time.perf_counter()

    async def conn(reader, writer):
        sent = 0
        while (elapsed := time.perf_counter() - t0) < seconds:
            ahead = sent / per_conn - elapsed
            if ahead > 0:
                await asyncio.sleep(ahead)
            writer.write(request)
            status = (await reader.readline()).split()[1].decode()
            length = 0
            while (line := await reader.readline()) not in (b"\r\n", b""):
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":")[1])
            await reader.readexactly(length)
            codes[status] += 1
            sent += 1
        writer.close()

    await asyncio.gather(*(conn(r, w) for r, w in conns))
    took = time.perf_counter() - t0
    return {"sent": sum(codes.values()), "per_s": round(sum(codes.values()) / took), "codes": dict(codes)}


def phase(url: str, seconds: float, rate: float | None) -> tuple[list[float], dict | None]:
    proc = None
    if rate:
        proc = subprocess.Popen([sys.executable, __file__, "--flooder", url, "--rate", str(rate),
                                 "--seconds", str(seconds + 1)], stdout=subprocess.PIPE, text=True)
        assert proc.stdout.readline().strip() == "flooding"  # it runs 1 s longer than the measured phase
    lat = asyncio.run(healthy(url, seconds))
    report = json.loads(proc.communicate(timeout=seconds + 60)[0]) if proc else None
    return lat, report


def audit_of_anonymous(url: str) -> tuple[int, int]:
    items, cursor = [], None
    while True:
        page = httpx.get(url + "/v1/audit", headers=AUTH, timeout=30,
                         params={"actor": "anonymous", "limit": 500, **({"cursor": cursor} if cursor else {})}).json()
        items += page["items"]
        cursor = page["next_cursor"]
        if not cursor:
            return len(items), sum(e["count"] for e in items)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=10)
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--rate", type=float, default=1000)
    ap.add_argument("--flooder")
    args = ap.parse_args()
    if args.flooder:
        print(json.dumps(asyncio.run(flooder(args.flooder, args.rate, args.seconds))))
        return
    load0 = os.getloadavg()
    with tempfile.TemporaryDirectory() as work:
        proc, url = _server.start_server(Path(work), {
            "RAYLANE_LOOPS_ENABLED": "false", "RAYLANE_ADMIN_TOKEN": TOKEN, "RAYLANE_SUBMIT_RATE_PER_S": "0"})
        try:
            asyncio.run(healthy(url, 1))  # warm up; the token is now one the server has seen valid
            ratios, rows, reports = [], [], []
            for i in range(args.pairs):
                idle, _ = phase(url, args.seconds, None)
                flood, report = phase(url, args.seconds, args.rate)
                ratio = pct(flood, 0.99) / pct(idle, 0.99)
                ratios.append(ratio)
                reports.append(report)
                rows.append(f"| {i + 1} | {pct(idle, .5):.1f} / {pct(idle, .99):.1f} ({len(idle)}) | "
                            f"{pct(flood, .5):.1f} / {pct(flood, .99):.1f} ({len(flood)}) | {ratio:.2f} | "
                            f"{report['per_s']} req/s: {report['codes']} |")
            flooded = sum(r["sent"] for r in reports)
            # The last counts reach the audit rows at the next flush (api.refusals.FLUSH_EVERY_S).
            audit_rows, audit_requests = wait_for(lambda: (a := audit_of_anonymous(url))[1] == flooded and a,
                                                  timeout=60, what="the audit to count every flood request")
        finally:
            _server.stop_server(proc)
    print("| pair | idle p50 / p99 ms (requests) | flood p50 / p99 ms (requests) | p99 ratio | flooder |")
    print("|---|---|---|---|---|")
    print("\n".join(rows))
    print(f"\nmedian p99 ratio {statistics.median(ratios):.2f} (spread {min(ratios):.2f}-{max(ratios):.2f}); "
          f"audit: {audit_rows} anonymous rows counting {audit_requests} refused requests; "
          f"load average {load0[0]:.2f} before, {os.getloadavg()[0]:.2f} after; {os.cpu_count()} CPUs")


if __name__ == "__main__":
    main()
