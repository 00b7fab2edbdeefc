"""The CLI for every day (#18.6): several ids and ``--label``/``--mine`` on cancel,
short ids, ``logs --tail``, ``--version``, shell completion, ``resubmit``,
``submit --set``, and clear errors for a wrong URL and a missing token.

Each command runs as a real subprocess (``python -m raylane.client.cli``) against a
real ``raylane-server serve`` without Ray (jobs stay PENDING), and each test
asserts what a user sees and the exit code. ``logs --tail`` needs a log, so it
runs in process against the app with a stand-in for Ray's log store.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml

from raylane import Client
from tests.conftest import ROOT, offline_server

EXAMPLES = ROOT / "examples"
ADMIN_TOKEN = "cli-daily-admin-token-0123456789"


def rl(*args, url: str | None, token: str | None = ADMIN_TOKEN, input: str | None = None,
       **extra_env: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("RAYLANE_URL", "RAYLANE_TOKEN")}
    env.update({"COLUMNS": "100", "NO_COLOR": "1", "TERM": "dumb", **extra_env})
    if url:
        env["RAYLANE_URL"] = url
    if token:
        env["RAYLANE_TOKEN"] = token
    return subprocess.run([sys.executable, "-m", "raylane.client.cli", *map(str, args)], capture_output=True,
                          text=True, cwd=ROOT, env=env, timeout=120, input=input)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    sp = offline_server(admin_token=ADMIN_TOKEN, tmp=tmp_path_factory.mktemp("cli-daily"))
    yield sp
    sp.kill()


@pytest.fixture
def sdk(server):
    with Client(server.url, token=ADMIN_TOKEN) as c:
        yield c


@pytest.fixture
def tag():
    return uuid.uuid4().hex[:12]


def hello(tag: str, name: str = "hello", **over) -> dict:
    return {**yaml.safe_load((EXAMPLES / "hello.yaml").read_text()), "name": name, "labels": {"t": tag}, **over}


def spec_file(tmp_path: Path, spec: dict) -> Path:
    path = tmp_path / f"{spec['name']}-{uuid.uuid4().hex[:6]}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def short(job_id: str) -> str:
    """A start of the id that is unique in practice: the millisecond (10) and 6 random characters."""
    return job_id[:16]


# --version and completion ---------------------------------------------------------------


def test_version_and_shell_completion(tmp_path):
    from raylane import __version__

    r = rl("--version", url=None)
    assert (r.returncode, r.stdout) == (0, f"raylane {__version__}\n")

    # Typer's completion, keyed on the name `raylane` (also under `python -m`).
    fixed = {"_TYPER_COMPLETE_TEST_DISABLE_SHELL_DETECTION": "1"}  # name the shell instead of detecting it
    r = rl("--show-completion", "bash", url=None, **fixed)
    assert r.returncode == 0 and "_RAYLANE_COMPLETE=complete_bash" in r.stdout and "complete -o default" in r.stdout
    r = rl("--install-completion", "bash", url=None, HOME=str(tmp_path), **fixed)
    assert r.returncode == 0 and "bash completion installed in" in r.stdout, r.stderr
    assert "_RAYLANE_COMPLETE" in (tmp_path / ".bash_completions" / "raylane.sh").read_text()
    assert "raylane.sh" in (tmp_path / ".bashrc").read_text()
    # What the installed script asks: the words so far, answered with the commands that fit.
    r = rl(url=None, COMP_WORDS="raylane resu", COMP_CWORD="1", _RAYLANE_COMPLETE="complete_bash")
    assert (r.returncode, r.stdout.split()) == (0, ["resubmit"])
    r = rl(url=None, COMP_WORDS="raylane cancel --m", COMP_CWORD="2", _RAYLANE_COMPLETE="complete_bash")
    assert r.stdout.split() == ["--mine"]


# Short ids ---------------------------------------------------------------------------------


def test_a_unique_start_of_an_id_works_wherever_an_id_is_taken(server, sdk, tag):
    job = sdk.submit(hello(tag))
    other = sdk.submit(hello(tag, "other"))
    s = short(job.id)

    r = rl("status", s, "-o", "json", url=server.url)
    assert r.returncode == 0 and json.loads(r.stdout)["id"] == job.id, r.stderr
    r = rl("status", s.upper(), "-o", "json", url=server.url)  # as read aloud from a screen
    assert r.returncode == 0 and json.loads(r.stdout)["id"] == job.id, r.stderr
    r = rl("events", s, "-o", "json", url=server.url)
    assert r.returncode == 0 and [e["job_id"] for e in json.loads(r.stdout)] == [job.id]
    r = rl("logs", s, url=server.url)
    assert (r.returncode, r.stdout) == (0, "")  # never ran
    r = rl("trials", s, url=server.url)
    assert r.returncode == 1
    assert r.stderr.strip() == f"Error: job {job.id} is a command job, not a sweep; it has no trials"
    r = rl("cancel", s, url=server.url)
    assert (r.returncode, r.stdout.strip()) == (0, f"Job {job.id}: cancelled; now CANCELLED")
    r = rl("wait", s, url=server.url)
    assert r.returncode == 1 and f"Job {job.id} CANCELLED" in r.stderr

    # Both ids start with the same millisecond's characters: ambiguous, and the message names them.
    common = os.path.commonprefix([job.id, other.id])
    r = rl("status", common, url=server.url)
    assert r.returncode == 2, r.stderr
    assert r.stderr.startswith(f"Error: {common} is the start of several job ids: ")
    assert f"{other.id} (other)" in r.stderr and f"{job.id} (hello)" in r.stderr and "give more of it" in r.stderr

    r = rl("status", "zzzzzzzz", url=server.url)
    assert (r.returncode, r.stderr.strip()) == (1, "Error: job zzzzzzzz not found")
    for whole in (job.id, job.id.upper()):  # a whole id is used as it is, in any case
        r = rl("status", whole, "-o", "json", url=server.url)
        assert r.returncode == 0 and json.loads(r.stdout)["id"] == job.id, r.stderr


# cancel: several ids, --label, --mine, --yes --------------------------------------------------


def test_cancel_several_ids_and_one_that_fails(server, sdk, tag):
    a, b = sdk.submit(hello(tag, "a")), sdk.submit(hello(tag, "b"))
    r = rl("cancel", a.id, short(b.id), url=server.url)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == [f"Job {a.id}: cancelled; now CANCELLED", f"Job {b.id}: cancelled; now CANCELLED"]
    assert r.stderr.strip() == "Cancelled 2 of 2 jobs."

    c = sdk.submit(hello(tag, "c"))
    r = rl("cancel", "zzzzzzzz", c.id, "-o", "json", url=server.url)
    assert r.returncode == 1  # one could not be cancelled; the other was
    assert [x["job"]["id"] for x in json.loads(r.stdout)] == [c.id]
    assert "Error: job zzzzzzzz not found" in r.stderr and "Cancelled 1 of 2 jobs." in r.stderr
    assert sdk.get_job(c.id).status.value == "CANCELLED"

    r = rl("cancel", a.id, "-o", "json", url=server.url)  # one id: one object, as before
    assert r.returncode == 0 and json.loads(r.stdout)["message"] == "job is already CANCELLED"


def test_cancel_by_label_asks_first_and_yes_skips_asking(server, sdk, tag):
    ids = [sdk.submit(hello(tag, f"l{i}")).id for i in range(3)]
    done = sdk.submit(hello(tag, "done")).id
    sdk.cancel(done)  # finished jobs are not chosen

    r = rl("cancel", "--label", f"t={tag}", url=server.url, input="")  # nobody answers
    assert r.returncode == 1, r.stderr
    assert f"3 unfinished jobs labelled t={tag}:" in r.stderr and all(i in r.stderr for i in ids)
    assert done not in r.stderr and "Nothing cancelled (pass --yes to cancel without asking)." in r.stderr
    assert {sdk.get_job(i).status.value for i in ids} == {"PENDING"}

    r = rl("cancel", "-l", f"t={tag}", url=server.url, input="n\n")
    assert r.returncode == 1 and "Cancel these 3? [y/N]" in r.stderr
    r = rl("cancel", "-l", f"t={tag}", url=server.url, input="y\n")
    assert r.returncode == 0, r.stderr
    assert sorted(line.split()[1].rstrip(":") for line in r.stdout.splitlines()) == sorted(ids)
    assert "Cancelled 3 of 3 jobs." in r.stderr

    r = rl("cancel", "-l", f"t={tag}", "--yes", url=server.url)
    assert (r.returncode, r.stdout) == (0, "")
    assert f"No unfinished jobs labelled t={tag}; nothing to cancel." in r.stderr


def test_cancel_mine_cancels_only_what_this_token_submitted(server, sdk, tag):
    project = f"p{tag[:8]}"
    sdk.create_project(project)
    bob = sdk.create_token(f"bob-{tag}", project=project, role="member").token
    with Client(server.url, token=bob) as as_bob:
        bobs = [as_bob.submit(hello(tag, f"bob{i}")).id for i in range(2)]
    admins = sdk.submit({**hello(tag, "admins"), "project": project}).id

    r = rl("cancel", "--mine", "--label", f"t={tag}", "--yes", url=server.url, token=bob)
    assert r.returncode == 0, r.stderr
    assert f"2 unfinished jobs labelled t={tag} and submitted by bob-{tag}:" in r.stderr
    assert sorted(line.split()[1].rstrip(":") for line in r.stdout.splitlines()) == sorted(bobs)
    assert sdk.get_job(admins).status.value == "PENDING"


def test_cancel_refuses_unclear_requests(server):
    for args, says in ((("cancel",), "give the job ids to cancel, or --label key=value / --mine"),
                       (("cancel", "abc", "--mine"), "give job ids, or --label/--mine to choose jobs, not both"),
                       (("cancel", "--label", "nope"), "'nope' is not key=value")):
        r = rl(*args, url=server.url)
        assert r.returncode == 2, (args, r.stderr)
        assert says in r.stderr and "Traceback" not in r.stderr, (args, r.stderr)


# submit --set and resubmit ------------------------------------------------------------------


def test_submit_set_overrides_dotted_paths_with_yaml_values(server, tag, tmp_path):
    f = spec_file(tmp_path, hello(tag))
    r = rl("submit", f, "--set", "priority=5", "--set", "resources.cpus_per_worker=2", "--set", "labels.run=7",
           "--set", "name=renamed", "--set", "timeout_s=1e3", "-o", "json", url=server.url)
    assert r.returncode == 0, r.stderr
    job = json.loads(r.stdout)
    assert (job["name"], job["priority"], job["spec"]["resources"]["cpus_per_worker"]) == ("renamed", 5, 2)
    assert job["spec"]["timeout_s"] == 1000.0 and job["labels"] == {"t": tag, "run": "7"}

    for bad, says in (("resources.gpu=2", "--set resources.gpu: resources has no field 'gpu'; it has "),
                      ("nmae=x", "the spec has no field 'nmae'; did you mean name?"),
                      ("name.first=x", "name is a value, not a section"),
                      ("priority", "'priority' is not key=value")):
        r = rl("submit", f, "--set", bad, url=server.url)
        assert r.returncode == 2, (bad, r.stderr)
        assert says in " ".join(r.stderr.split()) and "Traceback" not in r.stderr, (bad, r.stderr)
    # A known path with a wrong value is the server's to refuse, naming the field.
    r = rl("submit", f, "--set", "resources.gpus_per_worker=1.5", url=server.url)
    assert r.returncode == 2 and "resources.gpus_per_worker:" in r.stderr


def test_set_values_are_yaml_except_in_text_fields():
    from raylane.client.overrides import apply_overrides

    got = apply_overrides({"name": "x", "labels": {"a": "b"}}, [
        "priority=3", "args.lr=1e-4", "args.on=true", "runtime_env.pip=[numpy, pandas]", "timeout_s=null",
        "name=123", "labels.run=7", "runtime_env.env_vars.N=08", "project=null"])
    assert got == {"name": "123", "labels": {"a": "b", "run": "7"}, "priority": 3, "timeout_s": None,
                   "args": {"lr": 1e-4, "on": True}, "project": None,
                   "runtime_env": {"pip": ["numpy", "pandas"], "env_vars": {"N": "08"}}}
    assert apply_overrides({"name": "x"}, {"labels.n": 5}) == {"name": "x", "labels": {"n": 5}}  # as given


def test_resubmit_copies_the_spec_with_changes_and_a_label(server, sdk, tag):
    old = sdk.submit(hello(tag, "orig", priority=1))
    sdk.cancel(old.id)
    r = rl("resubmit", short(old.id), "--set", "priority=9", url=server.url)
    assert r.returncode == 0, r.stderr
    new_id = re.search(r"Submitted job (\w+) \(orig, command\)", r.stdout).group(1)
    new = sdk.get_job(new_id)
    assert new.id != old.id and new.priority == 9 and new.status.value == "PENDING"
    assert new.spec.entrypoint == old.spec.entrypoint and new.project == old.project
    assert new.labels == {"t": tag, "raylane.io/resubmitted-from": old.id}

    r = rl("resubmit", old.id, "-o", "json", url=server.url)
    assert r.returncode == 0 and json.loads(r.stdout)["priority"] == 1

    r = rl("resubmit", old.id, "--set", "resource.gpus_per_worker=1", url=server.url)
    assert r.returncode == 2 and "--set resource.gpus_per_worker: the spec has no field 'resource'; did you mean " \
        "resources?" in r.stderr
    r = rl("resubmit", "zzzzzzzz", url=server.url)
    assert (r.returncode, r.stderr.strip()) == (1, "Error: job zzzzzzzz not found")


# Errors: a wrong URL, a missing token ----------------------------------------------------------


class _WebSite(BaseHTTPRequestHandler):
    """Some other web server: a page for /, 404 pages elsewhere, HTML always."""

    def do_GET(self):
        body = b"<!doctype html><html><body><h1>Welcome to nginx!</h1></body></html>"
        self.send_response(200 if self.path.split("?")[0] in ("/", "/app/v1/jobs") else 404)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def website():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _WebSite)
    t = threading.Thread(target=httpd.serve_forever, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def test_a_url_that_is_not_raylane_says_so_without_its_html(website):
    r = rl("ls", url=website)
    assert r.returncode == 1
    assert r.stderr.strip() == (f"Error: {website}/v1/jobs answered 404 text/html: not a Raylane API? "
                                "Check the URL")
    r = rl("status", "x1", url=website)
    assert r.returncode == 1 and "answered 404 text/html: not a Raylane API?" in r.stderr
    # A server that answers 200 with a page to everything (a web app's catch-all) is not taken for one either.
    r = rl("ls", url=website + "/app")
    assert r.returncode == 1, r.stderr
    assert r.stderr.strip() == f"Error: {website}/app/v1/jobs answered 200 text/html: not a Raylane API? Check the URL"
    assert "<html" not in r.stderr + r.stdout and "Traceback" not in r.stderr


def test_a_missing_or_refused_token_tells_cli_users_what_to_set(server):
    r = rl("ls", url=server.url, token=None)
    assert r.returncode == 1
    assert r.stderr.strip() == (f"Error: {server.url} needs an API token and none was given: set RAYLANE_TOKEN "
                                "or pass --token")
    r = rl("--token", "not-a-real-token-0000", "ls", url=server.url, token=None)
    assert r.returncode == 1
    assert r.stderr.strip() == (f"Error: {server.url} refused the token (missing, unknown, expired or revoked API "
                                "token): check RAYLANE_TOKEN or --token")
    assert "token=" not in r.stderr


# logs --tail ---------------------------------------------------------------------------------


LOG = "".join(f"line {i}\n" for i in range(1, 8))


class _LogsOnly:
    """Ray's log store, the one part of Ray that `logs` reads."""

    def logs(self, submission_id: str) -> str:
        return LOG

    def close(self) -> None:
        pass


def test_logs_tail_prints_the_last_lines(api, cp, monkeypatch):
    from typer.testing import CliRunner

    from raylane.client import cli
    from raylane.orchestrator.domain.states import JobStatus
    from raylane.orchestrator.store import db
    from raylane.orchestrator.store.transitions import transition
    from tests.conftest import ADMIN_TOKEN as APP_TOKEN

    job_id = api.post("/v1/jobs", json={"name": "tail", "kind": "command", "entrypoint": "true"}).json()["id"]
    with db.transaction(cp.sessions) as s:  # it ran once, and ended
        transition(s, job_id, JobStatus.DISPATCHING, reason="admitted", actor="test", attempt=1,
                   values={"attempts": 1})
        transition(s, job_id, JobStatus.CANCELLING, reason="cancel requested", actor="test", attempt=1)
        transition(s, job_id, JobStatus.CANCELLED, reason="cancelled by user", actor="test", attempt=1)
    cp.backend = _LogsOnly()
    monkeypatch.setattr(cli, "_client", lambda: Client("http://testserver", token=APP_TOKEN,
                                                       transport=api._transport))
    run = CliRunner()
    r = run.invoke(cli.app, ["logs", job_id[:16], "--tail", "3"])
    assert (r.exit_code, r.stdout) == (0, "line 5\nline 6\nline 7\n")
    r = run.invoke(cli.app, ["logs", job_id, "-n", "0"])
    assert (r.exit_code, r.stdout) == (0, "")
    r = run.invoke(cli.app, ["logs", job_id, "--tail", "100"])
    assert (r.exit_code, r.stdout) == (0, LOG)
    # Followed: the last lines, then only what is new (the ended job's stream repeats nothing).
    r = run.invoke(cli.app, ["logs", job_id, "--tail", "2", "--follow"])
    assert (r.exit_code, r.stdout) == (0, "line 6\nline 7\n")
    r = run.invoke(cli.app, ["logs", job_id, "--tail", "-1"])
    assert r.exit_code == 2 and "--tail" in r.stderr and "greater than or equal to" in " ".join(r.stderr.split())


def test_submit_sends_an_array_spec_to_the_arrays_api(server, sdk, tmp_path, tag):
    path = spec_file(tmp_path, hello(tag, name="shards", array={"size": 3, "max_parallel": 1}))
    r = rl("submit", path, url=server.url)
    assert r.returncode == 0, r.stderr
    m = re.search(r"Submitted array (arr_[0-9a-f]+) \(shards\): 3 members, 2 held by max_parallel", r.stdout)
    assert m, r.stdout
    assert f"raylane ls --label raylane.array={m.group(1)}" in r.stdout
    assert sorted(j.name for j in sdk.list_jobs(labels={"raylane.array": m.group(1)}).items) == \
        ["shards-0", "shards-1", "shards-2"]
    r = rl("submit", path, "--follow", url=server.url)  # one log to stream; --wait is test_cli_nouns.py's
    assert r.returncode == 2 and "--wait waits for all its members" in r.stderr
    r = rl("submit", path, "-o", "json", url=server.url)
    assert r.returncode == 0 and json.loads(r.stdout)["size"] == 3
