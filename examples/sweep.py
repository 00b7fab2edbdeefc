"""The objective of examples/lr-sweep.yaml: a known optimum at lr = 1e-3,
batch_size = 32, so a test can check that the sweep finds its region."""

from __future__ import annotations

import math


def objective(config):
    lr, bs = config["lr"], config["batch_size"]
    loss = (math.log10(lr) + 3.0) ** 2 + (0.0 if bs == 32 else 0.25)
    return {"loss": loss}
