"""The runner protocol on both sides of the process boundary: the inputs on the
driver's command line come back as they left, a runner of another version
refuses to run (with an exit code the reconciler reads as RUNTIME_ENV), a result
past the bound fails the attempt with the limit and the size, and the control
plane reads a result from Ray's key-value store, finds the GCS from the
dashboard alone, and neither hangs nor loses a finished job while it cannot."""

from __future__ import annotations

import json
import os
import shlex

import httpx
import pytest

import raylane
from raylane.jobs import base, run
from raylane.orchestrator.backends import ray_jobs
from raylane.orchestrator.backends.ray_jobs import RayJobsBackend, ResultUnavailable
from raylane.orchestrator.domain import protocol
from raylane.orchestrator.domain.protocol import Env
from raylane.orchestrator.domain.specs import JobSpec
from raylane.orchestrator.domain.views import Placement
from raylane.orchestrator.domain.profile import default_profile
from raylane.orchestrator.loops.dispatcher import Claimed, Dispatcher, runner_env
from raylane.orchestrator.settings import Settings
from raylane.orchestrator.testing import MemoryGcs

SPEC = JobSpec.model_validate({"name": "t", "kind": "training", "entrypoint": "m:f"})
PLACEMENT = Placement(node_group="gpu", market="ON_DEMAND", strategy="STRICT_PACK", colocate=True, num_workers=1,
                      worker_resources={"GPU": 1}, label_selector={"ray.io/node-group": "gpu"}, total={"GPU": 1},
                      reasons=["a test"])


def _env(tmp_path, **override) -> dict[str, str]:
    env = runner_env("01job", 3, "vision", SPEC, PLACEMENT, tmp_path)
    env.update(override)
    return env


def _clear_runner_env(monkeypatch):
    for name in (protocol.PAYLOAD_ENV, protocol.INPUTS_KEY_ENV, *[v for k, v in vars(Env).items() if k.isupper()]):
        monkeypatch.delenv(name, raising=False)


def test_the_command_line_carries_the_inputs_and_the_versions_back_unchanged(tmp_path, monkeypatch):
    env = _env(tmp_path)
    assert env[Env.VERSION] == raylane.__version__ and env[Env.PROTOCOL] == str(protocol.PROTOCOL_VERSION)
    command = protocol.driver_command(env)
    assignment, *rest = shlex.split(command)  # base64 needs no quoting: the shell sees one word
    name, _, blob = assignment.partition("=")
    assert name == protocol.PAYLOAD_ENV and rest == ["python", "-m", protocol.RUNNER_MODULE]
    assert protocol.decode_payload(blob) == env

    _clear_runner_env(monkeypatch)
    monkeypatch.setenv(protocol.PAYLOAD_ENV, blob)
    ctx = base.RunContext.from_env()
    assert (ctx.job_id, ctx.attempt, ctx.project) == ("01job", 3, "vision")
    assert ctx.spec == SPEC and ctx.placement == PLACEMENT and ctx.storage.uri == str(tmp_path / "vision" / "01job")
    assert ctx.storage.local_path.is_dir() and protocol.PAYLOAD_ENV not in os.environ


def test_with_a_gcs_the_command_line_names_only_the_inputs_key_and_the_versions(tmp_path, monkeypatch):
    env = _env(tmp_path, **{Env.SPEC: SPEC.model_copy(update={"name": "secret-in-env"}).model_dump_json()})
    key = protocol.inputs_key("raylane-01job-3")
    words = shlex.split(protocol.driver_command(env, inputs_key=key))
    assert words == [f"{protocol.INPUTS_KEY_ENV}={key}", f"{Env.VERSION}={raylane.__version__}",
                     f"{Env.PROTOCOL}={protocol.PROTOCOL_VERSION}", "python", "-m", protocol.RUNNER_MODULE]

    stored = {key: protocol.encode_inputs(env)}
    read = []
    monkeypatch.setattr(base, "read_inputs", lambda k: read.append(k) or protocol.decode_inputs(stored[k]))
    _clear_runner_env(monkeypatch)
    for w in words[:3]:
        monkeypatch.setenv(*w.split("=", 1))
    ctx = base.RunContext.from_env()
    assert read == [key] and ctx.spec.name == "secret-in-env" and ctx.placement == PLACEMENT
    assert protocol.INPUTS_KEY_ENV not in os.environ and os.environ[Env.SPEC] == env[Env.SPEC]

    # Versions are checked from the command line, before the store is read.
    read.clear()
    _clear_runner_env(monkeypatch)
    monkeypatch.setenv(protocol.INPUTS_KEY_ENV, key)
    monkeypatch.setenv(Env.VERSION, "0.0.1")
    monkeypatch.setenv(Env.PROTOCOL, str(protocol.PROTOCOL_VERSION))
    with pytest.raises(protocol.VersionMismatchError):
        base.RunContext.from_env()
    assert read == []


class KvBackend(RayJobsBackend):
    """The backend with Ray's HTTP API and GCS replaced by memory."""

    def __init__(self, gcs):
        super().__init__("http://ray.invalid", gcs=gcs)
        self.submitted = []

    def submit(self, **kw):
        self.submitted.append(kw)

    def find_gcs(self):
        return self.gcs


def _dispatch_one(tmp_path, backend):

    settings = Settings(database_url=f"sqlite:///{tmp_path / 'x.db'}", data_dir=tmp_path / "data")
    d = Dispatcher(settings, sessions=None, backend=backend, profile=default_profile())
    d.after_submit_hook = _stop  # Ray has the attempt; stop before the database write
    with pytest.raises(Stop):
        d.submit(Claimed(job_id="01job", attempt=1, project="vision", spec=SPEC, placement=PLACEMENT))
    return d, backend.submitted[-1]


class Stop(Exception):
    pass


def _stop(claimed):
    raise Stop


def test_the_dispatcher_leaves_a_runners_inputs_in_rays_store(tmp_path):
    gcs = MemoryGcs()
    _, sent = _dispatch_one(tmp_path, KvBackend(gcs))
    key = protocol.inputs_key("raylane-01job-1")
    assert sent["entrypoint"].startswith(f"{protocol.INPUTS_KEY_ENV}={key} ")
    inputs = protocol.decode_inputs(gcs.kv[key])
    assert JobSpec.model_validate_json(inputs[Env.SPEC]) == SPEC
    # The spec stays off the command line; the user's entrypoint shows after it, as a
    # comment, for Ray's dashboard (#48), and in the job's metadata.
    run, _, comment = sent["entrypoint"].partition("  # ")
    assert SPEC.entrypoint not in run and comment == f"raylane training: {SPEC.entrypoint}"
    assert sent["metadata"]["raylane_entrypoint"] == SPEC.entrypoint
    KvBackend(gcs).forget_inputs("raylane-01job-1")
    assert gcs.kv == {}


def test_without_a_gcs_the_inputs_ride_on_the_command_line_with_one_warning(tmp_path, caplog):
    backend = KvBackend(None)
    d, sent = _dispatch_one(tmp_path, backend)
    assert sent["entrypoint"].startswith(f"{protocol.PAYLOAD_ENV}=")
    with pytest.raises(Stop):
        d.submit(Claimed(job_id="01job", attempt=2, project="vision", spec=SPEC, placement=PLACEMENT))
    assert len([r for r in caplog.records if "GCS address is unknown" in r.message]) == 1


@pytest.mark.parametrize("override", [{Env.VERSION: "0.0.1"}, {Env.PROTOCOL: "0"}, {Env.VERSION: ""}])
def test_a_runner_of_another_version_refuses_before_running_anything(tmp_path, monkeypatch, capsys, override):
    env = _env(tmp_path, **override)
    with pytest.raises(protocol.VersionMismatchError, match="runner version mismatch"):
        protocol.check_versions(env)

    _clear_runner_env(monkeypatch)
    monkeypatch.setenv(protocol.PAYLOAD_ENV, protocol.encode_payload(env))
    monkeypatch.setattr(run, "load_callable", lambda path: pytest.fail("user code loaded by a mismatched runner"))
    assert run.main() == protocol.EXIT_VERSION_MISMATCH
    err = capsys.readouterr().err
    assert err.startswith(protocol.VERSION_MISMATCH_MARKER) and f"this node has raylane {raylane.__version__}" in err


def test_a_result_is_bounded_with_the_limit_and_the_size_in_the_error(monkeypatch):
    fits = {"x": "a" * (protocol.MAX_RESULT_BYTES - len(json.dumps({"x": ""})))}
    assert protocol.decode_result(protocol.encode_result(fits)) == fits
    assert protocol.decode_result(b"[1, 2]") == {"value": [1, 2]}
    too_big = {"x": "a" * protocol.MAX_RESULT_BYTES}
    with pytest.raises(protocol.ResultTooLargeError) as e:
        base.report_result("raylane-01job-1", too_big)  # refused before Ray is touched
    assert f"is {len(json.dumps(too_big))} bytes" in str(e.value) and "limit is 1048576 bytes" in str(e.value)


def test_the_runner_leaves_its_result_under_the_attempts_key(monkeypatch):
    from ray.experimental import internal_kv

    store = {}
    monkeypatch.setattr(internal_kv, "_internal_kv_initialized", lambda: True)
    monkeypatch.setattr(internal_kv, "_internal_kv_put",
                        lambda key, value, overwrite, namespace: store.__setitem__((key, namespace), value))
    base.report_result("raylane-01job-1", {"loss": 0.5})
    assert store == {(protocol.result_key("raylane-01job-1"), protocol.KV_NAMESPACE): b'{"loss": 0.5}'}

    monkeypatch.setattr(internal_kv, "_internal_kv_initialized", lambda: False)
    with pytest.raises(RuntimeError, match="connected Ray driver"):
        base.report_result("raylane-01job-1", {})


def test_the_control_plane_reads_a_result_and_deletes_it_once_stored():
    gcs = MemoryGcs()
    backend = RayJobsBackend("http://ray.invalid", gcs=gcs)
    assert backend.result("raylane-01job-1") is None  # none reported
    gcs.kv[protocol.result_key("raylane-01job-1")] = protocol.encode_result({"loss": 0.5})
    assert backend.result("raylane-01job-1") == {"loss": 0.5}
    backend.forget_result("raylane-01job-1")
    assert gcs.kv == {}
    # A value that is not JSON (the job's own code wrote the key) is no result, not an error each pass.
    gcs.kv[protocol.result_key("raylane-01job-2")] = b"{"
    assert backend.result("raylane-01job-2") is None


def test_an_unreachable_gcs_delays_a_result_then_gives_it_up_without_holding_the_job(monkeypatch):
    now = [1000.0]
    monkeypatch.setattr(ray_jobs.time, "monotonic", lambda: now[0])
    gcs = MemoryGcs()
    gcs.down = True
    backend = RayJobsBackend("http://ray.invalid", gcs=gcs)
    with pytest.raises(ResultUnavailable):
        backend.result("raylane-01job-1")
    with pytest.raises(ResultUnavailable):  # within RESULT_RETRY_S: the GCS is not asked again
        backend.result("raylane-01job-1")
    assert gcs.calls["result"] == 1
    now[0] += ray_jobs.RESULT_RETRY_S
    with pytest.raises(ResultUnavailable):
        backend.result("raylane-01job-1")
    assert gcs.calls["result"] == 2
    now[0] += backend.result_patience_s
    assert backend.result("raylane-01job-1") is None  # given up: the attempt ends without it
    backend.forget_result("raylane-01job-1")  # a copy that cannot be deleted is left, with a warning
    assert backend._result_failing == {}

    gcs.down = False  # back before the patience ran out: the result arrives
    gcs.kv[protocol.result_key("raylane-01job-2")] = protocol.encode_result({"ok": True})
    assert backend.result("raylane-01job-2") == {"ok": True}


def _summary(cmdline):
    return {"data": {"summary": [
        {"raylet": {"nodeId": "w", "isHeadNode": False}, "cmdline": ["raylet", "--gcs-address=10.0.0.1:9999"]},
        {"raylet": {"nodeId": "h", "isHeadNode": True}, "cmdline": cmdline},
    ]}}


def test_without_an_address_the_gcs_is_the_one_the_head_node_was_started_with(monkeypatch):
    listed = {"cmdline": []}
    backend = RayJobsBackend("http://ray.invalid", token="tok")
    backend.http = httpx.Client(base_url="http://ray.invalid", transport=httpx.MockTransport(
        lambda req: httpx.Response(200, json=_summary(listed["cmdline"]))))
    # Ray's node list does not show the head's processes yet: no result for now, not a lost one.
    assert backend.gcs_address_from_nodes() is None
    with pytest.raises(ResultUnavailable, match="no GCS address"):
        backend.result("raylane-01job-1")
    listed["cmdline"] = ["/ray/raylet", "--raylet_socket_name=/tmp/s", "--gcs-address=192.168.1.5:6380", "--x=1"]
    assert backend.gcs_address_from_nodes() == "192.168.1.5:6380"
    backend._gcs_search_after = 0.0  # the search backoff is over
    backend._result_failing.clear()
    gcs = backend.find_gcs()
    try:
        assert gcs is backend.gcs and gcs.address == "192.168.1.5:6380" and gcs._metadata == (
            ("authorization", "Bearer tok"),)
    finally:
        backend.close()


def test_the_driver_command_shows_the_users_entrypoint_as_a_comment(tmp_path):
    """Ray's dashboard shows a job's entrypoint: the user's, after the wrapper (#48)."""
    env = _env(tmp_path)
    key = protocol.inputs_key("raylane-01job-3")
    shown = protocol.shown_entrypoint("training", "examples.train:main")
    command = protocol.driver_command(env, inputs_key=key, shown=shown)
    assert command.endswith("python -m raylane.jobs.run  # raylane training: examples.train:main")
    # A comment: the shell runs the same words as without it.
    assert shlex.split(command, comments=True) == shlex.split(protocol.driver_command(env, inputs_key=key))
    # Nothing can end the comment or reach the shell: a newline, $(...), ; and quotes become ?.
    odd = protocol.shown_entrypoint("command", "a\nrm -rf /; $(x) `y` 'z'")
    assert "\n" not in odd and not set("$;`'()\"") & set(odd)
    assert len(protocol.shown_entrypoint("sweep", "m:" + "f" * 1000)) < 240


def test_runtime_env_for_is_the_attempts_env_from_its_spec_alone(tmp_path):
    """A command's inputs ride in its env vars with its own entrypoint; a runner's go
    to Ray's store (entrypoint None), its workers getting only what their code reads
    (array index, parents) beside the spec's env vars, which win over the storage's."""
    from raylane.orchestrator.loops.dispatcher import runtime_env_for

    inputs = {Env.SPEC: "{}", Env.ARRAY_INDEX: "3", Env.JOB_ID: "01job"}
    storage = {"AWS_ACCESS_KEY_ID": "storage", "AWS_REGION": "eu"}
    cmd = JobSpec(name="c", kind="command", entrypoint="echo hi", runtime_env={"env_vars": {"AWS_REGION": "us"},
                                                                              "pip": ["rich"]})
    runtime_env, entrypoint, job_env = runtime_env_for(cmd, inputs, storage_env=storage, data_dir=tmp_path / "state")
    assert entrypoint == "echo hi" and runtime_env["pip"] == ["rich"]
    assert runtime_env["env_vars"] == {"AWS_ACCESS_KEY_ID": "storage", "AWS_REGION": "us", **inputs}
    assert job_env == {"AWS_ACCESS_KEY_ID": "storage", "AWS_REGION": "us"}
    runner = JobSpec(name="t", kind="training", entrypoint="m:f", runtime_env={"working_dir": "s3://b/code.zip"})
    runtime_env, entrypoint, job_env = runtime_env_for(runner, inputs, storage_env={}, data_dir=tmp_path / "state")
    assert entrypoint is None and runtime_env == {"env_vars": {Env.ARRAY_INDEX: "3"}, "working_dir": "s3://b/code.zip"}
    assert job_env == {Env.ARRAY_INDEX: "3"}
