"""The ``raylane`` CLI, run as a real subprocess (``python -m raylane.client.cli``) against a
real ``raylane-server serve``, with the terminal width fixed (COLUMNS=100) so tables and
progress lines are stable.

The CLI only speaks HTTP through the SDK, so one database kind is enough here
(tests/test_sdk.py runs the SDK on SQLite and PostgreSQL). The last test starts
a real local Ray cluster with ``raylane-server cluster up`` and runs jobs on it.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import httpx
import pytest
import yaml

from raylane import Client, JobStatus
from tests.conftest import ROOT, free_port, offline_server
from tests.helpers import wait_for

EXAMPLES = ROOT / "examples"
ADMIN_TOKEN = "cli-test-admin-token-0123456789"  # the server's RAYLANE_ADMIN_TOKEN


def env_for(url: str | None, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RAYLANE_URL", "RAYLANE_TOKEN")}
    env.update({"COLUMNS": "100", "LINES": "50", "NO_COLOR": "1", "TERM": "dumb", "RAYLANE_TOKEN": ADMIN_TOKEN,
                **extra})
    if url:
        env["RAYLANE_URL"] = url
    return env


def rl(*args: str, url: str | None = None, timeout: float = 120, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "raylane.client.cli", *map(str, args)], capture_output=True, text=True,
                          cwd=ROOT, env=env_for(url, **env), timeout=timeout)


def start_rl(*args: str, url: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "raylane.client.cli", *map(str, args)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=ROOT, env=env_for(url))


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    sp = offline_server(admin_token=ADMIN_TOKEN, tmp=tmp_path_factory.mktemp("cli"))
    yield sp
    sp.kill()


@pytest.fixture
def sdk(server):
    with Client(server.url, token=ADMIN_TOKEN) as c:
        yield c


@pytest.fixture
def tag():
    return uuid.uuid4().hex[:12]


def spec_file(tmp_path: Path, tag: str, name: str = "hello", source: str = "hello.yaml", **over) -> Path:
    data = {**yaml.safe_load((EXAMPLES / source).read_text()), "name": name, "labels": {"t": tag}, **over}
    path = tmp_path / f"{name}-{uuid.uuid4().hex[:6]}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def submitted_id(text: str) -> str:
    m = re.search(r"Submitted job (\w+) ", text)
    assert m, text
    return m.group(1)


def read_until(stream, pattern: str, timeout: float = 30) -> str:
    """Read lines from a child's pipe until one matches (bounded by the test's wait)."""
    seen = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = stream.readline()
        if not line:
            break
        seen.append(line)
        if re.search(pattern, line):
            return "".join(seen)
    raise AssertionError(f"no line matching {pattern!r} in {''.join(seen)!r}")


# Reading and writing jobs ---------------------------------------------------------------


def test_submit_ls_status_events_cancel(server, sdk, tag, tmp_path):
    r = rl("submit", spec_file(tmp_path, tag), url=server.url)
    assert r.returncode == 0, r.stderr
    job_id = submitted_id(r.stdout)
    assert "(hello, command) on cpu (ON_DEMAND): PENDING, waiting for admission" in r.stdout

    sweep = rl("submit", spec_file(tmp_path, tag, "sweep1", "lr-sweep.yaml"), "-o", "json", url=server.url)
    assert sweep.returncode == 0, sweep.stderr
    sweep_job = json.loads(sweep.stdout)
    assert sweep_job["kind"] == "sweep" and sweep_job["placement"]["node_group"] == "spot-cpu"

    r = rl("ls", "--label", f"t={tag}", url=server.url)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].split() == ["ID", "NAME", "KIND", "STATUS", "GROUP", "CREATED", "REASON"]
    # Ids as their shortest start that tells the rows apart (#48); -o wide shows them whole.
    assert sweep_job["id"].startswith(lines[1].split()[0]) and job_id.startswith(lines[2].split()[0])
    assert lines[1].split()[1:5] == ["sweep1", "sweep", "PENDING", "spot-cpu"]
    assert lines[2].split()[1:5] == ["hello", "command", "PENDING", "cpu"]
    assert all(len(line) <= 100 for line in lines)

    # Filters, and --url instead of RAYLANE_URL.
    r = rl("--url", server.url, "ls", "-l", f"t={tag}", "--kind", "sweep", "--status", "pending", "--since", "1h",
           "-o", "json")
    assert r.returncode == 0, r.stderr
    assert [j["id"] for j in json.loads(r.stdout)] == [sweep_job["id"]]
    r = rl("ls", "-l", f"t={tag}", "--name", "hel", "-g", "cpu", "--until", "2000-01-01T00:00:00Z", url=server.url)
    assert r.returncode == 0 and r.stdout.strip() == "No jobs match."
    r = rl("ls", "-l", f"t={tag}", "-n", "1", url=server.url)
    assert len(r.stdout.splitlines()) == 3 and "Showing the newest 1; --limit shows more." in r.stdout

    r = rl("status", job_id, url=server.url)
    assert r.returncode == 0, r.stderr
    assert re.search(r"Status\s+PENDING\s+waiting for admission", r.stdout)
    assert re.search(r"Node group\s+cpu \(ON_DEMAND\), PACK, 1 x CPU 1", r.stdout)
    assert "- command without GPUs: cpu (ON_DEMAND)" in r.stdout
    assert json.loads(rl("status", job_id, "-o", "json", url=server.url).stdout)["id"] == job_id

    r = rl("cancel", job_id, url=server.url)
    assert r.returncode == 0 and r.stdout.strip() == f"Job {job_id}: cancelled; now CANCELLED"
    r = rl("cancel", job_id, "-o", "json", url=server.url)
    assert json.loads(r.stdout)["message"] == "job is already CANCELLED"

    r = rl("events", job_id, url=server.url)
    assert r.returncode == 0, r.stderr
    rows = [line.split() for line in r.stdout.splitlines()]
    assert rows[0] == ["TIME", "FROM", "TO", "REASON", "BY", "ATTEMPT"]
    assert rows[1][2:4] == ["-", "PENDING"] and rows[2][2:4] == ["PENDING", "CANCELLED"]
    evs = json.loads(rl("events", job_id, "-o", "json", url=server.url).stdout)
    assert [e["to_status"] for e in evs] == ["PENDING", "CANCELLED"]

    r = rl("logs", job_id, url=server.url)
    assert r.returncode == 0 and r.stdout == ""  # never ran
    r = rl("logs", job_id, "-f", url=server.url, timeout=60)
    assert r.returncode == 0 and r.stdout == ""  # an ended job's stream ends at once


def mask(text: str, job_id: str) -> str:
    text = re.sub(r"\d\d:\d\d:\d\d", "HH:MM:SS", text).replace(job_id, "ID")
    return re.sub(r"after \d+s", "after Ns", text)


def test_submit_wait_prints_each_status_change_and_exit_code(server, sdk, tag, tmp_path):
    p = start_rl("submit", spec_file(tmp_path, tag), "--wait", url=server.url)
    try:
        job_id = submitted_id(p.stdout.readline())
        head = read_until(p.stderr, r"PENDING")
        sdk.cancel(job_id)
        out, rest = p.communicate(timeout=60)
    finally:
        p.kill()
    assert p.returncode == 1  # CANCELLED
    # The captured progress (a terminal would also show a spinner with the elapsed time).
    expected = [
        "HH:MM:SS  PENDING      submitted; routed to cpu",
        "HH:MM:SS  CANCELLED    cancelled by user",
        "Job ID CANCELLED after Ns (cancelled by user)",
    ]
    assert mask(head + rest, job_id).splitlines() == expected

    r = rl("wait", job_id, url=server.url)  # already over: returns at once, the same story
    assert r.returncode == 1 and mask(r.stderr, job_id).splitlines() == expected
    assert json.loads(rl("wait", job_id, "-o", "json", url=server.url).stdout)["status"] == "CANCELLED"


def test_wait_timeout_exits_3_and_job_keeps_going(server, sdk, tag, tmp_path):
    r = rl("submit", spec_file(tmp_path, tag), "--wait", "--timeout", "1", url=server.url)
    assert r.returncode == 3, r.stderr
    job_id = submitted_id(r.stdout)
    assert f"Error: job {job_id} is still PENDING after 1s; it keeps running" in r.stderr
    assert sdk.get_job(job_id).status is JobStatus.PENDING


# What the Ctrl-C test waits for, each bounded on a loaded 2-core machine: the CLI's
# start (imports, compiled afresh where bytecode is not written, then the submit),
# and its exit after Ctrl-C (no more requests: unwinding, one message, closing).
CLI_START_S = 120
EXIT_AFTER_CTRL_C_S = 60


class PipeLines:
    """A child's stdout and stderr read by threads, so every wait on a line has a
    deadline (a bare ``readline`` blocks as long as the child stays silent)."""

    def __init__(self, p: subprocess.Popen):
        import queue
        import threading

        self.queues = {"out": queue.Queue(), "err": queue.Queue()}
        self.seen = {"out": [], "err": []}
        for name, stream in (("out", p.stdout), ("err", p.stderr)):
            threading.Thread(target=lambda q=self.queues[name], st=stream: [q.put(x) for x in iter(st.readline, "")]
                             + [q.put(None)], daemon=True).start()

    def until(self, name: str, pattern: str, timeout: float) -> str:
        import queue

        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            try:
                line = self.queues[name].get(timeout=left)
            except queue.Empty:
                break
            if line is None:
                break
            self.seen[name].append(line)
            if re.search(pattern, line):
                return line
        raise AssertionError(f"no line matching {pattern!r} on std{name} in {timeout}s: {''.join(self.seen[name])!r}")

    def rest(self, name: str, timeout: float = 10) -> str:
        """Everything up to the end of the stream (the child has exited)."""
        try:
            self.until(name, r"(?!)", timeout)
        except AssertionError:
            pass
        return "".join(self.seen[name])


def test_ctrl_c_during_wait_leaves_the_job_and_says_so(server, sdk, tag, tmp_path):
    # PYTHONFAULTHANDLER: a child that does not exit after Ctrl-C is sent SIGABRT
    # and prints every thread's stack, so a hang says where it hangs.
    p = subprocess.Popen([sys.executable, "-m", "raylane.client.cli", "submit", str(spec_file(tmp_path, tag)), "--wait"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
                         env=env_for(server.url, PYTHONFAULTHANDLER="1"))
    lines = PipeLines(p)
    try:
        job_id = submitted_id(lines.until("out", r"Submitted job", CLI_START_S))
        lines.until("err", r"PENDING", CLI_START_S)  # waiting: the first event is printed
        p.send_signal(signal.SIGINT)
        try:
            p.wait(EXIT_AFTER_CTRL_C_S)
        except subprocess.TimeoutExpired:
            p.send_signal(signal.SIGABRT)
            p.wait(30)
            raise AssertionError(f"still running {EXIT_AFTER_CTRL_C_S}s after Ctrl-C:\n{lines.rest('err')}") from None
    finally:
        p.kill()
    err = lines.rest("err")
    assert p.returncode == 130, err
    assert f"Stopped waiting. Job {job_id} was not cancelled and goes on without you (now PENDING)" in err
    assert f"raylane cancel {job_id}" in err and "Traceback" not in err
    assert sdk.get_job(job_id).status is JobStatus.PENDING


def test_follow_streams_log_and_ends_with_the_job(server, sdk, tag, tmp_path):
    p = start_rl("submit", spec_file(tmp_path, tag), "--follow", url=server.url)
    try:
        head = read_until(p.stderr, r"PENDING  ")
        job_id = submitted_id(head)
        time.sleep(0.5)
        assert p.poll() is None  # still following a waiting job
        sdk.cancel(job_id)
        out, err = p.communicate(timeout=60)
    finally:
        p.kill()
    assert p.returncode == 1 and out == ""  # stdout carries only the (empty) log
    assert f"Job {job_id} CANCELLED" in err


def test_plan_and_nodes(server, sdk, tag, tmp_path):
    r = rl("plan", EXAMPLES / "finetune.yaml", url=server.url)
    assert r.returncode == 0, r.stderr
    assert re.search(r"Node group\s+gpu \(ON_DEMAND\)", r.stdout)
    assert re.search(r"Strategy\s+STRICT_PACK, co-located", r.stdout)
    assert re.search(r"Workers\s+2 x CPU 1, GPU 1", r.stdout)
    assert "Why:\n  - 2 workers x 1 GPU, tightly coupled: co-locate on one node" in r.stdout
    placement = json.loads(rl("plan", EXAMPLES / "lr-sweep.yaml", "-o", "json", url=server.url).stdout)
    assert placement["node_group"] == "spot-cpu" and placement["strategy"] == "SPREAD" and placement["reasons"]

    r = rl("plan", spec_file(tmp_path, tag, "huge", "finetune.yaml",
                             resources={"num_workers": 1, "gpus_per_worker": 9}), url=server.url)
    assert r.returncode == 2 and "resources: one worker needs 9 GPUs" in r.stderr

    sdk.submit({"name": "q", "kind": "command", "entrypoint": "true", "labels": {"t": tag}})
    r = rl("nodes", url=server.url)
    assert r.returncode == 0, r.stderr
    rows = {line.split()[0]: line for line in r.stdout.splitlines()[1:]}
    assert set(rows) == {"head", "gpu", "spot-cpu", "cpu"}
    assert "2 x H100" in rows["gpu"] and "SPOT" in rows["spot-cpu"] and "0 up (1-4)" in rows["cpu"]
    assert re.search(r"0 run, [1-9]\d* queued", rows["cpu"])
    groups = json.loads(rl("nodes", "-o", "json", url=server.url).stdout)
    assert {g["name"] for g in groups} == set(rows)


def test_trials_table_best_first(server, sdk, tag, tmp_path):
    sweep_id = submitted_id(rl("submit", spec_file(tmp_path, tag, "sw", "lr-sweep.yaml"), url=server.url).stdout)
    r = rl("trials", sweep_id, url=server.url)
    assert r.returncode == 0 and "No trials yet" in r.stdout and "PENDING" in r.stdout

    # What the reconciler stores when a sweep ends (the real store function, into the server's DB).
    from raylane.orchestrator.store import db
    from raylane.orchestrator.store.jobs import save_trials

    engine = db.make_engine(server.db_url)
    try:
        with db.transaction(db.make_sessionmaker(engine)) as s:
            save_trials(s, sweep_id, [
                {"trial_id": "t1", "status": "TERMINATED", "config": {"lr": 0.01, "batch_size": 16},
                 "metrics": {"loss": 1.25}, "node_group": "spot-cpu"},
                {"trial_id": "t2", "status": "TERMINATED", "config": {"lr": 0.001, "batch_size": 32},
                 "metrics": {"loss": 0.0001}, "node_group": "spot-cpu"},
                {"trial_id": "t3", "status": "ERROR", "config": {"lr": 0.1, "batch_size": 64}, "metrics": {},
                 "error": "boom"},
            ], attempt=1)
    finally:
        engine.dispose()
    r = rl("trials", sweep_id, url=server.url)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == f"3 trials of {sweep_id}, best first by loss (min)"
    assert lines[1].split() == ["#", "LOSS", "BATCH_SIZE", "LR", "STATUS", "GROUP", "ERROR"]
    assert lines[2].split() == ["1", "0.0001", "32", "0.001", "TERMINATED", "spot-cpu"]
    assert lines[3].split() == ["2", "1.25", "16", "0.01", "TERMINATED", "spot-cpu"]
    assert lines[4].split() == ["3", "-", "64", "0.1", "ERROR", "-", "boom"]
    worst_first = json.loads(rl("trials", sweep_id, "--mode", "max", "--sort-by", "loss", "-o", "json",
                                url=server.url).stdout)
    assert [t["trial_id"] for t in worst_first] == ["t1", "t2", "t3"]

    hello_id = sdk.submit({"name": "h", "kind": "command", "entrypoint": "true"}).id
    r = rl("trials", hello_id, url=server.url)
    assert r.returncode == 1 and "is a command job, not a sweep" in r.stderr


# Errors: a message and an exit code, never a traceback -----------------------------------


def test_errors_have_messages_and_exit_codes(server, tag, tmp_path):
    for args in (("status", "doesnotexist1"), ("cancel", "doesnotexist1"), ("events", "doesnotexist1"),
                 ("logs", "doesnotexist1"), ("trials", "doesnotexist1"), ("wait", "doesnotexist1")):
        r = rl(*args, url=server.url)
        assert r.returncode == 1, (args, r.stdout, r.stderr)
        assert r.stderr.strip() == "Error: job doesnotexist1 not found", args

    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"name": "bad", "kind": "training", "entrypoint": "m:f",
                                   "resources": {"gpus_per_worker": 1.5}}))
    r = rl("submit", bad, url=server.url)
    assert r.returncode == 2
    assert r.stderr.splitlines() == [
        "Error: the server refused the request:",
        "  resources.gpus_per_worker: Value error, more than one GPU per worker must be a whole number",
    ]
    bad.write_text("name: [\n")
    r = rl("submit", bad, url=server.url)
    assert r.returncode == 2 and "not valid YAML or JSON" in r.stderr and "Traceback" not in r.stderr

    for args in (("submit", tmp_path / "missing.yaml"), ("ls", "--label", "nope"), ("ls", "--status", "bogus"),
                 ("ls", "--since", "yesterday"), ("nope",)):
        r = rl(*args, url=server.url)
        assert r.returncode == 2, (args, r.stderr)
        assert "Traceback" not in r.stderr

    if httpx.get(server.url + "/v1/jobs").status_code == 401:  # the server enforces tokens
        r = rl("--token", "not-a-real-token-0000", "ls", url=server.url)
        assert r.returncode == 1 and r.stderr.startswith("Error: ") and "RAYLANE_TOKEN" in r.stderr

    dead = f"http://127.0.0.1:{free_port()}"
    for args in (("ls",), ("status", "x1"), ("submit", EXAMPLES / "hello.yaml", "--wait"), ("nodes",)):
        r = rl(*args, url=dead)
        assert r.returncode == 4, (args, r.stderr)
        assert r.stderr.startswith(f"Error: cannot connect to the Raylane server at {dead} (Connection refused)")
        assert "raylane-server serve" in r.stderr and "Traceback" not in r.stderr


def test_defaults_to_local_url_and_documents_global_options():
    r = rl("--help", url=None)
    assert r.returncode == 0 and "--url" in r.stdout and "RAYLANE_URL" in r.stdout and "RAYLANE_TOKEN" in r.stdout
    for cmd in ("submit", "ls", "status", "logs", "cancel", "events", "trials", "plan", "nodes", "report"):
        assert re.search(rf"│ {cmd}\b", r.stdout), cmd
    for cmd in ("serve", "db", "cluster", "profile"):  # the server's, in raylane-server
        assert not re.search(rf"│ {cmd}\b", r.stdout), cmd
    assert "raylane-server" in r.stdout


def test_server_commands_are_raylane_server_and_raylane_hands_them_over():
    srv = subprocess.run([sys.executable, "-m", "raylane.api.cli", "--help"], capture_output=True, text=True,
                         cwd=ROOT, env=env_for(None), timeout=120)
    assert srv.returncode == 0, srv.stderr
    for cmd in ("serve", "db", "cluster", "profile"):
        assert re.search(rf"│ {cmd}\b", srv.stdout), cmd
    for cmd in ("submit", "ls"):
        assert not re.search(rf"│ {cmd}\b", srv.stdout), cmd
    # `raylane serve ...` as before the split: the same command, run by raylane-server.
    r = rl("serve", "--help", url=None)
    assert r.returncode == 0 and "--local-cluster" in r.stdout and "raylane-server serve" in r.stdout, r.stderr


def test_the_client_cli_imports_no_server_dependency():
    heavy = ("ray", "sqlalchemy", "fastapi", "uvicorn", "alembic", "psycopg", "pydantic_settings", "limits",
             "raylane.api", "raylane.orchestrator.tooling", "raylane.orchestrator.store")
    code = ("import sys; from raylane.client import cli; "
            f"print([m for m in {heavy!r} if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stdout + out.stderr


# The local cluster, and jobs that really run ---------------------------------------------------

TINY_PROFILE = """
name: tiny
groups:
  - {name: head, role: head, cpus: 0, memory_gb: 1, min_nodes: 1, max_nodes: 1}
  - {name: cpu, cpus: 2, memory_gb: 1, min_nodes: 1, max_nodes: 1, local_nodes: 1}
"""

FUNCTION_MODULE = '''
import raylane


@raylane.job(cpus=1)
def square(ctx):
    print("squaring", ctx.args["x"], flush=True)
    return ctx.args["x"] ** 2
'''


@pytest.mark.slow
def test_local_cluster_up_then_jobs_run_then_down(server_factory, tmp_path):
    """`raylane-server cluster up` (a head and one CPU node), a server on it, a command with
    --wait --follow, a decorated function, `nodes`, then `cluster down`."""
    profile = tmp_path / "tiny.yaml"
    profile.write_text(TINY_PROFILE)
    data = tmp_path / "data"
    local = {"RAYLANE_PROFILE": str(profile), "RAYLANE_DATA_DIR": str(data)}

    r = rl("cluster", "status", url=None, **local)
    assert r.returncode == 1 and "No local cluster is running" in r.stdout
    try:
        r = rl("cluster", "up", url=None, timeout=300, **local)
        assert r.returncode == 0, r.stdout + r.stderr
        assert "Local Ray cluster up (profile tiny)" in r.stdout
        state = json.loads(rl("cluster", "status", "-o", "json", url=None, **local).stdout)
        assert state["up"] and [n["group"] for n in state["nodes"]] == ["head", "cpu"]
        assert {n["ray_state"] for n in state["nodes"]} == {"ALIVE"}

        from raylane.orchestrator.store import migrate

        db_url = f"sqlite:///{tmp_path / 'e2e.db'}"
        migrate.upgrade(db_url)
        token = Path(state["token_path"]).read_text().strip()
        srv = server_factory({"RAYLANE_DATABASE_URL": db_url, "RAYLANE_DATA_DIR": str(data),
                              "RAYLANE_ADMIN_TOKEN": ADMIN_TOKEN, "RAYLANE_AUTH_ENABLED": "true",
                              "RAYLANE_POLICY_WORKING_DIR_ROOTS": json.dumps([str(tmp_path)]),
                              "RAYLANE_PROFILE": str(profile), "RAYLANE_DASHBOARD_URL": state["dashboard_url"],
                              "RAYLANE_RAY_AUTH_TOKEN": token, "RAYLANE_DISPATCH_INTERVAL_S": "0.5",
                              "RAYLANE_RECONCILE_INTERVAL_S": "0.5"}).start(timeout=120)

        r = rl("nodes", url=srv.url)
        assert r.returncode == 0, r.stderr
        assert re.search(r"cpu\s+ON_DEMAND\s+-\s+1 up \(1-1\)\s+0/2", r.stdout), r.stdout

        r = rl("submit", EXAMPLES / "hello.yaml", "--follow", "--timeout", "240", url=srv.url, timeout=300)
        assert r.returncode == 0, r.stdout + r.stderr
        assert "42" in r.stdout  # the driver's log, streamed
        steps = [line.split()[1] for line in r.stderr.splitlines() if re.match(r"\d\d:\d\d:\d\d ", line)]
        assert steps[0] == "PENDING" and steps[-2:] == ["RUNNING", "SUCCEEDED"]
        assert re.search(r"Job \w+ SUCCEEDED after \S+$", r.stderr.strip())

        mod_dir = tmp_path / "fnmod"
        mod_dir.mkdir()
        (mod_dir / "sdk_e2e_fn.py").write_text(textwrap.dedent(FUNCTION_MODULE))
        sys.path.insert(0, str(mod_dir))
        try:
            import sdk_e2e_fn

            with Client(srv.url, token=ADMIN_TOKEN) as c:
                job = sdk_e2e_fn.square.submit(client=c, x=7)
                # Zipped here and uploaded: the server is not asked to read the client's disk.
                assert job.spec.runtime_env.working_dir == c.upload_package(mod_dir).uri
                done = c.wait(job.id, timeout=240)
                assert done.status is JobStatus.SUCCEEDED, (done.status_reason, c.logs(job.id))
                assert done.result["workers"][0]["return"] == 49
                assert "squaring 7" in c.logs(job.id)
                info = c.cluster()
                assert {(n.node_group, n.state) for n in info.nodes} == {("head", "ALIVE"), ("cpu", "ALIVE")}
                # Ray's dashboard through this server (/ray); Ray's own address stays the operator's.
                assert info.dashboard_url == f"{srv.url}/ray"
                assert done.dashboard_url == f"{srv.url}/ray/#/jobs/{done.ray_submission_id}"
        finally:
            sys.path.remove(str(mod_dir))
            sys.modules.pop("sdk_e2e_fn", None)
        srv.stop()

        # Chaos by hand: a preemption notice, a replacement, a reclaim, a head restart.
        def ray_state(name):
            view = json.loads(rl("cluster", "status", "-o", "json", url=None, **local).stdout)
            return next((n["ray_state"] for n in view["nodes"] if n["name"] == name), "gone")

        r = rl("cluster", "drain", "nope-0", url=None, **local)
        assert r.returncode == 2 and "no node 'nope-0'" in r.stderr and "cpu-0" in r.stderr, r.stderr
        r = rl("cluster", "drain", "cpu-0", "--deadline-s", "60", url=None, timeout=120, **local)
        assert r.returncode == 0 and "cpu-0 is draining" in r.stdout, r.stdout + r.stderr
        wait_for(lambda: ray_state("cpu-0") == "DEAD", timeout=60, what="the idle drained node leaving")
        r = rl("cluster", "add", "cpu", url=None, timeout=300, **local)
        assert r.returncode == 0 and "Node cpu-1 is up" in r.stdout, r.stdout + r.stderr
        assert ray_state("cpu-1") == "ALIVE"
        r = rl("cluster", "kill", "cpu-1", url=None, **local)
        assert r.returncode == 0 and ray_state("cpu-1") == "gone"
        r = rl("cluster", "restart-head", url=None, timeout=300, **local)
        assert r.returncode == 0 and "Head restarted" in r.stdout, r.stdout + r.stderr
        view = json.loads(rl("cluster", "status", "-o", "json", url=None, **local).stdout)
        assert view["up"] and view["dashboard_url"] == state["dashboard_url"]  # same addresses
        assert {n["group"] for n in view["nodes"]} == {"head", "cpu"}
        assert {n["ray_state"] for n in view["nodes"]} == {"ALIVE"}, view["nodes"]
    finally:
        r = rl("cluster", "down", url=None, timeout=120, **local)
    assert r.returncode == 0 and "stopped" in r.stdout, r.stdout + r.stderr
    r = rl("cluster", "status", url=None, **local)
    assert r.returncode == 1
    assert wait_for(lambda: not any(_alive(n["pid"]) for n in state["nodes"]), timeout=30, what="nodes gone")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True
