"""A user's own top-level packages named like Raylane's folders (``jobs``, ``api``,
``client``, ``orchestrator``) are the ones their job imports: Raylane's runner
lives under the ``raylane`` namespace, so it takes none of those names first."""

from __future__ import annotations

import pytest

from tests.ray.conftest import wait_status

pytestmark = pytest.mark.ray
TERMINAL = {"SUCCEEDED", "FAILED", "CANCELLED"}


def test_a_job_imports_its_own_jobs_and_api_packages(rapi, tmp_path_factory):
    wd = tmp_path_factory.mktemp("userproj")  # outside the control plane's data_dir (tmp_path)
    for pkg in ("jobs", "api", "client", "orchestrator"):
        (wd / pkg).mkdir()
        (wd / pkg / "__init__.py").write_text(f"WHOSE = 'user {pkg}'\n")
    (wd / "jobs" / "train.py").write_text(
        "import api, client, orchestrator\n"
        "import jobs\n\n\n"
        "def main(config=None):\n"
        "    return {'jobs': jobs.WHOSE, 'api': api.WHOSE, 'client': client.WHOSE,\n"
        "            'orchestrator': orchestrator.WHOSE, 'file': jobs.__file__}\n")
    spec = {"name": "own-packages", "kind": "training", "entrypoint": "jobs.train:main",
            "runtime_env": {"working_dir": str(wd)},
            "resources": {"num_workers": 1, "gpus_per_worker": 0, "cpus_per_worker": 0.5}}
    r = rapi.post("/v1/jobs", json=spec)
    assert r.status_code == 201, r.text
    done = wait_status(rapi, r.json()["id"], TERMINAL, timeout=180)
    assert done["status"] == "SUCCEEDED", done["status_reason"]
    got = done["result"]["workers"][0]["return"]
    assert {k: got[k] for k in ("jobs", "api", "client", "orchestrator")} == {
        "jobs": "user jobs", "api": "user api", "client": "user client", "orchestrator": "user orchestrator"}
    assert "site-packages" not in got["file"] and "raylane" not in got["file"]
