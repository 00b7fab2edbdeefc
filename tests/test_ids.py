"""Job ids: ULIDs minted here, checked against python-ulid's encoding and order."""

from __future__ import annotations

import os
import threading
import time

from ulid import ULID

from raylane.orchestrator.domain import ids


def test_the_encoding_is_the_ulid_specs_in_lower_case():
    values = [0, 1, 1023, 1 << 80, (1 << 80) - 1, (1 << 128) - 1]
    values += [int.from_bytes(os.urandom(16), "big") for _ in range(2000)]
    for v in values:
        assert ids.encode(v) == str(ULID.from_int(v)).lower(), hex(v)


def test_ids_carry_the_time_they_were_minted_and_sort_in_minting_order():
    before = time.time()
    minted = [ids.new_job_id() for _ in range(50)] + ids.new_job_ids(1000) + [ids.new_job_id()] + ids.new_job_ids(3)
    after = time.time()
    assert minted == sorted(minted) and len(set(minted)) == len(minted)
    for i in minted:
        assert len(i) == 26 and i == i.lower()
        assert before - 0.002 <= ULID.from_str(i.upper()).timestamp <= after + 0.002
    assert ids.new_job_ids(0) == []
    # The bench's generator: an id of a given millisecond.
    assert ULID.from_str(ids.new_job_id(1_700_000_000_123).upper()).milliseconds == 1_700_000_000_123


def test_threads_minting_at_once_never_share_an_id_and_each_sees_its_ids_in_order():
    out: list[list[str]] = [[] for _ in range(4)]

    def mint(k):
        for j in range(500):
            out[k].extend(ids.new_job_ids(j % 7) if j % 2 else [ids.new_job_id()])

    threads = [threading.Thread(target=mint, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    every = [i for o in out for i in o]
    assert len(set(every)) == len(every)
    assert all(o == sorted(o) for o in out)


def test_a_millisecond_that_runs_out_goes_on_in_the_next_and_a_clock_going_back_is_not_followed(monkeypatch):
    ms = 1_800_000_000_000
    monkeypatch.setattr(ids.time, "time_ns", lambda: ms * 1_000_000)
    monkeypatch.setattr(ids, "_last", [ms, ids._RANDOM_MAX - 2])
    run = ids.new_job_ids(5)
    assert [ULID.from_str(i.upper()).milliseconds for i in run] == [ms + 1] * 5
    assert run == sorted(run)
    # The clock steps back: ids go on from the last one, still in order.
    monkeypatch.setattr(ids.time, "time_ns", lambda: (ms - 1000) * 1_000_000)
    later = ids.new_job_id()
    assert later > run[-1] and ULID.from_str(later.upper()).milliseconds == ms + 1


def test_a_forked_child_does_not_go_on_from_its_parents_last_id():
    import multiprocessing

    ids.new_job_id()
    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(1) as pool:
        state = pool.apply(_child_state)
    assert state == [-1, 0]


def _child_state():
    return list(ids._last)


def test_a_run_of_ids_is_each_id_encoded_alone_across_every_carry():
    """``encode_run`` encodes a run's shared digits once: across a carry into them
    (2**30, 2**40 and the timestamp's own boundary) it must still give each id."""
    from raylane.orchestrator.domain.ids import encode, encode_run

    for base in (0, (1 << 30) - 3, (5 << 80) | ((1 << 40) - 2), (7 << 80) - 4, (1 << 128) - 8, 123456789 << 80):
        n = 7
        assert encode_run(base, n) == [encode(base + i) for i in range(n)]
