"""Batch inference: Ray Data maps the user's predictor class over the input's
batches on the router's workers (spot CPU by default, GPUs if the spec asks)
and writes the output. Local paths and filesystem URIs (``s3://``, ``gs://``, via
pyarrow filesystems) are read and written alike.

The predictor is a class: constructed once per actor (load the model there),
called with a batch (a dict of numpy arrays) and returning a batch.
"""

from __future__ import annotations

import os
from typing import Any

import ray

from jobs.base import RunContext, load_callable

READERS = {"parquet": "read_parquet", "jsonl": "read_json", "csv": "read_csv"}
WRITERS = {"parquet": "write_parquet", "jsonl": "write_json", "csv": "write_csv"}


def infer_format(uri: str) -> str:
    u = uri.rstrip("/").lower()
    for ext, fmt in ((".parquet", "parquet"), (".jsonl", "jsonl"), (".json", "jsonl"), (".csv", "csv")):
        if u.endswith(ext):
            return fmt
    return "parquet"


def run(ctx: RunContext) -> dict[str, Any]:
    b = ctx.spec.batch
    pl = ctx.placement
    fmt = b.format or infer_format(b.input_uri)
    ds = getattr(ray.data, READERS[fmt])(b.input_uri)
    rows_in = ds.count()
    predictor = load_callable(ctx.spec.entrypoint)
    concurrency = b.concurrency or pl.num_workers
    out = ds.map_batches(
        predictor, batch_size=b.batch_size, concurrency=concurrency,
        num_cpus=pl.worker_resources.get("CPU", 1), num_gpus=pl.worker_resources.get("GPU", 0) or None,
        label_selector=pl.label_selector, fn_constructor_kwargs=ctx.spec.args.get("predictor_kwargs") or None,
    )
    out_fmt = b.format or infer_format(b.output_uri)
    out = out.materialize()
    # The attempt owns its output: a retried attempt (after a preemption) must not
    # add its files next to a failed attempt's, or rows would be written twice.
    _clear(b.output_uri)
    rows_out = out.count()
    getattr(out, WRITERS[out_fmt])(b.output_uri)
    return {"rows_in": rows_in, "rows_out": rows_out, "output_uri": b.output_uri, "format": out_fmt,
            "concurrency": concurrency, "node_group": pl.node_group,
            "driver_node_group": os.environ.get("RAY_NODE_TYPE_NAME")}


def _clear(uri: str) -> None:
    import pyarrow.fs as pafs

    fs, path = pafs.FileSystem.from_uri(uri if "://" in uri else os.path.abspath(uri))
    info = fs.get_file_info(path)
    if info.type == pafs.FileType.Directory:
        fs.delete_dir_contents(path, missing_dir_ok=True)
    elif info.type == pafs.FileType.File:
        fs.delete_file(path)
