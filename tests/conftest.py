"""Shared fixtures.

Databases: every store and API test runs on SQLite and on the real PostgreSQL at
127.0.0.1:5432. PostgreSQL tests get a fresh database per test, copied from a
template migrated once per run (CREATE DATABASE ... TEMPLATE), all named
``raylane_t_<run id>_*`` and dropped at the end. PostgreSQL not reachable is a
failure, not a skip: CI must test it.

Auth: the in-process ``api`` client runs with auth on, as an admin
(``ADMIN_TOKEN``, the bootstrap token of every fixture). A real server
(``ServerProcess``) also knows ``ADMIN_TOKEN`` but runs with auth off unless the
test's env sets ``RAYLANE_AUTH_ENABLED``, so plain ``httpx`` calls keep working;
``sp.headers`` carries the token for tests that turn auth on. Submit rate
limits are off in fixtures (tests/test_auth.py tests them); local working_dirs
under the repository and the temp directory are allowed.
"""

from __future__ import annotations

import os
import signal
import shutil
import socket
import json
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pytest

from tests.helpers import wait_for

# RAYLANE_TEST_PG: the server to make test databases on (a URL), or "1" to run
# ``make test-fast``'s database tests on PostgreSQL too, on the default server.
_PG = os.environ.get("RAYLANE_TEST_PG", "")
PG_ADMIN_URL = _PG if "://" in _PG else "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
RUN_ID = uuid.uuid4().hex[:8]
ROOT = Path(__file__).resolve().parent.parent

# A suite started in the background of a non-interactive shell (`make test &`,
# nohup) inherits SIGINT ignored, and so would every CLI a test starts: the
# Ctrl-C tests would wait for an interrupt that never comes. A handler here is
# reset to the default in each child at exec, where Python makes it
# KeyboardInterrupt again.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)
ADMIN_TOKEN = "rl_fixture-admin-token-0123456789"  # RAYLANE_ADMIN_TOKEN of every fixture
ADMIN_HEADERS = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
WORKING_DIR_ROOTS = [ROOT, Path(tempfile.gettempdir()).resolve()]


def _pg_admin():
    import psycopg

    url = PG_ADMIN_URL.replace("postgresql+psycopg://", "postgresql://")
    return psycopg.connect(url, autocommit=True)


def _pg_url(dbname: str) -> str:
    return PG_ADMIN_URL.rsplit("/", 1)[0] + "/" + dbname


@pytest.fixture(scope="session")
def pg_template():
    from raylane.orchestrator.store import migrate

    name = f"raylane_t_{RUN_ID}_tmpl"
    with _pg_admin() as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    migrate.upgrade(_pg_url(name))
    yield name
    with _pg_admin() as conn:
        rows = conn.execute("SELECT datname FROM pg_database WHERE datname LIKE %s", (f"raylane_t_{RUN_ID}_%",)).fetchall()
    drop_pg_databases([db for (db,) in rows])


PG_DROPPERS = 16


def drop_pg_databases(names: list[str]) -> None:
    """Drop them, several at a time: each DROP DATABASE waits for a checkpoint
    (1-2 s on a busy machine), and checkpoints asked for at once are one. One at
    a time, a worker's ~400 databases took ~55 s at the end of every run."""
    from concurrent.futures import ThreadPoolExecutor

    def drop(db: str) -> None:
        with _pg_admin() as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')

    with ThreadPoolExecutor(PG_DROPPERS) as pool:
        list(pool.map(drop, names))


_counter = iter(range(1_000_000))


def fresh_pg_database(template: str) -> str:
    name = f"raylane_t_{RUN_ID}_{next(_counter)}"
    with _pg_admin() as conn:
        conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template}"')
    return _pg_url(name)


# ``make test`` runs every database test on both; ``make test-fast`` (the inner
# loop) on SQLite alone unless RAYLANE_TEST_PG=1 (docs/testing.md).
DB_KINDS = ["sqlite"] if os.environ.get("RAYLANE_TEST_TIER") == "fast" and \
    os.environ.get("RAYLANE_TEST_PG") != "1" else ["sqlite", "postgresql"]


@pytest.fixture(scope="session")
def sqlite_template(tmp_path_factory) -> Path:
    """One SQLite database migrated to head per run (each worker's), copied for each
    test: running the 22 migrations took ~0.35 s a test, most of a fast test's setup."""
    from raylane.orchestrator.store import migrate

    path = tmp_path_factory.mktemp("sqlite-template") / "raylane.db"
    migrate.upgrade(f"sqlite:///{path}")
    return path


def fresh_sqlite_database(template: Path, directory: Path) -> str:
    """A copy of the migrated template in ``directory``, as its URL."""
    path = directory / "raylane.db"
    shutil.copyfile(template, path)
    return f"sqlite:///{path}"


@pytest.fixture(params=DB_KINDS)
def db_url(request, tmp_path):
    """A migrated, empty database of each kind."""
    if request.param == "sqlite":
        return fresh_sqlite_database(request.getfixturevalue("sqlite_template"), tmp_path)
    return fresh_pg_database(request.getfixturevalue("pg_template"))


@pytest.fixture
def settings(db_url, tmp_path):
    from raylane.orchestrator.settings import Settings

    return Settings(database_url=db_url, data_dir=tmp_path, auto_migrate=False, loops_enabled=False,
                    admin_token=ADMIN_TOKEN, submit_rate_per_s=0, policy_working_dir_roots=WORKING_DIR_ROOTS,
                    gc_freeze=False)  # a full gc.collect() per app start, ~90 ms; tests/test_gc_freeze.py turns it on


@pytest.fixture
def cp(settings):
    from raylane.orchestrator.services.controlplane import ControlPlane

    plane = ControlPlane(settings)
    yield plane
    plane.close()


@pytest.fixture
def api(settings, cp):
    """An in-process client of the FastAPI app, as the bootstrap admin (the e2e
    tests use a real uvicorn)."""
    from fastapi.testclient import TestClient

    from raylane.api.app import create_app

    with TestClient(create_app(settings, cp=cp), headers=ADMIN_HEADERS) as c:
        yield c


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    """A real ``raylane-server serve`` (uvicorn) in a child process on a free port."""

    def __init__(self, env: dict[str, str], log_path: Path):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        defaults = {"RAYLANE_ADMIN_TOKEN": ADMIN_TOKEN, "RAYLANE_SUBMIT_RATE_PER_S": "0",
                    "RAYLANE_POLICY_WORKING_DIR_ROOTS": json.dumps([str(r) for r in WORKING_DIR_ROOTS])}
        if "RAYLANE_AUTH_ENABLED" not in env:
            defaults["RAYLANE_AUTH_ENABLED"] = "false"  # tests that predate auth call it without a token
        merged = {**os.environ, **defaults, **env, "RAYLANE_PORT": str(self.port), "RAYLANE_HOST": "127.0.0.1"}
        self.env = {k: v for k, v in merged.items() if v is not None}  # None in env: leave the variable unset
        self.token = self.env.get("RAYLANE_ADMIN_TOKEN")
        self.headers = {"Authorization": f"Bearer {self.token}"}
        self.log_path = log_path
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 60) -> "ServerProcess":
        import httpx

        self.log = open(self.log_path, "ab")
        self.proc = subprocess.Popen([sys.executable, "-m", "raylane.api.cli", "serve"], env=self.env, cwd=ROOT,
                                     stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)

        def ready():
            assert self.proc.poll() is None, f"server exited: {self.log_path.read_text()[-2000:]}"
            try:
                return httpx.get(self.url + "/readyz", timeout=2).status_code == 200
            except httpx.HTTPError:
                return False

        # Poll often: chaos tests restart servers dozens of times and wait for each.
        wait_for(ready, timeout=timeout, what="server ready", max_interval=0.1)
        return self

    def kill(self, sig=9) -> None:
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, sig)
            self.proc.wait(30)

    def stop(self) -> None:
        self.kill(15)


def offline_server(tmp: Path, admin_token: str = ADMIN_TOKEN) -> ServerProcess:
    """A real server with auth on, on a fresh SQLite database in ``tmp``, its loops
    off and Ray "down" (a dashboard URL nothing answers): jobs are routed from the
    profile and stay PENDING. For the CLI and SDK tests, one per module."""
    from raylane.orchestrator.store import migrate

    url = f"sqlite:///{tmp / 'raylane.db'}"
    migrate.upgrade(url)
    env = {"RAYLANE_DATABASE_URL": url, "RAYLANE_DATA_DIR": str(tmp), "RAYLANE_LOOPS_ENABLED": "false",
           "RAYLANE_ADMIN_TOKEN": admin_token, "RAYLANE_AUTH_ENABLED": "true",
           "RAYLANE_DASHBOARD_URL": f"http://127.0.0.1:{free_port()}"}
    sp = ServerProcess(env, tmp / "server.log").start()
    sp.db_url = url
    return sp


@pytest.fixture
def server_factory(tmp_path):
    started: list[ServerProcess] = []

    def make(env: dict[str, str]) -> ServerProcess:
        sp = ServerProcess(env, tmp_path / f"server-{len(started)}.log")
        started.append(sp)
        return sp

    yield make
    for sp in started:
        sp.kill()


# Tiers -----------------------------------------------------------------------
#
# ``make test`` runs everything. ``make test-fast`` (the inner loop) runs
# ``-m "not ray and not slow and not process"``: no Ray cluster, no server or CLI
# subprocess, no browser. ``process`` is not written by hand: a test is marked
# when its own source, a fixture it uses, or a function of its module it calls
# starts one of those (the patterns below), so a new test is put in its tier by
# what it does. Under ``RAYLANE_TEST_TIER=fast`` a server, a cluster or a browser
# that starts all the same fails the test, so a test the patterns missed is found.

import inspect  # noqa: E402
import re  # noqa: E402

PROCESS_SOURCE = re.compile(r"ServerProcess\(|offline_server\(|server_factory|LocalCluster\(|sync_playwright|"
                            r"chromium|raylane\.api\.cli|raylane\.client\.cli|start_server\(")
_source_hits: dict[tuple[object, str], bool] = {}


def _starts_processes(obj, module_helpers: dict[str, object] | None = None, pattern: re.Pattern = PROCESS_SOURCE) -> bool:
    key = (obj, pattern.pattern)
    if key in _source_hits:
        return _source_hits[key]
    _source_hits[key] = False  # a fixture that uses itself indirectly ends here
    try:
        src = inspect.getsource(obj)
    except (OSError, TypeError):
        return False
    hit = bool(pattern.search(src))
    if not hit and module_helpers:
        hit = any(re.search(rf"\b{re.escape(name)}\(", src) and _starts_processes(fn, pattern=pattern)
                  for name, fn in module_helpers.items() if fn is not obj)
    _source_hits[key] = hit
    return hit


def _starts(item, module_helpers: dict[str, object], pattern: re.Pattern) -> bool:
    """Whether the test, a fixture it uses or a function of its module it calls matches ``pattern``."""
    if not hasattr(item, "function"):
        return False
    fixtures = [fd.func for defs in item._fixtureinfo.name2fixturedefs.values() for fd in defs]
    return any(_starts_processes(f, module_helpers, pattern) for f in [item.function, *fixtures])


def _module_helpers(module) -> dict[str, object]:
    return {name: fn for name, fn in vars(module).items()
            if inspect.isfunction(fn) and getattr(fn, "__module__", None) == module.__name__
            and not name.startswith("test_")}


CLUSTER_SOURCE = re.compile(r"LocalCluster\(|LocalFleet\(|AutoscalingCluster\(|\"cluster\", \"up\"|"
                            r"\"serve\", \"--local-cluster\"")


def _needs_a_cluster(item, module_helpers: dict[str, object]) -> bool:
    """``cluster``: the test needs a Ray cluster (``ray``-marked: the shared cluster
    of tests/ray, the autoscaling one, the local fleet) or starts one
    (``CLUSTER_SOURCE``). ``make test`` runs these in one process, one after
    another, beside the rest in worker processes: a 5-node cluster takes ~half a
    core idle and most of both while it starts, and two or three at once on 2
    cores made Ray give up starting nodes."""
    return bool(item.get_closest_marker("ray")) or _starts(item, module_helpers, CLUSTER_SOURCE)


# The package-scoped clusters tests share (tests/ray, tests/ray_autoscale). A
# ``cluster`` test using neither starts its own (``own_cluster``): ``make test``
# runs those after the rest, in the rest's process, while the shared ones run
# beside: the two processes overlap their clusters for a minute or two, not for
# the whole run (docs/testing.md). The local fleet's tests (two clusters each)
# stay with the shared ones: their process runs them first, while the rest's
# process starts no cluster.
SHARED_CLUSTERS = {"ray_cluster", "autoscaling_cluster"}
FIRST_IN_LINE = ("tests/fleet/",)


@pytest.hookimpl(tryfirst=True)  # before -m selects on the markers set here
def pytest_collection_modifyitems(config, items):
    helpers: dict[object, dict[str, object]] = {}
    for item in items:
        mod = getattr(item, "module", None)
        if mod not in helpers:
            helpers[mod] = _module_helpers(mod) if mod is not None else {}
        if _needs_a_cluster(item, helpers[mod]):
            item.add_marker(pytest.mark.cluster)
            if not SHARED_CLUSTERS & set(getattr(item, "fixturenames", ())) and \
                    not item.nodeid.startswith(FIRST_IN_LINE):
                item.add_marker(pytest.mark.own_cluster)
        if not item.get_closest_marker("process") and _starts(item, helpers[mod], PROCESS_SOURCE):
            item.add_marker(pytest.mark.process)


@pytest.fixture(autouse=True, scope="session")
def _fast_tier_starts_no_process():
    """``RAYLANE_TEST_TIER=fast``: a server, a local cluster or a browser started
    by a test that was not marked ``process`` fails it, naming what started."""
    if os.environ.get("RAYLANE_TEST_TIER") != "fast":
        yield
        return

    def refuse(what):
        def start(*a, **kw):
            raise AssertionError(f"the fast tier starts no {what}: mark the test `process` "
                                 "(or teach tests/conftest.py's PROCESS_SOURCE what it calls)")
        return start

    from raylane.orchestrator.tooling.localcluster import LocalCluster

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ServerProcess, "start", refuse("server subprocess"))
        mp.setattr(LocalCluster, "up", refuse("Ray cluster"))
        yield
