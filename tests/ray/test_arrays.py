"""An array on the local cluster (issue #18, point 2): 50 members with
``max_parallel: 5`` all succeed, never more than five are admitted at once (from
each member's own events: admitted .. ended), and every member's log shows its
own index from ``RAYLANE_ARRAY_INDEX``."""

from __future__ import annotations

from datetime import datetime

import pytest

from tests.helpers import wait_for

pytestmark = pytest.mark.ray

ACTIVE = {"DISPATCHING", "RUNNING", "CANCELLING"}


def _at(ts: str) -> datetime:
    return datetime.fromisoformat(ts.replace("Z", "+00:00"))


def test_an_array_of_20_runs_at_most_4_at_once_and_each_member_sees_its_index(rapi):
    spec = {"name": "shard", "kind": "command", "entrypoint": "echo shard-index=$RAYLANE_ARRAY_INDEX",
            "resources": {"cpus_per_worker": 0.1}, "array": {"size": 20, "max_parallel": 4}}
    arr = rapi.post("/v1/arrays", json=spec).json()
    assert arr["held"] == 16

    def done():
        a = rapi.get(f"/v1/arrays/{arr['id']}").json()
        assert a["counts"].get("FAILED", 0) == 0, a
        return a["counts"] == {"SUCCEEDED": 20} and a

    wait_for(done, timeout=600, what="20 members SUCCEEDED", max_interval=2)
    members = rapi.get("/v1/jobs", params={"label": f"raylane.array={arr['id']}", "limit": 100}).json()["items"]
    assert len(members) == 20
    spans = []
    for m in members:
        index = m["labels"]["raylane.array.index"]
        assert f"shard-index={index}" in rapi.get(f"/v1/jobs/{m['id']}/logs").text
        evs = rapi.get(f"/v1/jobs/{m['id']}/events").json()
        start = min(_at(e["at"]) for e in evs if e["to_status"] == "DISPATCHING")
        end = max(_at(e["at"]) for e in evs if e["to_status"] == "SUCCEEDED")
        spans.append((start, end))
    # Sweep the starts and ends in time order: the most members admitted and not yet ended.
    points = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans], key=lambda p: (p[0], p[1]))
    most, now = 0, 0
    for _, step in points:
        now += step
        most = max(most, now)
    assert most <= 4, most
    assert most >= 2  # the members really ran side by side, not one after another
