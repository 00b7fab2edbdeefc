"""What reading each node's free resources adds to a dispatcher pass's node
listing (a co-located gang needs one node that holds it: docs/scheduling.md).

    python bench/gcs_nodes.py [--calls 300] [--pairs 5]

The local multi-node cluster (the default profile: head, gpu, spot-cpu, cpu
nodes) is started on free ports. Then, alternating, ``--pairs`` times:

- *reference*: the node list alone, one ``GetAllNodeInfo`` call to the GCS, as
  ``RayGcs.all_nodes`` made it before;
- *variant*: ``RayGcs.all_nodes`` as it is now, the node list and
  ``GetAllAvailableResources`` (each alive node's free resources).

``--calls`` back to back each; reported per pair: the median wall time of a
call (ms), and their ratio; then the median ratio over the pairs, its spread
(min-max) and the machine's load. The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _median_ms(fn, calls: int) -> float:
    times = []
    for _ in range(calls):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=300)
    ap.add_argument("--pairs", type=int, default=5)
    args = ap.parse_args(argv)
    from ray.core.generated import gcs_service_pb2

    from raylane.orchestrator.backends.ray_gcs import RayGcs
    from raylane.orchestrator.domain.profile import default_profile
    from raylane.orchestrator.tooling.localcluster import LocalCluster

    cluster = LocalCluster(default_profile(), Path(tempfile.mkdtemp(prefix="raylane-gcs-nodes-")) / "cluster")
    state = cluster.up()
    try:
        gcs = RayGcs(state.gcs_address, state.token)
        nodes, _ = gcs.all_nodes()
        alive = sum(1 for n in nodes if n["state"] == "ALIVE")
        assert all("resourcesAvailable" in n for n in nodes if n["state"] == "ALIVE"), "no free resources read"

        def reference():
            gcs._call(gcs._nodes.GetAllNodeInfo, gcs_service_pb2.GetAllNodeInfoRequest())

        pairs = []
        for _ in range(args.pairs):
            ref = _median_ms(reference, args.calls)
            var = _median_ms(gcs.all_nodes, args.calls)
            pairs.append({"reference_ms": round(ref, 3), "variant_ms": round(var, 3), "ratio": round(var / ref, 3)})
            print(f"  node list {ref:.3f} ms, with each node's free resources {var:.3f} ms: {var / ref:.2f}x",
                  flush=True)
        ratios = [p["ratio"] for p in pairs]
        res = {"alive_nodes": alive, "calls": args.calls, "pairs": pairs,
               "median_ratio": statistics.median(ratios), "spread": [min(ratios), max(ratios)],
               "added_ms_median": round(statistics.median(p["variant_ms"] - p["reference_ms"] for p in pairs), 3),
               "load": round(os.getloadavg()[0], 2)}
        print(f"gcs_nodes: {alive} alive nodes, median {res['median_ratio']}x "
              f"({res['spread'][0]}-{res['spread'][1]}), +{res['added_ms_median']} ms a listing, load {res['load']}")
        print(json.dumps(res, sort_keys=True))
        gcs.close()
        return res
    finally:
        cluster.down()


if __name__ == "__main__":
    main()
