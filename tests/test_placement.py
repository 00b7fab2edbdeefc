"""Placement across a fleet (``orchestrator/domain/placement.py``): owned with room
(or soon) first, rented spot for kinds that tolerate it, rented on demand, owned
later; pins and renting policy; every reason names the cluster, the group and why.
Pure: the fleet is the shipped local-hybrid, "now" is written out per test."""

from __future__ import annotations

import pytest

from raylane.orchestrator.domain.errors import Forbidden
from raylane.orchestrator.domain.fleet import Fleet
from raylane.orchestrator.domain.placement import GroupNow, Holding, Queued, Rank, RentPolicy, expected_start, place
from raylane.orchestrator.domain.routing import Unroutable
from raylane.orchestrator.domain.specs import JobSpec

FLEET = Fleet.load("local-hybrid")
TRAIN = {"name": "finetune", "kind": "training", "entrypoint": "examples.train:main",
         "resources": {"num_workers": 2, "gpus_per_worker": 1, "cpus_per_worker": 1},
         "placement": {"node_group": "auto", "colocate": True}}
SWEEP = {"name": "lr", "kind": "sweep", "entrypoint": "examples.sweep:objective", "resources": {"cpus_per_worker": 1},
         "sweep": {"metric": "loss", "mode": "min", "num_samples": 8, "max_concurrent_trials": 2,
                   "search_space": {"lr": {"uniform": [0.1, 1.0]}}}}
CMD = {"name": "hello", "kind": "command", "entrypoint": "python -c 'print(42)'"}


def spec(doc, **placement) -> JobSpec:
    d = {**doc, "placement": {**doc.get("placement", {}), **placement}}
    return JobSpec.model_validate(d)


def now(gpus_held=0.0, cpus_held=0.0, next_free_s=None, cloud=None):
    """onprem up (gpu: 2 GPUs, 4 CPUs; cpu: 4 CPUs) with these held; cloud at zero unless given."""
    return {
        "onprem": {"gpu": GroupNow(1, {"GPU": 2, "CPU": 4}, {"GPU": gpus_held, "CPU": min(gpus_held, 4)}, next_free_s),
                   "cpu": GroupNow(1, {"CPU": 4}, {"CPU": cpus_held}, next_free_s)},
        "cloud": cloud or {},
    }


def order(fp):
    return [(c.cluster, c.group) for c in fp.candidates]


def test_training_goes_to_onprem_while_its_gpus_are_free_then_cloud_spot_then_on_demand():
    fp = place(spec(TRAIN), FLEET, now())
    assert order(fp) == [("onprem", "gpu"), ("cloud", "gpu-spot"), ("cloud", "gpu")]
    assert fp.nominee.cluster == "onprem" and fp.candidates[0].rank is Rank.OWNED_ROOM
    assert fp.reasons[:2] == ["placed on onprem gpu (owned)", "onprem gpu: room now (2 of 2 GPUs free, 4 of 4 CPUs free)"]
    p = fp.placement()
    assert (p.cluster, p.tier, p.node_group, p.strategy) == ("onprem", "owned", "gpu", "STRICT_PACK")


def test_onprem_gpus_held_but_freeing_soon_keep_the_job_on_onprem_with_the_wait_said():
    fp = place(spec(TRAIN), FLEET, now(gpus_held=2, next_free_s=360))
    assert fp.nominee.cluster == "onprem" and fp.candidates[0].rank is Rank.OWNED_SOON
    assert "onprem gpu: 2 of 2 GPUs held, next frees in ~6 min" in fp.reasons


def test_onprem_gpus_held_for_long_the_second_training_job_goes_to_cloud_spot_scaling_from_zero():
    fp = place(spec(TRAIN), FLEET, now(gpus_held=2, next_free_s=3600), owned_soon_s=600)
    assert order(fp) == [("cloud", "gpu-spot"), ("cloud", "gpu"), ("onprem", "gpu")]
    assert fp.reasons[0] == "placed on cloud gpu-spot (rented)"
    assert "cloud gpu-spot: scale-up from 0 nodes, $2.10/h spot" in fp.reasons
    assert "cloud gpu: scale-up from 0 nodes, $6.98/h on demand" in fp.reasons
    assert "onprem gpu: 2 of 2 GPUs held, next frees in ~60 min: after rented capacity" in fp.reasons
    p = fp.placement()
    assert p.market == "SPOT" and p.label_selector == {"ray.io/node-group": "gpu-spot"}
    assert "market SPOT: the job tolerates losing nodes: rented spot first" in p.reasons
    assert not any("asked for explicitly" in r for r in p.reasons)  # the user asked nothing


def test_a_command_does_not_tolerate_spot_and_goes_to_rented_on_demand_only():
    fp = place(spec(CMD), FLEET, now(cpus_held=4))
    assert order(fp) == [("cloud", "cpu"), ("onprem", "cpu")]
    assert "onprem cpu: 4 of 4 CPUs held, no end expected: after rented capacity" in fp.reasons


def test_a_sweep_runs_on_cloud_spot_cpu_when_onprem_is_full_and_the_cheapest_first():
    cloud = {"spot-cpu": GroupNow(1, {"CPU": 4}, {"CPU": 1}), "cpu": GroupNow(0)}
    fp = place(spec(SWEEP), FLEET, now(cpus_held=4, cloud=cloud))
    assert order(fp)[:2] == [("cloud", "spot-cpu"), ("cloud", "cpu")]
    assert fp.candidates[0].reason.startswith("cloud spot-cpu: room now on 1 node, $0.")
    # ... and on onprem's cpu group while it has room.
    assert place(spec(SWEEP), FLEET, now()).nominee.group == "cpu"
    assert place(spec(SWEEP), FLEET, now()).nominee.cluster == "onprem"


def test_repeated_preemption_skips_cloud_spot():
    fp = place(spec(TRAIN), FLEET, now(gpus_held=2), avoid_spot=True)
    assert ("cloud", "gpu-spot") not in order(fp) and order(fp)[0] == ("cloud", "gpu")


def test_a_job_pinned_to_onprem_waits_there_with_a_reason():
    fp = place(spec(TRAIN, cluster="onprem"), FLEET, now(gpus_held=2))
    assert order(fp) == [("onprem", "gpu")] and fp.nominee.cluster == "onprem"
    assert "onprem gpu: 2 of 2 GPUs held, no end expected: after rented capacity" in fp.reasons
    assert order(place(spec(TRAIN, tier="rented"), FLEET, now())) == [("cloud", "gpu-spot"), ("cloud", "gpu")]


@pytest.mark.parametrize("pins,field,words", [
    ({"cluster": "mars"}, "placement.cluster", "no cluster 'mars' in fleet local-hybrid; its clusters: onprem, cloud"),
    ({"cluster": "onprem", "tier": "rented"}, "placement.tier", "onprem is owned"),
    ({"cluster": "cloud", "node_group": "nope"}, "placement.node_group", "no node group 'nope'"),
])
def test_a_pin_the_fleet_cannot_honour_is_refused_naming_the_field(pins, field, words):
    with pytest.raises(Unroutable) as e:
        place(spec(TRAIN, **pins), FLEET, now())
    assert e.value.field == field and words in e.value.message


def test_a_project_forbidden_to_rent_never_leaves_onprem():
    rent = RentPolicy(project="ml", may_rent=False)
    fp = place(spec(TRAIN), FLEET, now(gpus_held=2, next_free_s=7200), rent=rent)
    assert order(fp) == [("onprem", "gpu")]
    assert "cloud: project ml may not rent (RAYLANE_FLEET_NO_RENT_PROJECTS)" in fp.reasons
    with pytest.raises(Forbidden) as e:
        place(spec(TRAIN, tier="rented"), FLEET, now(), rent=rent)
    assert e.value.field == "placement.tier"
    with pytest.raises(Forbidden) as e:
        place(spec(TRAIN, cluster="cloud"), FLEET, now(), rent=rent)
    assert e.value.field == "placement.cluster"


def test_a_rented_spend_cap_blocks_what_would_pass_it_and_the_job_waits_on_owned():
    rent = RentPolicy(project="ml", cap_per_hour=3.0, spend_per_hour=0.5)
    fp = place(spec(TRAIN), FLEET, now(gpus_held=2), rent=rent)
    spot, od, owned = fp.candidates
    assert spot.blocked is None  # 0.5 + 2.10 <= 3
    assert od.blocked == "project ml's rented spend would be $7.48/h, over its cap of $3.00/h"
    assert fp.nominee is spot
    capped = place(spec(TRAIN), FLEET, now(gpus_held=2), rent=RentPolicy(project="ml", cap_per_hour=1.0))
    assert capped.nominee.cluster == "onprem"
    assert any(r.startswith("cloud gpu-spot: scale-up from 0 nodes") and "(blocked: project ml's" in r
               for r in capped.reasons)


def test_a_job_no_cluster_can_ever_run_is_refused_with_each_cluster_s_reason():
    big = {**TRAIN, "resources": {"num_workers": 4, "gpus_per_worker": 1, "cpus_per_worker": 1}}
    with pytest.raises(Unroutable) as e:
        place(spec(big), FLEET, now())
    assert e.value.message.startswith("onprem: ") and "; cloud: " in e.value.message
    assert e.value.field == "resources"


def test_without_a_live_view_owned_comes_first_by_the_fleet_alone():
    fp = place(spec(TRAIN), FLEET, None)
    assert order(fp) == [("onprem", "gpu"), ("cloud", "gpu-spot"), ("cloud", "gpu")]
    assert fp.reasons[1] == "onprem gpu: owned, no live view of it now; owned first"
    assert fp.reasons[2] == "cloud gpu-spot: no live view of it now, $2.10/h spot"


def test_a_single_cluster_fleet_places_as_the_router_does():
    from raylane.orchestrator.domain.profile import default_profile
    from raylane.orchestrator.domain.routing import route

    single = Fleet.single(default_profile())
    fp = place(spec(TRAIN), single)
    assert fp.nominee.group == route(spec(TRAIN), default_profile()).node_group


def busy_gpu(*queued: Queued, end_s: float = 300.0, runs: dict | None = None) -> dict:
    """onprem's gpu group held whole by one training job expected to end in ``end_s``,
    with ``queued`` nominated there ahead of anything placed now."""
    n = now(gpus_held=2, next_free_s=end_s)
    n["onprem"]["gpu"].holding = [Holding({"GPU": 2, "CPU": 2}, end_s)]
    n["onprem"]["gpu"].queued = list(queued)
    n["onprem"]["gpu"].runs = runs or {}
    return n


def queued_training(job_id: str, run_s: float | None, priority: int = 50) -> Queued:
    return Queued(job_id, priority, {"GPU": 2, "CPU": 2}, run_s)


def test_the_jobs_queued_ahead_on_owned_count_in_when_a_job_starts_there():
    # nothing ahead: it starts when the running job ends (5 min), within 10: it waits for onprem
    fp = place(spec(TRAIN), FLEET, busy_gpu(), owned_soon_s=600)
    assert fp.nominee.cluster == "onprem" and fp.candidates[0].rank is Rank.OWNED_SOON
    # one ahead for 3 min: it starts in 8 min, still within 10
    fp = place(spec(TRAIN), FLEET, busy_gpu(queued_training("01A", 180)), owned_soon_s=600)
    assert fp.nominee.cluster == "onprem", fp.reasons
    assert "onprem gpu: 2 of 2 GPUs held, 1 queued ahead (2 GPUs), starts in ~8 min (next frees in ~5 min)" \
        in fp.reasons
    # two ahead for an hour each: the same first end, but its start is 2 h away: it rents
    fp = place(spec(TRAIN), FLEET, busy_gpu(queued_training("01A", 3600), queued_training("01B", 3600)),
               owned_soon_s=600)
    assert fp.nominee.cluster == "cloud" and order(fp)[-1] == ("onprem", "gpu")
    assert "onprem gpu: 2 of 2 GPUs held, 2 queued ahead (4 GPUs), starts in ~125 min (next frees in ~5 min): " \
           "after rented capacity" in fp.reasons


def test_only_the_jobs_admitted_before_it_are_ahead_of_a_job():
    low, early = queued_training("01A", 3600, priority=20), queued_training("01B", 3600)
    # a job of higher priority is admitted before the low one, whenever it came
    assert expected_start({"GPU": 2}, busy_gpu(low, early)["onprem"]["gpu"], priority=80, job_id="01Z") == 300
    # among equals, by id (age): 01B is ahead of 01C, not of 01A
    g = busy_gpu(early)["onprem"]["gpu"]
    assert expected_start({"GPU": 2}, g, priority=50, job_id="01C") == 300 + 3600
    assert expected_start({"GPU": 2}, g, priority=50, job_id="01A") == 300
    # a job judged again is not ahead of itself
    assert expected_start({"GPU": 2}, g, priority=50, job_id="01B") == 300


def test_a_job_ahead_whose_run_is_unknown_makes_the_start_unforeseen():
    fp = place(spec(TRAIN), FLEET, busy_gpu(queued_training("01A", None)), owned_soon_s=600)
    assert fp.nominee.cluster == "cloud"
    assert any(r.startswith("onprem gpu: 2 of 2 GPUs held, 1 queued ahead (2 GPUs), next frees in ~5 min, "
                            "its start not foreseen") for r in fp.reasons), fp.reasons


def test_a_small_job_starts_as_soon_as_its_share_frees():
    g = GroupNow(1, {"GPU": 2, "CPU": 4}, {"GPU": 2, "CPU": 2},
                 holding=[Holding({"GPU": 1, "CPU": 1}, 600), Holding({"GPU": 1, "CPU": 1}, 60)])
    assert expected_start({"GPU": 1, "CPU": 1}, g) == 60  # the first GPU to free is enough
    assert expected_start({"GPU": 2, "CPU": 2}, g) == 600  # both are needed


def test_the_wait_budget_grows_with_how_long_the_job_s_kind_runs_on_owned():
    # 40 min to wait, a training job runs 2 h there: within half its run (RAYLANE_FLEET_OWNED_WAIT_SHARE 0.5)
    n = busy_gpu(end_s=2400, runs={"training": 7200})
    assert place(spec(TRAIN), FLEET, n, owned_soon_s=600, owned_wait_share=0.5).nominee.cluster == "onprem"
    # without the share, 40 min is past the 10 min of RAYLANE_FLEET_OWNED_SOON_S
    assert place(spec(TRAIN), FLEET, n, owned_soon_s=600, owned_wait_share=0.0).nominee.cluster == "cloud"
    # a kind with no past run there: the budget is RAYLANE_FLEET_OWNED_SOON_S alone
    n = busy_gpu(end_s=2400)
    assert place(spec(TRAIN), FLEET, n, owned_soon_s=600, owned_wait_share=0.5).nominee.cluster == "cloud"


def test_priority_scales_the_wait_budget_urgent_work_rents_patient_work_waits():
    # 100 min to wait for onprem; a training job runs 2 h there; RAYLANE_FLEET_OWNED_WAIT_SHARE 1:
    # priority 50 may wait 120 min, 80 only 48 min (0.4 of it), 20 192 min (1.6), 100 the 10 min alone.
    n = busy_gpu(end_s=6000, runs={"training": 7200})
    placed = {p: place(spec({**TRAIN, "priority": p}), FLEET, n, owned_soon_s=600, owned_wait_share=1.0)
              for p in (20, 50, 80, 100)}
    assert {p: fp.nominee.cluster for p, fp in placed.items()} == \
        {20: "onprem", 50: "onprem", 80: "cloud", 100: "cloud"}
    assert any("after rented capacity" in r for r in placed[80].reasons), placed[80].reasons
    # 150 min: past what priority 50 waits, within what 20 waits
    n = busy_gpu(end_s=9000, runs={"training": 7200})
    assert place(spec({**TRAIN, "priority": 50}), FLEET, n, owned_soon_s=600,
                 owned_wait_share=1.0).nominee.cluster == "cloud"
    assert place(spec({**TRAIN, "priority": 20}), FLEET, n, owned_soon_s=600,
                 owned_wait_share=1.0).nominee.cluster == "onprem"


def test_with_rented_spot_full_patient_work_waits_longer_for_owned_urgent_work_does_not():
    """Renting costs what the open rented capacity costs: with cloud's one spot GPU
    node taken, that is on demand ($6.98/h, 3.3x spot's $2.10), and a job of the
    default priority or below waits that much longer for onprem (the budget x 3.3);
    a job above it rents on demand as before."""
    n = busy_gpu(end_s=9000, runs={"training": 7200})  # 150 min to wait; priority 50 may wait 120 with spot open
    assert place(spec(TRAIN), FLEET, n, owned_soon_s=600, owned_wait_share=1.0).nominee.group == "gpu-spot"
    n["cloud"] = {"gpu-spot": GroupNow(1, {"GPU": 2, "CPU": 4}, {"GPU": 2, "CPU": 2})}  # max_nodes 1, all held
    fp = place(spec(TRAIN), FLEET, n, owned_soon_s=600, owned_wait_share=1.0)
    assert (fp.nominee.cluster, fp.nominee.rank) == ("onprem", Rank.OWNED_SOON), fp.reasons
    assert "worth a 3.3x longer wait" in fp.nominee.reason, fp.nominee.reason
    urgent = place(spec({**TRAIN, "priority": 80}), FLEET, n, owned_soon_s=600, owned_wait_share=1.0)
    assert (urgent.nominee.cluster, urgent.nominee.group) == ("cloud", "gpu"), urgent.reasons


def test_a_running_job_s_timeout_bounds_the_wait_and_says_so():
    n = now(gpus_held=2, next_free_s=300)
    n["onprem"]["gpu"].next_free_bound = True
    fp = place(spec(TRAIN), FLEET, n)
    assert fp.nominee.cluster == "onprem"
    assert "onprem gpu: 2 of 2 GPUs held, next frees within ~5 min (a running job's timeout)" in fp.reasons


def test_what_victims_free_for_a_preempting_job_is_its_not_room_for_another():
    """A preempted job placed again the moment its attempt ended finds its GPU free
    on onprem, but its preemptor (queued there, ``Queued.reclaiming``) is owed it: not
    room now; its start is after the others' runs, past its wait budget here, so it rents."""
    free_one = now(gpus_held=1, next_free_s=3600)
    gpu = free_one["onprem"]["gpu"]
    gpu.holding = [Holding({"GPU": 1, "CPU": 1}, 3600)]
    gpu.runs = {"training": 3600}
    # Without the preemptor, the freed GPU is room now for the 1-GPU victim.
    victim = spec({**TRAIN, "resources": {"num_workers": 1, "gpus_per_worker": 1, "cpus_per_worker": 1}})
    assert place(victim, FLEET, free_one, job_id="V").nominee.rank is Rank.OWNED_ROOM
    gpu.queued = [Queued("W", 50, {"GPU": 1, "CPU": 1}, 3600, reclaiming=True)]
    fp = place(victim, FLEET, free_one, job_id="V", owned_soon_s=600, owned_wait_share=0.5)
    assert (fp.nominee.cluster, fp.nominee.group) == ("cloud", "gpu-spot")
    assert "onprem gpu: what is free is owed to job W, which preempted for it, next frees in ~60 min: after rented capacity" in \
        " | ".join(fp.reasons), fp.reasons
    # The preemptor itself has its room.
    assert place(victim, FLEET, free_one, job_id="W").nominee.rank is Rank.OWNED_ROOM


def test_owned_gpus_free_by_the_sum_but_on_two_nodes_are_no_room_for_a_colocated_gang():
    def onprem(*gpus_free, known=True):
        return {"onprem": {"gpu": GroupNow(2, {"GPU": 4, "CPU": 8}, {"GPU": 4 - sum(gpus_free), "CPU": 2},
                                           next_free_s=3600,
                                           node_free=[{"GPU": g, "CPU": 3} for g in gpus_free] if known else None),
                           "cpu": GroupNow(1, {"CPU": 4})},
                "cloud": {}}

    fp = place(spec(TRAIN), FLEET, onprem(1, 1), owned_soon_s=600)
    assert fp.nominee.cluster == "cloud"
    assert ("onprem gpu: free by the sum, but no one node with room for its 2 co-located workers, "
            "next frees in ~60 min: after rented capacity") in fp.reasons
    # One node with both GPUs free, or Ray not saying per node: room now, as before.
    assert place(spec(TRAIN), FLEET, onprem(0, 2)).candidates[0].rank is Rank.OWNED_ROOM
    assert place(spec(TRAIN), FLEET, onprem(1, 1, known=False)).candidates[0].rank is Rank.OWNED_ROOM
    # A single-GPU job is no gang: the free GPU on either node is room now.
    one = spec({**TRAIN, "resources": {"num_workers": 1, "gpus_per_worker": 1, "cpus_per_worker": 1}})
    assert place(one, FLEET, onprem(1, 1)).candidates[0].rank is Rank.OWNED_ROOM
