"""The entry point of a lane host of a runtime env (docs/fast-lane.md, "Lanes per
runtime env"): ``python -m raylane.jobs.lane_env``, the same host as
``raylane.jobs.lane``, which lists its env's items only (``RAYLANE_LANE_ENV``).

A module of its own so that a node whose raylane package predates lane envs
cannot run one. Started as ``raylane.jobs.lane``, such a host would ignore the
env it does not know and take the items of the node's own environment, running
other jobs in this env's code and packages while this env's items waited for a
host that never lists them. Here ``python -m`` fails on that node (no such
module): its Ray job fails at start, and the control plane's start backoff and
log say so.
"""

from __future__ import annotations

import os
import sys

from raylane.jobs.lane import main
from raylane.orchestrator.domain import lanes

if __name__ == "__main__":
    if not os.environ.get(lanes.HOST_ENV_ENV):
        sys.exit(f"{lanes.HOST_ENV_ENV} is not set: a lane env's host needs its env")
    sys.exit(main())
