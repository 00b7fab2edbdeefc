"""Structured logs: one JSON object per line with request id, job id and attempt;
the text format shows the same ids; loops start each pass about no job; a real
``raylane-server serve`` writes JSON lines that carry the caller's X-Request-ID."""

from __future__ import annotations

import io
import json
import logging

import httpx

from raylane.orchestrator import logcontext
from raylane.orchestrator.loops.base import LoopService
from tests.helpers import wait_for

BANNER = ("Raylane API:", "API docs:", "Database:", "Ray dashboard:", "Raylane admin token", "export RAYLANE_TOKEN=")


def _capture(fmt: str):
    stream = io.StringIO()
    root = logging.getLogger()
    saved = (list(root.handlers), root.level)
    handler = logcontext.configure("DEBUG", fmt, stream=stream)
    return stream, handler, saved


def _restore(saved):
    root = logging.getLogger()
    for h in list(root.handlers):
        root.removeHandler(h)
    for h in saved[0]:
        root.addHandler(h)
    root.setLevel(saved[1])


def test_json_lines_carry_request_job_and_attempt():
    stream, _, saved = _capture("json")
    try:
        log = logging.getLogger("raylane.test")
        logcontext.bind_job(None)  # a loop's run_once called directly by an earlier test may have bound one
        log.info("before any context")
        token = logcontext.request_id.set("req-1")
        with logcontext.job_context("job-1", 2):
            log.warning("inside %s", "a job", extra={"node_group": "gpu"})
            try:
                raise ValueError("boom")
            except ValueError:
                log.exception("it failed")
        logcontext.request_id.reset(token)
    finally:
        _restore(saved)
    lines = [json.loads(x) for x in stream.getvalue().splitlines()]
    # Only this test's logger: threads left by earlier tests may log to the root too.
    lines = [x for x in lines if x["logger"] == "raylane.test"]
    assert len(lines) == 3
    first, second, third = lines
    assert first["msg"] == "before any context" and first["level"] == "INFO" and first["logger"] == "raylane.test"
    assert (first["request_id"], first["job_id"], first["attempt"]) == (None, None, None)
    assert second["msg"] == "inside a job" and second["node_group"] == "gpu"
    assert (second["request_id"], second["job_id"], second["attempt"]) == ("req-1", "job-1", 2)
    assert "ValueError: boom" in third["exc"] and third["job_id"] == "job-1"
    assert first["ts"].endswith("+00:00")


def test_text_format_shows_the_ids():
    stream, _, saved = _capture("text")
    try:
        with logcontext.job_context("job-9", 1):
            logging.getLogger("raylane.test").info("hello")
    finally:
        _restore(saved)
    line = stream.getvalue().strip()
    assert line.endswith("raylane.test [job_id=job-9 attempt=1]: hello"), line


def test_a_loop_pass_starts_about_no_job():
    seen: list[tuple] = []

    class Loop(LoopService):
        name = "test"

        def run_once(self):
            seen.append((logcontext.job_id.get(), logcontext.attempt.get()))
            logcontext.bind_job(f"job-{len(seen)}", 1)  # what the dispatcher and reconciler do per attempt

    loop = Loop(0.01)
    loop.start()
    try:
        wait_for(lambda: len(seen) >= 3, timeout=10, what="three passes")
    finally:
        loop.stop()
    assert all(x == (None, None) for x in seen)


def test_server_writes_json_lines_with_the_request_id(server_factory, tmp_path):
    from raylane.orchestrator.store import migrate

    url = f"sqlite:///{tmp_path / 'log.db'}"
    migrate.upgrade(url)
    srv = server_factory({"RAYLANE_DATABASE_URL": url, "RAYLANE_DATA_DIR": str(tmp_path),
                          "RAYLANE_LOOPS_ENABLED": "false", "RAYLANE_LOG_FORMAT": "json"}).start()
    headers = dict(getattr(srv, "headers", {}))
    job = httpx.post(srv.url + "/v1/jobs", json={"name": "hello", "kind": "command", "entrypoint": "true"},
                     headers={**headers, "X-Request-ID": "submit-1"}, timeout=30).json()
    r = httpx.get(f"{srv.url}/v1/jobs/{job['id']}", headers={**headers, "X-Request-ID": "get-1"}, timeout=30)
    assert r.headers["x-request-id"] == "get-1"

    def logged():
        lines = [x for x in srv.log_path.read_text().splitlines() if x.strip() and not x.startswith(BANNER)
                 and not x.startswith("  ")]
        parsed = [json.loads(x) for x in lines]  # every log line is JSON
        return [p for p in parsed if p["request_id"] == "get-1"]

    (line,) = wait_for(logged, timeout=10, what="the request's log line")
    assert line["job_id"] == job["id"] and line["status"] == 200 and line["route"] == "/v1/jobs/{job_id}"
    assert line["msg"].startswith("GET /v1/jobs/") and line["logger"] == "raylane.http"
    assert {"ts", "level", "attempt"} <= set(line)
