"""Admission's decisions alone: ``loops.admission.decide`` on queue rows built
here, with no database and no Ray. What it returns is all that gets written
(tests/test_scheduler.py and tests/test_quotas.py check the writes)."""

from __future__ import annotations

from dataclasses import replace

from raylane.orchestrator.domain.profile import default_profile
from raylane.orchestrator.domain.routing import GroupState, route
from raylane.orchestrator.domain.specs import JobSpec
from raylane.orchestrator.domain.states import JobStatus
from raylane.orchestrator.loops.admission import Admit, Fail, Rules, Wait, decide
from raylane.orchestrator.store.queue import Queued
from raylane.orchestrator.store.quotas import Limits

PROFILE = default_profile()
RULES = Rules(max_concurrent_drivers=64, starvation_skips=3)
VIEW = {"gpu": GroupState(alive_nodes=1, total={"CPU": 4, "GPU": 2, "memory": 4 * 1024**3})}


def queued(job_id: str, gpus: int, *, project: str = "default", skips: int = 0, reason: str | None = None) -> Queued:
    spec = JobSpec(name=job_id, kind="command", entrypoint="true",
                   resources={"gpus_per_worker": gpus, "cpus_per_worker": 0.5})
    return Queued(id=job_id, project=project, status=JobStatus.PENDING, status_reason=reason, spec=spec,
                  placement=route(spec, PROFILE), attempts=0, skips=skips, preemptions=0)


def run(queue, *, limits=None, used=None):
    return decide(queue, VIEW, PROFILE, RULES, used=used or {}, drivers=0, limits=limits or {}, project_used={})


def summary(decisions):
    return [(type(d).__name__, d.job.id, getattr(d, "reason", None) or getattr(d, "passed_over", None))
            for d in decisions]


def test_a_pass_counts_what_it_admits_and_writes_a_reason_only_when_it_changes():
    first = run([queued("a", 2), queued("b", 1)])
    assert summary(first) == [("Admit", "a", []), ("Wait", "b", "waiting for 1 GPUs in group gpu: 0 free")]
    # The same wait again, with its reason already stored: nothing to write.
    again = run([queued("b", 1, reason="waiting for 1 GPUs in group gpu: 0 free")], used={"gpu": {"GPU": 2}})
    assert again == []


def test_a_backfill_passes_over_the_big_job_until_it_reserves_its_group():
    passed = run([queued("big", 2), queued("small", 1)], used={"gpu": {"GPU": 1}})
    assert summary(passed) == [("Wait", "big", "waiting for 2 GPUs in group gpu: 1 free"),
                               ("Admit", "small", ["big"])]
    starving = run([queued("big", 2, skips=3), queued("small", 1)], used={"gpu": {"GPU": 1}})
    assert [type(d) for d in starving] == [Wait, Wait]
    assert starving[1].reason == "waiting: group gpu is reserved for an older job that has waited longest"


def test_a_job_held_by_its_own_quota_is_not_passed_over():
    limits = {("p", "gpu"): Limits(max_gpus=0)}
    out = run([queued("held", 1, project="p", skips=10), queued("other", 1)], limits=limits)
    assert isinstance(out[0], Wait) and out[0].reason.startswith("project quota reached: p holds 0 of 0 GPUs")
    assert isinstance(out[1], Admit) and out[1].passed_over == []


def test_a_job_that_no_longer_fits_the_profile_fails():
    job = queued("x", 1)
    gone = Queued(**{**job.__dict__, "placement": None,
                     "spec": job.spec.model_copy(update={"resources": job.spec.resources.model_copy(
                         update={"gpus_per_worker": 64})})})
    out = run([gone])
    assert [type(d) for d in out] == [Fail] and "64" in out[0].message


# Groups that scale from zero (issue #13): capacity is what is live plus what
# the profile's max_nodes lets the autoscaler add, with a bound on how many jobs
# wait in Ray for it.

AHEAD = Rules(max_concurrent_drivers=64, starvation_skips=3, scale_ahead=1)
CPU_ROOM = {"cpu": GroupState(alive_nodes=1, total={"CPU": 4, "memory": 2 * 1024**3})}


def profile_with(**max_nodes):
    return PROFILE.model_copy(update={"groups": [
        g.model_copy(update={"max_nodes": max_nodes[g.name.replace("-", "_")], "min_nodes": 0})
        if g.name.replace("-", "_") in max_nodes else g for g in PROFILE.groups]})


def at_zero(queue, profile, rules=AHEAD, *, view=None, ahead=None):
    return decide(queue, view or {}, profile, rules, used={}, drivers=0, limits={}, project_used={}, ahead=ahead)


def test_a_group_at_zero_nodes_admits_one_job_ahead_of_its_scale_up_and_no_more():
    out = at_zero([queued("a", 2), queued("b", 1)], profile_with(gpu=1))
    assert summary(out) == [("Admit", "a", []),
                            ("Wait", "b", "waiting for 1 GPUs in group gpu: 0 free, counting the 1 more the "
                                          "autoscaler may add (max_nodes 1)")]
    assert out[0].scale_up == "waiting for the autoscaler: 0 of 1 gpu nodes up"
    # Room for two nodes, but the bound (one job ahead per group) holds the second back,
    # and a job already waiting in Ray counts against it on the next pass.
    two = at_zero([queued("a", 2), queued("b", 2)], profile_with(gpu=2))
    assert [type(d) for d in two] == [Admit, Wait]
    assert two[1].reason == ("waiting for the autoscaler: 0 of 2 gpu nodes up; 1 jobs already wait for it in Ray "
                             "(max 1)")
    later = at_zero([queued("b", 2)], profile_with(gpu=2), ahead={"gpu": 1})
    assert [type(d) for d in later] == [Wait]
    # With a bound of two, the second job waits in Ray for a second node.
    bound_2 = Rules(max_concurrent_drivers=64, starvation_skips=3, scale_ahead=2)
    both = at_zero([queued("a", 2), queued("b", 2)], profile_with(gpu=2), rules=bound_2)
    assert [d.scale_up for d in both] == ["waiting for the autoscaler: 0 of 1 gpu nodes up",
                                          "waiting for the autoscaler: 0 of 2 gpu nodes up"]


def test_without_scale_ahead_only_live_nodes_count():
    out = at_zero([queued("a", 1)], profile_with(gpu=1), rules=RULES)
    assert summary(out) == [("Wait", "a", "waiting for 1 GPUs in group gpu: 0 free")]


def test_a_group_with_max_nodes_0_and_no_node_never_admits_and_says_so():
    out = at_zero([queued("a", 1)], profile_with(gpu=0))
    assert [type(d) for d in out] == [Fail]
    assert out[0].message == "group gpu has no node and max_nodes 0: the autoscaler may add none"


def test_priority_order_and_starvation_hold_across_the_scale_up_boundary():
    # The older, starving job reserves its group: the newer one does not jump
    # ahead of it into the autoscaler's room.
    starving = at_zero([queued("big", 2, skips=3), queued("small", 1)], profile_with(gpu=1),
                       ahead={"gpu": 1})
    assert [type(d) for d in starving] == [Wait, Wait]
    assert starving[1].reason == "waiting: group gpu is reserved for an older job that has waited longest"


def sweep(job_id: str) -> Queued:
    spec = JobSpec(name=job_id, kind="sweep", entrypoint="examples.sweep:objective",
                   resources={"cpus_per_worker": 1},
                   sweep={"metric": "loss", "mode": "min", "num_samples": 4, "max_concurrent_trials": 2,
                          "search_space": {"lr": {"choice": [0.1, 0.2]}}})
    return Queued(id=job_id, project="default", status=JobStatus.PENDING, status_reason=None, spec=spec,
                  placement=route(spec, PROFILE), attempts=0, skips=0, preemptions=0)


def test_a_sweep_for_spot_cpu_at_zero_nodes_runs_on_its_fallback_cpu_with_room():
    job = sweep("s")
    assert job.placement.node_group == "spot-cpu" and job.placement.fallback_node_groups == ["cpu"]
    out = at_zero([job], PROFILE, rules=RULES, view=CPU_ROOM)
    assert [type(d) for d in out] == [Admit] and out[0].scale_up is None
    pl = out[0].placement
    assert (pl.node_group, pl.market, pl.label_selector) == ("cpu", "ON_DEMAND", {"ray.io/node-group": "cpu"})
    assert pl.reasons[-1] == "spot-cpu has no room now: runs on its fallback cpu"
    # With no room for a trial on cpu (only for the driver), it waits for spot-cpu's scale-up instead.
    full = at_zero([job], PROFILE, view={"cpu": GroupState(alive_nodes=1, total={"CPU": 0.5})})
    assert [type(d) for d in full] == [Admit] and full[0].placement.node_group == "spot-cpu"
    assert full[0].scale_up == "waiting for the autoscaler: 0 of 1 spot-cpu nodes up"
    # Its driver still needs room on its own (on-demand) group, scale-up or not ...
    no_driver = at_zero([job], PROFILE, view={"cpu": GroupState(alive_nodes=1, total={"CPU": 0})})
    assert summary(no_driver) == [("Wait", "s", "waiting for 0.1 CPUs in group cpu: 0 free (for the driver)")]
    # ... but on a fleet's cluster (a rented one scales every group from zero) it may wait for a group the
    # autoscaler may add a node to (cpu's max_nodes is 4), up to scale_ahead drivers a pass ...
    fleet = replace(AHEAD, driver_scale_ahead=True)
    two = at_zero([job, sweep("s2"), sweep("s3")], PROFILE, rules=fleet,
                  view={"cpu": GroupState(alive_nodes=1, total={"CPU": 0})})
    assert [type(d) for d in two][:1] == [Admit]
    assert two[0].scale_up == ("waiting for the autoscaler: 0 of 1 spot-cpu nodes up; its driver waits for "
                               "group cpu to add a node")
    assert sum(isinstance(d, Admit) for d in two) <= fleet.scale_ahead
    # ... and not for one at its max_nodes.
    capped = PROFILE.model_copy(update={"groups": [g.model_copy(update={"max_nodes": 1}) if g.name == "cpu" else g
                                                   for g in PROFILE.groups]})
    no_driver = at_zero([job], capped, rules=fleet, view={"cpu": GroupState(alive_nodes=1, total={"CPU": 0})})
    assert summary(no_driver) == [("Wait", "s", "waiting for 0.1 CPUs in group cpu: 0 free (for the driver)")]


def test_routing_never_prefers_a_group_that_can_never_have_a_node():
    """Found on the autoscaling cluster: a cheaper, same-size GPU group with
    max_nodes 0 won the 'smallest, then cheapest' ranking, and the job failed there
    instead of scaling the group that can grow."""
    gpu = next(g for g in PROFILE.groups if g.name == "gpu")
    dead = gpu.model_copy(update={"name": "a100", "max_nodes": 0, "min_nodes": 0,
                                  "price_per_hour": gpu.price_per_hour / 10})
    profile = PROFILE.model_copy(update={"groups": [*PROFILE.groups, dead]})
    spec = JobSpec.model_validate({"name": "t", "kind": "training", "entrypoint": "m:f",
                                   "resources": {"num_workers": 1, "gpus_per_worker": 1}})
    assert route(spec, profile).node_group == "gpu"


def cpu_job(job_id: str, cpus: float = 1, **kw) -> Queued:
    spec = JobSpec(name=job_id, kind="command", entrypoint="true", resources={"cpus_per_worker": cpus}, **kw)
    return Queued(id=job_id, project="default", status=JobStatus.PENDING, status_reason=None, spec=spec,
                  placement=route(spec, PROFILE), attempts=0, skips=0, preemptions=0)


QUEUE_AHEAD = Rules(max_concurrent_drivers=64, starvation_skips=3, queue_ahead=2)


def test_a_burst_of_cpu_jobs_queues_ahead_in_ray_up_to_the_bound_and_says_so():
    jobs = [cpu_job(f"j{i}") for i in range(8)]
    assert jobs[0].placement.node_group == "cpu"
    # The group's 4 CPUs are busy with running jobs: 2 more wait in Ray's queue, the rest in Raylane's.
    out = decide(jobs, CPU_ROOM, PROFILE, QUEUE_AHEAD, used={"cpu": {"CPU": 4}}, drivers=0, limits={},
                 project_used={})
    assert [type(d).__name__ for d in out] == ["Admit"] * 2 + ["Wait"] * 6
    assert all(d.scale_up is None for d in out[:2])
    assert out[0].queued == ("queued ahead in Ray until a running job ends "
                             "(waiting for 1 CPUs in group cpu: 0 free)")
    assert out[2].reason == "waiting for 1 CPUs in group cpu: 0 free"
    # Every admitted job waits to start until Ray runs it: 4 that fit now already
    # fill the bound, so none goes ahead of them.
    fresh = decide(jobs, CPU_ROOM, PROFILE, QUEUE_AHEAD, used={}, drivers=0, limits={}, project_used={})
    assert [type(d).__name__ for d in fresh] == ["Admit"] * 4 + ["Wait"] * 4
    assert [d.queued for d in fresh[:4]] == [None] * 4
    # Jobs already waiting to start in Ray count against the bound (the store's DISPATCHING jobs).
    busy = decide(jobs[:2], CPU_ROOM, PROFILE, QUEUE_AHEAD, used={"cpu": {"CPU": 4}}, drivers=0, limits={},
                  project_used={}, waiting={("cpu", False): 1})
    assert [type(d).__name__ for d in busy] == ["Admit", "Wait"]
    # Off (the default of Rules): only what fits now.
    off = decide(jobs, CPU_ROOM, PROFILE, RULES, used={"cpu": {"CPU": 4}}, drivers=0, limits={}, project_used={})
    assert [type(d).__name__ for d in off] == ["Wait"] * 8


def test_gpu_jobs_and_jobs_bigger_than_the_live_group_never_queue_ahead():
    rules = Rules(max_concurrent_drivers=64, starvation_skips=3, queue_ahead=8)
    gpu = decide([queued("a", 2), queued("b", 1)], VIEW, PROFILE, rules, used={}, drivers=0, limits={},
                 project_used={})
    assert summary(gpu) == [("Admit", "a", []), ("Wait", "b", "waiting for 1 GPUs in group gpu: 0 free")]
    small = {"cpu": GroupState(alive_nodes=1, total={"CPU": 1, "memory": 2 * 1024**3})}
    big = decide([cpu_job("one"), cpu_job("two", cpus=2)], small, PROFILE, rules, used={"cpu": {"CPU": 1}},
                 drivers=0, limits={}, project_used={})
    assert [type(d).__name__ for d in big] == ["Admit", "Wait"]  # "one" waits in Ray; "two" could never start there
    assert big[0].queued and big[1].reason == "waiting for 2 CPUs in group cpu: 0 free"


def test_a_group_the_autoscaler_may_grow_scales_ahead_instead_of_queueing_ahead():
    rules = Rules(max_concurrent_drivers=64, starvation_skips=3, scale_ahead=1, queue_ahead=8)
    out = decide([cpu_job("a", 4), cpu_job("b", 4), cpu_job("c", 4)], CPU_ROOM, profile_with(cpu=2), rules,
                 used={}, drivers=0, limits={}, project_used={})
    assert [(type(d).__name__, getattr(d, "scale_up", None) is not None, getattr(d, "queued", None))
            for d in out][:2] == [("Admit", False, None), ("Admit", True, None)]
    assert isinstance(out[2], Wait)


def test_only_commands_queue_ahead_never_past_a_waiting_job_nor_beside_lane_jobs():
    full = {"cpu": {"CPU": 4}}

    def run_full(queue, rules=QUEUE_AHEAD, waiting=None):
        return decide(queue, CPU_ROOM, PROFILE, rules, used=full, drivers=0, limits={}, project_used={},
                      waiting=waiting)

    # A sweep's driver would start on 0.1 CPU in Ray while its trials compete later: it waits here.
    assert [type(d) for d in run_full([sweep("s")])] == [Wait]
    # A waiting job ahead of it in the group: Ray's queue knows no priority, so none jumps it.
    big = cpu_job("big", cpus=4, priority=90)
    out = run_full([big, cpu_job("small")])
    # The head itself may go ahead; a smaller job never queues behind it in Ray,
    # where it would take the room the big one waits for, again and again.
    assert [type(d) for d in out] == [Admit, Wait] and out[0].queued
    later = decide([cpu_job("small")], CPU_ROOM, PROFILE, QUEUE_AHEAD, used=full, drivers=0, limits={},
                   project_used={}, waiting={("cpu", False): 1}, waiting_need={"cpu": 4.0})
    assert [type(d) for d in later] == [Wait]
    two = {"cpu": GroupState(alive_nodes=1, total={"CPU": 2, "memory": 2 * 1024**3})}
    blocked = decide([cpu_job("too-big", cpus=4), cpu_job("small")], two, PROFILE, QUEUE_AHEAD,
                     used={"cpu": {"CPU": 2}}, drivers=0, limits={}, project_used={})
    assert [type(d) for d in blocked] == [Wait, Wait]  # one that cannot go ahead still holds the others back
    # Lane jobs run in the group: they hold CPUs Ray does not see, so Ray's queue is no guide there.
    assert [type(d) for d in run_full([cpu_job("c")], waiting={("cpu", True): 1})] == [Wait]
    lane_rules = Rules(max_concurrent_drivers=64, starvation_skips=3, fast_lane=True, queue_ahead=8)
    lane_job = JobSpec(name="l", kind="command", entrypoint="true", resources={"cpus_per_worker": 1})
    lane = run_full([Queued(id="l", project="default", status=JobStatus.PENDING, status_reason=None, spec=lane_job,
                            placement=None, attempts=0, skips=0, preemptions=0)], rules=lane_rules)
    assert [type(d) for d in lane] == [Wait]  # a lane's host counts slots, not CPUs: never ahead


# A co-located gang (multi-GPU training: STRICT_PACK, one node) needs one node with
# room for all its workers. The group's sum is not enough: two nodes with one GPU
# free each hold no 2-GPU gang, and Ray would keep it pending, for good on a group
# at its max_nodes (bench/fleet_trace.py found it: docs/benchmarks/history.md).

def training(job_id: str, workers: int = 2) -> Queued:
    spec = JobSpec(name=job_id, kind="training", entrypoint="examples.train:main",
                   resources={"num_workers": workers, "gpus_per_worker": 1})
    return Queued(id=job_id, project="default", status=JobStatus.PENDING, status_reason=None, spec=spec,
                  placement=route(spec, PROFILE), attempts=0, skips=0, preemptions=0)


def gpu_nodes(*gpus_free: float, known: bool = True) -> dict:
    """Group gpu with one 2-GPU node per entry, each with ``gpus_free`` free as Ray says."""
    n = len(gpus_free)
    return {"gpu": GroupState(alive_nodes=n, total={"CPU": 4.0 * n, "GPU": 2.0 * n, "memory": 4.0 * n * 1024**3},
                              node_free=[{"CPU": 4.0, "GPU": g, "memory": 4 * 1024**3} for g in gpus_free]
                              if known else None)}


def test_a_colocated_gang_waits_for_one_node_with_room_for_it_not_the_groups_sum():
    assert training("t").placement.colocate
    used = {"gpu": {"GPU": 2.0, "CPU": 2.0}}  # two 1-GPU jobs, one on each node
    out = decide([training("t")], gpu_nodes(1, 1), PROFILE, RULES, used=used, drivers=0, limits={}, project_used={})
    assert summary(out) == [("Wait", "t", "waiting for 2 GPUs on one node of group gpu (its 2 workers are "
                                          "co-located): at most 1 free on any one node")]
    # Where Ray did not say what each node has free (the dashboard's list), the sum decides, as before.
    unknown = decide([training("t")], gpu_nodes(1, 1, known=False), PROFILE, RULES, used=used, drivers=0,
                     limits={}, project_used={})
    assert [type(d) for d in unknown] == [Admit]
    # A node with both GPUs free: admitted.
    whole = decide([training("t")], gpu_nodes(0, 2), PROFILE, RULES, used=used, drivers=0, limits={},
                   project_used={})
    assert [type(d) for d in whole] == [Admit]


def test_gangs_admitted_in_one_pass_take_their_node_and_a_small_job_still_fits_beside():
    used = {"gpu": {"GPU": 2.0, "CPU": 2.0}}  # nodes with 2, 1 and 1 GPUs free: 4 in all
    out = decide([training("t1"), training("t2"), queued("small", 1)], gpu_nodes(2, 1, 1), PROFILE, RULES,
                 used=used, drivers=0, limits={}, project_used={})
    assert summary(out) == [
        ("Admit", "t1", []),
        ("Wait", "t2", "waiting for 2 GPUs on one node of group gpu (its 2 workers are co-located): "
                       "at most 1 free on any one node"),
        ("Admit", "small", ["t2"])]


def test_a_gang_with_no_node_for_it_is_admitted_ahead_of_a_scale_up_where_the_group_may_grow():
    used = {"gpu": {"GPU": 2.0, "CPU": 2.0}}
    out = decide([training("t")], gpu_nodes(1, 1), profile_with(gpu=3), AHEAD, used=used, drivers=0, limits={},
                 project_used={})
    assert [type(d) for d in out] == [Admit]
    assert out[0].scale_up == "waiting for the autoscaler: 2 of 3 gpu nodes up"
    full = decide([training("t")], gpu_nodes(1, 1), profile_with(gpu=2), AHEAD, used=used, drivers=0, limits={},
                  project_used={})
    assert summary(full) == [("Wait", "t", "waiting for 2 GPUs on one node of group gpu (its 2 workers are "
                                           "co-located): at most 1 free on any one node; the group is at its max_nodes (2)")]


def test_a_gang_admitted_last_pass_and_not_yet_placed_by_ray_still_holds_its_node():
    # Ray shows nodes with 2, 1 and 1 GPUs free (2 of 6 taken), but Raylane counts 4
    # held: the gang it admitted last pass has not asked Ray for its placement group yet.
    used = {"gpu": {"GPU": 4.0, "CPU": 4.0}}
    out = decide([training("y")], gpu_nodes(2, 1, 1), PROFILE, RULES, used=used, drivers=0, limits={},
                 project_used={}, unplaced={"gpu": 2.0})
    assert summary(out) == [("Wait", "y", "waiting for 2 GPUs on one node of group gpu (its 2 workers are "
                                          "co-located): at most 1 free on any one node")]
    # What Raylane counts beyond what Ray shows is not all unplaced work: a sweep running
    # fewer trials than counted, a job on a draining node. Only what may still be placed
    # (``stats.unplaced_gpus``) is taken, else a node that fits sits idle.
    placed = decide([training("y")], gpu_nodes(2, 1, 1), PROFILE, RULES, used=used, drivers=0, limits={},
                    project_used={}, unplaced={})
    assert [type(d) for d in placed] == [Admit]


def test_a_one_gpu_job_admitted_ahead_in_the_pass_may_take_the_node_a_gang_needs():
    used = {"gpu": {"GPU": 1.0, "CPU": 1.0}}  # nodes with 2 and 1 GPUs free
    out = decide([queued("small", 1), training("t")], gpu_nodes(2, 1), PROFILE, RULES, used=used, drivers=0,
                 limits={}, project_used={})
    assert [type(d) for d in out] == [Admit, Wait]
    assert "on one node of group gpu" in out[1].reason


def test_one_worker_with_two_gpus_needs_one_node_that_holds_it_and_a_node_short_of_cpus_says_cpus():
    one = training("w", workers=1)
    one = Queued(**{**one.__dict__, "spec": one.spec.model_copy(update={"resources": one.spec.resources.model_copy(
        update={"gpus_per_worker": 2})})})
    one = Queued(**{**one.__dict__, "placement": route(one.spec, PROFILE)})
    assert not one.placement.colocate
    used = {"gpu": {"GPU": 2.0, "CPU": 2.0}}
    out = decide([one], gpu_nodes(1, 1), PROFILE, RULES, used=used, drivers=0, limits={}, project_used={})
    assert summary(out) == [("Wait", "w", "waiting for 2 GPUs on one node of group gpu (one worker, which no "
                                          "node splits): at most 1 free on any one node")]
    # The GPUs are on one node, the CPUs on the other: the reason says both are needed at once.
    view = gpu_nodes(2, 0)
    view["gpu"].node_free[0]["CPU"] = 1.0
    apart = decide([training("t")], view, PROFILE, RULES, used=used, drivers=0, limits={}, project_used={})
    assert summary(apart) == [("Wait", "t", "waiting for one node of group gpu with 2 GPUs and 2 CPUs free at once "
                                            "(its 2 workers are co-located)")]
    # No node has the CPUs: the reason names them.
    view["gpu"].node_free[1]["CPU"] = 1.0
    short = decide([training("t")], view, PROFILE, RULES, used=used, drivers=0, limits={}, project_used={})
    assert summary(short) == [("Wait", "t", "waiting for 2 CPUs on one node of group gpu (its 2 workers are "
                                            "co-located): at most 1 free on any one node")]
