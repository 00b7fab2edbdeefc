"""Raylane is the only door to Ray: the cluster's Jobs API refuses callers without
Ray's token (token auth stays on, DESIGN.md decision 8), while Raylane, which
holds the token server-side, submits and reads jobs for its own authenticated
callers."""

from __future__ import annotations

import httpx
import pytest

from tests.ray.conftest import wait_status

pytestmark = pytest.mark.ray
TERMINAL = {"SUCCEEDED", "FAILED", "CANCELLED"}


def test_ray_jobs_api_refuses_direct_unauthenticated_calls_while_raylane_works(rapi, ray_cluster):
    jobs_api = ray_cluster.state.dashboard_url + "/api/jobs/"
    # No token, or a wrong one: refused before Ray runs anything.
    for headers in ({}, {"Authorization": "Bearer not-the-ray-token"}):
        r = httpx.get(jobs_api, headers=headers, timeout=10)
        assert r.status_code in (401, 403), (headers, r.status_code, r.text[:200])
        r = httpx.post(jobs_api, headers=headers, timeout=10,
                       json={"entrypoint": "echo pwned", "submission_id": "direct-unauthenticated"})
        assert r.status_code in (401, 403), (headers, r.status_code, r.text[:200])

    # Raylane's callers go through Raylane's own token check...
    hello = {"name": "via-raylane", "kind": "command", "entrypoint": "python -c 'print(7)'"}
    assert rapi.post("/v1/jobs", json=hello, headers={"Authorization": ""}).status_code == 401
    job = rapi.post("/v1/jobs", json=hello).json()
    done = wait_status(rapi, job["id"], TERMINAL)
    assert done["status"] == "SUCCEEDED", done["status_reason"]
    # ...and only Ray's token holder (Raylane) sees the job in Ray; the direct submit never happened.
    listed = httpx.get(jobs_api, headers=ray_cluster.auth_headers(), timeout=10).json()
    ids = {j.get("submission_id") for j in listed}
    assert done["ray_submission_id"] in ids and "direct-unauthenticated" not in ids
