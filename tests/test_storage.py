"""Job storage (issue #13, point 3) without Ray: where the control plane puts it,
what it refuses, and the runners' side of it on a path and on an S3 endpoint on
loopback (moto); where a service says it is reachable (point 6)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from raylane.jobs import storage as js
from raylane.jobs.batch_inference import resolve_output
from raylane.jobs.service import client_url
from raylane.jobs.training import TrainContext
from raylane.orchestrator.domain.profile import ServeIngress
from raylane.orchestrator.loops.dispatcher import job_storage
from raylane.orchestrator.settings import Settings
from tests.s3 import CREDENTIALS, moto_s3


@pytest.fixture(scope="module")
def s3():
    with moto_s3() as s:
        yield s


@pytest.fixture
def s3_env(monkeypatch):
    for k, v in CREDENTIALS.items():  # what RAYLANE_STORAGE_ENV hands a job's processes
        monkeypatch.setenv(k, v)


# Settings ----------------------------------------------------------------------


def test_the_default_storage_is_a_directory_beside_data_dir_not_in_it(tmp_path):
    s = Settings(data_dir=tmp_path / "state")
    assert s.resolved_storage_uri == str(tmp_path / "state-storage")
    assert s.storage_local_root == tmp_path / "state-storage"
    assert not s.storage_local_root.is_relative_to(s.data_dir.resolve())


@pytest.mark.parametrize("uri, words", [
    ("relative/dir", "must be absolute"),
    ("ftp://host/x", "scheme 'ftp'"),
    ("s3://", "names no bucket"),
    ("{data_dir}/jobs", "inside data_dir"),
    ("{data_dir}", "inside data_dir"),
    ("file://{data_dir}/jobs", "inside data_dir"),
])
def test_a_storage_uri_that_jobs_could_not_share_or_that_reaches_the_state_is_refused(tmp_path, uri, words):
    with pytest.raises(ValidationError, match=words) as e:
        Settings(data_dir=tmp_path, storage_uri=uri.format(data_dir=tmp_path))
    assert "RAYLANE_STORAGE_URI" in str(e.value)


def test_storage_env_holds_credentials_not_raylane_or_ray_settings(tmp_path):
    with pytest.raises(ValidationError, match="RAYLANE_STORAGE_ENV"):
        Settings(data_dir=tmp_path, storage_env={"RAYLANE_ADMIN_TOKEN": "x"})
    ok = Settings(data_dir=tmp_path, storage_uri="s3://b/p", storage_env=CREDENTIALS)
    assert ok.storage_local_root is None and ok.storage_env == CREDENTIALS


def test_each_job_has_its_own_prefix_under_the_root():
    assert job_storage("s3://b/jobs/", "vision", "01J") == "s3://b/jobs/vision/01J"
    assert job_storage("/mnt/shared", "vision", "01J") == "/mnt/shared/vision/01J"


# The runners' side -------------------------------------------------------------


def _checkpoint(root: Path, name: str, step: int) -> Path:
    d = root / name
    d.mkdir(parents=True)
    (d / "state.json").write_text(json.dumps({"step": step}))
    return d


def test_a_checkpoint_stored_on_s3_is_found_by_another_node_and_a_half_one_is_not(s3, s3_env, tmp_path):
    store = js.Storage(f"s3://{s3.bucket}/default/01J/checkpoints", s3.endpoint)
    assert store.latest_checkpoint() is None
    store.put_dir(_checkpoint(tmp_path / "a", "checkpoint_000050", 50), "checkpoint_000050")
    # A node lost mid-upload: files without the marker.
    s3.client().put_object(Bucket=s3.bucket, Key="default/01J/checkpoints/checkpoint_000100/state.json", Body=b"{")
    assert store.latest_checkpoint() == "checkpoint_000050"
    got = store.get_dir("checkpoint_000050", tmp_path / "b")
    assert json.loads((got / "state.json").read_text()) == {"step": 50}
    assert f"default/01J/checkpoints/checkpoint_000050/{js.COMMITTED}" in s3.keys("default/01J/")


def test_training_stores_checkpoints_on_report_and_a_new_attempt_resumes_from_them(s3, s3_env, tmp_path):
    store = js.Storage(f"s3://{s3.bucket}/default/02J/checkpoints", s3.endpoint)
    first = TrainContext(0, 1, str(tmp_path / "node1"), {}, store=store)
    _checkpoint(first.checkpoint_dir, "checkpoint_000010", 10)
    assert s3.keys("default/02J/") == []  # written, not yet reported
    first.report(step=10)
    _checkpoint(first.checkpoint_dir, "checkpoint_000020", 20)
    first.report(step=20)
    assert store.latest_checkpoint() == "checkpoint_000020"

    again = TrainContext(0, 1, str(tmp_path / "node2"), {}, store=store)  # another node, empty disk
    latest = again.latest_checkpoint()
    assert latest.name == "checkpoint_000020" and json.loads((latest / "state.json").read_text()) == {"step": 20}
    again.report(step=21)  # the fetched checkpoint is not stored again
    assert again.store_checkpoints() == []


def test_tune_and_ray_data_open_s3_uris_through_the_endpoint(s3, s3_env):
    import pyarrow.fs as pafs

    fs, path = js.filesystem(f"s3://{s3.bucket}/default/03J/tune", s3.endpoint)
    assert isinstance(fs, pafs.S3FileSystem) and path == f"{s3.bucket}/default/03J/tune"
    with fs.open_output_stream(f"{path}/x") as f:
        f.write(b"1")
    assert s3.keys("default/03J/") == ["default/03J/tune/x"]
    fs, path = js.filesystem("/mnt/shared/j")
    assert isinstance(fs, pafs.LocalFileSystem) and path == "/mnt/shared/j"


def test_batch_output_goes_to_the_job_storage_unless_the_spec_names_a_place():
    st = js.Storage("s3://b/default/04J")
    assert resolve_output(None, st) == "s3://b/default/04J/output"
    assert resolve_output("preds.parquet", st) == "s3://b/default/04J/preds.parquet"
    assert resolve_output("s3://other/out", st) == "s3://other/out"
    assert resolve_output("/mnt/shared/out", st) == "/mnt/shared/out"


# Services ------------------------------------------------------------------------


def test_a_service_reports_the_url_a_client_should_use():
    assert client_url(ServeIngress(), "/m", "10.0.0.5") == "http://127.0.0.1:8100/m"
    assert client_url(ServeIngress(host="0.0.0.0", port=9000), "/m", "10.0.0.5") == "http://10.0.0.5:9000/m"
    assert client_url(ServeIngress(host="::"), "/m", "fd00::5") == "http://[fd00::5]:8100/m"
    assert client_url(ServeIngress(host="0.0.0.0", public_url="https://svc.example.com/"), "/m",
                      "10.0.0.5") == "https://svc.example.com/m"
    with pytest.raises(ValidationError):
        ServeIngress(public_url="javascript:alert(1)")
