"""A job's side of a drain: each checkpoint request (one more draining node of
the attempt) is seen once, read from Ray's key-value store at most once a second."""

from __future__ import annotations

import json

from raylane.jobs import base
from raylane.orchestrator.domain import ids, protocol


def test_each_request_is_seen_once_and_the_store_is_read_at_most_once_a_second(monkeypatch):
    from ray.experimental import internal_kv

    store: dict[tuple[str, str], bytes] = {}
    reads = []
    now = [100.0]

    def get(key, namespace=None):
        reads.append(key)
        return store.get((key, namespace))

    monkeypatch.setattr(internal_kv, "_internal_kv_initialized", lambda: True)
    monkeypatch.setattr(internal_kv, "_internal_kv_get", get)
    monkeypatch.setattr(base.time, "monotonic", lambda: now[0])
    monkeypatch.setattr(base, "_signal", None)  # put back after the test
    sid = ids.submission_id("01job", 1)
    base.watch_checkpoint_requests(sid)

    def tick():
        now[0] += base.CheckpointSignal.CHECK_EVERY_S
        return base.checkpoint_requested()

    assert not tick()  # nothing asked
    key = (protocol.checkpoint_key(sid), protocol.KV_NAMESPACE)
    store[key] = json.dumps({"nodes": ["a"], "reason": "node a is draining"}).encode()
    assert base.checkpoint_requested() is False and len(reads) == 1  # within the second: not read again
    assert tick() and not tick() and not tick()  # seen once
    store[key] = json.dumps({"nodes": ["a", "b"], "reason": "node b is draining"}).encode()
    assert tick() and not tick()  # a second draining node: a new request, seen once
    base.watch_checkpoint_requests(sid)  # a new trial of the sweep sees the standing request once
    assert tick() and not tick()


def test_outside_a_job_nothing_is_requested(monkeypatch):
    monkeypatch.setattr(base, "_signal", None)
    assert base.checkpoint_requested() is False
