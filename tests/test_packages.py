"""Code from the client: the zip built on the client (.gitignore, excludes,
a deterministic hash, the size limit checked before anything is sent), and
the API's /v1/packages (content-addressed upload, who may, how much, the
sweep, a spec naming a package)."""

from __future__ import annotations

import hashlib
import io
import os
import shutil
import subprocess
import sys
import zipfile
from datetime import timedelta

import pytest

from raylane.client import packaging
from raylane.client.packaging import PackageTooLarge, build, list_files
from tests.conftest import ADMIN_HEADERS, ROOT, free_port

HELLO = {"name": "hello", "kind": "command", "entrypoint": "python -c 'print(42)'"}


def tree(root, files: dict[str, str | bytes]):
    for rel, body in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(body if isinstance(body, bytes) else body.encode())
    return root


def names(pkg) -> list[str]:
    return sorted(zipfile.ZipFile(io.BytesIO(pkg.data)).namelist())


# The zip -----------------------------------------------------------------------


def test_gitignore_rules_are_honoured_in_every_directory(tmp_path):
    tree(tmp_path, {
        ".gitignore": "# build output\n*.log\n/data/\nbuild\n!keep.log\ndocs/*.tmp\n",
        "train.py": "x", "a.log": "x", "keep.log": "x", "data/big.bin": "x", "src/data/ok.py": "x",
        "build/out.o": "x", "src/build": "file named like a dir rule", "docs/a.tmp": "x", "docs/sub/b.tmp": "x",
        "src/.gitignore": "secret*.py\n", "src/secret_key.py": "x", "src/model.py": "x", "secret_top.py": "x",
        ".git/HEAD": "x", "src/__pycache__/m.cpython-311.pyc": "x", "m.pyc": "x",
    })
    got = [rel for rel, _ in list_files(tmp_path)]
    assert got == sorted(got)
    assert set(got) == {".gitignore", "train.py", "keep.log", "src/data/ok.py", "docs/sub/b.tmp", "src/.gitignore",
                        "src/model.py", "secret_top.py"}


def test_excludes_win_and_gitignore_can_be_ignored(tmp_path):
    tree(tmp_path, {".gitignore": "*.csv\n!keep.csv\n", "keep.csv": "x", "other.csv": "x", "ckpt/w.pt": "x",
                    "m/w.pt": "x", "main.py": "x"})
    assert [r for r, _ in list_files(tmp_path, ["keep.csv", "ckpt/", "**/*.pt"])] == [".gitignore", "main.py"]
    assert "other.csv" in [r for r, _ in list_files(tmp_path, gitignore=False)]


def test_the_hash_depends_on_the_tree_alone(tmp_path):
    a = tree(tmp_path / "a", {"pkg/__init__.py": "", "pkg/mod.py": "X = 1\n", "run.sh": "#!/bin/sh\n"})
    (a / "run.sh").chmod(0o755)
    first = build(a)
    b = tmp_path / "b"
    shutil.copytree(a, b)  # new inode times, another path
    os.utime(b / "pkg" / "mod.py", (1, 1))
    assert build(b).sha256 == first.sha256 == build(a).sha256
    assert first.sha256 == hashlib.sha256(first.data).hexdigest()
    assert names(first) == ["pkg/__init__.py", "pkg/mod.py", "run.sh"]  # at the top, as Ray unpacks gcs:// dirs
    info = zipfile.ZipFile(io.BytesIO(first.data)).getinfo("run.sh")
    assert (info.external_attr >> 16) & 0o777 == 0o755
    (b / "pkg" / "mod.py").write_text("X = 2\n")
    assert build(b).sha256 != first.sha256


def test_a_tree_over_the_limit_is_refused_naming_its_biggest_files(tmp_path):
    tree(tmp_path, {"weights.bin": b"0" * 5000, "data/set.npy": b"0" * 3000, "main.py": "x"})
    with pytest.raises(PackageTooLarge) as e:
        build(tmp_path, max_bytes=4096)
    msg = str(e.value)
    assert str(tmp_path.resolve()) in msg and "weights.bin (5000 bytes)" in msg and "data/set.npy" in msg
    assert msg.index("weights.bin") < msg.index("data/set.npy")
    assert build(tmp_path, max_bytes=4096, excludes=["*.bin"]).files == 2


def test_cli_refuses_an_oversized_working_dir_before_sending_anything(tmp_path):
    laptop = tree(tmp_path / "laptop", {"train.py": "x", "model.ckpt": b""})
    with open(laptop / "model.ckpt", "r+b") as f:  # a sparse file over the default limit: no disk spent
        f.truncate(packaging.DEFAULT_MAX_BYTES + 1)
    spec = tmp_path / "hello.yaml"
    spec.write_text("name: hello\nkind: command\nentrypoint: python -c 'print(42)'\n")
    # Nothing listens at this URL: had the CLI tried to send, it would say it cannot connect.
    url = f"http://127.0.0.1:{free_port()}"
    env = {**os.environ, "RAYLANE_URL": url, "NO_COLOR": "1", "COLUMNS": "200"}
    for args in (["submit", str(spec), "--working-dir", str(laptop)],
                 ["run", "--working-dir", str(laptop), "--", "python", "train.py"]):
        r = subprocess.run([sys.executable, "-m", "raylane.client.cli", *args], capture_output=True, text=True,
                           cwd=ROOT, env=env, timeout=60)
        assert r.returncode == 2, r.stdout + r.stderr
        out = " ".join(r.stderr.split())
        assert str(laptop.resolve()) in out and "model.ckpt" in out and "cannot connect" not in out, out


def test_sdk_sends_nothing_for_an_oversized_tree(tmp_path):
    import httpx

    from raylane import Client

    sent = []
    transport = httpx.MockTransport(lambda req: sent.append(req) or httpx.Response(500))
    tree(tmp_path, {"big.bin": b"0" * 2048})
    with Client("http://raylane.invalid", transport=transport) as c, pytest.raises(PackageTooLarge):
        c.upload_package(tmp_path, max_bytes=1024)
    assert sent == []


# The API -----------------------------------------------------------------------


def put(api, data: bytes, **kw):
    return api.put(f"/v1/packages/{hashlib.sha256(data).hexdigest()}", content=data, **kw)


def test_upload_is_content_addressed(api):
    data = b"PK zip bytes"
    sha = hashlib.sha256(data).hexdigest()
    assert api.head(f"/v1/packages/{sha}").status_code == 404
    r = put(api, data)
    assert r.status_code == 201 and r.json()["uri"] == f"raylane://packages/{sha}"
    assert put(api, data).status_code == 200  # already there: nothing stored twice
    assert api.head(f"/v1/packages/{sha}").status_code == 200
    r = api.put(f"/v1/packages/{'0' * 64}", content=data)
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "sha256"]
    r = api.put("/v1/packages/ABC", content=data)
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["path", "sha256"]


def test_only_members_and_admins_upload_and_the_size_is_capped(api, cp):
    for role in ("member", "viewer"):
        r = api.post("/v1/tokens", json={"name": f"a-{role}", "project": "default", "role": role})
        assert r.status_code == 201, r.text
        headers = {"Authorization": f"Bearer {r.json()['token']}"}
        r = put(api, f"by a {role}".encode(), headers=headers)
        assert r.status_code == (201 if role == "member" else 403), r.text
    cp.settings.package_max_bytes = 1024  # the service checks it per upload (the body limit is the outer bound)
    r = put(api, b"0" * 2048)
    assert r.status_code in (413, 422) and "1024" in r.text


def test_a_spec_may_name_only_an_uploaded_package(api):
    data = b"PK code"
    sha = hashlib.sha256(data).hexdigest()
    spec = {**HELLO, "runtime_env": {"working_dir": f"raylane://packages/{sha}"}}
    r = api.post("/v1/jobs", json=spec)
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "runtime_env.working_dir"]
    assert put(api, data).status_code == 201
    assert api.post("/v1/jobs", json=spec).status_code == 201
    r = api.post("/v1/jobs", json={**HELLO, "runtime_env": {"working_dir": "raylane://packages/nope"}})
    assert r.status_code == 422 and r.json()["detail"][0]["rule"] == "policy.working_dir.package"


def test_the_sweep_keeps_what_a_live_job_or_a_recent_use_needs(api, cp):
    from raylane.orchestrator.store import db, packages as store_packages
    from raylane.orchestrator.store.transitions import utcnow

    live, idle, fresh = b"PK live", b"PK idle", b"PK fresh"
    for data in (live, idle, fresh):
        assert put(api, data).status_code == 201
    sha = {d: hashlib.sha256(d).hexdigest() for d in (live, idle, fresh)}
    r = api.post("/v1/jobs", json={**HELLO, "runtime_env": {"working_dir": f"raylane://packages/{sha[live]}"}})
    assert r.status_code == 201  # PENDING: live
    old = utcnow() - timedelta(days=30)
    with db.transaction(cp.sessions) as s:
        for d in (live, idle):
            store_packages.touch(s, sha[d], now=old)
    assert cp.packages.sweep() == [sha[idle]]
    assert [api.head(f"/v1/packages/{sha[d]}").status_code for d in (live, idle, fresh)] == [200, 404, 200]
    assert api.post(f"/v1/jobs/{r.json()['id']}/cancel").status_code == 200
    with db.transaction(cp.sessions) as s:
        store_packages.touch(s, sha[live], now=old)
    assert cp.packages.sweep() == [sha[live]]  # its job has ended


# The handoff to Ray ---------------------------------------------------------------


def test_a_package_goes_to_rays_package_store_once(tmp_path):
    import httpx

    from raylane.orchestrator.backends.ray_jobs import PackageMissing, RayJobsBackend

    ray_has: dict[str, bytes] = {}
    seen: list[tuple[str, str]] = []

    def ray(req: httpx.Request) -> httpx.Response:
        seen.append((req.method, req.url.path))
        name = req.url.path.rsplit("/", 1)[-1]
        if req.method == "PUT":
            ray_has[name] = req.content
            return httpx.Response(200)
        return httpx.Response(200 if name in ray_has else 404)

    backend = RayJobsBackend("http://ray.invalid:8265")
    backend.http = httpx.Client(base_url=backend.dashboard_url, transport=httpx.MockTransport(ray))
    data = b"PK the zip"
    sha = hashlib.sha256(data).hexdigest()
    loads = []
    load = lambda: loads.append(1) or data  # noqa: E731
    assert backend.ensure_package(sha, load) == f"gcs://_ray_pkg_{sha}.zip"
    assert backend.ensure_package(sha, load) == f"gcs://_ray_pkg_{sha}.zip"
    assert ray_has == {f"_ray_pkg_{sha}.zip": data} and len(loads) == 1
    assert [m for m, _ in seen] == ["GET", "PUT", "GET"]
    with pytest.raises(PackageMissing):
        backend.ensure_package("0" * 64, lambda: None)


def test_the_dispatcher_hands_ray_the_package_a_spec_names(cp, settings):
    from raylane.orchestrator.domain.profile import default_profile
    from raylane.orchestrator.loops.dispatcher import Dispatcher

    class Backend:
        def __init__(self):
            self.got: dict[str, bytes | None] = {}

        def ensure_package(self, sha, load):
            self.got[sha] = load()
            return f"gcs://_ray_pkg_{sha}.zip"

    data = b"PK code"
    sha = hashlib.sha256(data).hexdigest()
    assert cp.packages.upload(sha, data, project="default", actor="t")
    backend = Backend()
    d = Dispatcher(settings, cp.sessions, backend, default_profile())
    env = d._packages_to_ray({"working_dir": f"raylane://packages/{sha}", "py_modules": ["s3://b/m.zip"],
                              "env_vars": {"A": "1"}})
    assert env == {"working_dir": f"gcs://_ray_pkg_{sha}.zip", "py_modules": ["s3://b/m.zip"], "env_vars": {"A": "1"}}
    assert backend.got == {sha: data}
    assert d._packages_to_ray({"working_dir": "/srv/code"}) == {"working_dir": "/srv/code"}


def test_a_database_error_reading_a_jobs_package_refuses_nothing_and_the_submit_is_tried_again(
        cp, settings, monkeypatch):
    """The dispatcher reads and marks a job's uploaded package in the database just
    before handing it to Ray. A failure there (a locked SQLite, a PostgreSQL
    failover) is the database's, not the job's: the attempt keeps its claim and is
    submitted, with the same id, once its lease expires, as when Ray is out of reach."""
    import sqlite3

    from sqlalchemy.exc import OperationalError, ProgrammingError

    from raylane.orchestrator.domain.profile import default_profile
    from raylane.orchestrator.domain.specs import JobSpec
    from raylane.orchestrator.domain.states import JobStatus
    from raylane.orchestrator.loops import dispatcher as dispatcher_mod
    from raylane.orchestrator.loops.dispatcher import Dispatcher
    from raylane.orchestrator.store import db, lifecycle
    from raylane.orchestrator.store.tables import jobs
    from tests.test_scheduler import view

    class Backend:
        reachability = None

        def __init__(self):
            self.submitted: list[tuple[str, dict]] = []

        def cluster_view(self):
            return view()

        def ensure_package(self, sha, load):
            assert load() is not None
            return f"gcs://_ray_pkg_{sha}.zip"

        def submit(self, *, submission_id, runtime_env, **kw):
            self.submitted.append((submission_id, runtime_env))

        def forget_inputs(self, sid):
            pass

    data = b"PK code"
    sha = hashlib.sha256(data).hexdigest()
    assert cp.packages.upload(sha, data, project="default", actor="t")
    job, _ = cp.submit(JobSpec(name="pkg", kind="command", entrypoint="python main.py",
                               runtime_env={"working_dir": f"raylane://packages/{sha}"}), project="default", actor="t")
    backend = Backend()
    d = Dispatcher(settings, cp.sessions, backend, default_profile())
    real_touch = dispatcher_mod.store_packages.touch

    def locked(*a, **kw):
        raise OperationalError("UPDATE packages", {}, Exception("database is locked"))

    monkeypatch.setattr(dispatcher_mod.store_packages, "touch", locked)
    d.run_once()
    got = cp.get(job.id, project=None)
    assert got.status is JobStatus.DISPATCHING and backend.submitted == [], got.status_reason
    monkeypatch.setattr(dispatcher_mod.store_packages, "touch", real_touch)
    d.run_once()
    assert backend.submitted == []  # still held by its lease
    with db.transaction(cp.sessions) as s:  # the lease runs out
        s.execute(jobs.update().where(jobs.c.id == job.id).values(lease_expires_at=jobs.c.created_at))
    d.run_once()
    assert [(sid, env["working_dir"]) for sid, env in backend.submitted] == [
        (f"raylane-{job.id}-1", f"gcs://_ray_pkg_{sha}.zip")]
    with db.transaction(cp.sessions) as s:
        assert lifecycle._attempt_status(s, job.id, 1).value == "SUBMITTED"

    # An error of the statement, not of the database's availability, fails again if
    # tried again: the job is refused with it, not held in DISPATCHING for ever.
    def broken(*a, **kw):
        raise ProgrammingError("UPDATE packages", {}, Exception("no such column: last_used_at"))

    other, _ = cp.submit(JobSpec(name="pkg2", kind="command", entrypoint="python main.py",
                                 runtime_env={"working_dir": f"raylane://packages/{sha}"}), project="default", actor="t")
    monkeypatch.setattr(dispatcher_mod.store_packages, "touch", broken)
    d.run_once()
    refused = cp.get(other.id, project=None)
    assert refused.status is JobStatus.FAILED and "no such column" in refused.status_reason, refused.status_reason

    # SQLite raises OperationalError for a broken statement too: still the job's refusal.
    def broken_sqlite(*a, **kw):
        raise OperationalError("UPDATE packages", {}, sqlite3.OperationalError("no such table: packages"))

    monkeypatch.setattr(dispatcher_mod.store_packages, "touch", real_touch)  # the submit reads it too
    third, _ = cp.submit(JobSpec(name="pkg3", kind="command", entrypoint="python main.py",
                                 runtime_env={"working_dir": f"raylane://packages/{sha}"}), project="default", actor="t")
    monkeypatch.setattr(dispatcher_mod.store_packages, "touch", broken_sqlite)
    d.run_once()
    refused = cp.get(third.id, project=None)
    assert refused.status is JobStatus.FAILED and "no such table" in refused.status_reason, refused.status_reason
