"""The Python SDK (``raylane.Client`` / ``AsyncClient``) against a real ``raylane-server serve``.

One server per database kind serves the module (a server start costs seconds on
2 cores); each test tags its jobs with its own label so tests never see each
other's jobs. That server points at a Ray dashboard where nothing listens (Ray
down), so jobs are routed and stay PENDING; tests that need the server exactly
as configured in the brief (no Ray at all) or a dead one start their own.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
import uuid
from datetime import datetime, timedelta, timezone
from pathlib import Path

import httpx
import pytest

import raylane
from raylane import (
    AsyncClient, Client, Conflict, ConnectionFailed, JobSpec, JobStatus, NotFound, RaylaneError, ServerError,
    ValidationFailed, WaitTimeout,
)
from raylane.orchestrator.domain.specs import load_spec_document
from tests.conftest import ROOT, ServerProcess, free_port, fresh_pg_database

HELLO = {"name": "hello", "kind": "command", "entrypoint": "python -c 'print(42)'"}
EXAMPLES = ROOT / "examples"
# The server's bootstrap admin token (RAYLANE_ADMIN_TOKEN); the SDK sends it as a Bearer token.
ADMIN_TOKEN = "sdk-test-admin-token-0123456789"


def server_env(db_url: str, data_dir: Path, **extra: str) -> dict[str, str]:
    return {"RAYLANE_DATABASE_URL": db_url, "RAYLANE_DATA_DIR": str(data_dir), "RAYLANE_LOOPS_ENABLED": "false",
            "RAYLANE_ADMIN_TOKEN": ADMIN_TOKEN, "RAYLANE_AUTH_ENABLED": "true",
            # Functions as jobs upload their directory; local paths are for tests that still send one.
            "RAYLANE_POLICY_WORKING_DIR_ROOTS": json.dumps([str(ROOT), str(data_dir)]), **extra}


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def server(request, tmp_path_factory):
    """A real server (uvicorn) per database kind, shared by this module's tests."""
    tmp = tmp_path_factory.mktemp(f"sdk-{request.param}")
    if request.param == "sqlite":
        from raylane.orchestrator.store import migrate

        url = f"sqlite:///{tmp / 'raylane.db'}"
        migrate.upgrade(url)
    else:
        url = fresh_pg_database(request.getfixturevalue("pg_template"))
    # Ray is "down": routing works from the profile, nothing is dispatched.
    env = server_env(url, tmp, RAYLANE_DASHBOARD_URL=f"http://127.0.0.1:{free_port()}")
    sp = ServerProcess(env, tmp / "server.log").start()
    yield sp
    sp.kill()


@pytest.fixture
def client(server):
    with Client(server.url, token=ADMIN_TOKEN) as c:
        yield c


@pytest.fixture
def tag():
    """A label unique to the test, to find its jobs on the shared server."""
    return {"t": uuid.uuid4().hex[:12]}


def hello(tag, **over):
    return {**HELLO, "labels": dict(tag), **over}


def sweep_spec(tag):
    return {**load_spec_document((EXAMPLES / "lr-sweep.yaml").read_text()), "labels": dict(tag)}


# A module-level function for the decorator tests (the cluster imports it by name).
@raylane.job(gpus=1, name="fn-train", labels={"team": "sdk"})
def decorated(ctx):
    return {"lr": ctx.args["lr"], "rank": ctx.rank}


def plain(ctx):
    return sum(ctx.args.get("xs", []))


# Submitting -------------------------------------------------------------------------


def test_submit_dict_jobspec_and_yaml_path(client, tag, tmp_path):
    a = client.submit(hello(tag))
    assert isinstance(a, raylane.Job) and a.status is JobStatus.PENDING and a.status_reason
    assert a.placement is not None and a.placement.node_group == "cpu" and a.placement.reasons

    b = client.submit(JobSpec.model_validate(hello(tag, name="as-model")))
    assert b.name == "as-model" and b.spec.labels == tag

    path = tmp_path / "job.yaml"
    path.write_text((EXAMPLES / "finetune.yaml").read_text() + f"\nlabels: {json.dumps(tag)}\n")
    c = client.submit(path)
    d = client.submit(str(path))  # a str path too; a new key per call: a second job
    assert c.kind.value == "training" and c.placement.node_group == "gpu" and c.placement.strategy == "STRICT_PACK"
    assert d.id != c.id
    assert client.get_job(c.id).spec.resources.num_workers == 2
    assert {j.id for j in client.iter_jobs(labels=tag)} == {a.id, b.id, c.id, d.id}


def test_idempotency_key_returns_same_job_and_conflicts_on_other_spec(client, tag):
    key = "sdk-" + uuid.uuid4().hex
    first = client.submit(hello(tag), idempotency_key=key)
    again = client.submit(hello(tag), idempotency_key=key)
    assert again.id == first.id
    with pytest.raises(Conflict) as e:
        client.submit(hello(tag, name="other"), idempotency_key=key)
    assert e.value.status_code == 409
    assert len(list(client.iter_jobs(labels=tag))) == 1


def test_invalid_spec_is_validation_failed_with_field_errors(client, tag, tmp_path):
    with pytest.raises(ValidationFailed) as e:
        client.submit(hello(tag, kind="nonsense"))
    assert e.value.status_code == 422
    assert e.value.errors and e.value.errors[0]["loc"] == ["body", "kind"]
    assert "kind" in e.value.fields and "kind:" in str(e.value)

    with pytest.raises(ValidationFailed) as e:
        client.submit(hello(tag, resources={"gpus_per_worker": 1.5}))
    assert "whole number" in e.value.fields["resources.gpus_per_worker"]

    bad = tmp_path / "bad.yaml"
    bad.write_text("name: [\n")
    with pytest.raises(ValidationFailed, match="not valid YAML"):
        client.submit(bad)
    with pytest.raises(FileNotFoundError):
        client.submit(tmp_path / "missing.yaml")
    assert list(client.iter_jobs(labels=tag)) == []


def test_submit_batch(client, tag):
    r = client.submit_batch([hello(tag, name=f"b{i}") for i in range(3)])
    assert r.count == 3 and len(set(r.ids)) == 3
    assert sorted(j.name for j in client.iter_jobs(labels=tag)) == ["b0", "b1", "b2"]
    with pytest.raises(ValidationFailed) as e:
        client.submit_batch([hello(tag), hello(tag, entrypoint="")])
    assert e.value.errors[0]["loc"][:3] == ["body", "jobs", "1"]


# Reading ----------------------------------------------------------------------------


def test_list_filters_and_paging(client, tag):
    ids = [client.submit(hello(tag, name=f"page-{i}")).id for i in range(7)]
    sweep = client.submit(sweep_spec(tag))

    page = client.list_jobs(labels=tag, limit=3)
    assert isinstance(page, raylane.JobPage) and len(page.items) == 3 and page.next_cursor
    page2 = client.list_jobs(labels=tag, limit=3, cursor=page.next_cursor)
    assert not {j.id for j in page.items} & {j.id for j in page2.items}

    every = list(client.iter_jobs(labels=tag, page_size=3))
    assert [j.id for j in every] == [sweep.id, *reversed(ids)]  # newest first, each once
    assert len(list(client.iter_jobs(labels=tag, page_size=3, max_items=5))) == 5

    assert [j.id for j in client.iter_jobs(labels=tag, kind="sweep")] == [sweep.id]
    assert [j.id for j in client.iter_jobs(labels=tag, node_group="spot-cpu")] == [sweep.id]
    assert len(list(client.iter_jobs(labels=tag, status=[JobStatus.PENDING, "RUNNING"]))) == 8
    assert list(client.iter_jobs(labels=tag, status="SUCCEEDED")) == []
    assert [j.name for j in client.iter_jobs(labels=tag, name_prefix="page-6")] == ["page-6"]
    now = datetime.now(timezone.utc)
    assert len(list(client.iter_jobs(labels=tag, created_after=now - timedelta(hours=1)))) == 8
    assert list(client.iter_jobs(labels=tag, created_before=now - timedelta(hours=1))) == []
    with pytest.raises(ValidationFailed, match="timezone"):
        client.list_jobs(labels=tag, created_after=datetime(2026, 1, 1))


def test_get_events_attempts_cancel_and_not_found(client, tag):
    job = client.submit(hello(tag))
    assert client.get_job(job.id).id == job.id
    evs = client.events(job.id)
    assert [e.to_status for e in evs] == [JobStatus.PENDING] and isinstance(evs[0], raylane.JobEvent)
    assert client.events(job.id, after_id=evs[-1].id) == []
    assert client.attempts(job.id) == []

    r = client.cancel(job.id)
    assert r.job.status is JobStatus.CANCELLED and r.message == "cancelled"
    assert "already" in client.cancel(job.id).message  # idempotent
    assert [e.to_status for e in client.events(job.id)] == [JobStatus.PENDING, JobStatus.CANCELLED]

    for call in (client.get_job, client.events, client.attempts, client.cancel, client.logs, client.trials):
        with pytest.raises(NotFound, match="not found") as e:
            call("doesnotexist1")
        assert e.value.status_code == 404


def test_wait_times_out_then_returns_when_cancelled(client, tag):
    job = client.submit(hello(tag))
    t0 = time.monotonic()
    with pytest.raises(WaitTimeout) as e:
        client.wait(job.id, timeout=0.6)
    assert 0.5 < time.monotonic() - t0 < 5
    assert e.value.status is JobStatus.PENDING and e.value.job_id == job.id and "keeps running" in str(e.value)
    assert isinstance(e.value, TimeoutError)

    seen = []
    canceller = threading.Timer(0.8, client.cancel, args=(job.id,))
    canceller.start()
    try:
        done = client.wait(job.id, timeout=30, on_event=seen.append)
    finally:
        canceller.join()
    assert done.status is JobStatus.CANCELLED and done.finished_at is not None
    assert [e.to_status for e in seen] == [JobStatus.PENDING, JobStatus.CANCELLED]

    with pytest.raises(NotFound):
        client.wait("doesnotexist1", timeout=1)


def test_logs_text_and_follow_until_the_job_ends(client, tag):
    job = client.submit(hello(tag))
    assert client.logs(job.id) == ""  # no attempt yet
    with pytest.raises(ValidationFailed, match="no attempt 2"):
        client.logs(job.id, attempt=2)

    chunks: list[str] = []
    follower = threading.Thread(target=lambda: chunks.extend(client.logs(job.id, follow=True)))
    follower.start()
    time.sleep(1.0)
    assert follower.is_alive()  # still following a waiting job
    client.cancel(job.id)
    follower.join(30)
    assert not follower.is_alive() and "".join(chunks) == ""
    assert list(client.logs(job.id, follow=True)) == []  # an ended job's stream ends at once


def test_trials_plan_node_groups_health_cluster(server, client, tag, tmp_path):
    sweep = client.submit(sweep_spec(tag))
    assert client.trials(sweep.id) == []  # a sweep stores its trials when it ends
    assert client.trials(sweep.id, sort_by="loss", mode="max") == []

    p = client.plan(EXAMPLES / "finetune.yaml")
    assert isinstance(p, raylane.Placement) and p.node_group == "gpu" and p.strategy == "STRICT_PACK" and p.colocate
    assert client.plan(hello(tag)).node_group == "cpu"
    with pytest.raises(ValidationFailed, match="9 GPUs"):
        client.plan(hello(tag, kind="training", entrypoint="m:f", resources={"gpus_per_worker": 9}))

    groups = {g.name: g for g in client.node_groups()}
    assert set(groups) == {"head", "gpu", "spot-cpu", "cpu"}
    assert groups["gpu"].accelerator == {"type": "H100", "count": 2} and groups["spot-cpu"].market == "SPOT"
    assert groups["spot-cpu"].queued_jobs >= 1 and groups["gpu"].alive_nodes == 0

    h = client.health()
    # Jobs are accepted (ok), but this server's Ray is down: degraded, and it says so.
    assert h.ok and h.status == "degraded" and "Ray" in h.reason
    # The server's Ray is down: /v1/cluster says so as a 503 (after the SDK's bounded
    # retries; one here, each waits the server's Retry-After of 5 s).
    with Client(server.url, token=ADMIN_TOKEN, max_attempts=2) as c, pytest.raises(ServerError) as e:
        c.cluster()
    assert e.value.status_code == 503 and "unreachable" in str(e.value)


# Without Ray, and with no server --------------------------------------------------------


def test_server_without_ray(server_factory, db_url, tmp_path):
    srv = server_factory(server_env(db_url, tmp_path)).start()
    with Client(srv.url, token=ADMIN_TOKEN) as c:
        job = c.submit(HELLO)
        assert job.status is JobStatus.PENDING and job.placement is None
        for call in (c.node_groups, c.cluster, lambda: c.plan(HELLO)):
            with pytest.raises(ValidationFailed, match="Ray cluster|profile"):
                call()
        assert c.health().ok
    srv.kill()
    with Client(srv.url, max_attempts=2) as c:
        with pytest.raises(ConnectionFailed):
            c.get_job(job.id)


def test_server_down_is_connection_failed_with_a_clear_message():
    url = f"http://127.0.0.1:{free_port()}"
    t0 = time.monotonic()
    with Client(url) as c:
        with pytest.raises(ConnectionFailed) as e:
            c.submit(HELLO)
    took = time.monotonic() - t0
    msg = str(e.value)
    assert url in msg and "raylane-server serve" in msg and f"after {raylane.MAX_ATTEMPTS} tries" in msg
    assert isinstance(e.value, ConnectionError) and isinstance(e.value, RaylaneError)
    assert 0.5 < took < 15  # bounded backoff: seconds, not minutes


# Retries are safe ---------------------------------------------------------------------


class DropFirstResponseProxy:
    """A TCP proxy in front of the real server. On the first connection carrying a
    request whose first line starts with ``drop_prefix``, it forwards the request,
    reads the server's whole answer, then closes the client's socket without
    sending a byte: the server did the work, the client saw a dropped connection."""

    def __init__(self, upstream_port: int, drop_prefix: bytes):
        self.upstream = ("127.0.0.1", upstream_port)
        self.drop_prefix = drop_prefix
        self.dropped = 0
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        up = socket.create_connection(self.upstream)
        try:
            first = self._read_request(conn)
            if first.startswith(self.drop_prefix) and self.dropped == 0:
                self.dropped += 1
                up.sendall(first)
                up.settimeout(10)
                up.recv(65536)  # the server answered (and stored the job)...
                conn.close()  # ...but the client never hears it
                return
            up.sendall(first)
            self._pipe(conn, up)
        finally:
            up.close()
            conn.close()

    @staticmethod
    def _read_request(conn: socket.socket) -> bytes:
        """One whole HTTP request (headers, then Content-Length bytes of body)."""
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = conn.recv(65536)
            if not chunk:
                return data
            data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        length = 0
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        while len(body) < length:
            chunk = conn.recv(65536)
            if not chunk:
                break
            body += chunk
        return head + b"\r\n\r\n" + body

    @staticmethod
    def _pipe(a: socket.socket, b: socket.socket) -> None:
        def one_way(src, dst):
            try:
                while data := src.recv(65536):
                    dst.sendall(data)
            except OSError:
                pass
            finally:
                try:
                    dst.shutdown(socket.SHUT_WR)
                except OSError:
                    pass

        t = threading.Thread(target=one_way, args=(b, a), daemon=True)
        t.start()
        one_way(a, b)
        t.join(30)

    def close(self) -> None:
        self.sock.close()


def test_submit_retried_after_dropped_connection_creates_one_job(server, client, tag):
    proxy = DropFirstResponseProxy(server.port, b"POST /v1/jobs ")
    try:
        with Client(proxy.url, token=ADMIN_TOKEN) as via_proxy:
            job = via_proxy.submit(hello(tag))
        assert proxy.dropped == 1  # the first answer was lost; the retry got the same job
        assert [j.id for j in client.iter_jobs(labels=tag)] == [job.id]
    finally:
        proxy.close()


def test_batch_is_not_resent_after_the_request_may_have_arrived(server, client, tag):
    proxy = DropFirstResponseProxy(server.port, b"POST /v1/jobs/batch ")
    try:
        with Client(proxy.url, token=ADMIN_TOKEN) as via_proxy:
            with pytest.raises(ConnectionFailed, match="may have been stored"):
                via_proxy.submit_batch([hello(tag), hello(tag)])
        assert len(list(client.iter_jobs(labels=tag))) == 2  # stored once, not twice
    finally:
        proxy.close()


class FlakyTransport(httpx.BaseTransport):
    """Forwards to the real server; the first ``n`` requests get ``status`` instead."""

    def __init__(self, n: int, status: int):
        self.inner = httpx.HTTPTransport()
        self.n, self.status, self.seen = n, status, []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.seen.append(request)
        if len(self.seen) <= self.n:
            return httpx.Response(self.status, headers={"Retry-After": "0"}, json={"detail": "upstream restarting"})
        return self.inner.handle_request(request)


def test_502_503_504_are_retried_and_bounded(server, tag):
    flaky = FlakyTransport(2, 503)
    with Client(server.url, token=ADMIN_TOKEN, transport=flaky) as c:
        job = c.submit(hello(tag))
    assert len(flaky.seen) == 3 and job.status is JobStatus.PENDING
    keys = {r.headers["Idempotency-Key"] for r in flaky.seen}
    assert len(keys) == 1 and uuid.UUID(keys.pop()).version == 4  # one key for every try

    always = FlakyTransport(100, 502)
    with Client(server.url, token=ADMIN_TOKEN, transport=always, max_attempts=3) as c:
        with pytest.raises(ServerError, match="502") as e:
            c.get_job("x")
    assert len(always.seen) == 3 and e.value.status_code == 502


def test_token_and_url_from_environment(server, monkeypatch, tag):
    seen = FlakyTransport(0, 200)
    monkeypatch.setenv("RAYLANE_URL", server.url)
    monkeypatch.setenv("RAYLANE_TOKEN", ADMIN_TOKEN)
    with Client(transport=seen) as c:
        assert c.url == server.url and ADMIN_TOKEN not in repr(c)
        assert c.submit(hello(tag)).status is JobStatus.PENDING
    assert seen.seen[0].headers["Authorization"] == f"Bearer {ADMIN_TOKEN}"
    monkeypatch.delenv("RAYLANE_TOKEN")
    with Client(transport=seen) as c:
        assert c.health().ok  # a public probe
    assert "Authorization" not in seen.seen[-1].headers


def test_missing_or_wrong_token_is_unauthorized(server):
    assert httpx.get(server.url + "/v1/jobs").status_code == 401  # the fixture's server runs with auth on
    for token in (None, "not-a-real-token-0000"):
        with Client(server.url, token=token, max_attempts=1) as c:
            with pytest.raises(raylane.Unauthorized, match="RAYLANE_TOKEN") as e:
                c.list_jobs()
        assert e.value.status_code == 401


def test_error_statuses_map_to_typed_errors():
    # Every status the server can answer, through the one mapping function (403 and 500 are hard to provoke).
    from raylane.client.sdk import Forbidden, Unauthorized, _error_from

    def err(status, body):
        return _error_from(httpx.Response(status, json=body))

    assert isinstance(err(401, {"detail": "bad token"}), Unauthorized)
    assert "RAYLANE_TOKEN" in str(err(401, {"detail": "bad token"}))
    assert isinstance(err(403, {"detail": "not your project"}), Forbidden)
    assert isinstance(err(409, {"detail": "x"}), Conflict)
    assert isinstance(err(500, {"detail": "boom"}), ServerError)
    v = err(422, {"detail": [{"loc": ["body", "resources", "num_workers"], "msg": "too big", "type": "x"}]})
    assert isinstance(v, ValidationFailed) and v.fields == {"resources.num_workers": "too big"}


def test_an_sdk_error_is_the_servers_error_of_the_same_name():
    # One definition per error (tests/test_layers.py): what the server raised, the SDK raises as its subclass,
    # with the HTTP answer's facts added and its own attributes as before.
    from raylane.client.sdk import RateLimited, _error_from
    from raylane.orchestrator.domain import errors as domain

    gone = _error_from(httpx.Response(404, json={"detail": "job j-1 not found"}))
    assert isinstance(gone, domain.NotFound) and isinstance(gone, raylane.RaylaneError)
    assert (gone.message, str(gone), gone.status_code, gone.detail, gone.field) == (
        "job j-1 not found", "job j-1 not found", 404, "job j-1 not found", None)
    slow = _error_from(httpx.Response(429, json={"detail": "too many submits"}, headers={"Retry-After": "3"}))
    assert isinstance(slow, RateLimited) and isinstance(slow, domain.RateLimited)
    assert (slow.status_code, slow.retry_after_s, str(slow)) == (429, 3, "too many submits")
    assert _error_from(httpx.Response(429, json={"detail": "x"})).retry_after_s is None
    assert raylane.Conflict("x").status_code is None and issubclass(raylane.Conflict, domain.Conflict)


# Functions as jobs -------------------------------------------------------------------------


def test_decorated_function_submits_as_training_job(client, tag):
    job = decorated.submit(client=client, lr=0.01)
    spec = job.spec
    assert spec.kind.value == "training" and spec.entrypoint == "tests.test_sdk:decorated"
    # The directory holding the `tests` package, zipped here and uploaded: asked for
    # again, the server has it and nothing is sent.
    again = client.upload_package(ROOT)
    assert spec.runtime_env.working_dir == again.uri and not again.sent
    assert spec.resources.gpus_per_worker == 1 and spec.resources.num_workers == 1
    assert spec.args == {"lr": 0.01} and spec.labels["team"] == "sdk" and job.name == "fn-train"
    assert job.placement.node_group == "gpu"
    # What the training runner does on the cluster: import by name, call with the context.
    from raylane.jobs.base import load_callable

    ctx = type("Ctx", (), {"args": {"lr": 0.5}, "rank": 0})()
    assert load_callable(spec.entrypoint)(ctx) == {"lr": 0.5, "rank": 0}

    cpu = client.submit_function(plain, args={"xs": [1, 2]}, cpus=2, labels=tag)
    assert cpu.spec.entrypoint == "tests.test_sdk:plain" and cpu.spec.resources.gpus_per_worker == 0
    assert cpu.spec.resources.cpus_per_worker == 2 and cpu.placement.node_group == "cpu"
    more = client.submit_function(decorated, args={"lr": 1}, gpus=2, name="fn-2gpu", labels=tag)
    assert more.spec.resources.gpus_per_worker == 2 and more.name == "fn-2gpu"


def test_decorator_refuses_what_the_cluster_could_not_run():
    def nested(ctx):
        return 1

    with pytest.raises(TypeError, match="module-level"):
        raylane.job(nested).spec()
    with pytest.raises(TypeError, match="JSON"):
        decorated.spec(when=datetime.now())
    with pytest.raises(ValidationFailed, match="gpus_per_worker"):
        decorated.options(gpus=1.5).spec(lr=1)
    with pytest.raises(TypeError, match="unknown raylane.job option"):
        raylane.job(gpu=1)(plain)


def test_decorator_in_a_script_ships_the_script_directory(tmp_path):
    script = tmp_path / "train_script.py"
    script.write_text(
        "import json, raylane\n"
        "@raylane.job(cpus=1)\n"
        "def fit(ctx):\n    return ctx.args\n"
        "if __name__ == '__main__':\n"
        "    print(json.dumps(fit.spec(epochs=3).model_dump(mode='json')))\n")
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "PYTHONPATH": str(ROOT)}, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    spec = json.loads(out.stdout)
    assert spec["entrypoint"] == "train_script:fit" and spec["runtime_env"]["working_dir"] == str(tmp_path)
    assert spec["args"] == {"epochs": 3} and spec["name"] == "fit"


# AsyncClient -----------------------------------------------------------------------------


class AsyncDropOnce(httpx.AsyncBaseTransport):
    """Forwards every request to the real server; for the first submit, it drops the
    answer after the server has processed it (the connection "breaks")."""

    def __init__(self):
        self.inner = httpx.AsyncHTTPTransport()
        self.dropped = 0

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        resp = await self.inner.handle_async_request(request)
        if request.method == "POST" and request.url.path == "/v1/jobs" and not self.dropped:
            self.dropped += 1
            await resp.aread()
            await resp.aclose()
            raise httpx.ReadError("connection reset by peer", request=request)
        return resp


def test_async_client_covers_the_api(server, tag):
    async def main():
        drop = AsyncDropOnce()
        async with AsyncClient(server.url, token=ADMIN_TOKEN, transport=drop) as c:
            job = await c.submit(hello(tag))
            assert drop.dropped == 1
            assert [j.id async for j in c.iter_jobs(labels=tag, page_size=1)] == [job.id]
            b = await c.submit_batch([hello(tag, name="ab")])
            page = await c.list_jobs(labels=tag, limit=1)
            assert page.items[0].id == b.ids[0] and page.next_cursor
            assert (await c.get_job(job.id)).id == job.id
            assert [e.to_status for e in await c.events(job.id)] == [JobStatus.PENDING]
            assert await c.attempts(job.id) == []
            assert await c.logs(job.id) == ""
            with pytest.raises(WaitTimeout):
                await c.wait(job.id, timeout=0.3)

            async def cancel_soon():
                await asyncio.sleep(0.5)
                return await c.cancel(job.id)

            follow = asyncio.ensure_future(_collect(c.logs(job.id, follow=True)))
            waited, cancelled = await asyncio.gather(c.wait(job.id, timeout=30), cancel_soon())
            assert waited.status is JobStatus.CANCELLED and cancelled.message == "cancelled"
            assert await asyncio.wait_for(follow, 30) == ""
            assert await c.trials(job.id) == []
            assert (await c.plan(EXAMPLES / "hello.yaml")).node_group == "cpu"
            assert len(await c.node_groups()) == 4
            assert (await c.health()).ok
            fn_job = await c.submit_function(plain, args={"xs": [1]}, labels=tag)
            assert fn_job.spec.entrypoint == "tests.test_sdk:plain"
            with pytest.raises(NotFound):
                await c.get_job("doesnotexist1")
        async with AsyncClient(server.url, token=ADMIN_TOKEN, max_attempts=2) as c:
            with pytest.raises(ServerError):
                await c.cluster()  # Ray is down: 503 after one retry (5 s, the server's Retry-After)
        async with AsyncClient(f"http://127.0.0.1:{free_port()}", max_attempts=2) as dead:
            with pytest.raises(ConnectionFailed):
                await dead.health()

    asyncio.run(main())


async def _collect(agen) -> str:
    return "".join([chunk async for chunk in agen])


# The docs ------------------------------------------------------------------------------------


def test_docs_sdk_examples_run(server):
    """Every block marked <!-- runnable --> in docs/sdk.md, in order, in one fresh interpreter."""
    doc = (ROOT / "docs" / "sdk.md").read_text()
    blocks = re.findall(r"<!-- runnable -->\n```python\n(.*?)```", doc, re.S)
    assert len(blocks) >= 6
    env = {**os.environ, "RAYLANE_URL": server.url, "RAYLANE_TOKEN": ADMIN_TOKEN}
    out = subprocess.run([sys.executable, "-c", "\n".join(blocks)], capture_output=True, text=True, cwd=ROOT,
                         env=env, timeout=120)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    assert "gpu STRICT_PACK" in out.stdout and "still PENDING after 1s" in out.stdout
    assert "job doesnotexist1 not found" in out.stdout and "resources.gpus_per_worker" in out.stdout


# The light install ---------------------------------------------------------------------------

HEAVY = ("ray", "sqlalchemy", "fastapi", "uvicorn", "alembic", "psycopg", "pydantic_settings")


def test_import_raylane_loads_no_server_dependencies():
    code = ("import sys, raylane; c = raylane.Client('http://127.0.0.1:1'); "
            f"print([m for m in {HEAVY!r} if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


@pytest.mark.slow
def test_bare_client_install_pulls_no_server_dependencies(tmp_path):
    """``pip install raylane`` (no extras) into a fresh venv: no Ray, SQLAlchemy or
    FastAPI installed or imported, and the CLI works."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    py = venv / "bin" / "python"
    # Build from a copy of the tree (tracked and new files): building in place would
    # write build/ into a checkout others are working in.
    src = tmp_path / "src"
    _copy_tree(ROOT, src)
    r = subprocess.run([str(py), "-m", "pip", "install", "-q", "-c", str(ROOT / "constraints.txt"), str(src)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    freeze = subprocess.run([str(py), "-m", "pip", "list", "--format=json"], capture_output=True, text=True,
                            check=True, timeout=120).stdout
    installed = {p["name"].lower().replace("_", "-") for p in json.loads(freeze)}
    assert "raylane" in installed and {"httpx", "pydantic", "typer", "rich", "pyyaml", "tenacity"} <= installed
    assert not installed & {"ray", "sqlalchemy", "fastapi", "uvicorn", "alembic", "psycopg", "pydantic-settings",
                             "limits", "redis", "python-ulid"}

    # The venv's own install only: a PYTHONPATH of the caller's checkout would shadow it.
    bare = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    code = (f"import sys, raylane; c = raylane.Client(); print([m for m in {HEAVY!r} if m in sys.modules]); "
            "print(raylane.__file__)")
    out = subprocess.run([str(py), "-c", code], capture_output=True, text=True, cwd=tmp_path, env=bare, timeout=60)
    assert out.returncode == 0, out.stderr
    loaded, where = out.stdout.strip().splitlines()
    assert loaded == "[]" and str(venv) in where
    cli = subprocess.run([str(venv / "bin" / "raylane"), "--url", f"http://127.0.0.1:{free_port()}", "ls"],
                         capture_output=True, text=True, cwd=tmp_path, env=bare, timeout=120)
    assert cli.returncode == 4 and "cannot connect" in cli.stderr and "Traceback" not in cli.stderr
    # The server's commands, by either name, say what to install instead of failing on an import.
    for argv in (["raylane", "cluster", "status"], ["raylane-server", "cluster", "status"], ["raylane-server", "serve"]):
        server = subprocess.run([str(venv / "bin" / argv[0]), *argv[1:]], capture_output=True, text=True,
                                cwd=tmp_path, env=bare, timeout=120)
        assert server.returncode == 2 and "raylane[server]" in server.stderr, (argv, server.stderr)
        assert "Traceback" not in server.stderr


def _copy_tree(root: Path, dest: Path) -> None:
    import shutil

    # The sources only: no virtualenvs, caches, build output or local state.
    shutil.copytree(root, dest, ignore=shutil.ignore_patterns(
        ".git", ".venv", "venv", "__pycache__", "*.egg-info", "build", "dist", ".raylane", ".pytest_cache",
        "node_modules", "*.pyc"))
