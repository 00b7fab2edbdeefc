"""GET /metrics moves as jobs flow (submit, admit, run, fail, retry), the numbers
come from the database (a second app on the same database serves the same), the
request middleware sets X-Request-ID, and the Grafana dashboard refers only to
metrics that /metrics exposes. Status changes are driven the way the loops drive
them: the dispatcher's claim() for admission, ``transitions.transition`` and
``set_attempt`` for the rest (no Ray): the counts /metrics reads move only
through the store's writers."""

from __future__ import annotations

import json
import re
from datetime import timedelta
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import update

from raylane.orchestrator.loops.dispatcher import Dispatcher
from raylane.orchestrator.domain.profile import default_profile
from raylane.orchestrator.domain.routing import GroupState
from raylane.orchestrator.domain.states import AttemptStatus, FailureCause, JobStatus
from raylane.orchestrator.store import db
from raylane.orchestrator.store.tables import attempts, jobs
from raylane.orchestrator.store.transitions import set_attempt, transition, utcnow

GiB = 1024**3
GRAFANA = Path(__file__).resolve().parent.parent / "deploy" / "grafana" / "raylane.json"
VIEW = {
    "gpu": GroupState(alive_nodes=1, total={"CPU": 4, "GPU": 2, "memory": 4 * GiB}),
    "spot-cpu": GroupState(alive_nodes=2, total={"CPU": 8.0, "memory": 4 * GiB}),
    "cpu": GroupState(alive_nodes=1, total={"CPU": 4.0, "memory": 2 * GiB}),
}


@pytest.fixture
def plane(cp):
    from raylane.orchestrator.domain.routing import route

    profile = default_profile()
    cp.router = lambda spec: route(spec, profile)
    cp.dispatcher = Dispatcher(cp.settings, cp.sessions, backend=None, profile=profile)
    return cp


def scrape(api) -> dict[tuple, float]:
    r = api.get("/metrics")
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/plain")
    out = {}
    for fam in text_string_to_metric_families(r.text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def val(m, name, **labels) -> float:
    return m.get((name, tuple(sorted(labels.items()))), 0.0)


def running(cp, job_id, n, *, after_s: float):
    """What the reconciler does when Ray reports the attempt running, ``after_s`` after dispatch."""
    with db.transaction(cp.sessions) as s:
        created = s.execute(attempts.select().where(attempts.c.job_id == job_id, attempts.c.number == n)) \
            .mappings().one()["created_at"]
        set_attempt(s, job_id, n, AttemptStatus.SUBMITTED)
        set_attempt(s, job_id, n, AttemptStatus.RUNNING, values={"started_at": created + timedelta(seconds=after_s)})
        transition(s, job_id, JobStatus.RUNNING, reason="running", actor="test", attempt=n,
                   expected={JobStatus.DISPATCHING}, values={"started_at": utcnow(), "lease_owner": None})


def ended_badly(cp, job_id, n, cause: FailureCause, *, retry: bool):
    with db.transaction(cp.sessions) as s:
        set_attempt(s, job_id, n, AttemptStatus.FAILED, values={"ended_at": utcnow(), "cause": cause.value})
        extra = {"preemptions": jobs.c.preemptions + 1} if cause is FailureCause.PREEMPTED else {}
        if retry:
            transition(s, job_id, JobStatus.RETRYING, reason=f"{cause.value}; retrying", actor="test", attempt=n,
                       values={"failure_cause": cause.value, **extra})
        else:
            transition(s, job_id, JobStatus.FAILED, reason=cause.value, actor="test", attempt=n,
                       values={"failure_cause": cause.value, "finished_at": utcnow(), **extra})


def test_metrics_move_as_jobs_flow(api, plane):
    gpu = api.post("/v1/jobs", json={"name": "gpu", "kind": "command", "entrypoint": "nvidia-smi",
                                     "resources": {"gpus_per_worker": 1, "cpus_per_worker": 1}}).json()["id"]
    cpu = api.post("/v1/jobs", json={"name": "cpu", "kind": "command", "entrypoint": "true"}).json()["id"]
    m = scrape(api)
    assert val(m, "raylane_jobs", status="PENDING", node_group="gpu") == 1
    assert val(m, "raylane_jobs", status="PENDING", node_group="cpu") == 1
    assert val(m, "raylane_queue_depth", node_group="gpu") == 1
    assert val(m, "raylane_queue_oldest_age_seconds", node_group="gpu") >= 0
    assert val(m, "raylane_jobs_created_total", kind="command") == 2
    assert val(m, "raylane_attempts_total", node_group="gpu", market="ON_DEMAND") == 0
    assert val(m, "raylane_database_up") == 1

    # Admission: both dispatched, each with its first attempt.
    assert {c.job_id for c in plane.dispatcher.claim(VIEW)} == {gpu, cpu}
    m = scrape(api)
    assert val(m, "raylane_jobs", status="DISPATCHING", node_group="gpu") == 1
    assert val(m, "raylane_queue_depth", node_group="gpu") == 0
    assert val(m, "raylane_attempts_total", node_group="gpu", market="ON_DEMAND") == 1
    assert val(m, "raylane_admission_wait_seconds_count", node_group="gpu") == 1
    assert val(m, "raylane_admission_wait_seconds_bucket", node_group="gpu", le="+Inf") == 1
    assert val(m, "raylane_resources_held", node_group="gpu", resource="GPU") == 1
    # 1 GPU of a 2-GPU node at $6.98 per node-hour.
    assert val(m, "raylane_cost_rate_dollars_per_hour", node_group="gpu") == pytest.approx(3.49)

    running(plane, gpu, 1, after_s=1.5)
    running(plane, cpu, 1, after_s=20)
    m = scrape(api)
    assert val(m, "raylane_jobs", status="RUNNING", node_group="gpu") == 1
    assert val(m, "raylane_dispatch_latency_seconds_count", node_group="gpu") == 1
    assert val(m, "raylane_dispatch_latency_seconds_sum", node_group="gpu") == pytest.approx(1.5, abs=0.01)
    assert val(m, "raylane_dispatch_latency_seconds_bucket", node_group="gpu", le="1.0") == 0
    assert val(m, "raylane_dispatch_latency_seconds_bucket", node_group="gpu", le="2.0") == 1
    assert val(m, "raylane_dispatch_latency_seconds_bucket", node_group="cpu", le="10.0") == 0
    assert val(m, "raylane_dispatch_latency_seconds_bucket", node_group="cpu", le="30.0") == 1

    # The GPU attempt is preempted and retried; the CPU job fails for good.
    ended_badly(plane, gpu, 1, FailureCause.PREEMPTED, retry=True)
    ended_badly(plane, cpu, 1, FailureCause.APP_ERROR, retry=False)
    m = scrape(api)
    assert val(m, "raylane_jobs", status="RETRYING", node_group="gpu") == 1
    assert val(m, "raylane_jobs", status="FAILED", node_group="cpu") == 1
    assert val(m, "raylane_queue_depth", node_group="gpu") == 1
    assert val(m, "raylane_attempt_failures_total", node_group="gpu", cause="PREEMPTED") == 1
    assert val(m, "raylane_attempt_failures_total", node_group="cpu", cause="APP_ERROR") == 1
    assert val(m, "raylane_preemptions_total", node_group="gpu") == 1
    assert val(m, "raylane_retries_total", node_group="gpu") == 0
    assert val(m, "raylane_resources_held", node_group="gpu", resource="GPU") == 0

    # Backoff over: the retry is admitted as attempt 2.
    with db.transaction(plane.sessions) as s:
        s.execute(update(jobs).where(jobs.c.id == gpu).values(not_before=None))
    assert [c.job_id for c in plane.dispatcher.claim(VIEW)] == [gpu]
    m = scrape(api)
    assert val(m, "raylane_retries_total", node_group="gpu") == 1
    assert val(m, "raylane_attempts_total", node_group="gpu", market="ON_DEMAND") == 2
    # Admission wait is submit -> first dispatch: the retry does not add a sample.
    assert val(m, "raylane_admission_wait_seconds_count", node_group="gpu") == 1
    assert val(m, "raylane_queue_depth", node_group="gpu") == 0

    # Per-process HTTP latency, by route template (not raw path: ids would explode the series).
    api.get(f"/v1/jobs/{gpu}")
    m = scrape(api)
    assert val(m, "raylane_http_request_duration_seconds_count", method="POST", route="/v1/jobs", status="201") == 2
    assert val(m, "raylane_http_request_duration_seconds_count", method="GET", route="/v1/jobs/{job_id}",
               status="200") == 1
    assert not any(gpu in str(k) for k in m)


def test_every_replica_serves_the_same_database_numbers(api, plane, settings):
    """A second app (another replica) on the same database: same job and attempt numbers."""
    from fastapi.testclient import TestClient

    from raylane.api.app import create_app
    from raylane.orchestrator.services.controlplane import ControlPlane

    api.post("/v1/jobs", json={"name": "a", "kind": "command", "entrypoint": "true"})
    plane.dispatcher.claim(VIEW)
    other = ControlPlane(settings)
    try:
        with TestClient(create_app(settings, cp=other), headers=dict(api.headers)) as c2:
            a, b = scrape(api), scrape(c2)
    finally:
        other.close()
    db_derived = [k for k in a if k[0].startswith("raylane_") and not k[0].startswith("raylane_http")
                  and not k[0].startswith("raylane_queue_oldest_age")]
    assert db_derived and {k: a[k] for k in db_derived} == {k: b.get(k) for k in db_derived}


def test_request_ids(api):
    r = api.get("/healthz", headers={"X-Request-ID": "abc-123"})
    assert r.headers["x-request-id"] == "abc-123"
    generated = api.get("/healthz").headers["x-request-id"]
    assert re.fullmatch(r"[0-9a-f]{32}", generated)
    # A header that would break a log line is replaced, not echoed.
    r = api.get("/healthz", headers={"X-Request-ID": "evil id\twith spaces"})
    assert r.headers["x-request-id"] != "evil id\twith spaces"
    # Refused requests carry one too.
    assert api.get("/v1/jobs/nosuchjob").headers.get("x-request-id")


# Grafana -------------------------------------------------------------------------

PROMQL_WORDS = {"sum", "rate", "irate", "increase", "histogram_quantile", "by", "without", "max", "min", "avg",
                "count", "topk", "bottomk", "clamp_min", "clamp_max", "time", "vector", "on", "ignoring",
                "group_left", "group_right", "and", "or", "unless", "offset", "le", "abs", "sort_desc", "label_replace",
                "delta", "deriv", "avg_over_time", "max_over_time", "min_over_time", "sum_over_time", "scalar",
                "round", "absent", "changes", "resets", "bool"}


def _exprs(node):
    if isinstance(node, dict):
        for k, v in node.items():
            if k == "expr" and isinstance(v, str):
                yield v
            elif k == "definition" and isinstance(v, str) and v.startswith("label_values("):
                yield v[len("label_values("):].split(",")[0]  # a variable's metric
            else:
                yield from _exprs(v)
    elif isinstance(node, list):
        for x in node:
            yield from _exprs(x)


def metric_names(expr: str) -> set[str]:
    """Metric names in a PromQL expression: identifiers outside {...} label matchers,
    [range] selectors and strings, that are not functions, keywords or label names after by/without."""
    e = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    e = re.sub(r"\{[^}]*\}", "", e)
    e = re.sub(r"\[[^\]]*\]", "", e)
    e = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", e)
    e = re.sub(r"\$\w+", "", e)  # dashboard variables
    names = set()
    for m in re.finditer(r"(?<![\w.])([a-zA-Z_:][a-zA-Z0-9_:]*)(?!\w)", e):
        word = m.group(1)
        after = e[m.end():].lstrip()
        if word in PROMQL_WORDS or after.startswith("("):
            continue
        names.add(word)
    return names


def test_metric_name_parser():
    assert metric_names('histogram_quantile(0.9, sum by (le, node_group) (rate(raylane_x_bucket{a="b"}[5m])))') \
        == {"raylane_x_bucket"}
    assert metric_names('sum(raylane_jobs{status=~"RUNNING|PENDING"}) / on(node_group) raylane_y') \
        == {"raylane_jobs", "raylane_y"}


def test_grafana_dashboard_refers_only_to_metrics_that_exist(api, plane):
    # Some traffic and one attempt, so every family has samples.
    api.post("/v1/jobs", json={"name": "a", "kind": "command", "entrypoint": "true"})
    plane.dispatcher.claim(VIEW)
    exposed = {name for name, _ in scrape(api)}
    dash = json.loads(GRAFANA.read_text())
    exprs = list(_exprs(dash))
    assert len(exprs) >= 10, "the dashboard should have its panels' queries"
    used = set().union(*(metric_names(e) for e in exprs))
    missing = sorted(used - exposed)
    assert not missing, f"the dashboard queries metrics /metrics does not expose: {missing}"
    # And it shows the numbers this issue is about.
    for family in ("raylane_jobs", "raylane_queue_depth", "raylane_queue_oldest_age_seconds",
                   "raylane_admission_wait_seconds_bucket", "raylane_dispatch_latency_seconds_bucket",
                   "raylane_attempt_failures_total", "raylane_retries_total", "raylane_preemptions_total",
                   "raylane_http_request_duration_seconds_bucket"):
        assert family in used, f"no panel shows {family}"
    assert dash["uid"] and dash["title"]
    for p in dash["panels"]:
        assert p.get("datasource", {}).get("uid") in ("${datasource}", None) or p["type"] == "row", p["title"]
