"""Every noun has its verbs (#48): ``raylane arrays``, ``raylane schedules``,
``raylane costs``, ``status``/``cancel`` of an ``arr_`` id, ``submit --wait`` of
an array, and ``ls`` fitted to 80, 100 and 140 columns over an array's members.

Each command runs as a real subprocess against a real ``raylane-server serve``
without Ray (jobs stay PENDING; cancelling one ends it at once).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from raylane.client.clikit import money
from tests.conftest import ROOT
from tests.helpers import wait_for
from tests.test_cli_daily import ADMIN_TOKEN, hello, rl, server, sdk, spec_file, tag  # noqa: F401  (fixtures)


def array_spec(tag: str, size: int = 4, name: str = "lr-sweep-member", **array) -> dict:
    return hello(tag, name=name, array={"size": size, **array})


@pytest.mark.parametrize("width", [80, 100, 140])
def test_ls_fits_the_terminal_with_array_members_whole_and_told_apart(server, sdk, tag, width):
    arr = sdk.submit_array(array_spec(tag, size=6, name="a-rather-long-array-name"))
    members = {j.id: j.name for j in sdk.iter_jobs(labels={"raylane.array": arr.id})}
    assert len(members) == 6
    r = rl("ls", "--label", f"raylane.array={arr.id}", url=server.url, COLUMNS=str(width))
    assert r.returncode == 0, r.stderr
    lines = r.stdout.rstrip("\n").splitlines()
    assert all(len(line.rstrip()) <= width for line in lines), r.stdout
    assert lines[0].split()[:2] == ["ID", "NAME"] and "STATUS" in lines[0]
    for line in lines[1:]:
        shown, name, *rest = line.split()
        matches = [i for i in members if i.startswith(shown)]
        assert len(matches) == 1, (shown, r.stdout)  # a copied id is one job's
        assert members[matches[0]] == name and "PENDING" in rest  # the name whole, the status whole
    assert len(lines) == 7  # one line per job: nothing wrapped
    wide = rl("ls", "--label", f"raylane.array={arr.id}", "-o", "wide", url=server.url, COLUMNS="80")
    assert all(i in wide.stdout for i in members) and "REASON" in wide.stdout


def test_arrays_status_cancel_and_retry(server, sdk, tag):
    arr = sdk.submit_array(array_spec(tag, size=4, max_parallel=2))
    r = rl("arrays", "status", arr.id, url=server.url)
    assert r.returncode == 0, r.stderr
    assert f"Array {arr.id} (lr-sweep-member): 4 members, at most 2 at once" in r.stdout
    assert "4 PENDING (2 of them held back by max_parallel)" in r.stdout
    assert f"raylane ls --label raylane.array={arr.id}" in r.stdout
    # `status` and `cancel` know an array's id (they said "String should match pattern" before).
    r = rl("status", arr.id, url=server.url)
    assert r.returncode == 0 and f"Array {arr.id}" in r.stdout and "pattern" not in r.stderr, r.stderr
    r = rl("cancel", arr.id, url=server.url)
    assert r.returncode == 0, r.stderr
    assert f"Array {arr.id}: cancelled 4 unfinished member(s); now 4 CANCELLED" in r.stdout
    r = rl("arrays", "retry", arr.id, url=server.url)
    assert r.returncode == 0 and "4 member(s) submitted again" in r.stdout, r.stdout + r.stderr
    r = rl("arrays", "cancel", arr.id, "-o", "json", url=server.url)
    assert r.returncode == 0 and len(json.loads(r.stdout)["jobs"]) == 4
    r = rl("arrays", "status", "arr_0000000000000000", url=server.url)
    assert r.returncode == 1 and "pattern" not in r.stderr and "not found" in r.stderr.lower(), r.stderr


def test_submit_an_array_with_wait_waits_for_every_member_and_exits_by_them(server, sdk, tag, tmp_path):
    path = spec_file(tmp_path, array_spec(tag, size=3))
    r = rl("submit", path, "--wait", "--timeout", "1", url=server.url)
    assert r.returncode == 3 and "0 of 3 members ended" in r.stderr, r.stderr  # they stay PENDING offline
    env_args = [sys.executable, "-m", "raylane.client.cli", "submit", str(path), "--wait"]
    before = {j.labels.get("raylane.array") for j in sdk.iter_jobs(labels={"t": tag})}

    def submitted():
        return next((a for a in {j.labels.get("raylane.array") for j in sdk.iter_jobs(labels={"t": tag})}
                     if a not in before), None)

    env = {**os.environ, "RAYLANE_URL": server.url, "RAYLANE_TOKEN": ADMIN_TOKEN, "COLUMNS": "100", "NO_COLOR": "1"}
    p = subprocess.Popen(env_args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT, env=env)
    try:
        arr_id = wait_for(submitted, timeout=30, what="the array submitted")
        sdk.cancel_array(arr_id)
        out, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 1, err
    assert f"Submitted array {arr_id}" in err and "3/3 ended: 3 CANCELLED" in err
    assert f"Array {arr_id} FAILED: 3 CANCELLED" in err


def test_schedules_create_ls_next_pause_resume_delete(server, tag, tmp_path):
    path = spec_file(tmp_path, hello(tag, name="nightly"))
    name = f"nightly-{tag}"
    r = rl("schedules", "create", name, "0 2 * * *", path, "--timezone", "Europe/Berlin", url=server.url)
    assert r.returncode == 0, r.stderr
    sid = r.stdout.split()[1]
    assert sid.startswith("sch_") and f"({name}) created: `0 2 * * *` in Europe/Berlin" in r.stdout
    assert r.stdout.count("  next  ") == 5 and " 01:00:00" in r.stdout or " 02:00:00" in r.stdout
    r = rl("schedules", "ls", url=server.url, COLUMNS="80")
    assert r.returncode == 0 and sid in r.stdout and name in r.stdout and "active" in r.stdout, r.stdout
    assert all(len(line.rstrip()) <= 80 for line in r.stdout.splitlines()) or sid in r.stdout
    r = rl("schedules", "pause", sid, url=server.url)
    assert r.returncode == 0 and "paused" in r.stdout and "  next  " not in r.stdout
    r = rl("schedules", "resume", sid, url=server.url)
    assert r.returncode == 0 and "resumed" in r.stdout and r.stdout.count("  next  ") == 5
    r = rl("schedules", "next", sid, "-o", "json", url=server.url)
    assert r.returncode == 0 and len(json.loads(r.stdout)["next_runs"]) == 5
    r = rl("schedules", "create", f"s-{tag}", "* * * * * 30", path, "--paused", url=server.url)
    assert r.returncode == 0, r.stderr  # six fields: seconds last
    r = rl("schedules", "delete", sid, url=server.url)
    assert r.returncode == 0 and f"Schedule {sid} deleted" in r.stdout
    r = rl("schedules", "next", sid, url=server.url)
    assert r.returncode == 1 and "not found" in r.stderr.lower()
    r = rl("schedules", "create", f"bad-{tag}", "every day", path, url=server.url)
    assert r.returncode == 2 and "cron" in r.stderr, r.stderr


def test_costs_by_each_grouping(server):
    for by in ("project", "node_group", "kind"):
        r = rl("costs", "--by", by, "--since", "1d", url=server.url)
        assert r.returncode == 0, r.stderr
        assert r.stdout.startswith("Window ") and "total $" in r.stdout
    r = rl("costs", "-o", "json", url=server.url)
    assert r.returncode == 0 and json.loads(r.stdout)["group_by"] == "project"
    r = rl("costs", "--by", "colour", url=server.url)
    assert r.returncode == 2 and "--by" in r.stderr


def test_money_shows_what_a_cent_hides():
    assert money(0.0014) == "$0.0014" and money(0.000012) == "$0.000012"
    assert money(0) == "$0.00" and money(12.345) == "$12.35" and money(0.5) == "$0.50"


# Errors in the CLI's words ------------------------------------------------------


@pytest.mark.parametrize("suffix", ["/ui", "/v1", "/ui/"])
def test_a_url_with_the_ui_or_api_path_says_to_give_the_root(server, suffix):
    r = rl("--url", server.url + suffix, "ls", url=None)
    assert r.returncode == 1, r.stderr
    msg = " ".join(r.stderr.split())
    assert "not a Raylane API? Check the URL" in msg and f"give the server's root, {server.url}, without" in msg
    assert "Error: Not Found" not in msg


def test_https_against_the_plain_server_says_the_scheme_is_wrong(server):
    url = server.url.replace("http://", "https://")
    r = rl("--url", url, "ls", url=None)
    msg = " ".join(r.stderr.split())
    assert r.returncode == 4 and f"{url} answers plain HTTP, not HTTPS" in msg, msg
    assert f"use {server.url} in RAYLANE_URL or --url" in msg and "is `raylane-server serve` running" not in msg


def test_a_misspelt_field_in_a_spec_file_suggests_the_nearest(server, tag, tmp_path):
    spec = hello(tag)
    spec["entrypiont"] = spec.pop("entrypoint")
    r = rl("submit", spec_file(tmp_path, spec), url=server.url)
    assert r.returncode == 2
    assert "entrypiont: unknown field 'entrypiont'; did you mean entrypoint?" in r.stderr, r.stderr


def test_a_yaml_error_names_the_file_and_line_in_the_cli(server, tmp_path):
    bad = tmp_path / "job.yaml"
    bad.write_text("name: x\nkind: command\nentrypoint: [python,\n  resources: {\n")
    r = rl("submit", bad, url=server.url)
    msg = " ".join(r.stderr.split())
    assert r.returncode == 2 and f"{bad}, line " in msg and "<unicode string>" not in msg, msg


# What the job commands print, in process with the server's own answers ------------


class _Fake:
    """The SDK client, answering with jobs and events the real server made, changed where a test needs it."""

    def __init__(self, job=None, events=()):
        self.job, self.evs = job, list(events)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def resolve_job_id(self, job_id):
        return job_id

    def get_job(self, job_id):
        return self.job

    def events(self, job_id):
        return self.evs


def _invoke(monkeypatch, fake, *args, columns=80):
    from typer.testing import CliRunner

    from raylane.client import cli

    monkeypatch.setattr(cli, "_client", lambda: fake)
    monkeypatch.setenv("COLUMNS", str(columns))
    monkeypatch.setenv("NO_COLOR", "1")
    return CliRunner().invoke(cli.app, list(args))


def test_status_prints_the_dashboard_url_on_one_line(server, sdk, tag, monkeypatch):
    job = sdk.submit(hello(tag))
    url = f"{server.url}/ray/#/jobs/raylane-{job.id}-1"
    r = _invoke(monkeypatch, _Fake(job.model_copy(update={"dashboard_url": url})), "status", job.id, columns=60)
    assert r.exit_code == 0, r.output
    assert any(line.startswith("Ray") and line.endswith(url) for line in r.output.splitlines()), r.output


def test_events_are_one_line_each_with_the_reason_cut_to_the_terminal(server, sdk, tag, monkeypatch):
    job = sdk.submit(hello(tag))
    (ev,) = sdk.events(job.id)
    long = ev.model_copy(update={"reason": "submitted; routed to cpu; " + "a reason that goes on and on " * 6})
    r = _invoke(monkeypatch, _Fake(job, [long, ev]), "events", job.id, columns=80)
    lines = r.output.rstrip("\n").splitlines()
    assert r.exit_code == 0 and len(lines) == 3, r.output
    assert all(len(line.rstrip()) <= 80 for line in lines) and "\u2026" in lines[1]
    wide = _invoke(monkeypatch, _Fake(job, [long]), "events", job.id, "-o", "wide", columns=80)
    assert long.reason in wide.output


def test_the_final_line_counts_from_submit(server, sdk, tag):
    from datetime import timedelta

    from raylane.client.cli import _final_line

    job = sdk.submit(hello(tag))
    from raylane import JobStatus

    done = job.model_copy(update={"status": JobStatus.SUCCEEDED, "started_at": job.created_at + timedelta(seconds=5),
                                  "finished_at": job.created_at + timedelta(seconds=5, milliseconds=300)})
    assert _final_line(done).endswith("SUCCEEDED[/] after 5s")  # what the user waited, not the 0 s it ran


def test_run_streams_by_default_and_no_wait_returns(server, tag):
    r = rl("run", "--no-wait", "--name", f"nw-{tag}", "--", "python", "-c", "print(42)", url=server.url)
    assert r.returncode == 0 and "Submitted job" in r.stdout, r.stderr
    r = rl("run", "-o", "json", "--", "python", "-c", "print(42)", url=server.url)
    assert r.returncode == 0 and json.loads(r.stdout)["status"] == "PENDING"  # scripts: as before
    # By default it stays with the job (offline it stays PENDING): the status lines go to
    # stderr, stdout is kept for the log, as `ray job submit` streams it.
    r = rl("run", "--timeout", "1", "--", "python", "-c", "print(42)", url=server.url)
    assert r.returncode == 3 and "Submitted job" in r.stderr and "PENDING" in r.stderr and r.stdout == "", r.stderr
    r = rl("run", "--no-follow", "--timeout", "1", "--", "python", "-c", "print(42)", url=server.url)
    assert r.returncode == 3 and "Submitted job" in r.stdout, r.stdout + r.stderr


def test_a_job_command_given_an_array_id_says_where_arrays_are(server, sdk, tag):
    arr = sdk.submit_array(array_spec(tag, size=2))
    for cmd in ("events", "logs", "wait"):
        r = rl(cmd, arr.id, url=server.url)
        assert r.returncode == 2 and f"raylane arrays status {arr.id}" in r.stderr and "pattern" not in r.stderr
    import httpx

    r = httpx.get(f"{server.url}/v1/jobs/{arr.id}", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
    assert r.status_code == 422 and f"/v1/arrays/{arr.id}" in r.json()["detail"][0]["msg"], r.text
