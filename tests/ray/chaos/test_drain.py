"""Graceful drain: Ray's drain API marks a node as going away (the notice a
spot-termination watcher or KubeRay sends before a preemption). Raylane stops
admitting work onto it, asks the jobs running there to checkpoint now, and when
the node is gone the next attempt resumes from that checkpoint."""

from __future__ import annotations

import time

import pytest

from raylane.orchestrator.backends.ray_jobs import RayJobsBackend
from tests.helpers import wait_for
from tests.ray.chaos.test_spot_loss import lines, record, running_trial, trial_sweep
from tests.ray.conftest import wait_status

pytestmark = [pytest.mark.ray, pytest.mark.slow]
TERMINAL = {"SUCCEEDED", "FAILED", "CANCELLED"}
STEPS = 300  # the drain lands within ~40-60 steps (test-artifacts/reliability.jsonl): room to spare


def group_state(rapi, name):
    return next(g for g in rapi.get("/v1/node-groups").json() if g["name"] == name)


def test_drained_node_stops_admission_and_its_job_checkpoints_then_resumes(rapi, ray_cluster, ray_settings):
    # Periodic checkpoints off: any checkpoint is the one the drain asked for.
    spec = {"name": "drain-train", "kind": "training", "entrypoint": "examples.train:main",
            "resources": {"num_workers": 1, "cpus_per_worker": 1},
            "args": {"steps": STEPS, "step_sleep": 0.05, "checkpoint_every": 100000}, "retry": {"backoff_s": 0.5}}
    job = rapi.post("/v1/jobs", json=spec).json()
    group = job["placement"]["node_group"]
    storage = ray_settings.storage_local_root / "default" / job["id"] / "checkpoints"
    wait_status(rapi, job["id"], {"RUNNING"}, timeout=120)
    att = wait_for(lambda: rapi.get(f"/v1/jobs/{job['id']}/attempts").json()[-1]["driver_node_id"] and
                   rapi.get(f"/v1/jobs/{job['id']}/attempts").json()[-1], timeout=60)
    victim = next(n for n in ray_cluster.state.nodes if n.ports.get("node_id") == att["driver_node_id"])
    assert victim.group == group
    assert group_state(rapi, group)["draining_nodes"] == 0
    # Drain only once the training actor runs there (a drained node takes no new actor).
    ray = RayJobsBackend(ray_cluster.state.dashboard_url, ray_cluster.state.token)
    try:
        wait_for(lambda: (rj := ray.get(att["submission_id"])) and rj.ray_job_id and
                 rj.ray_job_id in ray.actor_jobs_on(victim.ports["node_id"]), timeout=60,
                 what="the training actor on the node")
    finally:
        ray.close()

    notice_at = time.monotonic()
    ray_cluster.drain_node(victim.name, deadline_s=300)

    # Raylane sees the drain (the dashboard does not show it; the GCS does) ...
    wait_for(lambda: group_state(rapi, group)["draining_nodes"] == 1, timeout=30, what="the drain in node-groups")
    # ... asks the job to checkpoint, and says so in the job's events ...
    ev = wait_for(lambda: [e for e in rapi.get(f"/v1/jobs/{job['id']}/events").json()
                           if "is draining: asked attempt 1 to checkpoint" in (e["reason"] or "")],
                  timeout=30, what="the checkpoint request event")
    assert victim.ports["node_id"][:12] in ev[0]["reason"] and ev[0]["attempt"] == 1
    # ... and the job saves one at once, off its own schedule.
    ckpt = wait_for(lambda: sorted(storage.glob("checkpoint_*")), timeout=30, what="the drain checkpoint")
    asked_to_saved_s = time.monotonic() - notice_at
    drain_step = int(ckpt[-1].name.split("_")[1])
    assert 0 < drain_step < STEPS

    # Nothing new is admitted onto the draining node: a second job of the same
    # shape waits, saying for what.
    second = rapi.post("/v1/jobs", json={**spec, "name": "drain-second", "args": {"steps": 5}}).json()
    assert second["placement"]["node_group"] == group
    # (Its first reason, "waiting for admission", comes before any admission pass.)
    waiting = wait_for(lambda: (j := rapi.get(f"/v1/jobs/{second['id']}").json())["status"] == "PENDING"
                       and f"in group {group}" in (j["status_reason"] or "") and j, timeout=30,
                       what="the second job waiting for its group")
    assert "waiting for" in waiting["status_reason"], waiting["status_reason"]

    # The node goes (the preemption itself); a fresh one replaces it.
    ray_cluster.kill_node(victim.name)
    ray_cluster.add_node(group)
    done = wait_status(rapi, job["id"], TERMINAL, timeout=300)
    assert done["status"] == "SUCCEEDED", done["status_reason"]
    atts = rapi.get(f"/v1/jobs/{job['id']}/attempts").json()
    # The node went as it was warned it would: a preemption, whatever its market.
    assert len(atts) == 2 and atts[0]["cause"] == "PREEMPTED", atts
    ret = done["result"]["workers"][0]["return"]
    assert ret["resumed_from"] == drain_step and ret["steps_run"] == STEPS - drain_step, ret
    assert wait_status(rapi, second["id"], TERMINAL, timeout=300)["status"] == "SUCCEEDED"
    record(test="drain_checkpoint", notice_to_checkpoint_s=round(asked_to_saved_s, 1), resumed_from_step=drain_step,
           first_attempt_cause=atts[0]["cause"])


def test_drained_spot_node_trials_checkpoint_when_asked_and_resume_there(rapi, ray_cluster, tmp_path):
    """A sweep's trials checkpoint only when Raylane asks (``raylane.jobs.base.
    checkpoint_requested``): the trials on a drained spot node save when told,
    and after the node goes Tune resumes them from exactly those checkpoints, in
    the same attempt."""
    log = tmp_path / "trials.jsonl"
    job = rapi.post("/v1/jobs", json=trial_sweep("drain-sweep", "drain_trial", log, trials=4, iters=60,
                                                 sleep=0.25)).json()
    trial = wait_for(lambda: running_trial(log, 2.0), timeout=240, what="a trial running for 2 s")
    victim = next(n for n in ray_cluster.state.nodes if n.ports.get("node_id") == trial["node"])
    assert victim.group == "spot-cpu"
    ray_cluster.drain_node(victim.name, deadline_s=300)
    wait_for(lambda: [e for e in rapi.get(f"/v1/jobs/{job['id']}/events").json()
                      if "is draining: asked attempt 1 to checkpoint" in (e["reason"] or "")],
             timeout=30, what="the checkpoint request event")
    # Every trial still running on the node saves a checkpoint when told.
    def saved_on_victim():
        ls = lines(log)
        done = {x["x"] for x in ls if x.get("done")}
        on_victim = {x["x"] for x in ls if "start" in x and x["node"] == trial["node"]} - done
        saved = {x["x"]: x["ckpt"] for x in ls if "ckpt" in x and x["node"] == trial["node"]}
        return on_victim and on_victim <= saved.keys() and saved

    saved = wait_for(saved_on_victim, timeout=30, what="the trials on the drained node checkpointing")
    done_before_kill = {x["x"] for x in lines(log) if x.get("done")}
    ray_cluster.kill_node(victim.name)
    ray_cluster.add_node("spot-cpu")
    done = wait_status(rapi, job["id"], TERMINAL, timeout=300)
    assert done["status"] == "SUCCEEDED", done["status_reason"]
    assert done["attempts"] == 1  # the driver (on on-demand) never moved; only trials did
    ls = lines(log)
    resumed = {x: [y["start"] for y in ls if y.get("x") == x and y.get("start", 0) > 0]
               for x in saved if x not in done_before_kill}
    assert resumed and all(starts == [saved[x]] for x, starts in resumed.items()), (saved, resumed, ls)
    assert {x["x"] for x in ls if x.get("done")} == set(range(4))
    record(test="drain_sweep", trials_checkpointed=len(saved), resumed_from=sorted(saved[x] for x in resumed))
