"""Generate the input of examples/batch-inference.yaml: N rows of (id, x) as Parquet."""

from __future__ import annotations

import sys

import pyarrow as pa
import pyarrow.parquet as pq


def make(path: str, n: int = 1000) -> None:
    pq.write_table(pa.table({"id": list(range(n)), "x": [float(i) / 10 for i in range(n)]}), path)


if __name__ == "__main__":
    make(sys.argv[1] if len(sys.argv) > 1 else "/tmp/raylane-example-input.parquet")
