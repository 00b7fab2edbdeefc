"""Where a submit's server CPU goes: py-spy samples a real server (GIL holders
only, 200 Hz) while 32 connections submit for 8 s (or, with ``--batches N``, N
batches of 1,000 jobs go two at a time), then prints the share of samples
under each function (inclusive), largest first.

    python bench/profile_submit.py [--db sqlite|postgresql] [--batches N] [--top 60] [--grep NAME]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import _server, submit_throughput as st  # noqa: E402


def shares(raw: Path, leaf: bool = False) -> tuple[int, collections.Counter]:
    """(samples, samples under each function) from py-spy's raw (collapsed) output;
    ``leaf``: samples in each function itself (its own time, not its callees')."""
    inclusive: collections.Counter = collections.Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        total += int(n)
        frames = [f.split(" (")[0] for f in stack.split(";")]
        for name in ({frames[-1]} if leaf else set(frames)):
            inclusive[name] += int(n)
    return total, inclusive


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--db", choices=("sqlite", "postgresql"), default="sqlite")
    ap.add_argument("--seconds", type=int, default=8)
    ap.add_argument("--top", type=int, default=60)
    ap.add_argument("--grep", help="only functions whose name contains this")
    ap.add_argument("--self", dest="leaf", action="store_true", help="each function's own samples, not its callees'")
    ap.add_argument("--rate", type=int, default=200, help="samples a second")
    ap.add_argument("--batches", type=int, default=0, help="sample N batches of 1,000 jobs instead of single submits")
    args = ap.parse_args()
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    drop = None
    if args.db == "sqlite":
        url = f"sqlite:///{tempfile.mkdtemp(prefix='raylane-prof-')}/p.db"
    else:
        url, drop = st.pg_database()
    raw = Path(tempfile.mkdtemp(prefix="raylane-prof-")) / "submit.txt"
    proc, base = st.start_server(url, tempfile.mkdtemp(prefix="raylane-prof-"))
    try:
        asyncio.run(st.singles(base, 1.0, 4))  # warm-up
        rec = subprocess.Popen([spy, "record", "-p", str(proc.pid), "-r", str(args.rate), "-d", str(args.seconds), "--gil",
                                "--nonblocking", "--format", "raw", "-o", str(raw)], stdout=subprocess.DEVNULL)
        if args.batches:
            n, dt = asyncio.run(st.batches(base, args.batches, 1000, 2))
            rec.send_signal(signal.SIGINT)  # py-spy writes what it has sampled and exits
        else:
            n, dt, _ = asyncio.run(st.singles(base, args.seconds, 32))
        rec.wait()
    finally:
        _server.stop_server(proc)
        if drop:
            drop()
    total, inclusive = shares(raw, args.leaf)
    what = "jobs/s in batches" if args.batches else "submits/s"
    print(f"{args.db}: {n / dt:.0f} {what} while sampled; {total} samples")
    rows = [(k, v) for k, v in inclusive.most_common() if not args.grep or args.grep in k]
    for name, v in rows[:args.top]:
        print(f"{100 * v / total:5.1f}%  {name}")


if __name__ == "__main__":
    main()
