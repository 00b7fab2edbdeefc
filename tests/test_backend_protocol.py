"""The backend Protocols of ``backends.base`` and who implements them: Ray's own
backends (``RayJobsBackend`` over the Jobs API, ``RayGcs`` over the GCS,
``LaneBackend`` for the warm lanes) and the in-memory ``FakeRay`` the fast tests
use. Each implementation has every member with the Protocol's parameters, so a
test against the fake exercises the calls the loops make on Ray."""

from __future__ import annotations

import inspect

import pytest

from raylane.orchestrator.backends.base import AttemptBackend, RayBackend, RayKV
from raylane.orchestrator.backends.lanes import LaneBackend
from raylane.orchestrator.backends.ray_gcs import RayGcs
from raylane.orchestrator.backends.ray_jobs import RayJobsBackend
from raylane.orchestrator.testing import FakeRay, MemoryGcs

ATTRIBUTES = {"gcs", "reachability"}  # instance attributes, set in __init__


def _members(proto) -> list[str]:
    return sorted(n for n in dir(proto) if not n.startswith("_") and n not in ATTRIBUTES)


def _params(fn) -> list[tuple[str, object]]:
    return [(p.name, p.kind) for p in list(inspect.signature(fn).parameters.values())[1:]]


@pytest.mark.parametrize("proto, impl", [
    (RayBackend, RayJobsBackend), (RayBackend, FakeRay),
    (RayKV, RayGcs), (RayKV, MemoryGcs),
    (AttemptBackend, LaneBackend),
])
def test_each_implementation_has_every_member_with_the_protocols_parameters(proto, impl):
    for name in _members(proto):
        assert hasattr(impl, name), f"{impl.__name__} lacks {proto.__name__}.{name}"
        want, got = _params(getattr(proto, name)), _params(getattr(impl, name))
        # An implementation may take more (keyword) arguments, never fewer or others.
        assert got[:len(want)] == want, f"{impl.__name__}.{name}{got} is not {proto.__name__}.{name}{want}"


def test_the_fake_and_rays_backend_are_both_ray_backends_and_two_fakes_are_two_clusters():
    assert isinstance(FakeRay(), RayBackend) and isinstance(RayJobsBackend("http://ray.invalid"), RayBackend)
    assert isinstance(FakeRay().gcs, RayKV) and isinstance(LaneBackend(FakeRay()), AttemptBackend)
    owned, rented = FakeRay(name="owned"), FakeRay(name="rented")
    owned.submit(submission_id="raylane-01a-1", entrypoint="true", runtime_env=None, metadata={})
    assert rented.get("raylane-01a-1") is None and owned.get("raylane-01a-1").status == "PENDING"
    assert set(owned.node_ids("cpu")).isdisjoint(rented.node_ids("cpu"))
    owned.down = True  # an outage of one cluster is that cluster's
    assert not owned.ping() and rented.ping()
    assert owned.reachability.now().state == "unreachable" and rented.reachability.now().state == "reachable"
