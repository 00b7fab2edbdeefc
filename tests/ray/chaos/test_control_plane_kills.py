"""Control planes killed with SIGKILL at random points while jobs flow: several
replicas on PostgreSQL, leases taken over, nothing lost, nothing run twice.

Scaled to CI (2 cores): each Ray job costs ~1-3 s of CPU in Ray itself (a job
supervisor actor and a driver process), and on a slow CI machine 60 jobs took
over 10 minutes, so 16 jobs flow while at least 20 kills land (every replica
killed about seven times; each restart costs a server's start, 2-3 s of CPU, on
the suite's critical path), instead of the 300 jobs a bigger machine would run;
``RAYLANE_CHAOS_JOBS=300 RAYLANE_CHAOS_KILLS=100`` runs the full size
(docs/reliability.md has its figures).
"""

from __future__ import annotations

import os
import random
import threading
import time
import uuid

import httpx
import pytest

from tests.conftest import fresh_pg_database
from tests.helpers import wait_for

pytestmark = [pytest.mark.ray, pytest.mark.slow]

REPLICAS = 3
JOBS = int(os.environ.get("RAYLANE_CHAOS_JOBS", "16"))
MIN_KILLS = int(os.environ.get("RAYLANE_CHAOS_KILLS", "20"))
TERMINAL = {"SUCCEEDED", "FAILED", "CANCELLED"}


# Its own bound is the wait below (1,200 s), not pytest-timeout's 600 s for any test:
# on a slow 2-core machine (Ray drivers starting while replicas restart every second)
# 60 jobs took ~9 minutes here, all of them succeeding once, and the run was
# cut off at 600 s with two of them done in Ray but not yet recorded.
@pytest.mark.timeout(1500)
def test_kill_minus_nine_replicas_while_jobs_flow(server_factory, pg_template, ray_cluster, tmp_path):
    url = fresh_pg_database(pg_template)
    env = {"RAYLANE_DATABASE_URL": url, "RAYLANE_DATA_DIR": str(tmp_path), "RAYLANE_LOG_LEVEL": "WARNING",
           "RAYLANE_DASHBOARD_URL": ray_cluster.state.dashboard_url, "RAYLANE_RAY_AUTH_TOKEN": ray_cluster.state.token,
           "RAYLANE_LEASE_S": "2", "RAYLANE_RECONCILE_INTERVAL_S": "0.5", "RAYLANE_DISPATCH_INTERVAL_S": "0.3"}
    replicas = [server_factory(env).start() for _ in range(REPLICAS)]
    rng = random.Random(7)
    kills = 0
    stop = threading.Event()

    def killer():
        nonlocal kills
        while not stop.is_set():
            time.sleep(rng.uniform(0.3, 1.5))  # a random point in whatever the replica was doing
            i = rng.randrange(REPLICAS)
            old = replicas[i]
            old.kill(9)
            kills += 1
            replicas[i] = server_factory(env)
            try:
                replicas[i].start()
            except Exception:
                if not stop.is_set():
                    raise

    def any_call(method: str, path: str, **kw) -> httpx.Response:
        # A client retries on another replica when one is down (same Idempotency-Key).
        for _ in range(200):
            for r in list(replicas):
                try:
                    return httpx.request(method, r.url + path, timeout=5, **kw)
                except httpx.HTTPError:
                    continue
            time.sleep(0.1)
        raise AssertionError("no replica answered")

    t = threading.Thread(target=killer, daemon=True)
    t.start()
    ids = []
    try:
        for i in range(JOBS):
            key = f"cp-kill-{uuid.uuid4()}"
            spec = {"name": f"k{i}", "kind": "command", "entrypoint": "true",
                    "resources": {"cpus_per_worker": 0.25}, "placement": {"node_group": "cpu"}}
            r = any_call("POST", "/v1/jobs", json=spec, headers={"Idempotency-Key": key})
            assert r.status_code in (200, 201), r.text
            ids.append(r.json()["id"])

        def all_done():
            if kills < MIN_KILLS:
                return False
            st = [any_call("GET", f"/v1/jobs/{j}").json()["status"] for j in ids]
            return all(s in TERMINAL for s in st) and st

        statuses = wait_for(all_done, timeout=1200, interval=2, what="all jobs terminal after the kills")
    finally:
        stop.set()
        t.join(60)
    assert len(set(ids)) == JOBS and statuses.count("SUCCEEDED") == JOBS, statuses
    # Ray shows no duplicate: each job has exactly one Ray job per attempt it made.
    ray_jobs = httpx.get(ray_cluster.state.dashboard_url + "/api/jobs/", headers=ray_cluster.auth_headers(),
                         timeout=30).json()
    by_job: dict[str, list[str]] = {}
    for rj in ray_jobs:
        jid = (rj.get("metadata") or {}).get("raylane_job_id")
        if jid in ids:
            by_job.setdefault(jid, []).append(rj["submission_id"])
    for jid in ids:
        attempts = any_call("GET", f"/v1/jobs/{jid}/attempts").json()
        assert sorted(by_job.get(jid, [])) == sorted(a["submission_id"] for a in attempts)
        assert len(attempts) == 1, attempts  # nothing was lost, so nothing ran twice
    print(f"{kills} SIGKILLs survived; {JOBS} jobs succeeded once each")
    from tests.ray.chaos.test_spot_loss import record

    record(test="control_plane_kills", kills=kills, jobs=JOBS, replicas=REPLICAS)
