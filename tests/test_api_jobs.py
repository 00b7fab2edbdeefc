"""/v1/jobs through the FastAPI app on SQLite and PostgreSQL."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import pytest

HELLO = {"name": "hello", "kind": "command", "entrypoint": "python -c 'print(42)'"}


def test_submit_get_events(api):
    r = api.post("/v1/jobs", json={**HELLO, "labels": {"team": "nlp"}})
    assert r.status_code == 201, r.text
    job = r.json()
    for key in ("id", "name", "kind", "status", "created_at", "placement"):
        assert key in job
    assert job["status"] == "PENDING" and job["status_reason"] == "waiting for admission"
    got = api.get(f"/v1/jobs/{job['id']}").json()
    assert got["id"] == job["id"] and got["labels"] == {"team": "nlp"}
    evs = api.get(f"/v1/jobs/{job['id']}/events").json()
    assert [e["to_status"] for e in evs] == ["PENDING"]


def test_idempotency_key_returns_same_job(api):
    r1 = api.post("/v1/jobs", json=HELLO, headers={"Idempotency-Key": "abc"})
    r2 = api.post("/v1/jobs", json=HELLO, headers={"Idempotency-Key": "abc"})
    assert (r1.status_code, r2.status_code) == (201, 200)
    assert r1.json()["id"] == r2.json()["id"]
    r3 = api.post("/v1/jobs", json={**HELLO, "priority": 1}, headers={"Idempotency-Key": "abc"})
    assert r3.status_code == 409 and "different job spec" in r3.json()["detail"]


def test_fifty_concurrent_http_submits_one_key(api):
    with ThreadPoolExecutor(50) as ex:
        rs = list(ex.map(lambda _: api.post("/v1/jobs", json=HELLO, headers={"Idempotency-Key": "k50"}), range(50)))
    assert sorted({r.status_code for r in rs}) in ([200, 201], [201])
    assert len({r.json()["id"] for r in rs}) == 1
    assert len(api.get("/v1/jobs").json()["items"]) == 1


def test_batch_submit_is_one_transaction(api):
    specs = [{**HELLO, "name": f"b{i}"} for i in range(1000)]
    r = api.post("/v1/jobs/batch", json={"jobs": specs})
    assert r.status_code == 201, r.text[:500]
    assert r.json()["count"] == 1000
    # One bad spec in a batch: nothing is stored, and the error names its index and field.
    bad = [{**HELLO, "name": f"c{i}"} for i in range(10)] + [{**HELLO, "resources": {"gpus_per_worker": -2}}]
    r = api.post("/v1/jobs/batch", json={"jobs": bad})
    assert r.status_code == 422
    assert r.json()["detail"][0]["loc"] == ["body", "jobs", "10", "resources", "gpus_per_worker"]
    assert api.get("/v1/jobs", params={"name_prefix": "c"}).json()["items"] == []
    r = api.post("/v1/jobs/batch", json={"jobs": [HELLO] * 1001})
    assert r.status_code == 422 and "at most 1000" in r.text


def test_a_routed_batch_stores_each_jobs_placement_and_names_a_job_that_can_never_run(api, cp):
    """With a router, as a server wired to Ray has: alike jobs routed once
    (``routing.route_many``), each stored with its own placement; a job no group
    can ever hold refuses the batch, by index."""
    from raylane.orchestrator.domain.profile import default_profile
    from raylane.orchestrator.domain.routing import route

    profile = default_profile()
    routed = []
    cp.router = lambda spec: routed.append(spec.name) or route(spec, profile)
    gpu = {**HELLO, "name": "g", "resources": {"gpus_per_worker": 1}}
    r = api.post("/v1/jobs/batch", json={"jobs": [HELLO, gpu, HELLO, {**HELLO, "name": "spot", "placement": {
        "market": "SPOT"}}]})
    assert r.status_code == 201, r.text
    groups = [api.get(f"/v1/jobs/{i}").json()["placement"]["node_group"] for i in r.json()["ids"]]
    assert groups == ["cpu", "gpu", "cpu", "spot-cpu"]
    assert routed == ["hello", "g", "spot"]  # the second "hello" took the first's placement
    never = {**HELLO, "name": "never", "resources": {"gpus_per_worker": 8}}
    r = api.post("/v1/jobs/batch", json={"jobs": [HELLO, HELLO, HELLO, never]})
    assert r.status_code == 422, r.text
    d = r.json()["detail"][0]
    assert d["loc"] == ["body", "jobs.3.resources"] and d["msg"].startswith("jobs[3]: ") and "GPU" in d["msg"], d
    assert api.get("/v1/jobs", params={"name_prefix": "never"}).json()["items"] == []
    assert len(api.get("/v1/jobs").json()["items"]) == 4


def test_list_filters_and_cursor_pagination_stable_under_inserts(api):
    ids = [api.post("/v1/jobs", json={**HELLO, "name": f"job-{i}", "labels": {"i": str(i % 3)}}).json()["id"]
           for i in range(25)]
    api.post("/v1/jobs", json={"name": "tr", "kind": "training", "entrypoint": "m:f"})
    seen, cursor, pages = [], None, 0
    while True:
        params = {"limit": 7, "name_prefix": "job-"}
        if cursor:
            params["cursor"] = cursor
        page = api.get("/v1/jobs", params=params).json()
        seen += [j["id"] for j in page["items"]]
        pages += 1
        # Inserts between pages neither repeat nor shift what comes next.
        api.post("/v1/jobs", json={**HELLO, "name": f"job-new-{pages}"})
        cursor = page["next_cursor"]
        if not cursor:
            break
    assert seen == list(reversed(ids))  # newest first, each once
    assert pages == 4
    kinds = {j["kind"] for j in api.get("/v1/jobs", params={"kind": "training"}).json()["items"]}
    assert kinds == {"training"}
    lab = api.get("/v1/jobs", params={"label": "i=1"}).json()["items"]
    assert len(lab) == 8 and all(j["labels"]["i"] == "1" for j in lab)
    assert api.get("/v1/jobs", params={"status": "RUNNING"}).json()["items"] == []
    # A prefix with LIKE wildcards matches literally.
    assert api.get("/v1/jobs", params={"name_prefix": "job%"}).json()["items"] == []
    first = api.get(f"/v1/jobs/{ids[0]}").json()["created_at"]
    after = api.get("/v1/jobs", params={"created_after": first, "name_prefix": "job-", "limit": 500}).json()["items"]
    assert ids[0] in {j["id"] for j in after}
    assert api.get("/v1/jobs", params={"created_before": first, "name_prefix": "job-"}).json()["items"] == []


def test_cancel_pending_then_idempotent_then_finished_is_409(api, cp):
    from raylane.orchestrator.store import db
    from raylane.orchestrator.store.transitions import transition
    from raylane.orchestrator.domain.states import JobStatus

    jid = api.post("/v1/jobs", json=HELLO).json()["id"]
    r = api.post(f"/v1/jobs/{jid}/cancel")
    assert r.status_code == 200 and r.json()["job"]["status"] == "CANCELLED"
    assert api.post(f"/v1/jobs/{jid}/cancel").status_code == 200  # idempotent
    jid2 = api.post("/v1/jobs", json=HELLO).json()["id"]
    with db.transaction(cp.sessions) as s:
        transition(s, jid2, JobStatus.DISPATCHING, reason="t", actor="t")
        transition(s, jid2, JobStatus.RUNNING, reason="t", actor="t")
    r = api.post(f"/v1/jobs/{jid2}/cancel")
    assert r.json()["job"]["status"] == "CANCELLING" and r.json()["job"]["cancel_requested"]
    with db.transaction(cp.sessions) as s:
        transition(s, jid2, JobStatus.CANCELLED, reason="ray stopped it", actor="t")
    jid3 = api.post("/v1/jobs", json=HELLO).json()["id"]
    with db.transaction(cp.sessions) as s:
        transition(s, jid3, JobStatus.DISPATCHING, reason="t", actor="t")
        transition(s, jid3, JobStatus.RUNNING, reason="t", actor="t")
        transition(s, jid3, JobStatus.SUCCEEDED, reason="t", actor="t")
    r = api.post(f"/v1/jobs/{jid3}/cancel")
    assert r.status_code == 409 and "already finished as SUCCEEDED" in r.json()["detail"]
    evs = [e["to_status"] for e in api.get(f"/v1/jobs/{jid}/events").json()]
    assert evs == ["PENDING", "CANCELLED"]


@pytest.mark.parametrize("path", ["/v1/jobs/nope", "/v1/jobs/nope/events", "/v1/jobs/nope/attempts"])
def test_unknown_ids_are_404(api, path):
    r = api.get(path)
    assert r.status_code == 404 and "not found" in r.json()["detail"]
    assert api.post("/v1/jobs/nope/cancel").status_code == 404


def test_bad_input_gets_clear_4xx_and_stores_nothing(api):
    cases = [
        (b'{"name": "x", ', 422, "JSON decode"),
        (b'{"name": "\xff\xfe", "kind": "command", "entrypoint": "true"}', 400, "not valid UTF-8"),
        (json.dumps({**HELLO, "name": "n" * 2_000_000}).encode(), 422, "at most 128"),
        (json.dumps({**HELLO, "labels": {f"k{i}": "v" for i in range(5000)}}).encode(), 422, "at most 64"),
        (json.dumps({**HELLO, "kind": "nope"}).encode(), 422, "kind"),
        (b"[" * 100_000 + b"]" * 100_000, 400, "nested too deeply"),
        (json.dumps([HELLO]).encode(), 422, ""),
    ]
    for body, status, words in cases:
        r = api.post("/v1/jobs", content=body, headers={"content-type": "application/json"})
        assert r.status_code == status, (body[:60], r.status_code, r.text[:300])
        assert words in r.text
        assert len(r.content) < 20_000  # the input is not echoed back
    big = b'{"name": "' + b"x" * (9 * 1024 * 1024) + b'"}'
    r = api.post("/v1/jobs", content=big, headers={"content-type": "application/json"})
    assert r.status_code == 413 and "larger than" in r.json()["detail"]
    assert api.get("/v1/jobs").json()["items"] == []
    assert api.get("/v1/jobs", params={"cursor": "garbage"}).status_code == 422
    assert api.get("/v1/jobs", params={"label": "nokey"}).status_code == 422
    assert api.get("/v1/jobs", params={"created_after": "2026-01-01T00:00:00"}).status_code == 422


def test_health_and_openapi(api):
    assert api.get("/healthz").json() == {"status": "ok"}
    assert api.get("/readyz").json()["status"] == "ok"
    spec = api.get("/openapi.json").json()
    for path in ("/v1/jobs", "/v1/jobs/batch", "/v1/jobs/{job_id}", "/v1/jobs/{job_id}/events",
                 "/v1/jobs/{job_id}/cancel", "/healthz", "/readyz"):
        assert path in spec["paths"], path


def test_list_by_id_prefix_and_submitter(api):
    """The CLI's short ids and `cancel --mine` ask the server, which keeps the project scope."""
    api.post("/v1/projects", json={"name": "pfx-a"})
    alice = api.post("/v1/tokens", json={"name": "alice-pfx", "project": "pfx-a", "role": "member"}).json()["token"]
    as_alice = {"Authorization": f"Bearer {alice}"}
    mine = api.post("/v1/jobs", json={**HELLO, "name": "mine"}, headers=as_alice).json()["id"]
    admins = api.post("/v1/jobs", json={**HELLO, "name": "admins"}).json()["id"]

    got = api.get("/v1/jobs", params={"id_prefix": mine[:-3]}).json()["items"]
    assert [j["id"] for j in got] == [mine]
    assert api.get("/v1/jobs", params={"id_prefix": mine}).json()["items"][0]["id"] == mine
    # Alice's token sees her project only: the admin's job is no candidate for her, whatever the prefix.
    assert api.get("/v1/jobs", params={"id_prefix": admins}, headers=as_alice).json()["items"] == []
    # The first 10 characters are the millisecond: both ids share a short prefix, the admin sees both.
    both = api.get("/v1/jobs", params={"id_prefix": mine[:4], "limit": 500}).json()["items"]
    assert {mine, admins} <= {j["id"] for j in both}

    by = api.get("/v1/jobs", params={"submitted_by": "alice-pfx"}).json()["items"]
    assert [j["id"] for j in by] == [mine]
    assert api.get("/v1/jobs", params={"submitted_by": "nobody"}).json()["items"] == []

    for bad in ("ABC", "a%", "x" * 27):
        r = api.get("/v1/jobs", params={"id_prefix": bad})
        assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["query", "id_prefix"], bad
