"""A batch routes each shape of job once (``routing.route_many``).

Memoising is only right while the key holds everything the router reads: a
recording stand-in for the spec fails this file when ``route`` (or the lane rule
it calls) reads an attribute ``ROUTE_READS`` does not cover, and the memoised
placements are compared with routing each spec on its own.
"""

from __future__ import annotations

import itertools

import pytest
from pydantic import BaseModel

from raylane.orchestrator.domain.errors import Invalid
from raylane.orchestrator.domain.profile import default_profile
from raylane.orchestrator.domain.routing import ROUTE_READS, GroupState, Unroutable, route, route_key, route_many
from raylane.orchestrator.domain.specs import JobSpec

PROFILE = default_profile()
VIEW = {"cpu": GroupState(alive_nodes=1, total={"CPU": 4.0}),
        "spot-cpu": GroupState(alive_nodes=2, total={"CPU": 8.0})}  # no gpu node: a reason says so
SWEEP = {"metric": "loss", "num_samples": 6, "search_space": {"lr": {"choice": [1, 2]}}}
SECTIONS = {"sweep": {"sweep": SWEEP}, "batch_inference": {"batch": {"input_uri": "s3://b/in"}},
            "service": {"service": {"replicas": 2}}}


def variety() -> list[JobSpec]:
    """Specs across kinds, sizes, hints, lanes and runtime envs, two names each."""
    out = []
    shapes = [
        {"resources": {"cpus_per_worker": 0.25}},
        {"resources": {"num_workers": 3, "cpus_per_worker": 2}},
        {"resources": {"num_workers": 2, "gpus_per_worker": 1}},
        {"resources": {"gpus_per_worker": 1, "accelerator_type": "H100", "memory_gb_per_worker": 8}},
        {"resources": {"cpus_per_worker": 0.5}, "lane": "isolated"},
        {"resources": {"cpus_per_worker": 0.5}, "placement": {"node_group": "spot-cpu"}},
        {"placement": {"market": "ON_DEMAND"}},
        {"placement": {"market": "SPOT"}},
        {"resources": {"num_workers": 2, "gpus_per_worker": 1}, "placement": {"colocate": False}},
        {"runtime_env": {"working_dir": "raylane://packages/abc"}},
        {"runtime_env": {"working_dir": "raylane://packages/def", "env_vars": {"A": "1"}}},
        {"runtime_env": {"working_dir": "/srv/code"}},
        {"runtime_env": {"pip": ["numpy==2.0"]}},
        {"runtime_env": {"py_modules": ["s3://b/m.zip"]}},
    ]
    for kind, shape, name in itertools.product(
            ("command", "function", "training", "sweep", "batch_inference", "service"), shapes, ("a", "b")):
        entry = "true" if kind == "command" else "pkg.mod:fn"
        extra = dict(SECTIONS.get(kind, {}))
        if kind == "sweep" and name == "b":
            extra["sweep"] = {**SWEEP, "max_concurrent_trials": 2}
        try:
            out.append(JobSpec(name=name, kind=kind, entrypoint=entry, labels={"n": name}, **shape, **extra))
        except ValueError:
            continue  # a combination the spec refuses (a service with GPUs and a lane, say)
    return out


class Recorder:
    """Stands in for a spec (or one of its sections) and writes down what is read."""

    def __init__(self, obj, path: str, reads: set[str]):
        self._obj, self._path, self._reads = obj, path, reads

    def __getattr__(self, name):
        value = getattr(self._obj, name)
        path = f"{self._path}.{name}" if self._path else name
        self._reads.add(path)
        return Recorder(value, path, self._reads) if isinstance(value, BaseModel) else value


def covered(path: str) -> bool:
    """In the key, under a section in it, or a section on the way to one (``spec.sweep
    is not None``: the key's ``sweep.num_trials`` is None without a sweep)."""
    return any(path == p or path.startswith(p + ".") or p.startswith(path + ".") for p in ROUTE_READS)


def test_the_router_reads_nothing_its_memo_key_leaves_out():
    reads: set[str] = set()
    routed = 0
    for spec in variety():
        for fast_lane, avoid_spot, view in itertools.product((False, True), (False, True), (None, VIEW)):
            try:
                route(Recorder(spec, "", reads), PROFILE, view, fast_lane=fast_lane, avoid_spot=avoid_spot)
                routed += 1
            except Unroutable:
                pass
    assert routed > 200
    # What it reads at all (the recorder works), and nothing outside the key.
    assert {"kind", "resources.cpus_per_worker", "placement.node_group", "runtime_env.working_dir"} <= reads
    assert sorted(p for p in reads if not covered(p)) == []


@pytest.mark.parametrize("fast_lane", [False, True])
@pytest.mark.parametrize("view", [None, VIEW])
def test_a_batch_routed_once_a_shape_places_every_job_as_routing_each_would(fast_lane, view):
    specs = [s for s in variety() if _routable(s)]
    placements = route_many(specs, lambda s: route(s, PROFILE, view, fast_lane=fast_lane))
    assert [p.model_dump() for p in placements] == [route(s, PROFILE, view, fast_lane=fast_lane).model_dump()
                                                    for s in specs]
    # Names and labels do not change a route: jobs "a" and "b" of a shape share one
    # placement (sweeps excepted: "b" caps its trials)...
    pairs = [(p, q) for (s, p), (t, q) in zip(zip(specs, placements), zip(specs[1:], placements[1:]))
             if (s.name, t.name) == ("a", "b") and s.kind.value != "sweep"]
    assert len(pairs) > 60 and all(p is q for p, q in pairs)
    shared = {id(p) for p in placements}
    # ... and jobs that differ in what is read never do.
    by_key: dict[tuple, int] = {}
    for s, p in zip(specs, placements):
        assert by_key.setdefault(route_key(s), id(p)) == id(p)
    assert len(by_key) == len(shared)


def test_keys_differ_where_the_route_does():
    base = JobSpec(name="a", kind="command", entrypoint="true")
    changes = [{"kind": "function", "entrypoint": "pkg.mod:fn"}, {"lane": "isolated"}, {"resources": {"cpus_per_worker": 2}},
               {"placement": {"market": "SPOT"}}, {"runtime_env": {"pip": ["x"]}},
               {"runtime_env": {"working_dir": "s3://b/c.zip"}}, {"runtime_env": {"py_modules": ["s3://b/m.zip"]}}]
    keys = {route_key(JobSpec.model_validate({**base.model_dump(exclude_none=True), **c})) for c in changes}
    assert route_key(base) not in keys and len(keys) == len(changes)
    sweeps = [{**SWEEP}, {**SWEEP, "num_samples": 7}, {**SWEEP, "max_concurrent_trials": 2}]
    keys = {route_key(JobSpec(name="s", kind="sweep", entrypoint="m:f", sweep=sw)) for sw in sweeps}
    assert len(keys) == 3
    # What the router does not read keeps the key.
    same = JobSpec(name="other", kind="command", entrypoint="echo hi", labels={"x": "y"}, priority=90,
                   runtime_env={"env_vars": {"A": "1"}})
    assert route_key(same) == route_key(base)


def test_a_job_that_can_never_run_is_refused_with_its_index_in_the_batch():
    ok = JobSpec(name="a", kind="command", entrypoint="true")
    never = JobSpec(name="b", kind="command", entrypoint="true", resources={"gpus_per_worker": 8})
    with pytest.raises(Invalid) as e:
        route_many([ok, ok, never], lambda s: route(s, PROFILE))
    assert e.value.field == "jobs.2.resources" and e.value.message.startswith("jobs[2]: ")
    assert "GPU" in e.value.message


def _routable(spec: JobSpec) -> bool:
    try:
        route(spec, PROFILE)
        return True
    except Unroutable:
        return False


def test_a_grid_sweep_counts_every_combination_of_its_grid_as_a_trial():
    """Tune runs ``num_samples`` of each grid combination: a 4 x 3 grid sampled twice
    is 24 trials, and a cap of 8 at a time is 8, not ``num_samples`` (2)."""
    space = {"lr": {"grid": [1, 2, 3, 4]}, "bs": {"grid": [16, 32, 64]}, "wd": {"uniform": [0.0, 0.1]}}

    def sweep(**kw) -> JobSpec:
        return JobSpec(name="g", kind="sweep", entrypoint="m:f", resources={"cpus_per_worker": 1},
                       sweep={"metric": "loss", "num_samples": 2, "max_concurrent_trials": 8, "search_space": space,
                              **kw})

    capped = sweep()
    assert capped.sweep.num_trials == 24
    pl = route(capped, PROFILE, VIEW)
    assert pl.num_workers == 8 and pl.total["CPU"] == 8
    assert any("sweep of 24 independent trials" in r for r in pl.reasons)
    # No cap: as many at once as the group holds (spot-cpu: 8 CPUs live), not 2.
    assert route(sweep(max_concurrent_trials=None), PROFILE, VIEW).num_workers == 8
    # Routed alike only where the trial count is alike.
    fewer = sweep(search_space={"lr": space["lr"]})
    assert route_key(fewer) != route_key(capped) and route(fewer, PROFILE, VIEW).num_workers == 8
    assert route(sweep(num_samples=1, search_space={"lr": {"grid": [1, 2, 3]}}), PROFILE, VIEW).num_workers == 3
