"""The loops' side of a warm lane, on SQLite and PostgreSQL, against the
in-memory stand-ins for Ray's KV store and Jobs API of tests/test_lane_backend.py:
an attempt cancelled before it was recorded as submitted leaves no lane keys
behind but its claim, and an error in a dispatch pass is the error raised,
with the lane attempts it queued recorded all the same."""

from __future__ import annotations

import pytest

from raylane.orchestrator.backends.lanes import LaneBackend
from raylane.orchestrator.domain import lanes
from raylane.orchestrator.domain.ids import submission_id
from raylane.orchestrator.domain.profile import default_profile
from raylane.orchestrator.domain.routing import route
from raylane.orchestrator.domain.specs import JobSpec
from raylane.orchestrator.domain.states import AttemptStatus, JobStatus
from raylane.orchestrator.loops.dispatcher import Dispatcher
from raylane.orchestrator.loops.reconciler import Reconciler
from raylane.orchestrator.store import db, jobs as store, lifecycle
from tests.test_lane_backend import Ray
from tests.test_scheduler import view


class Cluster(Ray):
    """Ray as both backends see it: the Jobs API, the KV store, the cluster's groups."""

    def __init__(self):
        super().__init__()
        self.stopped: list[str] = []

    def cluster_view(self):
        return view()

    def stop(self, sid):
        self.stopped.append(sid)
        return True

    def forget_inputs(self, sid):
        pass

    def get_many(self, sids):
        return {sid: self.jobs.get(sid) for sid in sids}


@pytest.fixture
def lane(settings, monkeypatch):
    from raylane.orchestrator.services.controlplane import ControlPlane

    monkeypatch.setattr("raylane.orchestrator.backends.lane_hosts.HOST_CHECK_S", 0.0)
    settings = settings.model_copy(update={"fast_lane": True})
    plane = ControlPlane(settings)
    profile = default_profile()
    plane.router = lambda spec: route(spec, profile, fast_lane=True)
    plane.ray = Cluster()
    plane.lanes = LaneBackend(plane.ray, idle_s=5, slots=2)
    plane.dispatcher = Dispatcher(settings, plane.sessions, plane.ray, profile, lanes=plane.lanes)
    yield plane
    plane.close()


def submit(plane, name: str) -> str:
    job, _ = plane.submit(JobSpec(name=name, kind="command", entrypoint="true"), project="default", actor="t")
    assert job.placement.lane == "cpu"
    return job.id


def keys_of(plane, sid: str) -> dict[str, bytes]:
    return {k: v for k, v in plane.ray.gcs.d.items() if sid in k}


def cancel_before_record(plane, claimed) -> None:
    """What a user's cancel and the reconciler do while the dispatcher is between
    queueing the attempt and recording it."""
    with db.transaction(plane.sessions) as s:
        store.cancel(s, claimed.job_id, project=None)
    with db.transaction(plane.sessions) as s:
        assert lifecycle.cancelled_before_submit(s, claimed.job_id, claimed.attempt)


def test_an_attempt_cancelled_before_it_was_recorded_leaves_only_its_claim(lane):
    jid = submit(lane, "c")
    sid = submission_id(jid, 1)
    lane.dispatcher.after_submit_hook = lambda c: cancel_before_record(lane, c)
    lane.dispatcher.run_once()
    assert lane.get(jid, project=None).status is JobStatus.CANCELLED
    # No host took it: taken here, it never runs, and nothing of it is left but the tombstone.
    assert keys_of(lane, sid) == {lanes.claim_key(sid): lanes.FORGOTTEN}


def test_one_a_host_already_runs_is_stopped_and_its_host_deletes_its_keys_when_done(lane):
    jid = submit(lane, "r")
    sid = submission_id(jid, 1)
    host = lanes.host_submission_id("cpu", 1)

    def host_took_it_then_cancel(c):
        gcs = lane.ray.gcs
        gcs.kv_put(lanes.claim_key(sid), host.encode(), overwrite=False)
        gcs.kv_del(lanes.todo_key("cpu", sid))
        gcs.kv_put(lanes.status_key(sid), lanes.LaneStatus("RUNNING", group="cpu", host=host).encode())
        cancel_before_record(lane, c)

    lane.dispatcher.after_submit_hook = host_took_it_then_cancel
    lane.dispatcher.run_once()
    # Its host is asked to stop it; the claim says forgotten, which the host reads after its last write
    # (tests/test_lane_host.py: it then deletes what it wrote, the stop request too).
    assert keys_of(lane, sid) == {lanes.claim_key(sid): lanes.FORGOTTEN, lanes.stop_key(sid): b"1"}


def test_a_job_cancelled_after_its_dispatcher_died_mid_submit_leaves_only_its_claim(lane, settings):
    jid = submit(lane, "d")
    sid = submission_id(jid, 1)
    (claimed,) = lane.dispatcher.claim(view())
    lane.lanes.submit(submission_id=sid, group="cpu", command="true", env={})  # ... and the dispatcher died
    with db.transaction(lane.sessions) as s:
        store.cancel(s, jid, project=None)
    Reconciler(settings, lane.sessions, lane.ray, lanes=lane.lanes).run_once()
    assert lane.get(jid, project=None).status is JobStatus.CANCELLED
    assert keys_of(lane, sid) == {lanes.claim_key(sid): lanes.FORGOTTEN}
    assert lane.ray.stopped == []  # no Ray job of its own to stop


class Broken(Exception):
    pass


def test_an_error_in_a_pass_is_the_one_raised_and_the_lane_attempts_it_queued_are_recorded(lane):
    first, second = submit(lane, "a"), submit(lane, "b")

    def after_submit(c):
        if c.job_id == second:
            raise Broken("the pass broke here")

    def on_submitted():
        raise RuntimeError("recording's own hook failed too")

    lane.dispatcher.after_submit_hook = after_submit
    lane.dispatcher.on_submitted = on_submitted
    with pytest.raises(Broken, match="the pass broke here"):
        lane.dispatcher.run_once()
    with db.transaction(lane.sessions) as s:
        assert lifecycle._attempt_status(s, first, 1) is AttemptStatus.SUBMITTED


def test_the_sweep_deletes_lane_keys_of_attempts_ended_past_their_keep_and_resumes_from_its_mark(
        lane, settings, monkeypatch):
    """A claim is a tombstone for ``lane_tombstone_keep_s``, not for ever: the
    reconciler then deletes it with whatever of the attempt is left in Ray's store,
    a batch at a time from where the last sweep stopped, and leaves a recent
    attempt's claim alone. A Ray job's attempt costs no call; a leftover todo item
    goes before its claim, found where the attempt ran even if its job has been
    placed elsewhere since."""
    from datetime import timedelta

    from sqlalchemy import update

    from raylane.orchestrator.loops import reconciler
    from raylane.orchestrator.store.tables import attempts, jobs
    from raylane.orchestrator.store.transitions import utcnow

    monkeypatch.setattr(reconciler, "SWEEP_BATCH", 2)
    ids = {}
    for name in ("ray", "old", "older", "recent"):
        jid = ids[name] = submit(lane, name)
        lane.dispatcher.after_submit_hook = lambda c: cancel_before_record(lane, c)
        lane.dispatcher.run_once()
        assert lane.get(jid, project=None).status is JobStatus.CANCELLED
    sid = {name: submission_id(jid, 1) for name, jid in ids.items()}
    gcs = lane.ray.gcs
    gcs.kv_del(lanes.claim_key(sid["ray"]))  # an attempt that ran as a Ray job of its own: no lane keys at all
    # Leftovers a failed forget could leave: a status and a re-put todo item; and the
    # job has been placed elsewhere since (a retry routed off the lane).
    gcs.kv_put(lanes.status_key(sid["old"]), b"{}")
    gcs.kv_put(lanes.todo_key("cpu", sid["old"]), b"{}")
    # Records in Ray's job store: a lane host's goes with the tombstone, a Ray job's own stays Ray's.
    gcs.records[sid["older"]] = lanes.dashboard_record(
        {"command": "true"}, lanes.LaneStatus("SUCCEEDED", group="cpu", host=lanes.host_submission_id("cpu", 1)),
        node_id=None)
    ray_own = gcs.records[sid["ray"]] = b'{"status": "SUCCEEDED", "entrypoint": "true", "metadata": {}}'
    now = utcnow()
    with db.transaction(lane.sessions) as s:
        s.execute(update(jobs).where(jobs.c.id == ids["old"]).values(placement={"node_group": "gpu", "lane": None}))
        for name, days in (("ray", 4), ("older", 3), ("old", 2)):
            s.execute(update(attempts).where(attempts.c.job_id == ids[name])
                      .values(ended_at=now - timedelta(days=days)))
    dels = []
    real_del = gcs.kv_del
    monkeypatch.setattr(gcs, "kv_del", lambda key, **kw: (dels.append(key), real_del(key, **kw)))
    rec = Reconciler(settings, lane.sessions, lane.ray, lanes=lane.lanes)

    rec.run_once()  # the batch of two: the Ray job's attempt and "older"
    assert keys_of(lane, sid["older"]) == {}
    assert dels == [lanes.claim_key(sid["older"])]  # nothing of the Ray job's, nothing else of "older"
    assert gcs.records == {sid["ray"]: ray_own}
    assert lanes.claim_key(sid["old"]) in gcs.d
    dels.clear()
    rec.run_once()  # a full batch: the next pass sweeps on at once
    assert keys_of(lane, sid["old"]) == {}
    assert dels == [lanes.todo_key("cpu", sid["old"]), lanes.attempt_prefix(sid["old"]), lanes.claim_key(sid["old"])]
    assert keys_of(lane, sid["recent"]) == {lanes.claim_key(sid["recent"]): lanes.FORGOTTEN}
    mark = lane.lanes.sweep_mark()
    assert mark is not None and mark[0] == now - timedelta(days=2)

    # The next sweep starts at the mark: what it passed is not read again, and the
    # recent attempt goes once its keep is over.
    gcs.kv_put(lanes.claim_key(sid["older"]), lanes.FORGOTTEN)
    with db.transaction(lane.sessions) as s:
        s.execute(update(attempts).where(attempts.c.job_id == ids["recent"]).values(ended_at=now - timedelta(days=1.5)))
    rec.run_once()  # within SWEEP_EVERY_S of the last sweep: none now
    assert lanes.claim_key(sid["recent"]) in gcs.d
    Reconciler(settings, lane.sessions, lane.ray, lanes=lane.lanes).run_once()  # another replica, or a restart
    assert keys_of(lane, sid["recent"]) == {}
    assert keys_of(lane, sid["older"]) == {lanes.claim_key(sid["older"]): lanes.FORGOTTEN}


def test_a_sweep_past_its_time_budget_stops_and_the_next_pass_goes_on(lane, settings, monkeypatch):
    """A backlog (the first sweep after an upgrade, a day of a busy lane) is swept
    a little at each pass, never in one long stall of the loop that sees jobs end."""
    from datetime import timedelta

    from sqlalchemy import update

    from raylane.orchestrator.store.tables import attempts
    from raylane.orchestrator.store.transitions import utcnow

    monkeypatch.setattr("raylane.orchestrator.backends.lane_sweep.SWEEP_BUDGET_S", 0.0)  # one attempt a sweep
    sids = []
    for name in ("a", "b", "c"):
        jid = submit(lane, name)
        lane.dispatcher.after_submit_hook = lambda c: cancel_before_record(lane, c)
        lane.dispatcher.run_once()
        sids.append(submission_id(jid, 1))
    with db.transaction(lane.sessions) as s:
        s.execute(update(attempts).values(ended_at=utcnow() - timedelta(days=2)))
    rec = Reconciler(settings, lane.sessions, lane.ray, lanes=lane.lanes)
    for swept in (1, 2, 3):
        rec.run_once()
        assert [lanes.claim_key(sid) in lane.ray.gcs.d for sid in sids] == [False] * swept + [True] * (3 - swept)


def test_the_packages_lane_jobs_touched_are_remembered_for_a_minute_not_for_ever(lane):
    import time

    d = lane.dispatcher
    d._touched = {f"{i:064x}": time.monotonic() - 120 for i in range(2000)}  # months of one package per job
    d._touch_packages({"working_dir": "raylane://packages/" + "ab" * 32})
    assert list(d._touched) == ["ab" * 32]


def test_rays_dashboard_keeps_live_lane_jobs_and_a_bounded_tail_of_ended_ones(lane, settings, monkeypatch):
    """Each lane attempt has a record in Ray's dashboard (its host writes it), and
    Ray's Jobs page lists every record on each read: the records of ended lane
    attempts go once they are not among the newest ``lane_dashboard_keep`` ended
    attempts, or an hour after their end. A Ray job's own record is Ray's and stays;
    a live attempt's is never touched. The sweep resumes from its mark."""
    import time
    from datetime import timedelta

    from sqlalchemy import update

    from raylane.orchestrator.store.tables import attempts
    from raylane.orchestrator.store.transitions import utcnow

    ids = {}
    for name in ("ancient", "a", "b", "c", "d", "ray"):
        jid = ids[name] = submit(lane, name)
        lane.dispatcher.after_submit_hook = lambda c: cancel_before_record(lane, c)
        lane.dispatcher.run_once()
    sid = {name: submission_id(jid, 1) for name, jid in ids.items()}
    gcs = lane.ray.gcs
    host = lanes.host_submission_id("cpu", 1)
    for name in ("ancient", *"abcd"):
        gcs.records[sid[name]] = lanes.dashboard_record(
            {"command": "true"}, lanes.LaneStatus("SUCCEEDED", group="cpu", host=host), node_id=None)
    ray_own = gcs.records[sid["ray"]] = b'{"status": "SUCCEEDED", "entrypoint": "true", "metadata": {}}'
    live = gcs.records["raylane-live-1"] = lanes.dashboard_record(
        {"command": "sleep 9"}, lanes.LaneStatus("RUNNING", group="cpu", host=host), node_id=None)
    now = utcnow()
    with db.transaction(lane.sessions) as s:
        for name, minutes in (("ancient", 3 * 24 * 60), ("a", 120), ("b", 30), ("ray", 25), ("c", 20), ("d", 10)):
            s.execute(update(attempts).where(attempts.c.job_id == ids[name])
                      .values(ended_at=now - timedelta(minutes=minutes)))

    # Within the hour, but past the newest two ended attempts ("d", "c"): "a" and "b" go.
    # With no mark at all (Ray's store lost them) the sweep starts a tombstone's keep
    # ago, not at the first attempt ever: "ancient" is the tombstone sweep's (not run here).
    rec = Reconciler(settings.model_copy(update={"lane_dashboard_keep": 2}), lane.sessions, lane.ray, lanes=lane.lanes)
    rec._swept_at = time.monotonic()
    rec.run_once()
    assert lane.lanes.sweep_mark() is None
    assert set(gcs.records) == {sid["ancient"], sid["c"], sid["d"], sid["ray"], "raylane-live-1"}
    del gcs.records[sid["ancient"]]
    assert gcs.records[sid["ray"]] == ray_own and gcs.records["raylane-live-1"] == live
    mark = lane.lanes.sweep_mark(lanes.RECORDS_MARK_KEY)
    assert mark is not None and mark[0] == now - timedelta(minutes=25)  # the Ray job's attempt, passed

    # With room for a thousand, only the hour bounds them; the next sweep starts at
    # the mark (a record written behind it stays until the tombstone sweep's day).
    gcs.records[sid["a"]] = b'{"status": "SUCCEEDED", "metadata": {"raylane_lane_host": "h"}}'
    monkeypatch.setattr(lanes, "RECORD_KEEP_S", 15 * 60.0)  # "c" is past it, "d" not
    Reconciler(settings, lane.sessions, lane.ray, lanes=lane.lanes).run_once()
    assert set(gcs.records) == {sid["a"], sid["d"], sid["ray"], "raylane-live-1"}


def test_the_lane_is_on_by_default_and_small_jobs_are_ray_jobs_while_the_gcs_is_unknown(settings):
    """The fast lane is the default; a control plane that cannot find Ray's GCS
    (not set, not in the head's command line) routes small jobs as Ray jobs
    instead of queueing them for a store it cannot reach, and takes the lane
    once the GCS is known."""
    import httpx

    from raylane.orchestrator.services.controlplane import ControlPlane
    from raylane.orchestrator.settings import Settings

    assert Settings.model_fields["fast_lane"].default is True
    head = {"raylet": {"nodeId": "h", "state": "ALIVE", "isHeadNode": True, "resourcesTotal": {"CPU": 0},
                       "labels": {"ray.io/node-group": "head"}}, "cmdline": ["raylet", "--node-manager-port=1"]}
    nodes = httpx.MockTransport(lambda req: httpx.Response(200, json={"data": {"summary": [head]}}))
    plane = ControlPlane(settings)
    try:
        from raylane.orchestrator.services.assembly import attach_ray

        attach_ray(plane, "http://ray.invalid", None, default_profile())
        plane.backend.http = httpx.Client(base_url="http://ray.invalid", transport=nodes)
        job, _ = plane.submit(JobSpec(name="small", kind="command", entrypoint="true"), project="default", actor="t")
        assert job.placement.lane is None, job.placement

        plane.backend.gcs = Cluster().gcs  # found (or set): the lane takes small jobs
        plane._view_cache = None
        job, _ = plane.submit(JobSpec(name="small", kind="command", entrypoint="true"), project="default", actor="t")
        assert job.placement.lane == "cpu" and "fast lane" in job.placement.reasons[-1], job.placement
    finally:
        plane.backend.gcs = None  # the stand-in has nothing to close
        plane.close()
