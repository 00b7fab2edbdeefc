"""A job sees none of the control plane's secrets (issue #13, point 5): the shared
cluster's nodes were started from an environment holding a fake admin token and
database URL (conftest.CONTROL_PLANE_SECRETS), as an operator's server may have;
a command job prints its environment and lists its working directory and every
parent of it."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.ray.conftest import CONTROL_PLANE_SECRETS, wait_status

pytestmark = pytest.mark.ray

LOOK = r"""env | sed 's/^/ENV /'; d=$(pwd); echo "CWD $d"; while :; do echo "LS $d: $(ls -A "$d" | tr '\n' ' ')"; [ "$d" = / ] && break; d=$(dirname "$d"); done"""


def test_a_job_sees_no_secret_and_no_data_dir(rapi, ray_cluster, ray_settings):
    job = rapi.post("/v1/jobs", json={"name": "look", "kind": "command", "entrypoint": LOOK}).json()
    done = wait_status(rapi, job["id"], {"SUCCEEDED", "FAILED", "CANCELLED"})
    assert done["status"] == "SUCCEEDED", done["status_reason"]
    log = rapi.get(f"/v1/jobs/{job['id']}/logs").text
    env = dict(line[4:].split("=", 1) for line in log.splitlines() if line.startswith("ENV ") and "=" in line)
    assert env.get("RAY_AUTH_MODE") == "token" and "PATH" in env  # the listing is really there

    assert not set(CONTROL_PLANE_SECRETS) & set(env)
    for secret in CONTROL_PLANE_SECRETS.values():
        assert secret not in log
    # The cluster's directory stands for the control plane's data_dir here (``raylane
    # serve --local-cluster`` keeps it at <data_dir>/cluster): no variable leads there.
    assert not [k for k, v in env.items() if str(ray_cluster.dir) in v]

    cwd = Path(next(line[4:] for line in log.splitlines() if line.startswith("CWD ")))
    for tree in (ray_cluster.dir, ray_settings.data_dir.resolve()):
        assert not cwd.is_relative_to(tree), (cwd, tree)
    listings = [line for line in log.splitlines() if line.startswith("LS ")]
    assert listings[-1].startswith("LS /:")  # it listed up to the root
    for line in listings:
        names = line.split(": ", 1)[1].split()
        assert "raylane.db" not in names and "admin_token" not in names and "state.json" not in names, line
