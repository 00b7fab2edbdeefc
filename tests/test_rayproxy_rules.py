"""The /ray proxy's parts that need no Ray: the redactor (Ray's token never goes
back, however a body is cut) and the scoping rules per role (``api.rayscope``).
The same rules against a real cluster, through a real server:
tests/ray/test_ray_dashboard_proxy.py."""

from __future__ import annotations

import pytest

from raylane.api.rayproxy import Redactor, redact
from raylane.api.rayscope import Kind, decide
from raylane.orchestrator.services.access import Caller

SECRET = "0123456789abcdef0123456789abcdef"
ADMIN = Caller(name="a", project=None, role="admin", token_id="tok_a")
MEMBER = Caller(name="m", project="alpha", role="member", token_id="tok_m")


@pytest.mark.parametrize("size", [1, 2, 3, 7, 31, 32, 33, 1000])
def test_the_secret_is_replaced_however_the_body_is_cut(size):
    body = (f"head {SECRET} middle {SECRET[:10]} x {SECRET}{SECRET} tail\n").encode() * 3
    r = Redactor(SECRET)
    out = b"".join(r.feed(body[i:i + size]) for i in range(0, len(body), size)) + r.flush()
    assert SECRET.encode() not in out
    assert out == body.replace(SECRET.encode(), Redactor.MASK)
    assert redact(SECRET, body) == out


def test_a_line_ending_in_a_newline_is_not_held_back():
    r = Redactor(SECRET)
    assert r.feed(b"a log line\n") == b"a log line\n"
    assert r.feed(b"ends in 01") == b"ends in "  # could be the secret's start: waits
    assert r.feed(b"x\n") == b"01x\n"


def q(s: str) -> dict[str, list[str]]:
    from urllib.parse import parse_qs

    return parse_qs(s, keep_blank_values=True)


@pytest.mark.parametrize("caller", [ADMIN, MEMBER])
@pytest.mark.parametrize("method,path", [
    ("POST", "api/jobs/"), ("POST", "api/jobs/x/stop"), ("DELETE", "api/jobs/x"), ("PUT", "api/packages/gcs/p.zip"),
    ("PUT", "api/serve/applications/"), ("GET", "api/actors/kill"), ("GET", "worker/traceback"),
    ("GET", "worker/cpu_profile"), ("GET", "task/cpu_profile"), ("GET", "memory_profile"),
    ("GET", "api/packages/gcs/p.zip"), ("GET", "static/../api/jobs/"), ("OPTIONS", "api/jobs/"),
])
def test_whatever_acts_is_refused_whoever_asks(caller, method, path):
    d = decide(method, path, {}, caller)
    assert d.kind is Kind.REFUSE and d.status == 403


def test_member_reads_are_scoped():
    assert decide("GET", "api/jobs/", {}, MEMBER).kind is Kind.LIST_JOBS
    assert decide("GET", "api/jobs/", {}, ADMIN).kind is Kind.PASS
    d = decide("GET", "api/jobs/raylane-x-1", {}, MEMBER)
    assert d.kind is Kind.JOB and d.job == "raylane-x-1"
    d = decide("GET", "api/v0/logs/file", q("node_id=n&filename=job-driver-raylane-x-1.log&lines=10"), MEMBER)
    assert d.kind is Kind.JOB and d.job == "raylane-x-1" and not d.stream
    assert decide("GET", "api/v0/logs/stream", q("node_id=n&submission_id=s"), MEMBER).stream
    for bad in ("node_id=n&filename=raylet.out", "node_id=n&filename=job-driver-a.log&task_id=t",
                "node_id=n&actor_id=a", "node_id=n&pid=1", "node_id=n&filename=job-driver-a.log&submission_id=b",
                "node_id=n&filename=../job-driver-a.log", "node_id=n"):
        assert decide("GET", "api/v0/logs/file", q(bad), MEMBER).status == 404, bad
    d = decide("GET", "api/v0/tasks", q("detail=1&filter_keys=job_id&filter_predicates==&filter_values=03000000"),
               MEMBER)
    assert d.kind is Kind.JOB and d.job == "03000000"
    assert decide("GET", "api/v0/tasks", q("detail=1"), MEMBER).status == 404
    for path in ("logical/actors", "api/v0/actors", "api/v0/placement_groups", "nodes", "api/v0/logs",
                 "api/serve/applications/", "nodes/abc123"):
        assert decide("GET", path, {}, MEMBER).status == 403, path
        assert decide("GET", path, {}, ADMIN).kind is Kind.PASS, path
    for path in ("", "static/js/main.js", "api/cluster_status", "api/v0/cluster_metadata", "timezone"):
        assert decide("GET", path, {}, MEMBER).kind is Kind.PASS, path
    assert decide("GET", "nodes", q("view=summary"), MEMBER).kind is Kind.PASS
    assert decide("GET", "api/authentication_mode", {}, MEMBER).kind is Kind.AUTH_MODE


def test_the_public_shell_is_only_the_app():
    from raylane.api.rayscope import is_shell

    assert is_shell("GET", "") and is_shell("GET", "static/js/main.js") and is_shell("HEAD", "favicon.ico")
    for method, path in (("GET", "static/../api/jobs/"), ("POST", "static/x"), ("GET", "api/jobs/"),
                         ("GET", "nodes")):
        assert not is_shell(method, path), (method, path)
