"""PyTorch eager: threads, channels_last, autocast (bf16/fp16), TF32; inference or a training step. On a GPU, the
levers of #68 (:func:`gpu_levers`): ``io=pinned`` stages inputs and outputs in pinned host buffers copied with
``non_blocking`` (one synchronize per step), and ``cuda_graphs`` captures the inference step once per input shape
(:class:`PerShape`, so a server that runs several batch sizes has one graph each) and replays it. On a CPU they are
no-ops, said once on stderr (a CPU plan never enumerates them; the GPU session's dry run measures GPU deployments
on the CPU).

A training step is forward, a loss (the job's: a built-in on seeded targets, or the user's ``module:function``;
else the mean square of the outputs: the data is random, the work is real), backward and an SGD-with-momentum
update.

:func:`profile` reports the kernels (aten ops, forward, backward and the optimizer's) of a profiled step.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from modak.image.calling import by_keyword, call_model, flatten
from modak.image.functions import import_beside
from modak.image.kernels import Kernel, KernelTime, Profile
from modak.image.runtimes.base import Adapter, FunctionSession, RunRequest, has_graph, loss_targets
from modak.image.runtimes.profiling import WARMUP_STEPS, median_step
from modak.image.runtimes.torch_kernels import (
    IO_RANGE,
    STEP_RANGE,
    Call,
    call_kernel,
    module_ranges,
    onnx_nodes,
    walk,
)

if TYPE_CHECKING:
    import numpy as np

AUTOCAST = {"bf16": "bfloat16", "fp16": "float16"}  # precision -> the dtype autocast computes in
MAX_GRAPHS = 8  # CUDA graphs kept per session (one per input shape): beyond them a shape runs eagerly
CAPTURE_WARMUP_STEPS = 3  # eager steps on a side stream before a capture (cuDNN/cuBLAS pick their kernels)


@dataclass(frozen=True)
class GpuLevers:
    """What a request's GPU levers (#68) do where it runs: ``cuda_graphs`` (capture and replay the eager inference
    step; torch.compile's graphs are its mode's, :func:`modak.image.runtimes.torch_compile.compile_mode`),
    ``pinned`` (pinned staging buffers and non-blocking copies); ``ignored``: the levers set that this device
    cannot apply (a CPU), for the one line that says so."""

    cuda_graphs: bool
    pinned: bool
    ignored: tuple[str, ...] = ()


def gpu_levers(request: RunRequest, compiled: bool = False) -> GpuLevers:
    """The levers ``request``'s parameters set, as its device applies them; ``compiled``: the module is
    ``torch.compile``'d (its mode captures graphs, so the eager capture is off)."""
    graphs = request.params.get("cuda_graphs") is True
    pinned = request.params.get("io") == "pinned"
    if request.device != "gpu":
        ignored = (*(["cuda_graphs=true"] if graphs else []), *(["io=pinned"] if pinned else []))
        return GpuLevers(False, False, tuple(ignored))
    return GpuLevers(graphs and not compiled and request.task == "inference", pinned)


class PerShape:
    """One built value per key (an input shape), at most ``limit`` of them: what :meth:`get` cannot keep any more is
    None (the caller runs that shape without one)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.built: dict[Any, Any] = {}

    def get(self, key: Any, build: Callable[[], Any]) -> Any:
        if key not in self.built:
            if len(self.built) >= self.limit:
                return None
            self.built[key] = build()
        return self.built[key]


class Staging:
    """Host <-> device copies of a session's feeds and outputs: pageable (``torch.from_numpy(...).to(device)``,
    ``.cpu()``) or through pinned host buffers kept per name and shape, copied with ``non_blocking`` (the outputs'
    copies end in one synchronize of the stream)."""

    def __init__(self, device: Any, pinned: bool) -> None:
        self.device, self.pinned = device, pinned
        self.buffers: dict[tuple, Any] = {}

    def _buffer(self, key: tuple, shape: tuple[int, ...], dtype: Any) -> Any:
        import torch

        if key not in self.buffers:
            self.buffers[key] = torch.empty(shape, dtype=dtype, pin_memory=True)
        return self.buffers[key]

    def to_device(self, name: str, array: np.ndarray) -> Any:
        import numpy as np
        import torch

        host = torch.from_numpy(np.ascontiguousarray(array))
        if not self.pinned:
            return host.to(self.device)
        staged = self._buffer(("in", name, tuple(host.shape), host.dtype), tuple(host.shape), host.dtype)
        staged.copy_(host)
        return staged.to(self.device, non_blocking=True)

    def to_host(self, outputs: Sequence[Any]) -> list[np.ndarray]:
        import torch

        if not self.pinned:
            return [o.float().cpu().numpy() for o in outputs]
        found = []
        for index, output in enumerate(outputs):
            shape = tuple(output.shape)
            found.append(self._buffer(("out", index, shape), shape, torch.float32))
            found[-1].copy_(output, non_blocking=True)
        torch.cuda.current_stream(self.device).synchronize()
        return [buffer.numpy().copy() for buffer in found]  # the buffers are the next step's


def prepare(request: RunRequest, inputs: dict[str, np.ndarray]) -> FunctionSession:
    return build_session(request, inputs)


def build_session(request: RunRequest, inputs: dict[str, np.ndarray],
                  wrap: Callable[[Any], Any] | None = None) -> FunctionSession:
    """The session for a zoo model or the user's own (:func:`user_module`); ``wrap`` transforms the module (e.g.
    ``torch.compile``). ``inputs`` are unused: eager modules take any batch."""
    return _build(request, wrap)[0]


def _build(request: RunRequest, wrap: Callable[[Any], Any] | None,
           profiled: bool = False) -> tuple[FunctionSession, Any]:
    """:func:`build_session`'s session, and the module it runs (before ``wrap``); ``profiled``: the session
    converts its feeds and outputs inside a profiler range named :data:`IO_RANGE`."""
    import torch
    from torch.profiler import record_function

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
    levers = gpu_levers(request, compiled=wrap is not None)
    if levers.ignored:
        import sys

        print(f"modak: {', '.join(levers.ignored)} are GPU levers: not applied on the {request.device}",
              file=sys.stderr)
    staging = Staging(device, levers.pinned)
    channels_last = bool(request.params.get("channels_last"))
    if channels_last:
        model = model.to(memory_format=torch.channels_last)  # type: ignore[call-overload]  # torch's hints omit it

    def io() -> Any:
        return record_function(IO_RANGE) if profiled else contextlib.nullcontext()

    def tensors(feeds: Mapping[str, np.ndarray]) -> list[Any]:
        with io():
            found = [staging.to_device(name, feeds[name]) for name in input_names]
            return [t.contiguous(memory_format=torch.channels_last) if channels_last and t.dim() == 4 else t
                    for t in found]
    module = wrap(model) if wrap else model
    keyword = by_keyword(model, input_names)

    def forward(batch: Sequence[Any]) -> Any:
        return call_model(module, input_names, batch, keyword)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    if request.task == "inference":
        graphs = PerShape(MAX_GRAPHS if levers.cuda_graphs else 0)

        def infer(feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
            batch = tensors(feeds)
            key = tuple((tuple(t.shape), t.dtype) for t in batch)
            replay = graphs.get(key, lambda: capture_graph(forward, batch, device.type, request.precision))
            if replay is not None:
                outputs = replay(batch)
            else:
                with torch.inference_mode(), autocast(device.type, request.precision):
                    outputs = _as_list(forward(batch))
            sync()
            with io():
                return staging.to_host(outputs)
        return FunctionSession(infer), model

    model.train()
    optimizer = training_optimizer(model.parameters())
    scaler = torch.amp.GradScaler(device.type, enabled=request.precision == "fp16")
    loss_of = _loss(request, device)

    def train_step(feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        optimizer.zero_grad(set_to_none=True)
        with autocast(device.type, request.precision):
            batch = tensors(feeds)
            loss = loss_of(forward(batch), dict(zip(input_names, batch)))
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        sync()
        with io():
            return staging.to_host([loss.detach()])
    return FunctionSession(train_step), model


def capture_graph(forward: Callable[[Sequence[Any]], Any], batch: Sequence[Any], device_type: str, precision: str
                  ) -> Callable[[Any], list[Any]]:
    """The inference step ``forward`` on inputs shaped like ``batch`` captured in a CUDA graph (after
    :data:`CAPTURE_WARMUP_STEPS` eager steps on a side stream); the replay: a batch's tensors copied into the
    graph's static inputs, the graph replayed, its static outputs (overwritten by the next replay)."""
    import torch

    static = [t.clone() for t in batch]
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side), torch.no_grad(), autocast(device_type, precision):
        for _ in range(CAPTURE_WARMUP_STEPS):
            forward(static)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.no_grad(), autocast(device_type, precision), torch.cuda.graph(graph):
        outputs = _as_list(forward(static))

    def replay(tensors: Any) -> list[Any]:
        for target, source in zip(static, tensors):
            target.copy_(source, non_blocking=True)
        graph.replay()
        return outputs
    return replay


def autocast(device_type: str, precision: str) -> Any:
    """The autocast context a step at ``precision`` runs in on ``device_type`` (disabled at fp32)."""
    import torch

    dtype = getattr(torch, AUTOCAST[precision]) if precision in AUTOCAST else None
    return torch.autocast(device_type, dtype=dtype, enabled=dtype is not None)


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
    model = getattr(import_beside(folder, spec["module"]), spec["factory"])(**spec.get("kwargs", {}))
    if spec.get("weights"):
        model.load_state_dict(torch.load(folder / spec["weights"], map_location="cpu", weights_only=True), strict=True)
    return model.eval()  # as exported (a training session sets train mode)


def _loss(request: RunRequest, device: Any) -> Callable[[Any, dict[str, Any]], Any]:
    """The training step's loss of (the module's outputs, the batch: input name -> tensor)."""
    from pathlib import Path

    import torch
    import torch.nn.functional as F

    if request.loss is None:
        return lambda outputs, batch: sum(o.float().square().mean() for o in _as_list(outputs))
    if ":" in request.loss:
        module, _, function = request.loss.rpartition(":")
        return getattr(import_beside(Path(request.onnx_path).parent, module), function)
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
    """A module's output tensors as a list, in the order its ONNX export lists them
    (:func:`modak.image.calling.flatten`: a ``ModelOutput``'s tensors, without its key/value cache)."""
    return list(flatten(outputs).tensors)


def profile(request: RunRequest, inputs: dict[str, np.ndarray], steps: int) -> Profile:
    """The candidate's kernels (aten ops: forward, backward and the optimizer's in a training step) over one
    profiled step, prepared as :func:`prepare` prepares it (see :func:`profile_steps`)."""
    return profile_steps(request, inputs, steps)


def profile_steps(request: RunRequest, inputs: dict[str, np.ndarray], steps: int,
                  wrap: Callable[[Any], Any] | None = None) -> Profile:
    """``steps`` steps under ``torch.profiler`` (``record_shapes``), after :data:`WARMUP_STEPS` unprofiled ones;
    the kernels of the median step (:func:`modak.image.runtimes.profiling.median_step`).

    A kernel is a dispatcher operator as ``__torch_dispatch__`` sees it, the ops a meta-tensor trace reports: the
    outermost op of each call that is not a ``CompositeImplicitAutograd`` decomposition (``aten::linear`` is
    ``aten::t`` and ``aten::addmm``; ``aten::convolution`` stays whole), or an Inductor kernel. Its time is the
    op's whole CPU time, the ops it calls included (on a GPU: the device time of the kernels it launched), so no
    time counts twice; what the step spent outside any kernel (Python, the autograd engine, composite wrappers) is
    ``unmapped_seconds``, as is the session's conversion of its feeds and outputs (:data:`IO_RANGE`). An
    operator's kind, shapes and attributes are :func:`aten_kernel`'s, as a plan's meta-tensor trace makes them.

    ``nodes`` (eager, with an ONNX graph): a forward op maps to the node of its ONNX op type (:data:`ATEN_ONNX`) in
    the scope of the modules that ran it (their forward hooks mark it), where they ran as many such ops as the
    graph has such nodes in that scope (the k-th op to the k-th node); a backward op maps to its forward op's nodes
    (through the autograd sequence number). Elsewhere they stay empty.
    """
    from torch.profiler import ProfilerActivity, record_function
    from torch.profiler import profile as torch_profile

    session, model = _build(request, wrap, profiled=True)
    hooks = module_ranges(model) if wrap is None else []
    gpu = request.device == "gpu"
    walls: list[float] = []
    try:
        for _ in range(WARMUP_STEPS):
            session.run(inputs)
        activities = [ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if gpu else [])]
        with torch_profile(activities=activities, record_shapes=True) as profiler:
            for index in range(steps):
                start = time.perf_counter()
                with record_function(f"{STEP_RANGE}{index}"):
                    session.run(inputs)
                walls.append(time.perf_counter() - start)
    finally:
        for hook in hooks:
            hook.remove()
    median = median_step(walls)
    step = next(e for e in profiler.events() if e.name == f"{STEP_RANGE}{median}")
    calls: list[Call] = []
    unmapped_us = sum(walk(child, None, -1, calls) for child in step.cpu_children) + step.self_cpu_time_total
    nodes = (onnx_nodes([(c.kind, c.scope if c.backward_of < 0 else None) for c in calls], request.onnx_path)
             if wrap is None and has_graph(request) else {})
    forward_nodes = {c.event.sequence_nr: nodes[i] for i, c in enumerate(calls)
                     if i in nodes and c.backward_of < 0 and c.event.sequence_nr >= 0}
    found: dict[Kernel, list[float]] = {}
    for i, call in enumerate(calls):
        covered = nodes.get(i, forward_nodes.get(call.backward_of, ()) if call.backward_of >= 0 else ())
        kernel = replace(call_kernel(call), nodes=covered)
        us = call.event.device_time_total if gpu else call.event.cpu_time_total
        found.setdefault(kernel, []).append(us / 1e6)
    notes = [f"{len(walls)} profiled steps; the kernels of the median step; times are "
             + ("device times of the kernels each op launched" if gpu else "each op's CPU time, nested ops included")]
    if wrap is not None:
        notes.append("torch.compile: kernels are not mapped to ONNX nodes (the compiled graph keeps no module "
                     "scopes); Inductor's fused kernels list their source aten ops in attributes 'aten' (from "
                     "their names: at most 10), and the profiler records no shapes for them")
    return Profile(source="torch-profiler", steps=steps, step_seconds=walls[median],
                   kernels=tuple(KernelTime(kernel=k, seconds=sum(t), calls=len(t)) for k, t in found.items()),
                   unmapped_seconds=0.0 if gpu else unmapped_us / 1e6, notes=tuple(notes))


HOST_COPY_BYTES = 256 << 20  # the host-link probe's buffer (large enough that the copy's setup is noise)


def host_copy_gbs(nbytes: int = HOST_COPY_BYTES) -> dict[str, float]:
    """GB/s of copies between host and the current CUDA device, each direction, from pinned and pageable host
    memory (best of a few, :func:`modak.hardware.probe`'s and the GPU session's host-link figures, as the target's
    ``gpus.peaks`` name them). Needs CUDA."""
    import torch

    device = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    found: dict[str, float] = {}
    for pinned in (True, False):
        host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=pinned)
        for name, target, source in (("h2d", device, host), ("d2h", host, device)):
            best = float("inf")
            for run in range(6):  # the first warms up
                start = time.perf_counter()
                target.copy_(source, non_blocking=pinned)
                torch.cuda.synchronize()
                best = min(best, time.perf_counter() - start) if run else best
            found[f"{name}_{'pinned' if pinned else 'pageable'}_gbs"] = round(nbytes / best / 1e9, 2)
    return found


def gemm(n: int, threads: int, precision: str) -> Callable[[], Any]:
    """``torch.matmul`` into a preallocated output (the caller sets PyTorch's threads)."""
    import torch

    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
    c = torch.empty(n, n, dtype=dtype)
    return lambda: torch.matmul(a, b, out=c)


class PyTorch(Adapter):
    name = "pytorch"
    framework = "pytorch"
    packages = ("torch",)
    kernels = "torch"  # the aten ops dispatched on fake tensors (modak.workload.kernels.trace_step)
    run_settings = ("threads", "wait_policy", "allocator", "cuda_graphs", "io")
    profiles_as_planned = True
    gemm_precisions = ("fp32", "bf16")
    prepare = staticmethod(prepare)
    profile = staticmethod(profile)
    gemm = staticmethod(gemm)
