"""PyTorch eager: threads, channels_last, autocast (bf16/fp16), TF32; inference or a training step.

A training step is forward, a loss (mean square of the outputs: the data is random, the work is real),
backward and an SGD-with-momentum update.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from modak.image.runtimes.base import FunctionSession, RunRequest

_AUTOCAST = {"bf16": "bfloat16", "fp16": "float16"}


def prepare(request: RunRequest, inputs: dict[str, np.ndarray]) -> FunctionSession:
    return build_session(request, inputs)


def build_session(request: RunRequest, inputs: dict[str, np.ndarray],
                  wrap: Callable[[Any], Any] | None = None) -> FunctionSession:
    """The session for a zoo model; ``wrap`` transforms the module (e.g. ``torch.compile``)."""
    import torch

    from modak.image.zoo import get_entry

    if request.zoo is None:
        raise ValueError(f"{request.runtime} runs zoo architectures; this request has only an ONNX file")
    if request.threads:
        torch.set_num_threads(request.threads)
    device = torch.device("cuda" if request.device == "gpu" else "cpu")
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = request.precision == "tf32"
        torch.backends.cudnn.allow_tf32 = request.precision == "tf32"
    entry = get_entry(request.zoo)
    model = entry.build(request.input_shapes).to(device)
    tensors = [torch.from_numpy(inputs[name]).to(device) for name in entry.input_shapes]
    if request.params.get("channels_last"):
        model = model.to(memory_format=torch.channels_last)
        tensors = [t.contiguous(memory_format=torch.channels_last) if t.dim() == 4 else t for t in tensors]
    module = wrap(model) if wrap else model
    dtype = getattr(torch, _AUTOCAST[request.precision]) if request.precision in _AUTOCAST else None
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    def autocast() -> Any:
        return torch.autocast(device.type, dtype=dtype, enabled=dtype is not None)

    if request.task == "inference":
        def infer() -> list[np.ndarray]:
            with torch.inference_mode(), autocast():
                outputs = _as_list(module(*tensors))
            sync()
            return [o.float().cpu().numpy() for o in outputs]
        return FunctionSession(infer)

    model.train()
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    scaler = torch.amp.GradScaler(device.type, enabled=request.precision == "fp16")

    def train_step() -> list[np.ndarray]:
        optimizer.zero_grad(set_to_none=True)
        with autocast():
            loss = sum(o.float().square().mean() for o in _as_list(module(*tensors)))
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        sync()
        return [loss.detach().float().cpu().numpy()]
    return FunctionSession(train_step)


def _as_list(outputs: Any) -> list[Any]:
    return list(outputs) if isinstance(outputs, (list, tuple)) else [outputs]
