"""The job-kind traits table is the only place a kind's behaviour is written.

A test kind, ``probe``, exists only as a row registered in ``kinds.KINDS`` for
one test (no ``JobKind`` member, no runner). Routing, admission (``needed``) and
accounting (``cheaper_placements``) must decide for it exactly as they decide for
the built-in kind whose traits it copies, and flipping one trait of its row must
flip their decision: nothing else about the kind is read.
"""

from __future__ import annotations

import dataclasses
import importlib.util
from datetime import datetime, timedelta, timezone

import pytest

from raylane.orchestrator.domain import costs
from raylane.orchestrator.domain.costs import AttemptUsage
from raylane.orchestrator.domain.kinds import KINDS, KindTraits, UnknownKind, traits
from raylane.orchestrator.domain.profile import default_profile
from raylane.orchestrator.domain.routing import route
from raylane.orchestrator.domain.specs import JobKind, JobSpec
from raylane.orchestrator.loops.admission import needed

PROFILE = default_profile()
T0 = datetime(2026, 3, 2, tzinfo=timezone.utc)


@pytest.fixture
def probe(monkeypatch):
    """Register the test kind ``probe`` as a copy of a row, with traits changed."""

    def register(like: str, **changed) -> KindTraits:
        row = dataclasses.replace(KINDS[like], name="probe", **changed)
        monkeypatch.setitem(KINDS, "probe", row)
        return row

    return register


def as_kind(spec: JobSpec, kind: str) -> JobSpec:
    # A copy is not validated again: the spec's schema knows JobKind, the readers only the table.
    return spec.model_copy(update={"kind": kind})


SECTIONS = {"sweep": {"metric": "loss", "num_samples": 6, "search_space": {"lr": {"choice": [1, 2]}}},
            "batch": {"input_uri": "s3://b/in", "output_uri": "s3://b/out"}}


def cpu_spec(kind: str) -> JobSpec:
    row = traits(kind)
    section = {row.section: SECTIONS[row.section]} if row.section in SECTIONS else {}
    return JobSpec(name="p", kind=kind, entrypoint="pkg.mod:fn" if row.runner else "true",
                   resources={"num_workers": 4, "cpus_per_worker": 1}, **section)


def gpu_spec() -> JobSpec:
    return JobSpec(name="p", kind="command", entrypoint="true",
                   resources={"num_workers": 2, "gpus_per_worker": 1, "cpus_per_worker": 1})


def decisions(spec: JobSpec) -> dict:
    """What routing and admission decide, without the words that name the kind."""
    pl = route(spec, PROFILE)
    return {"placement": pl.model_dump(exclude={"reasons"}), "needed": needed(spec, pl)}


# The table itself ------------------------------------------------------------------


def test_every_kind_of_the_schema_has_one_row_and_every_row_a_kind():
    assert {k.value for k in JobKind} == set(KINDS)
    assert all(name == row.name for name, row in KINDS.items())


def test_every_runner_module_exists_and_every_section_is_a_spec_field():
    for row in KINDS.values():
        if row.runner:
            assert importlib.util.find_spec(row.runner) is not None, row.runner
        if row.section:
            assert row.section in JobSpec.model_fields, row.section
            # The spec looks for a kind's section only among these (JobSpec._kind_sections).
            assert row.section in JobSpec._section_fields, row.section


def test_an_unknown_kind_is_refused_with_the_known_ones():
    with pytest.raises(UnknownKind, match="no job kind 'nope'; kinds are: training, sweep"):
        traits("nope")
    assert traits(JobKind.SWEEP) is traits("sweep") is KINDS["sweep"]


# A one-row test kind ---------------------------------------------------------------


@pytest.mark.parametrize("like", list(KINDS))
def test_a_copied_row_decides_as_its_kind_for_routing_and_admission(probe, like):
    probe(like)
    for spec in (cpu_spec(like), gpu_spec().model_copy(update={"kind": JobKind(like)})):
        assert decisions(as_kind(spec, "probe")) == decisions(spec)


def test_spot_first_decides_the_market(probe):
    spec = as_kind(cpu_spec("command"), "probe")
    probe("command", spot_first=True)
    assert route(spec, PROFILE).node_group == "spot-cpu"
    probe("command", spot_first=False)
    assert route(spec, PROFILE).node_group == "cpu"


def test_strategy_decides_co_location_and_spread(probe):
    spec = as_kind(gpu_spec(), "probe")
    probe("command", strategy="STRICT_PACK")
    pl = route(spec, PROFILE)
    assert pl.colocate and pl.strategy == "STRICT_PACK"
    probe("command", strategy="SPREAD")
    pl = route(spec, PROFILE)
    assert not pl.colocate and pl.strategy == "SPREAD"


def test_a_runner_decides_where_the_driver_runs_and_what_it_holds(probe):
    spec = as_kind(cpu_spec("command"), "probe")
    probe("command", spot_first=True, runner=None)
    pl = route(spec, PROFILE)  # the command is its own driver: on spot, holding a worker's room
    assert pl.driver_label_selector == pl.label_selector and pl.driver_resources == {"CPU": 1}
    probe("command", spot_first=True, runner="raylane.jobs.sweep")
    pl = route(spec, PROFILE)  # a runner's driver stays off spot with its own small share
    assert pl.driver_market == "ON_DEMAND" and pl.driver_resources == {"CPU": spec.resources.driver_cpus}


def test_elastic_decides_what_admission_needs(probe):
    spec = as_kind(cpu_spec("command"), "probe")
    probe("command", elastic=True)
    pl = route(spec, PROFILE)
    assert needed(spec, pl) == {"CPU": 1 + spec.resources.driver_cpus}  # one worker, and its driver here
    probe("command", elastic=False)
    assert needed(spec, route(spec, PROFILE)) == {"CPU": 4}  # the whole gang (a command is its own driver)


def _on_demand_cpu(kind: str) -> AttemptUsage:
    return AttemptUsage(job_id="j", project="p", kind=kind, name="j", number=1, node_group="cpu", market="ON_DEMAND",
                        resources={"CPU": 4}, status="SUCCEEDED", cause=None, created_at=T0, started_at=T0,
                        ended_at=T0 + timedelta(hours=5), spec={"entrypoint": "true"})


def _gpu_command(kind: str) -> AttemptUsage:
    return dataclasses.replace(_on_demand_cpu(kind), node_group="gpu", resources={"CPU": 1, "GPU": 1},
                               spec={"entrypoint": "python -c 'print(42)'"})


def findings(usage: AttemptUsage) -> list[str]:
    items = costs.costs([usage], PROFILE, start=T0, end=T0 + timedelta(hours=10), now=T0 + timedelta(hours=10))
    return [c["finding"] for c in costs.cheaper_placements(items, PROFILE)]


@pytest.mark.parametrize("like", ["sweep", "command", "training"])
def test_a_copied_row_decides_as_its_kind_for_costs(probe, like):
    probe(like)
    for make in (_on_demand_cpu, _gpu_command):
        assert findings(make("probe")) == findings(make(like))


def test_cost_basis_decides_the_cheaper_placement(probe):
    probe("training", cost_basis="spot")
    assert findings(_on_demand_cpu("probe")) == ["elastic_on_demand"]
    assert findings(_gpu_command("probe")) == []
    probe("training", cost_basis="entrypoint")
    assert findings(_on_demand_cpu("probe")) == []
    assert findings(_gpu_command("probe")) == ["gpu_unused"]
    probe("training", cost_basis="held")
    assert findings(_on_demand_cpu("probe")) == findings(_gpu_command("probe")) == []


def test_the_api_lists_every_row_with_what_a_user_cares_about(api, probe):
    probe("sweep", summary="a test kind")
    kinds = {k["name"]: k for k in api.get("/v1/kinds").json()}
    assert list(kinds) == list(KINDS) and "probe" in kinds  # a new row reaches the UI with nothing else
    assert kinds["probe"]["summary"] == "a test kind" and kinds["probe"]["elastic"] is True
    assert kinds["command"]["entrypoint"] == "shell command" and kinds["training"]["entrypoint"] == "import path"
    assert kinds["sweep"]["section"] == "sweep" and kinds["sweep"]["checkpoints"] is True
    assert "runner" not in kinds["training"]  # a module path inside Ray is not the user's business
