"""One way for every benchmark to start a real `raylane-server serve` and stop it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx

from tests.conftest import free_port
from tests.helpers import wait_for

ROOT = Path(__file__).resolve().parent.parent


def start_server(work: Path, env: dict[str, str], *, timeout: float = 120,
                 tree: Path | None = None) -> tuple[subprocess.Popen, str]:
    """Start the server with ``env`` on a free port; its log goes to ``work/server.log``.
    ``tree``: run another checkout's code (a before/after comparison in one run).
    Returns (process, base URL) once /readyz answers 200."""
    port = free_port()
    root = Path(tree).resolve() if tree else ROOT
    full = {**os.environ, "RAYLANE_DATA_DIR": str(work), "RAYLANE_PORT": str(port), "RAYLANE_LOG_LEVEL": "WARNING",
            "PYTHONPATH": str(root), **env}
    log = Path(work) / "server.log"
    proc = subprocess.Popen([sys.executable, "-m", "raylane.api.cli", "serve"], env=full, cwd=root,
                            stdout=open(log, "ab"), stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"

    def ready() -> bool:
        assert proc.poll() is None, log.read_text()[-2000:]
        try:
            return httpx.get(url + "/readyz", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        wait_for(ready, timeout=timeout, what="raylane server")
    except BaseException:
        stop_server(proc)
        raise
    return proc, url


def stop_server(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(30)
