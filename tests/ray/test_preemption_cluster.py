"""Preemption on the local cluster (docs/sharing.md): project a borrows both GPUs
of group gpu with two training jobs; b submits a 1-GPU job within its guarantee.
a's youngest job is asked to checkpoint, saves one (examples/train.py does when
asked, and its report says so), is stopped then (not at the end of a 5-minute
grace), b's job runs, and a's job resumes from its checkpoint and finishes,
although its spec allows one attempt (a preemption is not charged). A service
is never the victim, whatever its priority."""

from __future__ import annotations

import pytest

from tests.conftest import ADMIN_HEADERS
from tests.helpers import wait_for
from tests.ray.conftest import cancel_leftovers, wait_status

pytestmark = [pytest.mark.ray, pytest.mark.slow]
GRACE_S = 300.0


@pytest.fixture
def papi(ray_settings):
    from fastapi.testclient import TestClient

    from raylane.api.app import create_app

    settings = ray_settings.model_copy(update={"preempt_min_run_s": 0.0, "preempt_grace_s": GRACE_S,
                                               "fast_lane": False})
    with TestClient(create_app(settings), headers=ADMIN_HEADERS) as c:
        yield c, settings
        cancel_leftovers(c)


def train(name: str, project: str, steps: int) -> dict:
    return {"name": name, "kind": "training", "entrypoint": "examples.train:main", "project": project,
            "resources": {"num_workers": 1, "gpus_per_worker": 1, "cpus_per_worker": 0.5},
            "args": {"steps": steps, "step_sleep": 0.05, "checkpoint_every": 100000},
            "retry": {"max_attempts": 1}}


def test_a_borrower_checkpoints_is_stopped_and_resumes_for_a_job_within_its_share(papi):
    api, settings = papi
    for p, groups in (("a", {"gpu": {"max_gpus": 1, "borrow_gpus": 1}}), ("b", {"gpu": {"max_gpus": 1}})):
        api.post("/v1/projects", json={"name": p})
        assert api.put(f"/v1/projects/{p}/quota", json={"node_groups": groups}).status_code == 200
    first = api.post("/v1/jobs", json=train("a-first", "a", 1200)).json()
    wait_status(api, first["id"], {"RUNNING"})
    second = api.post("/v1/jobs", json=train("a-second", "a", 300)).json()
    wait_status(api, second["id"], {"RUNNING"})
    assert api.get(f"/v1/jobs/{second['id']}").json()["placement"]["borrowed"]
    storage = settings.storage_local_root / "a" / second["id"] / "checkpoints"
    # Periodic checkpoints are off: any checkpoint is the one the preemption asks for.
    assert not list(storage.glob("checkpoint_*"))

    b = api.post("/v1/jobs", json={"name": "b-job", "kind": "command", "project": "b",
                                   "entrypoint": "python -c 'print(\"b ran\")'",
                                   "resources": {"gpus_per_worker": 1, "cpus_per_worker": 0.5}}).json()
    reason = wait_for(lambda: (r := api.get(f"/v1/jobs/{b['id']}").json()["status_reason"] or "") and
                      "preempting" in r and r, timeout=60, what="b's reason naming the preemption")
    assert second["id"] in reason and first["id"] not in reason
    # The victim checkpoints at the request and is stopped then, long before its grace ends.
    ckpt = wait_for(lambda: sorted(storage.glob("checkpoint_*")), timeout=60, what="the preemption's checkpoint")
    att = wait_for(lambda: (a := api.get(f"/v1/jobs/{second['id']}/attempts").json()[0])["ended_at"] and a,
                   timeout=90, what="the victim's attempt ended")
    assert att["cause"] == "PREEMPTED_BY_PRIORITY" and att["preempt_for"] == b["id"]
    assert "checkpoint was saved" in att["message"], att["message"]
    from datetime import datetime

    ended, deadline = (datetime.fromisoformat(att[k]) for k in ("ended_at", "preempt_deadline"))
    assert (deadline - ended).total_seconds() > GRACE_S / 2
    # b's job runs and ends; the first job of a was never disturbed.
    assert wait_status(api, b["id"], {"SUCCEEDED", "FAILED"}, timeout=120)["status"] == "SUCCEEDED"
    assert api.get(f"/v1/jobs/{first['id']}").json()["attempts"] == 1
    # a's job is admitted again (max_attempts 1: not charged) and resumes from its checkpoint.
    done = wait_status(api, second["id"], {"SUCCEEDED", "FAILED"}, timeout=240)
    assert done["status"] == "SUCCEEDED" and done["attempts"] == 2, done.get("status_reason")
    step = int(ckpt[0].name.split("_")[1])
    assert done["result"]["workers"][0]["return"]["resumed_from"] >= step > 0
    api.post(f"/v1/jobs/{first['id']}/cancel")


def test_a_job_that_does_not_checkpoint_is_stopped_at_its_grace_end_for_a_higher_priority_one(papi):
    """Priority, no quotas: a service (priority 5) and a low-priority command (10)
    hold a GPU each. A high-priority job needs one: the command is the victim,
    never the service, although its priority is the lowest (a service is not
    preemptible, ``kinds.KINDS``). The command ignores the request (it has no
    checkpoint) and is stopped when its own grace (``preemption.grace_s``, 5 s)
    ends; the high-priority job then runs, the command queues again, and the
    service runs on undisturbed."""
    api, _ = papi
    svc = api.post("/v1/jobs", json={"name": "gpu-svc", "kind": "service", "entrypoint": "examples.serve_app:Linear",
                                     "priority": 5, "resources": {"gpus_per_worker": 1, "cpus_per_worker": 0.5},
                                     "service": {"replicas": 1, "route_prefix": "/preempt-svc"}}).json()
    assert "id" in svc, svc
    wait_status(api, svc["id"], {"RUNNING"}, timeout=240)
    low = api.post("/v1/jobs", json={"name": "low-cmd", "kind": "command", "entrypoint": "sleep 600", "priority": 10,
                                     "resources": {"gpus_per_worker": 1, "cpus_per_worker": 0.5},
                                     "preemption": {"grace_s": 5}}).json()
    wait_status(api, low["id"], {"RUNNING"})
    high = api.post("/v1/jobs", json={"name": "high-cmd", "kind": "command", "priority": 90,
                                      "entrypoint": "python -c 'print(1)'",
                                      "resources": {"gpus_per_worker": 1, "cpus_per_worker": 0.5}}).json()
    reason = wait_for(lambda: (r := api.get(f"/v1/jobs/{high['id']}").json()["status_reason"] or "") and
                      "preempting" in r and r, timeout=60, what="the high job's reason naming its victim")
    assert low["id"] in reason and svc["id"] not in reason, reason
    att = wait_for(lambda: (a := api.get(f"/v1/jobs/{low['id']}/attempts").json()[0])["ended_at"] and a,
                   timeout=90, what="the low command stopped")
    assert att["cause"] == "PREEMPTED_BY_PRIORITY" and "end of its grace period" in att["message"], att
    from datetime import datetime

    ended, deadline = (datetime.fromisoformat(att[k]) for k in ("ended_at", "preempt_deadline"))
    assert ended >= deadline, (ended, deadline)  # not before its grace ended
    assert wait_status(api, high["id"], {"SUCCEEDED", "FAILED"}, timeout=120)["status"] == "SUCCEEDED"
    again = wait_status(api, low["id"], {"DISPATCHING", "RUNNING"}, timeout=120)
    assert again["attempts"] == 2
    service = api.get(f"/v1/jobs/{svc['id']}").json()
    assert (service["status"], service["attempts"]) == ("RUNNING", 1), service
    assert all(a["preempt_for"] is None for a in api.get(f"/v1/jobs/{svc['id']}/attempts").json())
    for j in (low, svc):
        api.post(f"/v1/jobs/{j['id']}/cancel")
