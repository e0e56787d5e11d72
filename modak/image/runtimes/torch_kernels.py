"""The kernels of a PyTorch step, as the profiler records them (:func:`modak.image.runtimes.pytorch.profile_steps`)
and as a plan's meta-tensor trace makes them (:func:`modak.workload.kernels.trace_step`): one kernel per dispatcher
operator call (:func:`aten_kernel`) or Inductor kernel, and the ONNX node each maps to (:func:`onnx_nodes`).
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from modak.image.kernels import Kernel
from modak.image.runtimes.profiling import op_class

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
class Call:
    """One kernel call of the profiled step: the profiler event, its kind, the ONNX scope of the modules whose
    forward ran it (eager forward: ``/layer1/layer1.0/conv1``, the root's ``""``; None elsewhere) and the forward
    sequence number of the backward node that ran it (or -1)."""

    event: Any
    kind: str
    scope: str | None
    backward_of: int


def module_ranges(model: Any) -> list[Any]:
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


def walk(event: Any, scope: str | None, backward_of: int, calls: list[Call]) -> float:
    """Append the kernel calls under ``event`` to ``calls``; the CPU time (µs) spent outside them (a
    ``CompositeImplicitAutograd`` op that called no other, as a no-op ``aten::to``, ran no kernel: a meta-tensor
    trace never sees it)."""
    kind = _kernel_kind(event.name)
    if kind is not None and kind not in NO_KERNEL and not _composite(event.name):
        calls.append(Call(event, kind, scope, backward_of))
        return 0.0
    if event.name == IO_RANGE:  # the session's conversions: no kernel of the step
        return event.cpu_time_total
    if event.name.startswith(MODULE_RANGE):
        module = event.name[len(MODULE_RANGE):]
        scope = inner_scope(scope, module)
    elif event.name.startswith(BACKWARD_RANGE):
        scope, backward_of = None, event.sequence_nr
    return event.self_cpu_time_total + sum(walk(child, scope, backward_of, calls) for child in event.cpu_children)


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


def call_kernel(call: Call) -> Kernel:
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
