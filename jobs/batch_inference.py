"""Batch inference: Ray Data maps the user's predictor class over the input's
batches on the router's workers (spot CPU by default, GPUs if the spec asks)
and writes the output. Local paths and filesystem URIs (``s3://``, ``gs://``, via
pyarrow filesystems, ``raylane.jobs.storage.filesystem`` so the storage endpoint
applies) are read and written alike. Without an ``output_uri``, or with a relative
one, the output goes to the job's storage (``<storage>/output``).

The predictor is a class: constructed once per actor (load the model there),
called with a batch (a dict of numpy arrays) and returning a batch.
"""

from __future__ import annotations

import os
import traceback
from typing import Any

import ray

from raylane.jobs.base import RunContext, load_callable
from raylane.jobs.storage import Storage, filesystem
from raylane.orchestrator.domain import protocol

READERS = {"parquet": "read_parquet", "jsonl": "read_json", "csv": "read_csv"}
WRITERS = {"parquet": "write_parquet", "jsonl": "write_json", "csv": "write_csv"}


def infer_format(uri: str) -> str:
    u = uri.rstrip("/").lower()
    for ext, fmt in ((".parquet", "parquet"), (".jsonl", "jsonl"), (".json", "jsonl"), (".csv", "csv")):
        if u.endswith(ext):
            return fmt
    return "parquet"


# A spot node can vanish while Ray Data is still starting a predictor actor on
# it; Ray Data's default (0) then fails the whole run. Replace up to this many
# actors that die in a row while starting; a predictor whose constructor always
# fails still fails the job, after as many tries.
ACTOR_INIT_DEATHS = 3
NODE_LOSS_RERUNS = 3  # runs of the dataset again after a node died under it, in one attempt


def run(ctx: RunContext) -> dict[str, Any]:
    b = ctx.spec.batch
    pl = ctx.placement
    data_ctx = ray.data.DataContext.get_current()
    if "RAY_DATA_MAX_CONSECUTIVE_ACTOR_INIT_DEATHS" not in os.environ:  # the user's own setting wins
        data_ctx.max_consecutive_actor_init_deaths = max(data_ctx.max_consecutive_actor_init_deaths,
                                                         ACTOR_INIT_DEATHS)
    output_uri = resolve_output(b.output_uri, ctx.storage)
    endpoint = ctx.storage.endpoint
    fmt = b.format or infer_format(b.input_uri)
    out_fmt = b.format or infer_format(output_uri)
    in_fs, in_path = filesystem(b.input_uri, endpoint)
    out_fs, out_path = filesystem(output_uri, endpoint)
    predictor = load_callable(ctx.spec.entrypoint)
    concurrency = b.concurrency or pl.num_workers

    def once() -> tuple[int, int]:
        ds = getattr(ray.data, READERS[fmt])(in_path, filesystem=in_fs)
        rows_in = ds.count()
        out = ds.map_batches(
            predictor, batch_size=b.batch_size, concurrency=concurrency,
            num_cpus=pl.worker_resources.get("CPU", 1), num_gpus=pl.worker_resources.get("GPU", 0) or None,
            label_selector=pl.label_selector, fn_constructor_kwargs=ctx.spec.args.get("predictor_kwargs") or None,
        ).materialize()
        # The run owns its output: a run again (here, or in a retried attempt after
        # a preemption) must not add its files next to an earlier run's, or rows
        # would be written twice.
        _clear(out_fs, out_path)
        rows_out = out.count()
        getattr(out, WRITERS[out_fmt])(out_path, filesystem=out_fs)
        return rows_in, rows_out

    for run_no in range(1, NODE_LOSS_RERUNS + 2):
        try:
            rows_in, rows_out = once()
            break
        except Exception as e:
            node = _dead_node_in(e)
            if node is None or run_no > NODE_LOSS_RERUNS:
                raise
            # Ray Data recovers from most node losses by itself, but not from all
            # (an internal actor such as the Parquet footer reader lost with its
            # node fails the run): run the dataset again in this attempt rather
            # than hand Raylane a failed attempt and start a new driver.
            print(f"raylane: node {node[:12]} died under the dataset ({type(e).__name__}); "
                  f"running it again ({run_no} of {NODE_LOSS_RERUNS})", flush=True)
    return {"rows_in": rows_in, "rows_out": rows_out, "output_uri": output_uri, "format": out_fmt,
            "concurrency": concurrency, "node_group": pl.node_group,
            "driver_node_group": os.environ.get("RAY_NODE_TYPE_NAME"), "runs": run_no}


def _dead_node_in(exc: BaseException) -> str | None:
    """The id of a node that died under this exception, if Ray's own words in it
    name one that is no longer alive (a code bug is never run again)."""
    text = "".join(traceback.format_exception(exc))
    alive = {n["NodeID"] for n in ray.nodes() if n.get("Alive")}
    return next((nid for nid in protocol.RAY_NODE_DIED.findall(text) if nid not in alive), None)


def resolve_output(uri: str | None, storage: Storage) -> str:
    """Where the output goes: the spec's URI or absolute path, else inside the job's storage."""
    if uri and ("://" in uri or os.path.isabs(uri)):
        return uri
    return storage.child(uri or "output").uri


def _clear(fs, path: str) -> None:
    import pyarrow.fs as pafs

    info = fs.get_file_info(path)
    if info.type == pafs.FileType.Directory:
        fs.delete_dir_contents(path, missing_dir_ok=True)
    elif info.type == pafs.FileType.File:
        fs.delete_file(path)
