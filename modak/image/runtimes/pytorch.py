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
import functools
import json
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from modak.image.calling import by_keyword, call_model, flatten
from modak.image.kernels import Kernel, KernelTime, Profile
from modak.image.runtimes.base import Adapter, FunctionSession, RunRequest, has_graph, loss_targets
from modak.image.runtimes.profiling import WARMUP_STEPS, median_step, op_class

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
    model = getattr(_import_beside(folder, spec["module"]), spec["factory"])(**spec.get("kwargs", {}))
    if spec.get("weights"):
        model.load_state_dict(torch.load(folder / spec["weights"], map_location="cpu", weights_only=True), strict=True)
    return model.eval()  # as exported (a training session sets train mode)


def _import_beside(folder: Any, name: str) -> Any:
    """The user's module ``name`` (a ``.py`` file name, or a dotted name of a package) from ``folder``, imported once
    per process as Python imports a module: its body (which may register custom ops with ``torch.library``) runs
    once however many sessions open the model."""
    import importlib
    import importlib.util
    import sys
    from pathlib import Path

    if not name.endswith(".py"):
        sys.path.insert(0, str(folder))
        return importlib.import_module(name)
    found = importlib.util.spec_from_file_location(Path(name).stem, Path(folder) / Path(name).name)
    assert found is not None and found.loader is not None
    loaded = sys.modules.get(found.name)
    if loaded is not None and getattr(loaded, "__file__", None) == found.origin:
        return loaded
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
    """A module's output tensors as a list, in the order its ONNX export lists them
    (:func:`modak.image.calling.flatten`: a ``ModelOutput``'s tensors, without its key/value cache)."""
    return list(flatten(outputs).tensors)


# --- Profiles (#40): the kernels of one step, from torch.profiler --------------------------------------------------

STEP_RANGE = "modak.step "  # + the step's index: the profiler range around each profiled step
MODULE_RANGE = "modak.module "  # + a module's qualified name: the range around its forward (eager profiles)
BACKWARD_RANGE = "autograd::engine::evaluate_function: "  # the autograd engine's range around a backward node
IO_RANGE = "modak.io"  # the range around a profiled session's conversions of its feeds and outputs (not the step's)
# Arguments of an aten op that say where and in which type its result goes, not what it costs at the step's
# precision (a kernel's attributes leave them out)
_PLACEMENT = frozenset({"dtype", "layout", "device", "pin_memory", "memory_format", "non_blocking", "copy",
                        "out_dtype", "input_dtype", "generator"})
# Operators that run no kernel, only make an alias (a meta-tensor trace sees autograd's detach of the outputs it
# saves, the profiler does not record it): neither a profile nor a plan lists them
NO_KERNEL = frozenset({"aten::detach"})
# aten op -> the ONNX op types the TorchScript exporter writes for it, for the ops it exports as one node; a kernel
# maps to a node where its module holds as many such ops as nodes of those types (see onnx_nodes). A linear
# layer on 3-D inputs is a MatMul and an Add: its addmm covers the MatMul.
ATEN_ONNX = {
    "aten::convolution": ("Conv", "ConvTranspose"), "aten::addmm": ("Gemm", "MatMul"), "aten::mm": ("MatMul",),
    "aten::bmm": ("MatMul",), "aten::relu": ("Relu",), "aten::relu_": ("Relu",), "aten::max_pool2d": ("MaxPool",),
    "aten::max_pool2d_with_indices": ("MaxPool",), "aten::avg_pool2d": ("AveragePool",),
    "aten::mean": ("GlobalAveragePool", "ReduceMean"),
    "aten::_adaptive_avg_pool2d": ("GlobalAveragePool", "AveragePool"),
    "aten::native_batch_norm": ("BatchNormalization",), "aten::_native_batch_norm_legit": ("BatchNormalization",),
    "aten::_native_batch_norm_legit_no_training": ("BatchNormalization",),
    "aten::native_layer_norm": ("LayerNormalization",), "aten::add": ("Add",), "aten::add_": ("Add",),
    "aten::mul": ("Mul",), "aten::div": ("Div",), "aten::sigmoid": ("Sigmoid",), "aten::tanh": ("Tanh",),
    "aten::_softmax": ("Softmax",), "aten::embedding": ("Gather",), "aten::cat": ("Concat",),
    "aten::hardtanh": ("Clip",), "aten::hardtanh_": ("Clip",),
}
_OPERATOR = re.compile(r"^\w+::\w+$")  # a dispatcher operator (aten::addmm, mkldnn::_convolution_pointwise)
# an Inductor kernel: [graph_N_](cpp|triton)_..._N; its kind drops the per-graph prefix and numeric suffix
_INDUCTOR = re.compile(r"^(?:graph_\d+_)?((?:cpp|triton)_\w+?)_\d+$")


@dataclass(frozen=True)
class _Call:
    """One kernel call of the profiled step: the profiler event, its kind, the ONNX scope of the modules whose
    forward ran it (eager forward: ``/layer1/layer1.0/conv1``, the root's ``""``; None elsewhere) and the forward
    sequence number of the backward node that ran it (or -1)."""

    event: Any
    kind: str
    scope: str | None
    backward_of: int


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
    hooks = _module_ranges(model) if wrap is None else []
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
    calls: list[_Call] = []
    unmapped_us = sum(_walk(child, None, -1, calls) for child in step.cpu_children) + step.self_cpu_time_total
    nodes = (onnx_nodes([(c.kind, c.scope if c.backward_of < 0 else None) for c in calls], request.onnx_path)
             if wrap is None and has_graph(request) else {})
    forward_nodes = {c.event.sequence_nr: nodes[i] for i, c in enumerate(calls)
                     if i in nodes and c.backward_of < 0 and c.event.sequence_nr >= 0}
    found: dict[Kernel, list[float]] = {}
    for i, call in enumerate(calls):
        covered = nodes.get(i, forward_nodes.get(call.backward_of, ()) if call.backward_of >= 0 else ())
        kernel = replace(_call_kernel(call), nodes=covered)
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


def _module_ranges(model: Any) -> list[Any]:
    """Forward hooks that put every module's forward in a profiler range named :data:`MODULE_RANGE` + its
    qualified name (the root's is empty); the hooks' handles, to remove them."""
    from torch.autograd.profiler import record_function

    handles = []
    for name, module in model.named_modules():
        open_ranges: list[Any] = []

        def enter(_module: Any, _args: Any, name: str = name, open_ranges: list[Any] = open_ranges) -> None:
            open_ranges.append(record_function(MODULE_RANGE + name))
            open_ranges[-1].__enter__()

        def leave(_module: Any, _args: Any, _output: Any, open_ranges: list[Any] = open_ranges) -> None:
            open_ranges.pop().__exit__(None, None, None)
        handles += [module.register_forward_pre_hook(enter), module.register_forward_hook(leave)]
    return handles


def _walk(event: Any, scope: str | None, backward_of: int, calls: list[_Call]) -> float:
    """Append the kernel calls under ``event`` to ``calls``; the CPU time (µs) spent outside them (a
    ``CompositeImplicitAutograd`` op that called no other, as a no-op ``aten::to``, ran no kernel: a meta-tensor
    trace never sees it)."""
    kind = _kernel_kind(event.name)
    if kind is not None and kind not in NO_KERNEL and not _composite(event.name):
        calls.append(_Call(event, kind, scope, backward_of))
        return 0.0
    if event.name == IO_RANGE:  # the session's conversions: no kernel of the step
        return event.cpu_time_total
    if event.name.startswith(MODULE_RANGE):
        module = event.name[len(MODULE_RANGE):]
        scope = inner_scope(scope, module)
    elif event.name.startswith(BACKWARD_RANGE):
        scope, backward_of = None, event.sequence_nr
    return event.self_cpu_time_total + sum(_walk(child, scope, backward_of, calls) for child in event.cpu_children)


def _kernel_kind(name: str) -> str | None:
    """The kind of the kernel a profiler event named ``name`` is (an operator, an Inductor kernel), else None."""
    if _OPERATOR.match(name):
        return name
    found = _INDUCTOR.match(name)
    return found.group(1) if found else None


@functools.cache
def _composite(name: str) -> bool:
    """Whether operator ``name`` decomposes into other operators (``CompositeImplicitAutograd``): its default
    overload, else its first."""
    import torch

    try:
        schemas = torch._C._jit_get_schemas_for_operator(name)
    except RuntimeError:
        return False
    if not schemas:
        return False
    overload = min(s.overload_name for s in schemas)  # "" (the default) sorts first
    try:
        return bool(torch._C._dispatch_has_kernel_for_dispatch_key(
            f"{name}.{overload}" if overload else name, "CompositeImplicitAutograd"))
    except RuntimeError:  # an overload the dispatcher does not hold (TorchScript's own)
        return False


def onnx_nodes(calls: Sequence[tuple[str, str | None]], onnx_path: str) -> dict[int, tuple[str, ...]]:
    """Index in ``calls`` -> the ONNX node of that call, for forward calls given as (kind, the ONNX scope of the
    modules that ran it: :func:`inner_scope`; None for a call that maps to none, as a backward one): the k-th call
    of a kind of :data:`ATEN_ONNX` in a scope maps to the k-th node of its op types in that scope, where the scope
    holds as many of each. A profile (:func:`profile_steps`) and a plan's meta-tensor trace
    (:func:`modak.workload.kernels.trace_step`) map their calls alike."""
    import onnx

    graph = [(node.name.rpartition("/")[0], node.op_type, node.name)
             for node in onnx.load(onnx_path, load_external_data=False).graph.node]
    wanted: dict[tuple[str, tuple[str, ...]], list[int]] = {}
    for i, (kind, scope) in enumerate(calls):
        if scope is not None and kind in ATEN_ONNX:
            wanted.setdefault((scope, ATEN_ONNX[kind]), []).append(i)
    found: dict[int, tuple[str, ...]] = {}
    for (scope, types), indices in wanted.items():
        names = [name for node_scope, op_type, name in graph if node_scope == scope and op_type in types]
        if len(names) == len(indices):
            found.update((i, (name,)) for i, name in zip(indices, names))
    return found


def inner_scope(scope: str | None, module: str) -> str:
    """The ONNX scope of the forward of the module of qualified name ``module`` (the root's: empty), called within
    ``scope`` (None: outside every module)."""
    return f"{scope or ''}/{_scope_level(module)}" if module else ""


def _scope_level(qualified_name: str) -> str:
    """The level a module adds to the scope of the TorchScript exporter's node names (``/layers.0/query/MatMul``):
    its qualified name from its last atom that is not an index (as ``torch.onnx.utils`` names it):
    ``layer2.0.downsample.0`` -> ``downsample.0``."""
    atoms = qualified_name.split(".")
    last = max((i for i, atom in enumerate(atoms) if not atom.isnumeric()), default=0)
    return ".".join(atoms[last:])


def _call_kernel(call: _Call) -> Kernel:
    """The kernel of a profiled call: an operator's as :func:`aten_kernel` makes it from the arguments the profiler
    recorded (matched to the operator's overload by their count and which are tensors); an Inductor kernel's
    attributes list its source aten ops (``aten``) and it has no recorded shapes."""
    event = call.event
    if not _OPERATOR.match(call.kind):
        return Kernel(kind=call.kind, op=op_class(call.kind),
                      attributes=json.dumps({"aten": inductor_sources(call.kind)}, sort_keys=True))
    recorded = list(event.input_shapes or ())
    dtypes = list(event.input_dtypes or ())
    values = list(event.concrete_inputs or ())
    strides = list(getattr(event, "structured_input_strides", None) or ())
    tensor = [d not in ("", "Scalar", "ScalarList") for d in dtypes]
    names = _argument_names(call.kind, tuple(tensor))
    arguments: list[Argument] = []
    for index, shape in enumerate(recorded):
        name = names[index] if index < len(names) else str(index)
        if index < len(tensor) and tensor[index]:
            listed = bool(shape) and all(isinstance(item, list) for item in shape)
            shapes = tuple(tuple(int(d) for d in item) for item in (shape if listed else [shape]))
            layout = strides[index] if index < len(strides) and not listed else None
            arguments.append(Argument(name, shapes, None, channels_last(shapes[0], layout) if layout else False))
        else:
            arguments.append(Argument(name, None, values[index] if index < len(values) else None))
    return aten_kernel(call.kind, arguments)


@functools.cache
def _argument_names(kind: str, tensor: tuple[bool, ...]) -> tuple[str, ...]:
    """The argument names of the overload of operator ``kind`` with as many arguments as ``tensor`` and tensors
    where it says (an absent optional tensor is recorded as no tensor; the first such overload; empty where none
    is)."""
    import torch

    try:
        schemas = torch._C._jit_get_schemas_for_operator(kind)
    except RuntimeError:
        return ()
    for schema in schemas:
        arguments = schema.arguments
        if len(arguments) == len(tensor) and all(
                "Tensor" in str(a.type) if is_tensor else str(a.type) not in ("Tensor", "List[Tensor]")
                for a, is_tensor in zip(arguments, tensor)):
            return tuple(a.name for a in arguments)
    return ()


@dataclass(frozen=True)
class Argument:
    """One argument of an aten op call: its name in the op's schema; a tensor's (or a tensor list's) ``shapes``
    (None for any other argument: then its ``value``, as JSON); whether a 4-D tensor is ``channels_last``."""

    name: str
    shapes: tuple[tuple[int, ...], ...] | None
    value: Any = None
    channels_last: bool = False


def aten_kernel(kind: str, arguments: list[Argument]) -> Kernel:
    """The kernel of one call of aten op ``kind``, as a profile and a plan's meta-tensor trace both make it: shapes,
    those of its tensor arguments in order; attributes, its other arguments that change its cost (by name: strides,
    padding, dilation, groups, transposed flags, ...; not where its result goes nor its type, :data:`_PLACEMENT`,
    nor absent optional ones) and ``channels_last`` where its first tensor has that layout."""
    shapes = tuple(shape for argument in arguments if argument.shapes is not None for shape in argument.shapes)
    attributes: dict[str, Any] = {a.name: a.value for a in arguments
                                  if a.shapes is None and a.value is not None and a.name not in _PLACEMENT}
    first = next((a for a in arguments if a.shapes), None)
    if first is not None and first.channels_last:
        attributes["channels_last"] = True
    return Kernel(kind=kind, op=op_class(kind), shapes=shapes, attributes=json.dumps(attributes, sort_keys=True))


def channels_last(shape: tuple[int, ...], strides: list[int]) -> bool:
    """Whether a tensor of ``shape`` and ``strides`` is a 4-D channels-last one that is not also contiguous."""
    if len(shape) != 4 or len(strides) != 4:
        return False
    n, c, h, w = shape
    del n
    return list(strides) == [h * w * c, 1, w * c, c] and list(strides) != [c * h * w, h * w, w, 1]


def inductor_sources(kind: str) -> list[str]:
    """The aten ops an Inductor kernel fused, from its name: Inductor names a kernel ``..._fused_`` + its source
    ops' names, sorted and joined with ``_`` (at most ``torch._inductor.config.kernel_name_max_ops``), which this
    splits back along aten's op names (fewest ops first; ``[]`` where the name does not split)."""
    _, fused, names = kind.partition("fused_")
    if not fused:
        return []
    vocabulary = _aten_names()
    best: dict[int, list[str]] = {0: []}  # start of the next op's name -> the fewest ops spelling what is before
    spelled: list[str] | None = None
    for start in range(len(names)):
        if start not in best:
            continue
        for end in range(start + 1, len(names) + 1):
            if names[start:end] not in vocabulary:
                continue
            ops = [*best[start], f"aten::{names[start:end]}"]
            if end == len(names):
                spelled = ops if spelled is None or len(ops) < len(spelled) else spelled
            elif names[end] == "_" and end + 1 < len(names) and len(best.get(end + 1, ops)) >= len(ops):
                best[end + 1] = ops
    return spelled or []


@functools.cache
def _aten_names() -> frozenset[str]:
    """The names of aten's operators, without their overloads (``convolution_backward``, ``copy_``)."""
    import torch

    return frozenset(name.partition("::")[2].partition(".")[0] for name in torch._C._dispatch_get_all_op_names()
                     if name.startswith("aten::"))


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
    profiles_as_planned = True
    gemm_precisions = ("fp32", "bf16")
    prepare = staticmethod(prepare)
    profile = staticmethod(profile)
    gemm = staticmethod(gemm)
