"""A service reachable off the host (issue #13, point 6): the profile says Serve
binds 0.0.0.0 on a port of its choosing; the service job's route is on that port,
its proxy listens on every interface (not loopback only), and the service answers
at the URL it reports and at this machine's other addresses."""

from __future__ import annotations

import socket

from pathlib import Path

import httpx
import pytest

from tests.helpers import wait_for
from tests.ray.conftest import wait_status
from tests.ray_autoscale.conftest import SERVE_PORT

pytestmark = [pytest.mark.ray, pytest.mark.slow]


def _other_addresses() -> list[str]:
    """This machine's IPv4 addresses other than loopback (none in some containers)."""
    try:
        return [a for a in socket.gethostbyname_ex(socket.gethostname())[2] if not a.startswith("127.")]
    except OSError:
        return []


def _listening_on(port: int) -> set[str]:
    """The addresses a TCP socket listens on at ``port`` (Linux's /proc/net/tcp*)."""
    out = set()
    for table, width in (("tcp", 8), ("tcp6", 32)):
        for line in Path(f"/proc/net/{table}").read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            addr, hexport = local.split(":")
            if state == "0A" and int(hexport, 16) == port:  # 0A: LISTEN
                out.add("any" if set(addr) == {"0"} else addr)
    return out


def test_a_service_binds_where_the_profile_says_and_reports_that_url(aapi):
    job = aapi.post("/v1/jobs", json={"name": "off-host", "kind": "service", "entrypoint": "examples.serve_app:Linear",
                                      "resources": {"cpus_per_worker": 0.25}, "placement": {"node_group": "cpu"},
                                      "service": {"replicas": 1, "route_prefix": "/linear"}}).json()

    def routed():
        j = aapi.get(f"/v1/jobs/{job['id']}").json()
        assert j["status"] in ("PENDING", "DISPATCHING", "RUNNING"), j["status_reason"]
        return j["result"] and j["result"].get("url")

    url = wait_for(routed, timeout=300, what="the service's route")
    assert url.endswith(f":{SERVE_PORT}/linear"), url

    def answers(u):
        try:
            r = httpx.post(u, json={"x": 2}, timeout=5)
        except httpx.HTTPError:
            return False
        return r.status_code == 200 and r.json() == {"y": 7.0}

    wait_for(lambda: answers(url), timeout=120, what="the service answers at its URL")
    listening = _listening_on(SERVE_PORT)
    assert "any" in listening, listening  # every interface (0.0.0.0 or ::), not 127.0.0.1 alone
    for address in _other_addresses()[:2]:
        assert answers(f"http://{address}:{SERVE_PORT}/linear"), address
    aapi.post(f"/v1/jobs/{job['id']}/cancel")
    wait_status(aapi, job["id"], {"CANCELLED"}, timeout=120)
