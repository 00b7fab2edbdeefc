"""Errors that say the fix (#48): a body without ``Content-Type:
application/json`` names the header; a misspelt field names the nearest valid
one; a refusal that is the same for every node group is said once. In the API
(in process), and in the CLI's words against a real server in test_cli_nouns.py
and below.
"""

from __future__ import annotations

import json

import pytest

from raylane.orchestrator.domain.profile import default_profile
from raylane.orchestrator.domain.routing import Unroutable, route
from raylane.orchestrator.domain.specs import JobSpec
from raylane.orchestrator.domain.suggest import nearest_field

HELLO = {"name": "hello", "kind": "command", "entrypoint": "python -c 'print(42)'"}


def test_a_body_sent_as_a_form_names_the_header(api):
    # What `curl -d '{...}'` sends without -H: application/x-www-form-urlencoded.
    r = api.post("/v1/jobs", content=json.dumps(HELLO),
                 headers={"Content-Type": "application/x-www-form-urlencoded"})
    assert r.status_code == 415, r.text
    assert r.json()["detail"] == ("the request body must be JSON with the header Content-Type: application/json "
                                  "(it was application/x-www-form-urlencoded)")
    r = api.post("/v1/schedules", content=json.dumps({"name": "n", "cron": "0 2 * * *", "spec": HELLO}),
                 headers={"Content-Type": "text/plain"})
    assert r.status_code == 415 and "Content-Type: application/json" in r.json()["detail"]
    assert api.post("/v1/jobs", json=HELLO).status_code == 201  # the same body, said to be JSON


def test_a_body_without_a_content_type_names_the_header(api):
    req = api.build_request("POST", "/v1/jobs", content=json.dumps(HELLO).encode())
    req.headers.pop("content-type", None)
    r = api.send(req)
    assert r.status_code == 415 and r.json()["detail"].endswith("Content-Type: application/json (it had none)")


@pytest.mark.parametrize("field, body, near", [
    ("entrypiont", {**{k: v for k, v in HELLO.items() if k != "entrypoint"}, "entrypiont": "x"}, "entrypoint"),
    ("resources.gpu_per_worker", {**HELLO, "resources": {"gpu_per_worker": 1}}, "gpus_per_worker"),
    ("priorty", {**HELLO, "priorty": 3}, "priority"),
])
def test_a_misspelt_field_suggests_the_nearest(api, field, body, near):
    r = api.post("/v1/jobs", json=body)
    assert r.status_code == 422, r.text
    msgs = {".".join(map(str, e["loc"][1:])): e["msg"] for e in r.json()["detail"]}
    assert msgs[field] == f"unknown field {field.split('.')[-1]!r}; did you mean {near}?", msgs


def test_a_field_far_from_any_says_unknown_only(api):
    r = api.post("/v1/jobs", json={**HELLO, "zzzzzz": 1})
    assert r.status_code == 422 and r.json()["detail"][0]["msg"] == "unknown field 'zzzzzz'"


def test_nearest_field_under_a_key_and_in_a_batch():
    assert nearest_field(["body", "spec", "entrypont"]) == "entrypoint"  # a schedule's spec
    assert nearest_field(["body", "jobs", 3, "sweep", "metic"]) == "metric"  # a batch's fourth job
    assert nearest_field(["body", "qqqq"]) is None


def test_a_refusal_the_same_for_every_group_is_said_once():
    spec = JobSpec(**HELLO, resources={"cpus_per_worker": 64})
    with pytest.raises(Unroutable) as e:
        route(spec, default_profile())
    msg = e.value.message
    assert msg.count("one worker needs 64 CPUs") == 1, msg
    assert " or " in msg  # both CPU groups named in the one sentence


def test_the_admin_token_banner_is_the_last_thing_start_up_says(server_factory, tmp_path):
    """`make run` on a new database: the token is not buried under a log line per migration."""
    env = {"RAYLANE_DATABASE_URL": f"sqlite:///{tmp_path / 'new.db'}", "RAYLANE_DATA_DIR": str(tmp_path),
           "RAYLANE_LOOPS_ENABLED": "false", "RAYLANE_AUTH_ENABLED": "true", "RAYLANE_ADMIN_TOKEN": None,
           "RAYLANE_LOG_FORMAT": "json"}
    srv = server_factory(env).start()
    out = srv.log_path.read_text()
    assert "Running upgrade" not in out and "database migrated to" in out  # one line, not one per migration
    lines = [line for line in out.splitlines() if line.strip()]
    banner = next(i for i, line in enumerate(lines) if line.startswith("Raylane admin token"))
    after = [line for line in lines[banner + 3:] if "uvicorn" not in line.lower() and "startup" not in line.lower()]
    assert lines[banner + 2].startswith("export RAYLANE_TOKEN=") and after == [], after
