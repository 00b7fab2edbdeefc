"""The fast lane (issue #16) on the shared local cluster: small command jobs run
in a warm lane's host, with the same statuses, logs, cancel, timeout and
retries as a Ray job of their own; ineligible jobs take the Ray-job path and
say why."""

from __future__ import annotations

import json
import os
import signal

import httpx
import pytest
from fastapi.testclient import TestClient

from raylane.orchestrator.domain import lanes
from raylane.orchestrator.domain.lanes import LaneStatus
from raylane.orchestrator.domain.specs import JobSpec
from raylane.orchestrator.domain.states import JobStatus
from tests.conftest import ADMIN_HEADERS
from tests.helpers import wait_for
from tests.ray.conftest import cancel_leftovers, wait_status

pytestmark = pytest.mark.ray
TERMINAL = {"SUCCEEDED", "FAILED", "CANCELLED"}


@pytest.fixture
def lane_settings(ray_settings):
    return ray_settings.model_copy(update={"fast_lane": True, "lane_idle_s": 60.0})


@pytest.fixture
def lapi(lane_settings):
    from raylane.api.app import create_app

    with TestClient(create_app(lane_settings), headers=ADMIN_HEADERS) as c:
        yield c
        cancel_leftovers(c)


@pytest.fixture
def gcs(ray_cluster):
    from raylane.orchestrator.backends.ray_gcs import RayGcs

    g = RayGcs(ray_cluster.state.gcs_address, ray_cluster.state.token)
    yield g
    g.close()


def lane_status(gcs, sid: str) -> LaneStatus | None:
    value = gcs.kv_get(lanes.status_key(sid))
    return LaneStatus.decode(value) if value else None


def host_of(gcs, sid: str) -> str | None:
    """The host that took the attempt: its claim names it before the command starts
    (the status names it only once the command has run 50 ms, ``jobs.lane.RUNNING_AFTER_S``)."""
    value = gcs.kv_get(lanes.claim_key(sid)) or b""
    return value.decode() if value.startswith(lanes.HOST_ID_PREFIX.encode()) else None


def ray_job(ray_cluster, sid: str) -> dict | None:
    r = httpx.get(ray_cluster.state.dashboard_url + f"/api/jobs/{sid}", headers=ray_cluster.auth_headers())
    return r.json() if r.status_code == 200 else None


def ended_page(ray_cluster, sid: str) -> dict:
    """A lane attempt's page in Ray's dashboard once it says the attempt ended: its
    host writes the end just after the status the reconciler reads (and the
    control plane a lost host's after it stored the outcome), so a test that saw
    the job end may read the page a moment before."""
    return wait_for(lambda: (p := ray_job(ray_cluster, sid)) and p["status"] not in ("PENDING", "RUNNING") and p,
                    timeout=30, what=f"{sid}'s end in Ray's dashboard")


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    # A zombie waits for its parent (the host) to reap it: it runs no more.
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0] == "Z"


def test_a_small_command_runs_in_the_lane_with_its_logs(lapi, ray_cluster, gcs):
    r = lapi.post("/v1/jobs", json={"name": "hi", "kind": "command",
                                    "entrypoint": "echo lane-says-$RAYLANE_JOB_ID-$GREETING",
                                    "runtime_env": {"env_vars": {"GREETING": "hello"}}})
    assert r.status_code == 201, r.text
    job = r.json()
    assert job["placement"]["lane"] == "cpu"
    assert job["placement"]["reasons"][-1].startswith("fast lane: a 1-CPU command")
    done = wait_status(lapi, job["id"], TERMINAL, timeout=90)
    assert done["status"] == "SUCCEEDED", done["status_reason"]
    assert f"lane-says-{job['id']}-hello" in lapi.get(f"/v1/jobs/{job['id']}/logs").text
    sid = f"raylane-{job['id']}-1"
    # No Ray job of its own (its host's Ray job ran it, on a cpu node), but a page
    # in Ray's dashboard all the same: the record its host wrote, read by Ray's job API.
    page = ended_page(ray_cluster, sid)
    assert page["status"] == "SUCCEEDED" and page["driver_exit_code"] == 0, page
    assert page["entrypoint"] == "echo lane-says-$RAYLANE_JOB_ID-$GREETING" and not page.get("runtime_env")
    # Shown by its name and its own command, as a Ray job of its own would be.
    assert {k: page["metadata"].get(k) for k in ("raylane_job_id", "raylane_project", "raylane_lane",
                                                 "raylane_name")} == \
        {"raylane_job_id": job["id"], "raylane_project": job["project"], "raylane_lane": "cpu", "raylane_name": "hi"}
    listed = httpx.get(ray_cluster.state.dashboard_url + "/api/jobs/", headers=ray_cluster.auth_headers())
    assert listed.status_code == 200 and sid in {j["submission_id"] for j in listed.json()}  # Ray's Jobs page
    # Its outcome and log are in the database: its keys have left Ray's store (which keeps live attempts only).
    assert lane_status(gcs, sid) is None and not gcs.kv_get(lanes.logs_key(sid))
    assert gcs.kv_get(lanes.claim_key(sid)) == lanes.FORGOTTEN  # the tombstone stays
    att = lapi.get(f"/v1/jobs/{job['id']}/attempts").json()[0]
    host_sid = att["ray_job"]  # the host that ran it: the one on the group's node, pinned there
    host = ray_job(ray_cluster, host_sid)
    assert gcs.kv_get(lanes.host_key("cpu", host["driver_node_id"])).decode() == host_sid
    assert host_sid == lanes.host_submission_id("cpu", int(host_sid.rsplit("-", 1)[1]), host["driver_node_id"])
    assert host["status"] == "RUNNING" and host["metadata"]["raylane_lane"] == "cpu"
    assert page["metadata"]["raylane_lane_host"] == host_sid and page["driver_node_id"] == host["driver_node_id"]
    assert att["driver_node_id"] == host["driver_node_id"] and att["exit_code"] == 0
    # It names the Ray job that ran it (its lane's host); its link is its own page in Ray's dashboard,
    # which Raylane's /ray serves as it serves a Ray job's.
    assert att["ray_job"] == host_sid
    assert done["dashboard_url"].endswith(f"/#/jobs/{sid}") and att["dashboard_url"] == done["dashboard_url"]
    proxied = lapi.get(f"/ray/api/jobs/{sid}")
    assert proxied.status_code == 200 and proxied.json()["metadata"]["raylane_job_id"] == job["id"], proxied.text
    # The host reads its own Ray job's status where Ray's job manager keeps it (its self-check).
    probe = lapi.post("/v1/jobs", json={"name": "probe", "kind": "command", "entrypoint":
                                        f"python -c 'from raylane.jobs.lane import _probe; print(_probe(\"{host_sid}\"))'"}).json()
    assert wait_status(lapi, probe["id"], TERMINAL, timeout=60)["status"] == "SUCCEEDED"
    assert lapi.get(f"/v1/jobs/{probe['id']}/logs").text.strip() == "RUNNING"
    evs = lapi.get(f"/v1/jobs/{job['id']}/events").json()
    assert [e["to_status"] for e in evs][-3:] == ["DISPATCHING", "RUNNING", "SUCCEEDED"]
    # A failing command fails as an application error, with its output.
    bad = lapi.post("/v1/jobs", json={"name": "bad", "kind": "command",
                                      "entrypoint": "echo oh-no; exit 3"}).json()
    failed = wait_status(lapi, bad["id"], TERMINAL, timeout=60)
    assert failed["status"] == "FAILED" and failed["failure_cause"] == "APP_ERROR"
    att = lapi.get(f"/v1/jobs/{bad['id']}/attempts").json()[0]
    assert att["exit_code"] == 3 and "oh-no" in att["message"]


def test_rays_dashboard_keeps_the_newest_ended_lane_jobs_only(lane_settings, ray_cluster):
    """Ray's Jobs page lists every record on each read: with
    ``lane_dashboard_keep`` 1, a lane job's page is there once it ended and gone
    once another lane job ended after it, while that one's stays."""
    from raylane.api.app import create_app

    with TestClient(create_app(lane_settings.model_copy(update={"lane_dashboard_keep": 1})),
                    headers=ADMIN_HEADERS) as c:
        try:
            first = c.post("/v1/jobs", json={"name": "first", "kind": "command", "entrypoint": "true"}).json()
            assert wait_status(c, first["id"], TERMINAL, timeout=120)["status"] == "SUCCEEDED"
            assert ended_page(ray_cluster, f"raylane-{first['id']}-1")["status"] == "SUCCEEDED"
            second = c.post("/v1/jobs", json={"name": "second", "kind": "command", "entrypoint": "true"}).json()
            assert wait_status(c, second["id"], TERMINAL, timeout=120)["status"] == "SUCCEEDED"
            assert ended_page(ray_cluster, f"raylane-{second['id']}-1")["status"] == "SUCCEEDED"
            wait_for(lambda: ray_job(ray_cluster, f"raylane-{first['id']}-1") is None, timeout=60,
                     what="the older lane job's page to leave Ray's dashboard")
            assert ray_job(ray_cluster, f"raylane-{second['id']}-1")["status"] == "SUCCEEDED"
        finally:
            cancel_leftovers(c)


def test_a_function_job_is_a_call_in_the_lane_or_a_ray_job_with_the_same_result(lapi, ray_cluster):
    spec = {"name": "fn", "kind": "function", "entrypoint": "json:dumps", "args": {"obj": [1, 2]}}
    lane = lapi.post("/v1/jobs", json=spec).json()
    iso = lapi.post("/v1/jobs", json={**spec, "lane": "isolated"}).json()
    boom = lapi.post("/v1/jobs", json={**spec, "entrypoint": "json:loads", "args": {"s": "not json"}}).json()
    assert lane["placement"]["lane"] == "cpu" and iso["placement"]["lane"] is None
    for j in (lane, iso):
        done = wait_status(lapi, j["id"], TERMINAL, timeout=120)
        assert done["status"] == "SUCCEEDED", done["status_reason"]
        assert done["result"] == {"value": "[1, 2]"}
    in_lane, own = ended_page(ray_cluster, f"raylane-{lane['id']}-1"), ray_job(ray_cluster, f"raylane-{iso['id']}-1")
    assert in_lane["status"] == own["status"] == "SUCCEEDED"  # both in Ray's job list
    assert in_lane["metadata"]["raylane_lane_host"] and "raylane_lane_host" not in own["metadata"]
    assert in_lane["entrypoint"] == "json:dumps"
    failed = wait_status(lapi, boom["id"], TERMINAL, timeout=60)
    assert failed["status"] == "FAILED" and failed["failure_cause"] == "APP_ERROR"
    assert "JSONDecodeError" in lapi.get(f"/v1/jobs/{boom['id']}/logs").text


def test_cancel_stops_the_running_process(lapi, ray_cluster, tmp_path, gcs):
    pidfile = tmp_path / "pid"
    j = lapi.post("/v1/jobs", json={"name": "long", "kind": "command",
                                    "entrypoint": f"echo $$ > {pidfile}; exec sleep 600"}).json()
    wait_status(lapi, j["id"], {"RUNNING"}, timeout=60)
    pid = wait_for(lambda: pidfile.exists() and pidfile.read_text().strip() and int(pidfile.read_text()),
                   timeout=30, what="the command's pid")
    assert not gone(pid)
    sid = f"raylane-{j['id']}-1"
    wait_for(lambda: (ray_job(ray_cluster, sid) or {}).get("status") == "RUNNING", timeout=30,
             what="the running job's page in Ray's dashboard")
    assert lapi.post(f"/v1/jobs/{j['id']}/cancel").json()["job"]["status"] == "CANCELLING"
    done = wait_status(lapi, j["id"], {"CANCELLED"}, timeout=60)
    assert done["status"] == "CANCELLED"
    assert gone(pid)
    assert ended_page(ray_cluster, sid)["status"] == "STOPPED"
    assert lapi.get(f"/v1/jobs/{j['id']}/attempts").json()[0]["status"] == "STOPPED"
    assert lane_status(gcs, f"raylane-{j['id']}-1") is None and not gcs.kv_get(lanes.stop_key(f"raylane-{j['id']}-1"))


def test_timeout_stops_it_and_fails_it_with_cause_timeout(lapi, tmp_path):
    pidfile = tmp_path / "pid"
    j = lapi.post("/v1/jobs", json={"name": "slow", "kind": "command", "timeout_s": 2,
                                    "entrypoint": f"echo $$ > {pidfile}; exec sleep 600"}).json()
    done = wait_status(lapi, j["id"], TERMINAL, timeout=90)
    assert done["status"] == "FAILED" and done["failure_cause"] == "TIMEOUT", done
    assert gone(int(pidfile.read_text()))


def test_ineligible_jobs_take_the_ray_job_path_and_say_why(lapi, ray_cluster):
    big = lapi.post("/v1/jobs", json={"name": "big", "kind": "command", "entrypoint": "echo big",
                                      "resources": {"cpus_per_worker": 2}}).json()
    iso = lapi.post("/v1/jobs", json={"name": "iso", "kind": "command", "entrypoint": "echo iso",
                                      "lane": "isolated"}).json()
    assert big["placement"]["lane"] is None
    assert big["placement"]["reasons"][-1] == "Ray job: asks for 2 CPUs (the fast lane takes ≤ 1)"
    assert iso["placement"]["lane"] is None
    assert iso["placement"]["reasons"][-1] == "Ray job: the spec asks for lane: isolated"
    for j, word in ((big, "big"), (iso, "iso")):
        done = wait_status(lapi, j["id"], TERMINAL, timeout=120)
        assert done["status"] == "SUCCEEDED", done["status_reason"]
        assert ray_job(ray_cluster, f"raylane-{j['id']}-1")["status"] == "SUCCEEDED"  # a Ray job of its own
        assert word in lapi.get(f"/v1/jobs/{j['id']}/logs").text


class Crash(BaseException):
    """Stands in for SIGKILL at the worst moment (not an Exception: nothing catches it)."""


def _plane(settings, **kw):
    from raylane.orchestrator.backends.ray_jobs import read_token
    from raylane.orchestrator.domain.profile import default_profile
    from raylane.orchestrator.services import assembly
    from raylane.orchestrator.services.controlplane import ControlPlane

    cp = ControlPlane(settings.model_copy(update={"loops_enabled": False, **kw}))
    assembly.attach_ray(cp, settings.dashboard_url, read_token(settings.ray_auth_token), default_profile(),
                        ray_address=settings.ray_address)
    return cp


def test_a_redispatched_lane_attempt_runs_once(lane_settings, tmp_path):
    out = tmp_path / "runs"
    cp1 = _plane(lane_settings, lease_s=0.5)
    job, _ = cp1.submit(JobSpec(name="once", kind="command", entrypoint=f"echo ran >> {out}"),
                        project="default", actor="t")

    def crash(_claimed):
        raise Crash()

    cp1.dispatcher.after_submit_hook = crash
    with pytest.raises(Crash):
        cp1.dispatcher.run_once()
    # The lane has the attempt (it may run it now); the database still says DISPATCHING.
    assert cp1.get(job.id, project=None).status is JobStatus.DISPATCHING
    wait_for(lambda: out.exists(), timeout=60, what="the lane ran it")

    # Another control plane takes over once the lease expires and dispatches the same attempt again.
    cp2 = _plane(lane_settings, lease_s=0.5)
    claimed = wait_for(lambda: cp2.dispatcher.claim(cp2.backend.cluster_view()), timeout=10, what="lease expiry")
    cp2.dispatcher.submit(claimed[0])
    reason = cp2.get(job.id, project=None).status_reason
    assert reason == "the warm lane already had this attempt (a retried dispatch); adopted it", reason

    def finished():
        cp2.dispatcher.run_once()
        cp2.reconciler.run_once()
        return cp2.get(job.id, project=None).status is JobStatus.SUCCEEDED

    wait_for(finished, timeout=60, what="job succeeded")
    assert out.read_text() == "ran\n"
    cp1.close()
    cp2.close()


def test_a_lost_lane_host_is_retried_and_the_job_succeeds_once(lapi, ray_cluster, tmp_path, gcs):
    marker, out = tmp_path / "first-try", tmp_path / "runs"
    cmd = f"if [ -e {marker} ]; then echo ran >> {out}; else echo $$ > {marker}; sleep 600; fi"
    j = lapi.post("/v1/jobs", json={"name": "survivor", "kind": "command", "entrypoint": cmd,
                                    "retry": {"backoff_s": 0}}).json()
    wait_status(lapi, j["id"], {"RUNNING"}, timeout=60)
    pid = wait_for(lambda: marker.exists() and marker.read_text().strip() and int(marker.read_text()),
                   timeout=30, what="the first attempt's pid")
    with open(f"/proc/{pid}/stat") as f:
        host_pid = int(f.read().rsplit(")", 1)[1].split()[1])  # the shell's parent: the lane host
    host_sid = host_of(gcs, f"raylane-{j['id']}-1")
    assert host_sid, gcs.kv_get(lanes.claim_key(f"raylane-{j['id']}-1"))
    os.kill(host_pid, signal.SIGKILL)  # the host dies as with its node, without a word
    done = wait_status(lapi, j["id"], TERMINAL, timeout=120)
    assert done["status"] == "SUCCEEDED", done["status_reason"]
    assert out.read_text() == "ran\n"
    first, second = lapi.get(f"/v1/jobs/{j['id']}/attempts").json()[:2]
    assert first["cause"] == "LOST" and host_sid in first["message"], first
    assert second["status"] == "SUCCEEDED"
    # Its host wrote no end for the first attempt: the control plane did, in Ray's dashboard too.
    assert ended_page(ray_cluster, f"raylane-{j['id']}-1")["status"] == "FAILED"
    assert ended_page(ray_cluster, f"raylane-{j['id']}-2")["status"] == "SUCCEEDED"
    assert second["ray_job"] != host_sid and first["driver_node_id"] == second["driver_node_id"]
    # A new host replaced the lost one, on the same node.
    assert gcs.kv_get(lanes.host_key("cpu", first["driver_node_id"])).decode() == second["ray_job"]
    wait_for(lambda: gone(pid), timeout=10, what="the lost host's command to die with it")


def test_a_control_plane_killed_while_lane_jobs_run_leaves_each_succeeded_once(lane_settings, tmp_path):
    cp1 = _plane(lane_settings)
    jobs = [cp1.submit(JobSpec(name=f"j{i}", kind="command", entrypoint=f"sleep 1; echo ran >> {tmp_path / str(i)}"),
                       project="default", actor="t")[0] for i in range(4)]
    cp1.dispatcher.run_once()  # all four in the lane (4 CPUs in group cpu), recorded as submitted
    assert {cp1.get(j.id, project=None).status for j in jobs} == {JobStatus.DISPATCHING}
    cp1.close()  # dies here: no reconciler of its ever sees them run

    cp2 = _plane(lane_settings)

    def all_done():
        cp2.reconciler.run_once()
        cp2.dispatcher.run_once()
        return all(cp2.get(j.id, project=None).status is JobStatus.SUCCEEDED for j in jobs)

    wait_for(all_done, timeout=90, what="every job succeeded")
    assert [(tmp_path / str(i)).read_text() for i in range(4)] == ["ran\n"] * 4
    assert all(cp2.get(j.id, project=None).attempts == 1 for j in jobs)
    cp2.close()


def test_a_lane_whose_spot_node_is_killed_mid_job_is_preempted_retried_and_succeeds_once(
        lapi, ray_cluster, tmp_path, gcs):
    marker, out = tmp_path / "first-try", tmp_path / "runs"
    cmd = f"if [ -e {marker} ]; then echo ran >> {out}; else echo $$ > {marker}; sleep 600; fi"
    j = lapi.post("/v1/jobs", json={"name": "spot-lane", "kind": "command", "entrypoint": cmd,
                                    "placement": {"node_group": "spot-cpu"}, "retry": {"backoff_s": 0}}).json()
    assert j["placement"]["lane"] == "spot-cpu"
    wait_for(lambda: marker.exists() and marker.read_text().strip(), timeout=90, what="the first attempt running")
    host_sid = host_of(gcs, f"raylane-{j['id']}-1")
    host = ray_job(ray_cluster, host_sid) if host_sid else None
    assert host is not None, host_sid
    victim = next(n for n in ray_cluster.state.nodes if n.ports.get("node_id") == host["driver_node_id"])
    assert victim.group == "spot-cpu"
    ray_cluster.kill_node(victim.name)  # a spot reclaim: the node and everything on it
    # The group's other spot node takes the retry (a new host there).
    done = wait_status(lapi, j["id"], TERMINAL, timeout=180)
    attempts = lapi.get(f"/v1/jobs/{j['id']}/attempts").json()
    assert done["status"] == "SUCCEEDED", (done["status_reason"], attempts)
    assert out.read_text() == "ran\n"
    assert [a["cause"] for a in attempts] == ["PREEMPTED", None], [(a["cause"], a["message"]) for a in attempts]
    assert done["preemptions"] == 1


def test_a_lane_function_is_cancelled_or_crashes_alone_and_the_lane_runs_on(lapi, gcs):
    # Standard library functions only: a lane takes no working_dir, and the nodes need not have the tests.
    hung = lapi.post("/v1/jobs", json={"name": "hung", "kind": "function", "entrypoint": "subprocess:run",
                                       "args": {"args": ["sleep", "600"]}}).json()
    assert hung["placement"]["lane"] == "cpu"
    wait_status(lapi, hung["id"], {"RUNNING"}, timeout=60)
    worker = wait_for(lambda: (st := lane_status(gcs, f"raylane-{hung['id']}-1")) and st.pid, timeout=30,
                      what="the call's worker")
    assert lapi.post(f"/v1/jobs/{hung['id']}/cancel").json()["job"]["status"] == "CANCELLING"
    assert wait_status(lapi, hung["id"], {"CANCELLED"}, timeout=60)["status"] == "CANCELLED"
    wait_for(lambda: gone(worker), timeout=10, what="the worker, killed with its process group")
    crash = lapi.post("/v1/jobs", json={"name": "abort", "kind": "function", "entrypoint": "os:abort"}).json()
    assert wait_status(lapi, crash["id"], TERMINAL, timeout=60)["status"] == "FAILED"
    assert lapi.get(f"/v1/jobs/{crash['id']}/attempts").json()[0]["exit_code"] == -signal.SIGABRT
    after = lapi.post("/v1/jobs", json={"name": "after", "kind": "function", "entrypoint": "subprocess:check_output",
                                        "args": {"args": ["sh", "-c", "sleep 3; echo still-here"]}}).json()
    # Read while it runs: once its outcome is stored, its status leaves Ray's store.
    pid = wait_for(lambda: (st := lane_status(gcs, f"raylane-{after['id']}-1")) and st.pid, timeout=60,
                   what="the next call's worker")
    assert pid != worker  # a fresh worker
    done = wait_status(lapi, after["id"], TERMINAL, timeout=60)
    assert done["status"] == "SUCCEEDED" and "still-here" in done["result"]["value"], done["status_reason"]


def test_lane_jobs_spread_over_the_groups_nodes_each_within_its_cpus(lapi, gcs, tmp_path):
    """spot-cpu has two 4-CPU nodes: admission counts 8 CPUs, so a host on one of
    them alone would run 8 one-CPU jobs on 4 CPUs. A host on each node, each
    bounded by its node's CPUs, runs 4 and 4."""
    gate = tmp_path / "go"
    spec = {"kind": "command", "entrypoint": f"while [ ! -e {gate} ]; do sleep 0.05; done",
            "resources": {"cpus_per_worker": 1}, "placement": {"node_group": "spot-cpu"}, "lane": "auto"}
    jobs = [lapi.post("/v1/jobs", json={**spec, "name": f"wide-{i}"}).json() for i in range(8)]
    assert all(j["placement"]["lane"] == "spot-cpu" for j in jobs), jobs[0]["placement"]

    def running_per_host():
        seen: dict[str, int] = {}
        for j in jobs:
            st = lane_status(gcs, f"raylane-{j['id']}-1")
            if st is not None and st.status == "RUNNING":
                seen[st.host] = seen.get(st.host, 0) + 1
        return seen

    per_host = wait_for(lambda: (r := running_per_host()) and sum(r.values()) == 8 and r, timeout=120,
                        what="all eight running")
    assert sorted(per_host.values()) == [4, 4], per_host
    gate.touch()
    done = [wait_status(lapi, j["id"], TERMINAL, timeout=60) for j in jobs]
    assert {d["status"] for d in done} == {"SUCCEEDED"}
    nodes = {lapi.get(f"/v1/jobs/{j['id']}/attempts").json()[0]["driver_node_id"] for j in jobs}
    assert len(nodes) == 2


def test_jobs_with_an_uploaded_package_run_in_a_lane_of_its_runtime_env(lapi, ray_cluster, gcs, tmp_path):
    """A working_dir package (the client's upload) makes a lane env: a host
    started by Ray in that runtime env runs the package's jobs, function calls
    and commands alike, in its unpacked directory, as a Ray job of its own would;
    jobs of the node's own environment keep their own hosts."""
    from raylane.client.packaging import build

    code = tmp_path / "laptop"
    code.mkdir()
    (code / "lanepkg.py").write_text("import os\n\n\ndef greet(name):\n    return f'hello {name} from {os.getcwd()}'\n")
    (code / "data.txt").write_text("packaged-data\n")
    pkg = build(code)
    r = lapi.put(f"/v1/packages/{pkg.sha256}", content=pkg.data)
    assert r.status_code in (200, 201), r.text
    env = {"working_dir": f"raylane://packages/{pkg.sha256}"}
    fn = lapi.post("/v1/jobs", json={"name": "pkg-fn", "kind": "function", "entrypoint": "lanepkg:greet",
                                     "args": {"name": "lane"}, "runtime_env": env}).json()
    cmd = lapi.post("/v1/jobs", json={"name": "pkg-cmd", "kind": "command", "entrypoint": "cat data.txt",
                                      "runtime_env": env}).json()
    own = lapi.post("/v1/jobs", json={"name": "own", "kind": "command", "entrypoint": "true"}).json()
    key = lanes.env_key(env)
    assert fn["placement"]["lane"] == "cpu" and fn["placement"]["lane_env"] == key, fn["placement"]
    assert cmd["placement"]["lane_env"] == key and own["placement"]["lane_env"] is None
    assert f"lane env {key}" in fn["placement"]["reasons"][-1]
    done = {j["name"]: wait_status(lapi, j["id"], TERMINAL, timeout=180) for j in (fn, cmd, own)}
    assert {n: d["status"] for n, d in done.items()} == {"pkg-fn": "SUCCEEDED", "pkg-cmd": "SUCCEEDED",
                                                         "own": "SUCCEEDED"}, {n: d["status_reason"] for n, d in done.items()}
    greeting = done["pkg-fn"]["result"]["value"]
    assert greeting.startswith("hello lane from ") and "_ray_pkg_" in greeting  # run where Ray unpacked it
    assert lapi.get(f"/v1/jobs/{cmd['id']}/logs").text.strip() == "packaged-data"
    hosts = {n: lapi.get(f"/v1/jobs/{d['id']}/attempts").json()[0]["ray_job"] for n, d in done.items()}
    assert hosts["pkg-fn"] == hosts["pkg-cmd"] and f"-e{key[:lanes.HOST_ID_ENV_CHARS]}-" in hosts["pkg-fn"]  # one host for the env's jobs
    assert hosts["own"] != hosts["pkg-fn"] and "-e" not in hosts["own"].rsplit("-", 2)[-2]
    host = ray_job(ray_cluster, hosts["pkg-fn"])
    assert host["runtime_env"]["working_dir"] == f"gcs://_ray_pkg_{pkg.sha256}.zip"
    assert host["metadata"]["raylane_lane_env"] == key
    # The env is recorded for whoever starts its next host; the jobs' items are gone from its queue.
    assert json.loads(gcs.kv_get(lanes.env_record_key(key))) == env
    assert gcs.kv_get(lanes.todo_key("cpu", f"raylane-{fn['id']}-1", key)) is None
