"""A small torch model trained on whatever device the worker was given (GPU when
Ray assigned one). Used by bench/gpu_check.py; torch is optional elsewhere."""

from __future__ import annotations

import time


def main(ctx):
    import torch

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    steps = int(ctx.args.get("steps", 300))
    torch.manual_seed(ctx.rank)
    model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 1024)).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(512, 1024, device=device)
    y = torch.randn(512, 1024, device=device)
    loss_fn = torch.nn.MSELoss()
    for _ in range(10):  # warm-up (kernels, allocator)
        opt.zero_grad(); loss_fn(model(x), y).backward(); opt.step()
    if device.type == "cuda":
        torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(steps):
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
    if device.type == "cuda":
        torch.cuda.synchronize()
    dt = time.perf_counter() - t
    return {"device": str(device), "gpu_name": torch.cuda.get_device_name(0) if device.type == "cuda" else None,
            "steps_per_s": steps / dt, "final_loss": float(loss)}


class _Ctx:
    rank, world_size, args = 0, 1, {}


if __name__ == "__main__":
    print(main(_Ctx()))
