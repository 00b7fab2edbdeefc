"""GPU check: a torch training example through Raylane on a real NVIDIA GPU,
against the same training run directly, and the throughput ratio (goal >= 0.98).

Needs a machine with an NVIDIA GPU and torch installed. Elsewhere it says so and
exits 0 (a clean skip). It starts its own local cluster whose gpu group has the
machine's real GPUs, and a Raylane server attached to it.

    python bench/gpu_check.py [--steps 300]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def gpus_present() -> tuple[bool, str]:
    if shutil.which("nvidia-smi") is None:
        return False, "no nvidia-smi on this machine"
    try:
        import torch
    except ImportError:
        return False, "torch is not installed (pip install torch)"
    if not torch.cuda.is_available():
        return False, "torch sees no CUDA device"
    return True, torch.cuda.get_device_name(0)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=300)
    args = ap.parse_args()
    ok, what = gpus_present()
    if not ok:
        print(f"SKIP: {what}; the GPU check needs a real NVIDIA GPU.")
        return 0
    import httpx
    import torch

    from examples.torch_train import _Ctx, main as train
    from raylane.orchestrator.tooling.localcluster import LocalCluster
    from raylane.orchestrator.domain.profile import Profile, default_profile
    from bench import _server

    ctx = _Ctx()
    ctx.args = {"steps": args.steps}
    direct = train(ctx)
    n = torch.cuda.device_count()
    prof = default_profile().model_copy(deep=True)
    gpu = prof.group("gpu")
    gpu.accelerator.count = n
    work = Path(tempfile.mkdtemp(prefix="raylane-gpu-"))
    (work / "profile.yaml").write_text(json.dumps(prof.model_dump(mode="json")))
    cluster = LocalCluster(Profile.load(work / "profile.yaml"), work / "cluster")
    state = cluster.up()
    try:
        server, url = _server.start_server(work, {
            "RAYLANE_AUTH_ENABLED": "false", "RAYLANE_DASHBOARD_URL": state.dashboard_url,
            "RAYLANE_RAY_AUTH_TOKEN": state.token, "RAYLANE_PROFILE": str(work / "profile.yaml")})
    except BaseException:
        cluster.down()
        raise
    try:
        spec = {"name": "gpu-check", "kind": "training", "entrypoint": "examples.torch_train:main",
                "resources": {"num_workers": 1, "gpus_per_worker": 1, "cpus_per_worker": 1},
                "args": {"steps": args.steps}}
        job = httpx.post(url + "/v1/jobs", json=spec).json()
        t = time.time()
        while True:
            j = httpx.get(url + f"/v1/jobs/{job['id']}").json()
            if j["status"] in ("SUCCEEDED", "FAILED", "CANCELLED"):
                break
            if time.time() - t > 900:
                raise TimeoutError("job did not finish in 15 minutes")
            time.sleep(0.5)
        assert j["status"] == "SUCCEEDED", j["status_reason"]
        w = j["result"]["workers"][0]
        via = w["return"]
        out = {"gpu": what, "direct_steps_per_s": direct["steps_per_s"], "raylane_steps_per_s": via["steps_per_s"],
               "ratio": via["steps_per_s"] / direct["steps_per_s"], "raylane_device": via["device"],
               "cuda_visible_devices": w["cuda_visible_devices"], "node_group": w["node_group"]}
        print(json.dumps(out, indent=2))
        assert via["device"].startswith("cuda"), "torch did not use the GPU through Raylane"
        return 0
    finally:
        _server.stop_server(server)
        cluster.down()


if __name__ == "__main__":
    sys.exit(main())
