"""Dispatch is idempotent: a control plane killed between Ray accepting an attempt
and the database recording it leaves one Ray job, not two: here Ray's own Jobs API
refuses the second submit of a submission id. The same path against the
in-memory Ray, and an attempt Ray forgot (LOST, retried), are in
tests/test_loops_on_fake_ray.py."""

from __future__ import annotations

import httpx
import pytest
from sqlalchemy import select

from raylane.orchestrator.settings import Settings
from raylane.orchestrator.domain.specs import JobSpec
from raylane.orchestrator.domain.states import JobStatus
from raylane.orchestrator.store.tables import attempts
from tests.helpers import wait_for

pytestmark = pytest.mark.ray


class Crash(BaseException):
    """Stands in for SIGKILL at the worst moment (not an Exception: nothing catches it)."""


def _plane(ray_settings: Settings, **kw):
    from raylane.orchestrator.backends.ray_jobs import read_token
    from raylane.orchestrator.domain.profile import default_profile
    from raylane.orchestrator.services import assembly
    from raylane.orchestrator.services.controlplane import ControlPlane

    cp = ControlPlane(ray_settings.model_copy(update={"loops_enabled": False, **kw}))
    assembly.attach_ray(cp, ray_settings.dashboard_url, read_token(ray_settings.ray_auth_token), default_profile())
    return cp


def test_crash_between_ray_submit_and_db_write_runs_once(ray_settings, ray_cluster):
    cp1 = _plane(ray_settings, lease_s=0.5)
    job, _ = cp1.submit(JobSpec(name="once", kind="command", entrypoint="python -c 'print(7)'"),
                        project="default", actor="t")

    def crash(_claimed):
        raise Crash()

    cp1.dispatcher.after_submit_hook = crash
    with pytest.raises(Crash):
        cp1.dispatcher.run_once()
    # Ray has the attempt; our database still says CLAIMED with a lease held by the dead process.
    with cp1.sessions() as s:
        assert s.execute(select(attempts.c.status).where(attempts.c.job_id == job.id)).scalar() == "CLAIMED"
    assert cp1.get(job.id, project=None).status is JobStatus.DISPATCHING

    # A second control plane (a restart, or a replica) takes over once the lease expires.
    cp2 = _plane(ray_settings, lease_s=0.5)
    wait_for(lambda: cp2.dispatcher.claim(cp2.backend.cluster_view()) and True, timeout=10, what="lease expiry")
    # claim() above re-claimed it; submit the same attempt again, as run_once would.
    cp2.reconciler.run_once()

    def finished():
        cp2.dispatcher.run_once()
        cp2.reconciler.run_once()
        return cp2.get(job.id, project=None).status is JobStatus.SUCCEEDED

    wait_for(finished, timeout=90, what="job succeeded")
    ray_jobs = httpx.get(ray_cluster.state.dashboard_url + "/api/jobs/", headers=ray_cluster.auth_headers()).json()
    mine = [j for j in ray_jobs if (j.get("metadata") or {}).get("raylane_job_id") == job.id]
    assert len(mine) == 1, mine
    assert cp2.get(job.id, project=None).attempts == 1
    cp1.close()
    cp2.close()
