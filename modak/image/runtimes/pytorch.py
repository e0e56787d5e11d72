"""PyTorch eager: threads, channels_last, autocast (bf16/fp16), TF32; inference or a training step.

A training step is forward, a loss (the job's: a built-in on seeded targets, or the user's ``module:function``;
else the mean square of the outputs: the data is random, the work is real), backward and an SGD-with-momentum
update.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from modak.image.runtimes.base import FunctionSession, RunRequest, loss_targets

AUTOCAST = {"bf16": "bfloat16", "fp16": "float16"}  # precision -> the dtype autocast computes in


def prepare(request: RunRequest, inputs: dict[str, np.ndarray]) -> FunctionSession:
    return build_session(request, inputs)


def build_session(request: RunRequest, inputs: dict[str, np.ndarray],
                  wrap: Callable[[Any], Any] | None = None) -> FunctionSession:
    """The session for a zoo model or the user's own (:func:`user_module`); ``wrap`` transforms the module (e.g.
    ``torch.compile``). ``inputs`` are unused: eager modules take any batch."""
    import torch

    if request.zoo is None and request.pytorch is None:
        raise ValueError(f"{request.runtime} runs PyTorch modules (a zoo architecture or the user's own); this "
                         "request has only an ONNX file")
    if request.threads:
        torch.set_num_threads(request.threads)
    device = torch.device("cuda" if request.device == "gpu" else "cpu")
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = request.precision == "tf32"
        torch.backends.cudnn.allow_tf32 = request.precision == "tf32"
    if request.zoo is not None:
        from modak.image.zoo import get_entry

        entry = get_entry(request.zoo)
        model, input_names = entry.build(request.input_shapes), list(entry.input_shapes)
    else:
        model, input_names = user_module(request), list(request.input_shapes)
    model = model.to(device)
    channels_last = bool(request.params.get("channels_last"))
    if channels_last:
        model = model.to(memory_format=torch.channels_last)  # type: ignore[call-overload]  # torch's hints omit it

    def tensors(feeds: Mapping[str, np.ndarray]) -> list[Any]:
        found = [torch.from_numpy(np.ascontiguousarray(feeds[name])).to(device) for name in input_names]
        return [t.contiguous(memory_format=torch.channels_last) if channels_last and t.dim() == 4 else t
                for t in found]
    module = wrap(model) if wrap else model
    dtype = getattr(torch, AUTOCAST[request.precision]) if request.precision in AUTOCAST else None
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    def autocast() -> Any:
        return torch.autocast(device.type, dtype=dtype, enabled=dtype is not None)

    if request.task == "inference":
        def infer(feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
            with torch.inference_mode(), autocast():
                outputs = _as_list(module(*tensors(feeds)))
            sync()
            return [o.float().cpu().numpy() for o in outputs]
        return FunctionSession(infer)

    model.train()
    optimizer = training_optimizer(model.parameters())
    scaler = torch.amp.GradScaler(device.type, enabled=request.precision == "fp16")
    loss_of = _loss(request, device)

    def train_step(feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        optimizer.zero_grad(set_to_none=True)
        with autocast():
            batch = tensors(feeds)
            loss = loss_of(module(*batch), dict(zip(input_names, batch)))
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        sync()
        return [loss.detach().float().cpu().numpy()]
    return FunctionSession(train_step)


def training_optimizer(parameters: Any) -> Any:
    """The training step's optimizer over ``parameters``: SGD with momentum."""
    import torch

    return torch.optim.SGD(parameters, lr=1e-3, momentum=0.9)


def user_module(request: RunRequest) -> Any:
    """The user's own model (``request.pytorch``) from the files beside the request's model file (the image's
    model folder): the factory's module called with its kwargs and the weights loaded (``weights_only``), or a
    ``torch.export`` program's module. The plan checked them in a child process when it was made."""
    from pathlib import Path

    import torch

    from modak.image.zoo import SEED

    spec = dict(request.pytorch or {})
    folder = Path(request.onnx_path).parent
    torch.manual_seed(SEED)  # as the plan's child did: weights the factory initializes are the export's
    if "program" in spec:
        return torch.export.load(folder / spec["program"]).module()
    model = getattr(_import_beside(folder, spec["module"]), spec["factory"])(**spec.get("kwargs", {}))
    if spec.get("weights"):
        model.load_state_dict(torch.load(folder / spec["weights"], map_location="cpu", weights_only=True), strict=True)
    return model.eval()  # as exported (a training session sets train mode)


def _import_beside(folder: Any, name: str) -> Any:
    """The user's module ``name`` (a ``.py`` file name, or a dotted name of a package) from ``folder``."""
    import importlib
    import importlib.util
    import sys
    from pathlib import Path

    if not name.endswith(".py"):
        sys.path.insert(0, str(folder))
        return importlib.import_module(name)
    found = importlib.util.spec_from_file_location(Path(name).stem, Path(folder) / Path(name).name)
    assert found is not None and found.loader is not None
    module = importlib.util.module_from_spec(found)
    sys.modules[found.name] = module
    found.loader.exec_module(module)
    return module


def _loss(request: RunRequest, device: Any) -> Callable[[Any, dict[str, Any]], Any]:
    """The training step's loss of (the module's outputs, the batch: input name -> tensor)."""
    from pathlib import Path

    import torch
    import torch.nn.functional as F

    if request.loss is None:
        return lambda outputs, batch: sum(o.float().square().mean() for o in _as_list(outputs))
    if ":" in request.loss:
        module, _, function = request.loss.rpartition(":")
        return getattr(_import_beside(Path(request.onnx_path).parent, module), function)
    name, targets = request.loss, {}

    def builtin(outputs: Any, batch: dict[str, Any]) -> Any:
        first = _as_list(outputs)[0].float()
        shape = tuple(first.shape)
        if shape not in targets:
            targets[shape] = torch.from_numpy(loss_targets(name, shape, request.seed)).to(device)
        if name == "cross_entropy":
            return F.cross_entropy(first.reshape(-1, shape[-1]), targets[shape].reshape(-1))
        return F.mse_loss(first, targets[shape])
    return builtin


def _as_list(outputs: Any) -> list[Any]:
    """A module's outputs as a list, in the order its ONNX export lists them (a mapping, e.g. a Hugging Face
    ``ModelOutput``: its values that are set)."""
    if isinstance(outputs, Mapping):
        return [value for value in outputs.values() if value is not None]
    return list(outputs) if isinstance(outputs, (list, tuple)) else [outputs]
