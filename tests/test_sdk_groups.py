"""The SDK has a method for every API group (#18.6): jobs, cluster, costs, access,
health, packages; sync and async alike. Against a real server (uvicorn) with auth
on and Ray down; the route table below fails when a route is added without one.
"""

from __future__ import annotations

import asyncio
import importlib
import pkgutil
from datetime import datetime, timedelta, timezone

import pytest

from raylane import (
    AmbiguousJobId, AsyncClient, Client, Conflict, CostBreakdown, Forbidden, JobCost, NotFound, Report, Unauthorized,
    ValidationFailed,
)
from tests.conftest import offline_server

ADMIN_TOKEN = "sdk-groups-admin-token-0123456789"
HELLO = {"name": "hello", "kind": "command", "entrypoint": "true"}

# A browser's session cookie for Ray's dashboard (/ray): a program sends its token instead.
BROWSER_ONLY = {("POST", "/v1/session"), ("DELETE", "/v1/session")}
# The benchmarks' reference (api/routers/bench.py): off unless a benchmark turns it on, not an API.
NOT_AN_API = {("POST", "/bench/bare-submit")}

# Each route of api/routers/ and the SDK method that calls it.
SDK_FOR_ROUTE = {
    ("GET", "/v1/me"): "whoami",
    ("POST", "/v1/tokens"): "create_token",
    ("GET", "/v1/tokens"): "list_tokens",
    ("POST", "/v1/tokens/{token_id}/revoke"): "revoke_token",
    ("POST", "/v1/projects"): "create_project",
    ("GET", "/v1/projects"): "list_projects",
    ("GET", "/v1/projects/{project}/quota"): "get_quota",
    ("PUT", "/v1/projects/{project}/quota"): "set_quota",
    ("GET", "/v1/audit"): "audit",
    ("POST", "/v1/plan"): "plan",
    ("GET", "/v1/node-groups"): "node_groups",
    ("GET", "/v1/fleet"): "fleet",
    ("GET", "/v1/cluster"): "cluster",
    ("GET", "/v1/kinds"): "kinds",
    ("GET", "/v1/costs"): "costs",
    ("GET", "/v1/report"): "report",
    ("GET", "/v1/jobs/{job_id}/cost"): "job_cost",
    # /healthz is a load balancer's liveness probe; health() reads /readyz, which says more.
    ("GET", "/healthz"): "health",
    ("GET", "/readyz"): "health",
    ("POST", "/v1/jobs"): "submit",
    ("POST", "/v1/jobs/batch"): "submit_batch",
    ("GET", "/v1/jobs"): "list_jobs",
    ("GET", "/v1/jobs/{job_id}"): "get_job",
    ("GET", "/v1/jobs/{job_id}/events"): "events",
    ("GET", "/v1/jobs/{job_id}/attempts"): "attempts",
    ("GET", "/v1/jobs/{job_id}/trials"): "trials",
    ("POST", "/v1/jobs/{job_id}/cancel"): "cancel",
    ("GET", "/v1/jobs/{job_id}/logs"): "logs",
    ("HEAD", "/v1/packages/{sha256}"): "upload_package",
    ("PUT", "/v1/packages/{sha256}"): "upload_package",
    ("POST", "/v1/arrays"): "submit_array",
    ("GET", "/v1/arrays/{array_id}"): "get_array",
    ("POST", "/v1/arrays/{array_id}/cancel"): "cancel_array",
    ("POST", "/v1/arrays/{array_id}/retry"): "retry_array",
    ("POST", "/v1/webhooks"): "create_webhook",
    ("GET", "/v1/webhooks"): "list_webhooks",
    ("GET", "/v1/webhooks/{hook_id}"): "get_webhook",
    ("DELETE", "/v1/webhooks/{hook_id}"): "delete_webhook",
    ("GET", "/v1/webhooks/{hook_id}/deliveries"): "webhook_deliveries",
    ("POST", "/v1/schedules"): "create_schedule",
    ("GET", "/v1/schedules"): "list_schedules",
    ("GET", "/v1/schedules/{schedule_id}"): "get_schedule",
    ("POST", "/v1/schedules/{schedule_id}/pause"): "pause_schedule",
    ("POST", "/v1/schedules/{schedule_id}/resume"): "resume_schedule",
    ("DELETE", "/v1/schedules/{schedule_id}"): "delete_schedule",
}


def test_every_route_has_an_sdk_method_in_both_clients():
    import raylane.api.routers as routers

    routes = set()
    for info in pkgutil.iter_modules(routers.__path__):
        for r in importlib.import_module(f"raylane.api.routers.{info.name}").router.routes:
            routes |= {(m, r.path) for m in r.methods}
    routes -= BROWSER_ONLY | NOT_AN_API
    assert routes == set(SDK_FOR_ROUTE), "add the SDK method for the new route here and in client/sdk.py"
    for name in set(SDK_FOR_ROUTE.values()):
        assert callable(getattr(Client, name)) and callable(getattr(AsyncClient, name)), name
        assert getattr(Client, name).__doc__, name


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    sp = offline_server(admin_token=ADMIN_TOKEN, tmp=tmp_path_factory.mktemp("sdk-groups"))
    yield sp
    sp.kill()


def test_access_costs_kinds_and_job_helpers(server):
    with Client(server.url, token=ADMIN_TOKEN) as admin:
        me = admin.whoami()
        assert me.role == "admin" and me.project is None and me.auth_enabled

        project = admin.create_project("groups-a", description="for the SDK test")
        assert project.name == "groups-a" and project.created_by == me.name
        with pytest.raises(Conflict):
            admin.create_project("groups-a")
        new = admin.create_token("carol", project="groups-a", role="member")
        assert new.token and new.project == "groups-a"
        assert new.id in {t.id for t in admin.list_tokens()}

        quota = admin.set_quota("groups-a", {"cpu": {"max_cpus": 4, "max_concurrent_jobs": 2}})
        assert quota.node_groups["cpu"].max_cpus == 4
        assert admin.get_quota("groups-a").node_groups["cpu"].max_concurrent_jobs == 2
        with pytest.raises(ValidationFailed):
            admin.set_quota("groups-a", {"no-such-group": {"max_cpus": 1}})

        with Client(server.url, token=new.token) as carol:
            assert carol.whoami().name == "carol"
            assert [p.name for p in carol.list_projects()] == ["groups-a"]
            job = carol.submit(HELLO)
            with pytest.raises(Forbidden):
                carol.list_tokens()
        assert {"groups-a", "default"} <= {p.name for p in admin.list_projects()}
        assert [j.id for j in admin.list_jobs(submitted_by="carol").items] == [job.id]

        # Short ids, and a new job from an old one.
        assert admin.resolve_job_id(job.id[:16]) == job.id
        assert admin.resolve_job_id(job.id) == job.id
        other = admin.submit(HELLO)
        with pytest.raises(AmbiguousJobId) as e:
            admin.resolve_job_id(job.id[:4])
        assert {job.id, other.id} <= {j.id for j in e.value.candidates}
        with pytest.raises(NotFound):
            admin.resolve_job_id("zzzzzzzz")
        again = admin.resubmit(job.id, overrides={"priority": 3, "labels.why": "again"})
        assert again.project == "groups-a" and again.priority == 3
        assert again.labels == {"why": "again", "raylane.io/resubmitted-from": job.id}
        with pytest.raises(ValidationFailed) as e:
            admin.resubmit(job.id, overrides=["resources.gpu=1"])
        assert "resources has no field 'gpu'" in str(e.value)

        # Costs: nothing ran (Ray is down), so all zero, but each answer is typed.
        end = datetime.now(timezone.utc)
        costs = admin.costs(group_by="node_group", start=end - timedelta(days=1), end=end)
        assert isinstance(costs, CostBreakdown) and costs.group_by == "node_group" and costs.total.cost == 0
        rep = admin.report(project="groups-a")
        assert isinstance(rep, Report) and rep.project == "groups-a" and rep.total["jobs"] == 0
        cost = admin.job_cost(job.id)
        assert isinstance(cost, JobCost) and (cost.job_id, cost.cost, cost.attempts) == (job.id, 0, [])
        with pytest.raises(ValidationFailed):
            admin.costs(start=end, end=end - timedelta(days=1))
        assert {"command", "training", "sweep"} <= {k.name for k in admin.kinds()}

        page = admin.audit(actor=me.name, limit=5)
        assert page.items and page.items[0].actor == me.name
        revoked = admin.revoke_token(new.id)
        assert revoked.revoked_at is not None
        with Client(server.url, token=new.token, max_attempts=1) as gone:
            with pytest.raises(Unauthorized) as e:
                gone.whoami()
            assert e.value.token_sent
        with Client(server.url, token="", max_attempts=1) as nobody:
            with pytest.raises(Unauthorized) as e:
                nobody.whoami()
            assert not e.value.token_sent and "set RAYLANE_TOKEN or pass token=" in str(e.value)


def test_async_client_has_the_same_groups(server):
    async def main():
        async with AsyncClient(server.url, token=ADMIN_TOKEN) as c:
            me = await c.whoami()
            await c.create_project("groups-b")
            tok = await c.create_token("dave", project="groups-b", role="viewer")
            assert tok.id in {t.id for t in await c.list_tokens()}
            assert (await c.revoke_token(tok.id)).revoked_at is not None
            assert "groups-b" in {p.name for p in await c.list_projects()}
            q = await c.set_quota("groups-b", {"cpu": {"max_cpus": 1}})
            assert q == await c.get_quota("groups-b")
            job = await c.submit({**HELLO, "project": "groups-b"})
            assert await c.resolve_job_id(job.id[:16]) == job.id
            again = await c.resubmit(job.id[:26], overrides=["name=copy"])
            assert again.name == "copy" and again.project == "groups-b"
            assert (await c.job_cost(job.id)).job_id == job.id
            assert (await c.costs()).group_by == "project"
            assert (await c.report()).total["cost"] == 0
            assert await c.kinds()
            assert (await c.audit(actor=me.name, limit=1)).items
            page = await c.list_jobs(submitted_by=me.name, id_prefix=job.id[:16])
            assert [j.id for j in page.items] == [job.id]
            assert await c.logs(job.id, tail=5) == ""

    asyncio.run(main())


def test_a_web_page_in_an_answer_is_named_never_shown():
    import httpx

    from raylane import NotFound, RaylaneError, ServerError
    from raylane.client.sdk import _error_from

    page = "<html><body>" + "x" * 5000 + "</body></html>"
    req = httpx.Request("GET", "http://proxy.example/v1/jobs?limit=5")

    def answer(status: int) -> RaylaneError:
        return _error_from(httpx.Response(status, text=page, headers={"content-type": "text/html"}, request=req))

    e = answer(404)
    assert isinstance(e, NotFound)
    assert str(e) == "http://proxy.example/v1/jobs answered 404 text/html: not a Raylane API? Check the URL"
    e = answer(502)  # a proxy in front of Raylane with no upstream: a server error, the page left out
    assert isinstance(e, ServerError) and str(e) == "server error 502: http://proxy.example/v1/jobs answered text/html"


def test_webhooks_and_schedules_through_both_clients(server):
    with Client(server.url, token=ADMIN_TOKEN) as c:
        hook = c.create_webhook("http://8.8.8.8/hook", statuses=["FAILED"], description="ci")
        assert hook.secret.startswith("whsec_") and [s.value for s in hook.statuses] == ["FAILED"]
        assert [h.id for h in c.list_webhooks()] == [hook.id] and not hasattr(c.get_webhook(hook.id), "secret")
        assert c.webhook_deliveries(hook.id) == []
        with pytest.raises(ValidationFailed) as e:
            c.create_webhook("ftp://example.com")
        assert "url" in str(e.value)
        c.delete_webhook(hook.id)
        with pytest.raises(NotFound):
            c.get_webhook(hook.id)

        sch = c.create_schedule("sdk-nightly", "0 2 * * *", HELLO, timezone="Europe/Berlin")
        assert len(sch.next_runs) == 5 and sch.timezone == "Europe/Berlin"
        with pytest.raises(Conflict):
            c.create_schedule("sdk-nightly", "@daily", HELLO)
        with pytest.raises(ValidationFailed) as e:
            c.create_schedule("bad", "every night", HELLO)
        assert "cron" in str(e.value)
        assert c.pause_schedule(sch.id).paused and c.get_schedule(sch.id).next_runs == []
        assert not c.resume_schedule(sch.id).paused
        assert sch.id in {s.id for s in c.list_schedules()}
        c.delete_schedule(sch.id)

    async def main():
        async with AsyncClient(server.url, token=ADMIN_TOKEN) as a:
            h = await a.create_webhook("http://8.8.8.8/async?key=s3cret")
            assert h.url == "http://8.8.8.8/async?key=s3cret"  # whole, to its creator, once
            assert (await a.get_webhook(h.id)).url == "http://8.8.8.8/\u2026"
            assert await a.webhook_deliveries(h.id) == [] and h.id in {x.id for x in await a.list_webhooks()}
            await a.delete_webhook(h.id)
            s = await a.create_schedule("sdk-async", "@hourly", HELLO)
            assert (await a.pause_schedule(s.id)).paused and not (await a.resume_schedule(s.id)).paused
            assert (await a.get_schedule(s.id)).name == "sdk-async" and await a.list_schedules()
            await a.delete_schedule(s.id)

    asyncio.run(main())


def test_arrays_through_both_clients(server):
    with Client(server.url, token=ADMIN_TOKEN) as c:
        arr = c.submit_array({**HELLO, "name": "sdk-arr", "array": {"size": 4, "max_parallel": 2}})
        assert (arr.size, arr.held, arr.counts) == (4, 2, {"PENDING": 4})
        assert len(c.list_jobs(labels={"raylane.array": arr.id}).items) == 4
        with pytest.raises(ValidationFailed):
            c.submit_array(HELLO)  # no array section
        assert len(c.cancel_array(arr.id).jobs) == 4 and c.get_array(arr.id).counts == {"CANCELLED": 4}

    async def main():
        async with AsyncClient(server.url, token=ADMIN_TOKEN) as a:
            assert (await a.get_array(arr.id)).id == arr.id
            again = await a.retry_array(arr.id)
            assert len(again.jobs) == 4 and again.array.held == 2
            assert len((await a.cancel_array(arr.id)).jobs) == 4
            assert (await a.submit_array({**HELLO, "array": {"size": 1}})).size == 1

    asyncio.run(main())


def test_the_fleet_of_one_cluster_by_the_sdk(server):
    """Without RAYLANE_FLEET the fleet is today's one cluster, named default."""
    import asyncio

    from raylane.client.sdk import AsyncClient

    with Client(server.url, token=ADMIN_TOKEN) as admin:
        fleet = admin.fleet()
    assert [c.name for c in fleet.clusters] == ["default"] and fleet.clusters[0].tier in ("owned", "rented")
    assert {g["name"] for g in fleet.clusters[0].groups} >= {"gpu", "cpu", "spot-cpu"}

    async def read():
        async with AsyncClient(server.url, token=ADMIN_TOKEN) as c:
            return await c.fleet()

    assert asyncio.run(read()).clusters[0].name == "default"
