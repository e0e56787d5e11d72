"""Apply the image's plan to your own PyTorch training loop.

    import torch
    import modak.runtime.torch

    model, optimizer, step = modak.runtime.torch.prepare(MyNet(), torch.optim.SGD(params, lr=0.1))
    print(step.describe())                 # runtime, device, precision, parameters, threads
    for x, y in batches:
        x, y = step.inputs(x), step.inputs(y)
        with step:                         # autocast in the plan's precision; the step's timer starts
            loss = loss_fn(model(x), y)
        step.update(loss)                  # backward, (scaled) optimizer step, zero_grad; the timer stops
    print(f"median step {step.median_seconds() * 1e3:.1f} ms")

What the plan's deployment (``$MODAK_PLAN``, the image's ``plan.json``) decides, applied as
:mod:`modak.image.runtimes.pytorch` applied it when ``modak bench`` measured the candidate: intra-op threads
(``$MODAK_THREADS``, which the image's entrypoint set from the real allocation), the device (CUDA for a GPU plan,
with TF32 on only for ``tf32``), ``channels_last`` (the model, and 4-D inputs through :meth:`Step.inputs`),
``torch.compile`` with the plan's mode (runtime ``torch-compile``; ``cuda_graphs`` on a GPU: its CUDA-graph twin,
:func:`modak.image.runtimes.torch_compile.compile_mode`), autocast for ``bf16``/``fp16`` and a gradient
scaler for ``fp16``. A plan whose runtime is not a PyTorch runtime is refused.

Started by torchrun (a job with ``scaling``: one process per worker), each process takes the GPU of its
``LOCAL_RANK`` and its share of the threads (``LOCAL_WORLD_SIZE`` processes share the node). Distributed training
itself stays the script's: ``torch.distributed.init_process_group()`` and ``DistributedDataParallel`` around the
model that :func:`prepare` returns.
"""

from __future__ import annotations

import os
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from modak.image.deployment import PLAN_VARIABLE, Deployment, environment, location, read_deployment
from modak.image.runtimes.base import adapter, adapters
from modak.image.runtimes.pytorch import AUTOCAST
from modak.image.runtimes.torch_compile import compile_mode


@dataclass
class Step:
    """One training step's context: autocast while the forward pass runs, the (scaled) update, step times."""

    deployment: Deployment
    threads: int
    device: Any  # torch.device
    optimizer: Any
    scaler: Any  # torch.amp.GradScaler (enabled for fp16 only)
    times: list[float] = field(default_factory=list)
    _autocast: Any = None
    _start: float | None = None

    @property
    def channels_last(self) -> bool:
        return bool(self.deployment.params.get("channels_last"))

    @property
    def autocast_dtype(self) -> Any:
        """The dtype the forward pass computes in (None: float32)."""
        import torch

        name = AUTOCAST.get(self.deployment.precision)
        return getattr(torch, name) if name else None

    def inputs(self, tensor: Any) -> Any:
        """``tensor`` on the plan's device, in channels_last memory format when the plan chose it (4-D only)."""
        import torch

        tensor = tensor.to(self.device, non_blocking=True)
        if self.channels_last and tensor.dim() == 4:
            tensor = tensor.contiguous(memory_format=torch.channels_last)
        return tensor

    def __enter__(self) -> Step:
        import torch

        self._start = time.perf_counter()
        dtype = self.autocast_dtype
        self._autocast = torch.autocast(self.device.type, dtype=dtype, enabled=dtype is not None)
        self._autocast.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._autocast.__exit__(*exc)
        self._autocast = None

    def update(self, loss: Any) -> None:
        """Backward through ``loss``, the optimizer step (through the gradient scaler), zero the gradients, and
        record the step's time (from entering the context)."""
        import torch

        self.scaler.scale(loss).backward()
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        if self._start is not None:
            self.times.append(time.perf_counter() - self._start)
            self._start = None

    def median_seconds(self, skip: int = 1) -> float:
        """Median step time, leaving out the first ``skip`` steps (compilation, warm-up)."""
        times = self.times[skip:] or self.times
        return statistics.median(times) if times else float("nan")

    def describe(self) -> str:
        """One line for the job's log: what the plan decided and what this process got."""
        params = " ".join(f"{k}={v}" for k, v in sorted(self.deployment.params.items()))
        return (f"modak plan: runtime {self.deployment.runtime} on {self.device.type}, precision "
                f"{self.deployment.precision}, {params}; {self.threads} threads")


def prepare(model: Any, optimizer: Any, *, plan: str | Path | None = None) -> tuple[Any, Any, Step]:
    """``model`` (moved, formatted, compiled as the plan says), ``optimizer`` (the same object: the model's
    parameters are moved in place) and the :class:`Step` context for the loop (see the module docstring)."""
    import torch

    deployment = read_deployment(plan or location(PLAN_VARIABLE))
    if adapter(deployment.runtime).framework != "pytorch":
        torch_runtimes = [name for name, runtime in adapters().items() if runtime.framework == "pytorch"]
        raise ValueError(f"the plan chose runtime {deployment.runtime!r}; modak.runtime.torch applies only the "
                         f"PyTorch runtimes ({', '.join(torch_runtimes)}): constrain the job's runtimes to them")
    threads = _threads(deployment)
    torch.set_num_threads(threads)
    device = torch.device("cuda" if deployment.device == "gpu" else "cpu")
    local_rank = os.environ.get("LOCAL_RANK", "")
    if device.type == "cuda" and local_rank.isdigit():  # torchrun: one GPU per process
        device = torch.device("cuda", int(local_rank))
        torch.cuda.set_device(device)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = deployment.precision == "tf32"
        torch.backends.cudnn.allow_tf32 = deployment.precision == "tf32"
    model.to(device)
    if deployment.params.get("channels_last"):
        model.to(memory_format=torch.channels_last)
    model.train()
    if deployment.runtime == "torch-compile":
        model = torch.compile(model, mode=compile_mode(deployment.params, deployment.device))
    scaler = torch.amp.GradScaler(device.type, enabled=deployment.precision == "fp16")
    return model, optimizer, Step(deployment, threads, device, optimizer, scaler)


def _threads(deployment: Deployment) -> int:
    """The threads the image's entrypoint set (``$MODAK_THREADS``), else the plan's policy on this allocation;
    divided among the ``$LOCAL_WORLD_SIZE`` processes torchrun started on this node."""
    given = os.environ.get("MODAK_THREADS", "")
    threads = int(given) if given.isdigit() else int(environment(deployment)["MODAK_THREADS"])
    processes = os.environ.get("LOCAL_WORLD_SIZE", "")
    return max(1, threads // int(processes)) if processes.isdigit() and int(processes) > 1 else threads
