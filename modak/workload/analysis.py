"""Per-node FLOPs and bytes of an ONNX graph at a given batch size, and the totals for one step of a task.

Cost model (the constants live in ``recipes/hardware/op_classes.yaml`` and :data:`OPTIMIZERS`):

* Conv, ConvTranspose, Gemm, MatMul (batched, broadcast), Einsum and the RNN family (the ``recurrent`` class)
  count 2 FLOPs per multiply-accumulate; a Conv or Gemm bias adds 1 FLOP per output element. ``macs`` holds the
  MACs alone (the number that published "GMAC" figures quote).
* Other ops cost a constant per output element (elementwise, normalization, softmax), per input element
  (reductions) or per window element (pooling); gathers and layout ops cost no FLOPs.
* Bytes assume every node reads all its inputs from memory and writes all its outputs (no fusion, no cache
  reuse); inputs that are initializers or Constant outputs count as weights. Shape and Size read no data.
  A gather reads the elements it gathers, not its whole data input: an embedding lookup (a Gather from a weight
  table) the rows it looks up, a Gather from an activation (the first token of a sequence) that slice.
* Nodes are costed at the shapes ONNX shape inference gives at the batch; those it leaves unknown come from ONNX
  Runtime, else are guessed (:mod:`modak.workload.shapes`; the profile counts each node's source).
* Training: the backward pass costs :data:`BACKWARD_FLOPS` x the forward FLOPs (gradients with respect to
  activations and weights, the common 2x rule) and moves :data:`BACKWARD_BYTES` x the forward bytes (saved
  activations and incoming gradients read, gradients written); the optimizer update costs per parameter the
  FLOPs and parameter-sized tensor reads/writes listed in :data:`OPTIMIZERS`. A graph exported in inference
  form (e.g. BatchNormalization with running statistics) stands in for its training form.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from modak.documents.analysis import Shapes, ShapeSources
from modak.errors import InputError, ModakError, did_you_mean, short_reason
from modak.image.kernels import Kernel
from modak.image.onnx_nodes import constant_tensors, holds_shape
from modak.image.runtimes.profiling import op_class as named_op_class
from modak.limits import MAX_ONNX_BYTES, MAX_ONNX_NODES, check_size
from modak.paths import data_dir
from modak.spec.loader import read_catalog
from modak.spec.models import Task
from modak.workload.shapes import ShapeSource, TensorType, complete, fill, value_types

if TYPE_CHECKING:
    import onnx
    from rich.table import Table

_MAC_CLASSES = ("conv", "matmul", "recurrent")  # classes whose FLOPs follow from multiply-accumulates
BACKWARD_FLOPS = 2.0
BACKWARD_BYTES = 2.0
# optimizer -> (FLOPs per parameter, parameter-sized tensors read or written per update):
#   sgd: p -= lr*g                                  read p, g; write p
#   sgd_momentum: v = mu*v + g; p -= lr*v            read p, g, v; write p, v
#   adam(w): two moment updates, bias correction, sqrt, divide (+ decoupled weight decay); read p, g, m, v;
#   write p, m, v
OPTIMIZERS: dict[str, tuple[int, int]] = {
    "sgd": (2, 3),
    "sgd_momentum": (4, 5),
    "rmsprop": (6, 5),
    "adagrad": (6, 5),
    "adam": (12, 7),
    "adamw": (14, 7),
}

# Bytes per element of each onnx.TensorProto data type (4-bit types pack two per byte).
_DTYPE_BYTES = {1: 4, 2: 1, 3: 1, 4: 2, 5: 2, 6: 4, 7: 8, 9: 1, 10: 2, 11: 8, 12: 4, 13: 8, 14: 8, 15: 16, 16: 2,
                17: 1, 18: 1, 19: 1, 20: 1, 21: 0.5, 22: 0.5, 23: 0.5}
_FLOAT_TYPES = {1, 10, 11, 16, 17, 18, 19, 20, 23}
_METADATA_ONLY = {"Shape", "Size"}  # read only their input's shape
_WEIGHT_INPUT = {"Conv": 1, "ConvInteger": 1, "DeformConv": 1, "QLinearConv": 3, "ConvTranspose": 1}
_CONV_BIAS = {"Conv": 2, "ConvTranspose": 2, "QLinearConv": 8}
_MATMUL_B = {"MatMul": 1, "MatMulInteger": 1, "QLinearMatMul": 3}


@dataclass(frozen=True)
class OpStats:
    """Cost of one node for one forward pass of the whole batch."""

    name: str
    op_type: str
    op_class: str
    macs: int
    flops: int
    input_bytes: int
    weight_bytes: int
    output_bytes: int

    @property
    def bytes(self) -> int:
        return self.input_bytes + self.weight_bytes + self.output_bytes


def covering(kernel: Kernel, covered: Sequence[OpStats], calls: int = 1) -> Kernel:
    """``kernel`` with the op class of the costliest of the ``covered`` nodes and their FLOPs and bytes per call (their
    sum over ``calls`` calls); one covering none keeps its own, with the class its runtime gave it, else the one
    its name says. A profiled kernel (:mod:`modak.measurements.profiles`) and a planned one
    (:mod:`modak.workload.kernels`) are costed here alike."""
    if not covered:
        return kernel if kernel.op else replace(kernel, op=named_op_class(kernel.kind))
    costliest = max(covered, key=lambda op: (op.flops, op.bytes))
    calls = max(calls, 1)
    return replace(kernel, op=costliest.op_class, flops=sum(op.flops for op in covered) / calls,
                   bytes=sum(op.bytes for op in covered) / calls)


class OpGroup(NamedTuple):
    count: int  # type: ignore[assignment]  # nodes of the group; shadows tuple.count(), which nothing here calls
    flops: int
    bytes: int


@dataclass(frozen=True)
class WorkloadProfile:
    """FLOPs and bytes of a model at one batch size; ``flops``/``bytes`` are per step of ``task``."""

    model_name: str
    task: Task
    batch_size: int
    input_shapes: Mapping[str, tuple[int, ...]]  # per sample, without the batch dimension
    ops: tuple[OpStats, ...]
    parameters: int
    parameter_bytes: int
    forward_flops: int
    forward_bytes: int
    flops: int
    bytes: int
    # The graph's inputs and outputs at the batch (what a GPU step copies between host and device; 0: unknown, as
    # for a model profiled without an ONNX graph)
    input_bytes: int = 0
    output_bytes: int = 0
    # Nodes per ShapeSource value: where the shapes each node is costed at came from (the least sure of them; {}: no
    # ONNX graph), and the nodes priced at guessed shapes (modak.workload.shapes)
    shape_sources: Mapping[str, int] = field(default_factory=dict)
    unknown_shapes: tuple[str, ...] = ()

    @property
    def macs(self) -> int:
        """Multiply-accumulates of the forward pass (conv, matmul and recurrent ops)."""
        return sum(op.macs for op in self.ops)

    @property
    def arithmetic_intensity(self) -> float:
        """FLOPs per byte moved in one step."""
        return self.flops / self.bytes if self.bytes else 0.0

    def by_op_type(self) -> dict[str, OpGroup]:
        """Forward count, FLOPs and bytes per op type, most FLOPs first."""
        return _group(self.ops, lambda op: op.op_type)

    def by_op_class(self) -> dict[str, OpGroup]:
        """Forward count, FLOPs and bytes per op class, most FLOPs first."""
        return _group(self.ops, lambda op: op.op_class)

    def shapes_record(self) -> Shapes | None:
        """Where the nodes' shapes came from, for the JSON documents: ``sources`` (nodes per source) and ``unknown``
        (the nodes priced at guessed shapes); None where ONNX shape inference gave them all, or without a graph."""
        if not any(count for source, count in self.shape_sources.items() if source != ShapeSource.onnx.value):
            return None
        counts = {source.value: self.shape_sources.get(source.value, 0) for source in ShapeSource}
        return Shapes(sources=ShapeSources(**counts), unknown=list(self.unknown_shapes))


def analyze(model: onnx.ModelProto | Path | str, batch_size: int,
            input_shapes: Mapping[str, list[int] | tuple[int, ...]] | None = None, task: Task | str = Task.inference,
            optimizer: str = "sgd_momentum", name: str | None = None) -> WorkloadProfile:
    """Profile ``model`` (a ModelProto or an ONNX file, whose weight data is not read) at ``batch_size``.

    Dimension 0 of every graph input is the batch; ``input_shapes`` gives per-sample shapes for inputs whose
    other dimensions are symbolic. The shapes ONNX shape inference leaves unknown are found otherwise, or guessed
    (:mod:`modak.workload.shapes`; the profile's ``shape_sources`` and ``unknown_shapes`` say which).
    """
    import onnx

    task = Task(task)
    if optimizer not in OPTIMIZERS:
        raise InputError(f"unknown optimizer '{optimizer}'{did_you_mean(optimizer, OPTIMIZERS)}")
    if batch_size < 1:
        raise InputError(f"batch size must be positive, got {batch_size}")
    if isinstance(model, (str, Path)):
        name = name or Path(model).stem
        model = load_model(Path(model))
    if model.functions:
        import onnx.inliner  # a submodule `import onnx` does not load

        model = onnx.inliner.inline_local_functions(model)
    graph = model.graph
    weights = {t.name: t for t in graph.initializer}
    constants = constant_tensors(graph)
    skeleton, fixed = _skeleton(model, batch_size, input_shapes or {})
    inferred = _infer_types(skeleton)
    for index, node in enumerate(graph.node):
        if any(attr.type in (5, 10) for attr in node.attribute):  # GRAPH, GRAPHS
            label = f"'{node.name}'" if node.name else f"#{index}"
            raise InputError(f"node {label} ({node.op_type}): control flow with subgraphs is not supported by the "
                             "analysis")
    inferred.update({t.name: (t.data_type, tuple(t.dims)) for t in weights.values()})
    costed = [_costed(node) for node in graph.node]
    shapes = fill(model, skeleton, inferred, costed)
    types = shapes.types
    ops = tuple(_node_stats(node, i, types, constants) for i, node in enumerate(graph.node))
    sources = [shapes.source(tensors) for tensors in costed]

    statistics = {n for node in graph.node if node.op_type == "BatchNormalization" for n in node.input[3:5]}
    params = [t for t in weights.values() if t.data_type in _FLOAT_TYPES and t.name not in statistics]
    parameters = sum(math.prod(t.dims) for t in params)
    parameter_bytes = sum(_nbytes(t.data_type, tuple(t.dims)) for t in params)
    inputs, outputs = ([types[v.name] for v in values if v.name not in weights and v.name in types]
                       for values in (graph.input, graph.output))
    profile = step_profile(name or graph.name or "model", task, batch_size, fixed, ops, parameters, parameter_bytes,
                           optimizer)
    return replace(profile, input_bytes=sum(_nbytes(kind, dims) for kind, dims in inputs),
                   output_bytes=sum(_nbytes(kind, dims) for kind, dims in outputs),
                   shape_sources={source.value: sources.count(source) for source in ShapeSource},
                   unknown_shapes=tuple(op.name for op, source in zip(ops, sources) if source is ShapeSource.guessed))


def step_profile(name: str, task: Task | str, batch_size: int, input_shapes: Mapping[str, tuple[int, ...]],
                 ops: tuple[OpStats, ...], parameters: int, parameter_bytes: int,
                 optimizer: str = "sgd_momentum") -> WorkloadProfile:
    """The profile of one step of ``task`` from the forward pass's ``ops`` (of an ONNX graph, or of PyTorch's
    flop counter where a model has no ONNX graph): training adds the backward pass and the optimizer update."""
    task = Task(task)
    forward_flops = sum(op.flops for op in ops)
    forward_bytes = sum(op.bytes for op in ops)
    flops, nbytes = forward_flops, forward_bytes
    if task is Task.training:
        update_flops, update_tensors = OPTIMIZERS[optimizer]
        flops = round(forward_flops * (1 + BACKWARD_FLOPS) + parameters * update_flops)
        nbytes = round(forward_bytes * (1 + BACKWARD_BYTES) + parameter_bytes * update_tensors)
    return WorkloadProfile(name, task, batch_size, dict(input_shapes), ops, parameters, parameter_bytes,
                           forward_flops, forward_bytes, flops, nbytes)


def tensor_shapes(model: onnx.ModelProto, batch_size: int,
                  input_shapes: Mapping[str, list[int] | tuple[int, ...]] | None = None) -> dict[str, tuple[int, ...]]:
    """The shape at ``batch_size`` of every tensor of ``model`` (its local functions inlined) that ONNX shape
    inference fixes, initializers included: the shapes :func:`analyze` costs the nodes at, where it needs no
    other source."""
    skeleton, _ = _skeleton(model, batch_size, input_shapes or {})
    shapes = {name: full for name, (_, dims) in _infer_types(skeleton).items() if (full := complete(dims)) is not None}
    shapes.update({t.name: tuple(t.dims) for t in model.graph.initializer})
    return shapes


def load_model(path: Path) -> onnx.ModelProto:
    """The ONNX file at ``path`` without its external weight data, within :data:`MAX_ONNX_BYTES` and
    :data:`MAX_ONNX_NODES`; a missing, oversized or undecodable file is an :class:`InputError` naming ``path``."""
    import onnx

    check_size(path, MAX_ONNX_BYTES, "the ONNX file")
    try:
        model = onnx.load(path, load_external_data=False)
    except FileNotFoundError:
        raise InputError("file not found", path) from None
    except Exception as exc:  # protobuf reports garbage with several exception types
        raise InputError(f"not a valid ONNX model: {short_reason(exc)}", path) from None
    check_node_count(model, path)
    return model


def check_node_count(model: onnx.ModelProto, path: Path | None = None) -> None:
    """Refuse a graph of more than :data:`MAX_ONNX_NODES` nodes, counting each call of a local function as the
    nodes it inlines to, without inlining (nested calls multiply the count), and refuse recursive functions."""
    cap = MAX_ONNX_NODES + 1
    sizes = {(f.domain, f.name): 1 for f in model.functions}
    for _ in range(len(sizes) + 1):  # sizes only grow; without recursion, stable after the longest call chain
        changed = False
        for function in model.functions:
            size = min(cap, sum(sizes.get((n.domain, n.op_type), 1) for n in function.node))
            changed |= size != sizes[(function.domain, function.name)]
            sizes[(function.domain, function.name)] = size
        if not changed:
            break
    else:
        raise InputError("a local function calls itself (directly or through others)", path)
    if sum(sizes.get((n.domain, n.op_type), 1) for n in model.graph.node) > MAX_ONNX_NODES:
        raise InputError(f"the graph has more than {MAX_ONNX_NODES:,} nodes (local functions inlined), the limit "
                         "of modak's analysis", path)


def format_table(profile: WorkloadProfile) -> Table:
    """A rich table for ``modak analyze``: forward cost per op type, the totals and the parameters."""
    import msgspec
    from rich.table import Table

    caption = (f"parameters: {profile.parameters / 1e6:.2f} M ({profile.parameter_bytes / 1e6:.1f} MB); "
               f"forward MACs: {profile.macs / 1e9:.3f} G")
    shapes = profile.shapes_record()
    if shapes is not None:
        caption += "; nodes' shapes: " + ", ".join(f"{count} {source}" for source, count in
                                                   msgspec.structs.asdict(shapes.sources).items() if count)
    table = Table(title=f"{profile.model_name}: {profile.task.value}, batch {profile.batch_size}", caption=caption)
    for header in ("op type", "class", "count", "GFLOP", "FLOP %", "MB", "FLOP/B"):
        table.add_column(header, justify="left" if header in ("op type", "class") else "right")
    classes: dict[str, set[str]] = {}
    for op in profile.ops:  # a Gather may be an embedding lookup in one place and data movement in another
        classes.setdefault(op.op_type, set()).add(op.op_class)
    total = profile.forward_flops or 1
    for op_type, group in profile.by_op_type().items():
        table.add_row(op_type, "/".join(sorted(classes[op_type])), str(group.count), f"{group.flops / 1e9:.3f}",
                      f"{100 * group.flops / total:.1f}", f"{group.bytes / 1e6:.1f}",
                      _intensity(group.flops, group.bytes))
    table.add_section()
    table.add_row("forward", "", str(len(profile.ops)), f"{profile.forward_flops / 1e9:.3f}", "100.0",
                  f"{profile.forward_bytes / 1e6:.1f}", _intensity(profile.forward_flops, profile.forward_bytes),
                  style="bold")
    if profile.task is Task.training:
        table.add_row("training step", "", "", f"{profile.flops / 1e9:.3f}", "", f"{profile.bytes / 1e6:.1f}",
                      _intensity(profile.flops, profile.bytes), style="bold")
    return table


# --- shapes ---------------------------------------------------------------------------------------------

def _skeleton(model: onnx.ModelProto, batch: int, sample_shapes: Mapping[str, Any]
              ) -> tuple[onnx.ModelProto, dict[str, tuple[int, ...]]]:
    """A copy of ``model`` for shape inference: fixed input shapes, large initializers as typed inputs."""
    from onnx import helper

    graph = model.graph
    weights = {t.name for t in graph.initializer}
    data_inputs = [vi for vi in graph.input if vi.name not in weights]
    unknown = set(sample_shapes) - {vi.name for vi in data_inputs}
    if unknown:
        name = sorted(unknown)[0]
        raise InputError(f"the model has no input '{name}'{did_you_mean(name, [vi.name for vi in data_inputs])}")
    inputs, fixed = [], {}
    for vi in data_inputs:
        dims = _fixed_dims(vi, batch, sample_shapes.get(vi.name))
        fixed[vi.name] = tuple(dims[1:])
        inputs.append(helper.make_tensor_value_info(vi.name, vi.type.tensor_type.elem_type, dims))
    kept = []
    for tensor in graph.initializer:
        if holds_shape(tensor):
            kept.append(tensor)
        else:
            inputs.append(helper.make_tensor_value_info(tensor.name, tensor.data_type, list(tensor.dims)))
    # Outputs keep only their type: declared symbolic dims would otherwise override the inferred ones.
    outputs = [helper.make_tensor_value_info(vi.name, vi.type.tensor_type.elem_type, None) for vi in graph.output]
    skeleton_graph = helper.make_graph(list(graph.node), graph.name or "model", inputs, outputs, kept)
    skeleton = helper.make_model(skeleton_graph, opset_imports=list(model.opset_import),
                                ir_version=max(model.ir_version, 4))  # IR 4: initializers need not be inputs
    return skeleton, fixed


def _fixed_dims(vi: onnx.ValueInfoProto, batch: int, sample: Any) -> list[int]:
    """The input's dimensions with the batch and the per-sample shape filled in."""
    tensor_type = vi.type.tensor_type
    if not vi.type.HasField("tensor_type"):
        raise InputError(f"input '{vi.name}' is not a tensor; the analysis handles tensor inputs only")
    if not tensor_type.HasField("shape"):
        if sample is None:
            raise InputError(f"input '{vi.name}' has no shape in the model; give its per-sample shape")
        return [batch, *(int(d) for d in sample)]
    dims = tensor_type.shape.dim
    if not dims:
        raise InputError(f"input '{vi.name}' is a scalar; the analysis needs a leading batch dimension")
    if sample is not None and len(sample) != len(dims) - 1:
        raise InputError(f"input '{vi.name}' has {len(dims)} dimensions (batch first), so its per-sample shape "
                         f"needs {len(dims) - 1} values, got {list(sample)}")
    fixed = []
    for index, dim in enumerate(dims):
        wanted = batch if index == 0 else (int(sample[index - 1]) if sample is not None else None)
        if dim.HasField("dim_value"):
            if wanted is not None and dim.dim_value != wanted:
                what = "batch size" if index == 0 else f"dimension {index}"
                raise InputError(f"input '{vi.name}' has a fixed {what} of {dim.dim_value} in the model, "
                                 f"not {wanted}; re-export it with that dimension dynamic")
            fixed.append(dim.dim_value)
        elif wanted is None:
            label = f" '{dim.dim_param}'" if dim.dim_param else ""
            raise InputError(f"input '{vi.name}' has a symbolic dimension{label} (dimension {index}); "
                             "give its per-sample shape")
        else:
            fixed.append(wanted)
    return fixed


def _infer_types(skeleton: onnx.ModelProto) -> dict[str, TensorType]:
    """Element type and (partial) shape of every tensor ONNX shape inference reaches."""
    import onnx

    try:
        inferred = onnx.shape_inference.infer_shapes(skeleton, check_type=True, data_prop=True)
    except Exception as exc:  # InferenceError, ValidationError: the graph contradicts itself
        raise InputError(f"ONNX shape inference failed: {short_reason(exc)}") from None
    types = value_types(inferred.graph)
    for tensor in inferred.graph.initializer:
        types[tensor.name] = (tensor.data_type, tuple(tensor.dims))
    return types


# --- costs ----------------------------------------------------------------------------------------------

OP_TABLE = "hardware/op_classes.yaml"
OP_TABLE_FILE = data_dir("recipes") / OP_TABLE


@cache
def op_table() -> dict[str, tuple[str, float]]:
    """op_type -> (op class, FLOP constant), from ``recipes/hardware/op_classes.yaml``."""
    data = read_catalog(OP_TABLE)
    return {op: (op_class, float(cost)) for op_class, ops in data.items() for op, cost in ops.items()}


def _costed(node: onnx.NodeProto) -> list[str]:
    """The tensors whose shapes ``node`` is costed at: its outputs and, unless it reads only shapes, its inputs."""
    inputs = [] if node.op_type in _METADATA_ONLY else [n for n in node.input if n]
    return [*inputs, *(n for n in node.output if n)]


def _node_stats(node: onnx.NodeProto, index: int, types: Mapping[str, tuple[int, tuple[int, ...]]],
                constants: frozenset[str]) -> OpStats:
    metadata_only = node.op_type in _METADATA_ONLY
    inputs = [(n, None if metadata_only else types[n]) for n in node.input if n]
    outputs = [types[n] for n in node.output if n]
    op_class, cost = op_table().get(node.op_type, ("elementwise", 1.0))
    gather = op_class == "embedding"
    if gather and node.input[0] not in constants:
        op_class = "data_movement"
    in_dims = [t[1] if t else () for _, t in inputs]
    out_dims = [t[1] for t in outputs]
    macs = _macs(node, in_dims, out_dims) if op_class in _MAC_CLASSES else 0
    flops = _flops(node, op_class, cost, macs, in_dims, out_dims)
    output_bytes = sum(_nbytes(*t) for t in outputs)
    input_bytes = weight_bytes = 0
    for position, (name, typed) in enumerate(inputs):
        if typed is not None:
            size = _nbytes(*typed)
            if name in constants:
                weight_bytes += size
            elif gather and position == 0:
                input_bytes += min(size, output_bytes)  # the gathered elements
            else:
                input_bytes += size
    if op_class == "embedding":
        weight_bytes = min(weight_bytes, output_bytes)  # the gathered rows
    return OpStats(node.name or f"{node.op_type}_{index}", node.op_type, op_class, macs, flops, input_bytes,
                   weight_bytes, output_bytes)


def _macs(node: onnx.NodeProto, ins: list[tuple[int, ...]], outs: list[tuple[int, ...]]) -> int:
    op, out = node.op_type, outs[0]
    if op in ("Conv", "ConvInteger", "QLinearConv", "DeformConv"):
        weight = ins[_WEIGHT_INPUT[op]]  # (out channels, in channels / group, *kernel)
        return math.prod(out) * math.prod(weight[1:])
    if op == "ConvTranspose":
        weight = ins[1]  # (in channels, out channels / group, *kernel)
        return math.prod(ins[0]) * math.prod(weight[1:])
    if op == "Gemm":
        trans_a = _attr(node, "transA", 0)
        return math.prod(out) * (ins[0][0] if trans_a else ins[0][-1])
    if op in _MATMUL_B:
        return math.prod(out) * ins[0][-1]
    if op == "Einsum":
        return _einsum_macs(_attr(node, "equation", b"").decode(), ins, out)
    if op in ("RNN", "GRU", "LSTM"):  # X: (seq, batch, features) or (batch, seq, features); W, R per direction
        return ins[0][0] * ins[0][1] * (math.prod(ins[1]) + math.prod(ins[2]))
    raise ModakError(f"op_classes.yaml makes {op} a conv, matmul or recurrent op, but the analysis has no MAC rule "
                     f"for it")


def _einsum_macs(equation: str, ins: list[tuple[int, ...]], out: tuple[int, ...]) -> int:
    """Output elements x the sizes of the summed-over letters x (operands - 1) multiplications."""
    equation = equation.replace(" ", "")
    lhs, _, rhs = equation.partition("->")
    terms = lhs.split(",")
    sizes: dict[str, int] = {}
    for term, dims in zip(terms, ins):
        letters = term.replace("...", "")
        start = term.find("...")
        explicit = dims if start < 0 else dims[:start] + dims[len(dims) - (len(letters) - start):]
        for letter, size in zip(letters, explicit):
            sizes[letter] = max(sizes.get(letter, 1), size)
    kept = rhs if "->" in equation else "".join(c for c in sizes if lhs.count(c) == 1)
    summed = math.prod(size for letter, size in sizes.items() if letter not in kept)
    return math.prod(out) * summed * max(1, len(terms) - 1)


def _flops(node: onnx.NodeProto, op_class: str, cost: float, macs: int, ins: list[tuple[int, ...]],
           outs: list[tuple[int, ...]]) -> int:
    out_elements = math.prod(outs[0]) if outs else 0
    if op_class in _MAC_CLASSES:
        bias_index = 2 if node.op_type == "Gemm" else _CONV_BIAS.get(node.op_type)
        has_bias = bias_index is not None and len(node.input) > bias_index and node.input[bias_index]
        return round(cost * macs) + (out_elements if has_bias else 0)
    if op_class in ("elementwise", "normalization", "softmax"):
        return round(cost * out_elements)
    if op_class == "reduction":
        return round(cost * math.prod(ins[0]))
    if op_class == "pooling":
        if node.op_type.startswith("Global"):
            return round(cost * math.prod(ins[0]))
        kernel = _attr(node, "kernel_shape", [])
        if node.op_type == "MaxRoiPool":
            kernel = _attr(node, "pooled_shape", [])
        return round(cost * out_elements * math.prod(kernel))
    return 0


def _attr(node: onnx.NodeProto, name: str, default: Any) -> Any:
    from onnx import helper

    for attr in node.attribute:
        if attr.name == name:
            return helper.get_attribute_value(attr)
    return default


def _nbytes(elem_type: int, dims: tuple[int, ...]) -> int:
    return math.ceil(math.prod(dims) * _DTYPE_BYTES.get(elem_type, 4))


def _group(ops: tuple[OpStats, ...], key: Any) -> dict[str, OpGroup]:
    totals: dict[str, list[int]] = {}
    for op in ops:
        entry = totals.setdefault(key(op), [0, 0, 0])
        entry[0] += 1
        entry[1] += op.flops
        entry[2] += op.bytes
    ordered = sorted(totals.items(), key=lambda item: (-item[1][1], -item[1][2], item[0]))
    return {k: OpGroup(*v) for k, v in ordered}


def _intensity(flops: int, nbytes: int) -> str:
    return f"{flops / nbytes:.1f}" if nbytes else "-"

