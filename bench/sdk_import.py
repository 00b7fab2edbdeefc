"""SDK import time: what ``import raylane`` costs a user's script, and ``raylane --help``
a shell, each measured in N fresh interpreters (median; min and max shown too).

    python bench/sdk_import.py [--runs 21] [--write-doc]

Every run is a new ``python`` process, so nothing is warm but the OS file cache
(the first, cold run is dropped). Three figures:

- in-process: ``time.perf_counter()`` around ``import raylane`` alone;
- process: wall time of ``python -c "import raylane"`` minus that of ``python -c pass``;
- CLI: wall time of ``python -m raylane.client.cli --help``.

It also checks that the import loaded none of the server's dependencies.
``--write-doc`` writes the result into docs/benchmarks/history.md under "## SDK import time",
replacing that section only (other sections belong to other benchmarks); the
table in docs/benchmarks.md quotes its latest figure.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "benchmarks" / "history.md"
HEADING = "## SDK import time"
HEAVY = ("ray", "sqlalchemy", "fastapi", "uvicorn", "alembic", "psycopg", "pydantic_settings")

PROBE = ("import sys, time\n"
         "t = time.perf_counter()\n"
         "import raylane\n"
         "dt = time.perf_counter() - t\n"
         "n, heavy = len(sys.modules), [m for m in %r if m in sys.modules]\n"
         "t = time.perf_counter()\n"
         "import httpx, asyncio\n"  # what the SDK defers to the first Client / AsyncClient
         "deferred = time.perf_counter() - t\n"
         "import json\n"
         "print(json.dumps({'s': dt, 'deferred': deferred, 'modules': n, 'heavy': heavy}))\n" % (HEAVY,))


def wall(args: list[str]) -> tuple[float, str]:
    t = time.perf_counter()
    out = subprocess.run(args, capture_output=True, text=True, cwd=ROOT, check=True, timeout=120)
    return time.perf_counter() - t, out.stdout


def measure(runs: int) -> dict:
    py = sys.executable
    in_proc, deferred, proc, bare, cli = [], [], [], [], []
    modules, heavy = 0, set()
    for i in range(runs + 1):
        b, _ = wall([py, "-c", "pass"])
        p, _ = wall([py, "-c", "import raylane"])
        _, out = wall([py, "-c", PROBE])
        c, _ = wall([py, "-m", "raylane.client.cli", "--help"])
        if i == 0:
            continue  # cold: the first run also fills the OS file cache and writes .pyc files
        data = json.loads(out)
        in_proc.append(data["s"])
        deferred.append(data["deferred"])
        modules = data["modules"]
        heavy |= set(data["heavy"])
        bare.append(b)
        proc.append(p)
        cli.append(c)

    def stats(xs: list[float]) -> dict:
        return {"median_ms": 1000 * statistics.median(xs), "min_ms": 1000 * min(xs), "max_ms": 1000 * max(xs)}

    return {"runs": runs, "in_process": stats(in_proc), "process_minus_bare": stats([p - b for p, b in zip(proc, bare)]),
            "bare_interpreter": stats(bare), "cli_help": stats(cli), "deferred_imports": stats(deferred),
            "modules_loaded": modules,
            "heavy_modules_loaded": sorted(heavy)}


def section(r: dict) -> str:
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    when = datetime.now(timezone.utc).strftime("%Y-%m-%d")

    def row(name: str, key: str) -> str:
        s = r[key]
        return f"| {name} | {s['median_ms']:.0f} | {s['min_ms']:.0f} | {s['max_ms']:.0f} |"

    return "\n".join([
        HEADING,
        "",
        f"`python bench/sdk_import.py --runs {r['runs']}`: {r['runs']} fresh interpreters each (after one cold run), "
        f"Python {platform.python_version()}, {os.cpu_count()} CPUs, load average {load:.1f} at the start, {when}.",
        "",
        "| What | median ms | min ms | max ms |",
        "|---|---:|---:|---:|",
        row("`import raylane` (in-process)", "in_process"),
        row("`python -c \"import raylane\"` minus `python -c pass`", "process_minus_bare"),
        row("`python -c pass` (the interpreter alone)", "bare_interpreter"),
        row("`raylane --help` (CLI start, whole process)", "cli_help"),
        row("`import httpx, asyncio` after it (deferred by the SDK)", "deferred_imports"),
        "",
        f"`import raylane` loads {r['modules_loaded']} modules; of the server's dependencies "
        f"({', '.join(HEAVY)}) it loads {', '.join(r['heavy_modules_loaded']) or 'none'}. The SDK imports "
        "pydantic, yaml and the job spec eagerly; httpx when the first `Client` is made and asyncio only in "
        "`AsyncClient` (the last row: what a script that only builds specs does not pay). Most of what is "
        "left is pydantic itself and the spec and resource models it builds at import. Medians move with the "
        "machine's load (shown above); the minimum is the better guide to an idle machine.",
        "",
    ])


def write_doc(text: str) -> None:
    doc = DOC.read_text() if DOC.exists() else "# Benchmarks\n\n"
    pattern = re.compile(rf"^{re.escape(HEADING)}\n.*?(?=^## |\Z)", re.S | re.M)
    if pattern.search(doc):
        doc = pattern.sub(lambda _: text + "\n", doc, count=1)
    else:
        doc = doc.rstrip("\n") + "\n\n" + text
    DOC.write_text(doc.rstrip("\n") + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=21)
    ap.add_argument("--write-doc", action="store_true", help=f"update {HEADING!r} in docs/benchmarks/history.md")
    args = ap.parse_args()
    r = measure(args.runs)
    print(json.dumps(r, indent=2))
    text = section(r)
    print(text)
    if r["heavy_modules_loaded"]:
        sys.exit(f"import raylane loaded server dependencies: {r['heavy_modules_loaded']}")
    if args.write_doc:
        write_doc(text)
        print(f"wrote {DOC.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
