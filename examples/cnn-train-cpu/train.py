"""An ordinary PyTorch training loop over the network of model.py (the one the job plans for), with the image's
plan applied by modak.runtime.torch.prepare.

Synthetic, learnable data (noisy copies of ten fixed images), so the loss must go down.
Steps: the first argument or $STEPS (default 60). Logs the plan, the loss and step times.

Started by torchrun (a job with ``scaling``: $WORLD_SIZE > 1), it trains data-parallel: a gloo process group
(NCCL on GPUs) and DistributedDataParallel around the prepared model, each worker on batches of its own.
"""

import os
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
from model import build_model
from torch.nn.parallel import DistributedDataParallel

import modak.runtime.torch


def batches(steps: int, batch: int = 64, worker: int = 0):
    """Noisy copies of ten fixed random "digit" images, labelled by which one they copy; each worker draws its
    own."""
    digits = torch.randn(10, 1, 28, 28, generator=torch.Generator().manual_seed(0))
    generator = torch.Generator().manual_seed(1 + worker)
    for _ in range(steps):
        labels = torch.randint(0, 10, (batch,), generator=generator)
        yield digits[labels] + 2.0 * torch.randn(batch, 1, 28, 28, generator=generator), labels


def main() -> int:
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else int(os.environ.get("STEPS", "60"))
    torch.manual_seed(0)
    model = build_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    model, optimizer, step = modak.runtime.torch.prepare(model, optimizer)
    workers, rank = int(os.environ.get("WORLD_SIZE", "1")), int(os.environ.get("RANK", "0"))
    where = ""
    if workers > 1:
        dist.init_process_group("nccl" if step.device.type == "cuda" else "gloo")
        model = DistributedDataParallel(model, device_ids=[step.device] if step.device.type == "cuda" else None)
        where = f", worker {rank} of {workers} on {os.uname().nodename}"
    print(step.describe() + where, flush=True)
    losses = []
    for index, (images, labels) in enumerate(batches(steps, worker=rank), 1):
        images, labels = step.inputs(images), step.inputs(labels)
        with step:
            loss = F.cross_entropy(model(images), labels)
        step.update(loss)
        losses.append(loss.detach().item())
        if index % 10 == 0 or index == steps:
            print(f"step {index}: loss {sum(losses[-10:]) / len(losses[-10:]):.4f}, "
                  f"{step.times[-1] * 1e3:.1f} ms", flush=True)
    first, last = sum(losses[:10]) / len(losses[:10]), sum(losses[-10:]) / len(losses[-10:])
    print(f"done: {steps} steps, loss {first:.4f} -> {last:.4f}, median step {step.median_seconds() * 1e3:.1f} ms"
          + where, flush=True)
    if workers > 1:
        dist.barrier()  # every worker is done before any tears the group down (a gloo worker can hang otherwise)
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
