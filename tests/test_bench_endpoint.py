"""POST /bench/bare-submit (api/routers/bench.py): the benchmarks' reference for a
submit is absent unless RAYLANE_BENCH_BARE_ENDPOINT is on; on, it validates as
POST /v1/jobs does, answers 201 and stores nothing."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select

from raylane.api.app import create_app
from raylane.orchestrator.store.tables import audit_log, jobs
from tests.conftest import ADMIN_HEADERS

SPEC = {"name": "bench", "kind": "command", "entrypoint": "true", "labels": {"bench": "1"}}


def rows(cp) -> tuple[int, int]:
    with cp.engine.connect() as conn:
        return (conn.execute(select(func.count()).select_from(jobs)).scalar(),
                conn.execute(select(func.count()).select_from(audit_log)).scalar())


@pytest.fixture
def bare_api(settings, cp):
    with TestClient(create_app(settings.model_copy(update={"bench_bare_endpoint": True}), cp=cp),
                    headers=ADMIN_HEADERS) as c:
        yield c


def test_absent_by_default(api):
    assert api.post("/bench/bare-submit", json=SPEC).status_code == 404
    assert "/bench/bare-submit" not in api.get("/openapi.json").text


def test_on_it_answers_201_and_stores_nothing(bare_api, cp):
    before = rows(cp)
    r = bare_api.post("/bench/bare-submit", json=SPEC)
    assert r.status_code == 201, r.text
    assert r.headers["x-content-type-options"] == "nosniff"  # the same middleware as /v1/jobs
    assert rows(cp) == before
    # The real route, on the same app, stores its job and its audit row.
    assert bare_api.post("/v1/jobs", json=SPEC).status_code == 201
    assert rows(cp) == (before[0] + 1, before[1] + 1)


def test_on_it_validates_the_spec_as_the_real_route_does(bare_api):
    bad = {**SPEC, "kind": "nonsense"}
    bare, real = bare_api.post("/bench/bare-submit", json=bad), bare_api.post("/v1/jobs", json=bad)
    assert bare.status_code == real.status_code == 422
    assert [e["loc"] for e in bare.json()["detail"]] == [e["loc"] for e in real.json()["detail"]]


def test_on_it_needs_a_token(bare_api):
    assert bare_api.post("/bench/bare-submit", json=SPEC, headers={"Authorization": ""}).status_code == 401
