"""A predictor for examples/batch-inference.yaml: y = 3x + 1 per row, so a test
can check every output row."""

from __future__ import annotations

import numpy as np


class Linear:
    def __init__(self, slope: float = 3.0, intercept: float = 1.0):
        # Load the model here: once per actor, not once per batch.
        self.slope, self.intercept = slope, intercept

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {"id": batch["id"], "x": batch["x"], "y": self.slope * batch["x"] + self.intercept}
