"""Which jobs take a warm lane (``domain.lanes.decide``) and what the router says: no Ray."""

from __future__ import annotations

import pytest

from raylane.orchestrator.domain import lanes
from raylane.orchestrator.domain.lanes import LaneStatus
from raylane.orchestrator.domain.profile import default_profile
from raylane.orchestrator.domain.routing import route
from raylane.orchestrator.domain.specs import JobSpec


def spec(**kw) -> JobSpec:
    return JobSpec(**{"name": "s", "kind": "command", "entrypoint": "true", **kw})


def test_a_small_command_takes_the_lane_with_its_reason():
    ok, why = lanes.decide(spec(), enabled=True)
    assert ok and why == "fast lane: a 1-CPU command runs in the group's warm lane, no Ray job of its own"
    assert lanes.decide(spec(resources={"cpus_per_worker": 0.5}), enabled=True)[0]
    assert lanes.decide(spec(runtime_env={"env_vars": {"A": "1"}}), enabled=True)[0]
    ok, why = lanes.decide(spec(kind="function", entrypoint="json:dumps", args={"obj": 1}), enabled=True)
    assert ok and why.startswith("fast lane: a 1-CPU function")


@pytest.mark.parametrize("kw, reason", [
    ({"resources": {"cpus_per_worker": 2}}, "Ray job: asks for 2 CPUs (the fast lane takes ≤ 1)"),
    ({"lane": "isolated"}, "Ray job: the spec asks for lane: isolated"),
    ({"resources": {"num_workers": 2}}, "Ray job: asks for 2 workers (the fast lane takes one)"),
    ({"resources": {"gpus_per_worker": 1}}, "Ray job: asks for GPUs (the fast lane takes CPU-only jobs)"),
    ({"runtime_env": {"working_dir": "/srv/code"}}, "Ray job: its runtime_env.working_dir is a directory on the "
     "server, packed afresh for each job (a warm lane takes uploaded packages and URIs, which name their contents)"),
    ({"runtime_env": {"working_dir": "s3://b/x.zip", "py_modules": ["s3://b/m.zip", "/srv/mod"]}},
     "Ray job: its runtime_env.py_modules is a directory on the server, packed afresh for each job (a warm lane "
     "takes uploaded packages and URIs, which name their contents)"),
    ({"kind": "training", "entrypoint": "m:f"}, "Ray job: kind training needs a driver of its own (the fast lane takes command, function)"),
])
def test_ineligible_jobs_say_why(kw, reason):
    assert lanes.decide(spec(**kw), enabled=True) == (False, reason)


def test_a_runtime_env_of_packages_and_pip_takes_a_lane_of_its_own():
    pkg = "raylane://packages/" + "ab" * 32
    env = {"working_dir": pkg, "pip": ["emoji==2.0"], "env_vars": {"A": "1"}}
    ok, why = lanes.decide(spec(runtime_env=env), enabled=True)
    key = lanes.env_key({"working_dir": pkg, "pip": ["emoji==2.0"]})
    assert ok and why == (f"fast lane: a 1-CPU command runs in the group's warm lane for its runtime env "
                          f"(working_dir, pip; lane env {key}), no Ray job of its own")
    pl = route(spec(runtime_env=env), default_profile(), fast_lane=True)
    assert pl.lane == pl.node_group and pl.lane_env == key and len(key) == lanes.ENV_KEY_CHARS
    # env_vars go with each job: they make no env of their own; the same code is the same env, other code another.
    assert route(spec(runtime_env={"env_vars": {"A": "1"}}), default_profile(), fast_lane=True).lane_env is None
    assert route(spec(runtime_env={**env, "env_vars": {"B": "2"}}), default_profile(), fast_lane=True).lane_env == key
    other = route(spec(runtime_env={"working_dir": "raylane://packages/" + "cd" * 32}), default_profile(),
                  fast_lane=True)
    assert other.lane_env not in (None, key)
    # Its keys are its env's own: a host of the node's own environment (or of the first release) lists none of them.
    assert not lanes.todo_key("cpu", "s", key).startswith(lanes.todo_prefix("cpu"))
    assert lanes.todo_key("cpu", "s", key).startswith(lanes.todo_prefix("cpu", key))
    assert lanes.host_key("cpu", "n" * 20, key) not in (lanes.host_key("cpu", "n" * 20), lanes.host_key("cpu", key))
    sid = lanes.host_submission_id("cpu", 3, "n" * 20, key)
    assert sid == f"raylane-lane-v1-cpu-nnnnnnnn-e{key[:lanes.HOST_ID_ENV_CHARS]}-3" and int(sid.rsplit("-", 1)[1]) == 3


def test_the_lane_is_off_unless_enabled():
    assert lanes.decide(spec(), enabled=False) == (False, "Ray job: the fast lane is off (RAYLANE_FAST_LANE)")


def test_router_records_the_lane_and_why():
    p = default_profile()
    pl = route(spec(), p, fast_lane=True)
    assert pl.lane == pl.node_group and pl.fallback_node_groups == []
    assert pl.reasons[-1].startswith("fast lane: ")
    assert not any(r.startswith("falls back to") for r in pl.reasons)
    big = route(spec(resources={"cpus_per_worker": 2}), p, fast_lane=True)
    assert big.lane is None and big.reasons[-1] == "Ray job: asks for 2 CPUs (the fast lane takes ≤ 1)"
    # Off: the placement is what it always was, reasons included.
    assert route(spec(), p) == route(spec(), p, fast_lane=False) and route(spec(), p).lane is None
    assert not any("lane" in r for r in route(spec(), p).reasons)


def test_lane_status_round_trips_and_keys_are_per_attempt():
    st = LaneStatus("RUNNING", group="cpu", host="raylane-lane-cpu-1", pid=12, start_time=1)
    assert LaneStatus.decode(st.encode()) == st
    assert lanes.todo_key("cpu", "raylane-x-1").startswith(lanes.todo_prefix("cpu"))
    assert lanes.stop_key("raylane-x-1").startswith(lanes.STOP_PREFIX)
    assert lanes.decode_item(lanes.encode_item("sid", "echo hi", {"A": "1"})) == {
        "v": lanes.PROTOCOL_VERSION, "sid": "sid", "command": "echo hi", "env": {"A": "1"}}


def test_what_a_host_lists_or_is_known_by_carries_the_protocol_version_and_records_say_theirs():
    v = f"v{lanes.PROTOCOL_VERSION}"
    # A host of another version lists other todo keys and is found under another host key, by another id.
    assert lanes.todo_prefix("cpu") == f"lane/{v}/cpu/todo/" and lanes.host_key("cpu") == f"lane/{v}/host/cpu"
    assert lanes.host_submission_id("cpu", 3) == f"raylane-lane-{v}-cpu-3"
    # The per-attempt keys are every version's: one claim rules an attempt whoever dispatched it.
    assert [lanes.claim_key("s"), lanes.status_key("s"), lanes.stop_key("s")] == [
        "lane/claim/s", "lane/a/s/status", "lane/stop/s"]
    # What they hold says its version; records from before the field are version 1 (the same format).
    assert LaneStatus.decode(LaneStatus("RUNNING").encode()).v == lanes.PROTOCOL_VERSION
    assert LaneStatus.decode(b'{"status": "RUNNING", "v": 7}').v == 7
    assert LaneStatus.decode(b'{"status": "RUNNING", "group": "cpu"}') == LaneStatus("RUNNING", group="cpu", v=1)
    assert lanes.version_of(lanes.decode_item(lanes.encode_item("s", "true", {}))) == lanes.PROTOCOL_VERSION
    assert lanes.version_of({"sid": "s", "command": "true", "env": {}}) == 1


def test_a_lost_lane_host_is_retried_as_lost_or_node_loss():
    from raylane.orchestrator.backends.ray_jobs import RayJob, RayNode
    from raylane.orchestrator.domain.states import CAUSES, FailureCause
    from raylane.orchestrator.loops.classify import classify

    def node(state):
        return RayNode(node_id="n1", state=state, labels={"ray.io/market-type": "ON_DEMAND"}, resources_total={},
                       is_head=False, death_reason=None, death_message="killed", draining=False)

    rj = RayJob("raylane-j-1", "FAILED", "lane host raylane-lane-cpu-1 ended (FAILED: ...)", lanes.HOST_LOST,
                1, 2, "n1", None, {})
    cause, msg = classify(rj, {"n1": node("ALIVE")})
    assert cause is FailureCause.LOST and "raylane-lane-cpu-1" in msg
    assert classify(rj, {"n1": node("DEAD")})[0] is FailureCause.NODE_LOST
    assert CAUSES[FailureCause.LOST].retried and CAUSES[FailureCause.NODE_LOST].retried
