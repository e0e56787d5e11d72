"""Which nodes of an ONNX graph a runtime's kernel covers, where the runtime names only some of them.

Runtimes rewrite the graph they are given (fusions, constant folding, layout conversions) and report kernels of the
rewritten graph. The link back to the ONNX graph is the tensors and the node names that survive: a kernel is
*seeded* with the ONNX nodes the runtime names for it (ONNX Runtime: the producers of the ONNX tensors it outputs;
OpenVINO: its ``originalLayersNames``), then *absorbs* the unclaimed ONNX nodes upstream of its seeds (the
convolution that a Conv+BatchNorm+ReLU fusion renamed), up to tensors the rewritten graph still has, graph inputs,
initializers and nodes another kernel claimed; a kernel that reads a tensor besides its main input also *joins* the
unclaimed nodes downstream that combine its results with that tensor (the residual Add that ONNX Runtime's NCHWc
convolution sums into its output, and the activation it applies after the sum). An ONNX node is identified as
:mod:`modak.workload.analysis` identifies it: its name, or ``<op_type>_<index>`` when it has none.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Iterable, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import onnx


# Initializers of at most this many elements (shapes, axes) keep their values for shape inference's data
# propagation; larger ones (weights) enter it as typed inputs, so that it does not serialize their data.
KEEP_INITIALIZER_ELEMENTS = 64


def holds_shape(tensor: onnx.TensorProto) -> bool:
    """Whether shape inference keeps the initializer ``tensor``'s values (a small inline one: shapes, axes) rather
    than only its type and dims (weights, external data)."""
    import math

    import onnx

    return math.prod(tensor.dims) <= KEEP_INITIALIZER_ELEMENTS and tensor.data_location != onnx.TensorProto.EXTERNAL


def node_ids(graph: onnx.GraphProto) -> list[str]:
    """The identifier of each node of ``graph``, in graph order."""
    return [node.name or f"{node.op_type}_{index}" for index, node in enumerate(graph.node)]


# Ops whose results differ from run to run: never computed once, whatever their inputs.
_NONDETERMINISTIC = frozenset({"RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike", "Bernoulli",
                               "Multinomial"})


def constant_tensors(graph: onnx.GraphProto) -> frozenset[str]:
    """The tensors of ``graph`` that hold data fixed in the file: its initializers and ``Constant`` nodes' outputs."""
    return frozenset({t.name for t in graph.initializer}
                     | {t for node in graph.node if node.op_type == "Constant" for t in node.output if t})


def shape_static_nodes(graph: onnx.GraphProto) -> frozenset[str]:
    """The nodes whose results are fixed once the graph's input shapes are, and not before: ``Shape`` and ``Size``
    (they read only shapes), and every node whose inputs are all such results, initializers (not graph inputs) or
    ``Constant`` results, at least one of them such a result; random ops left out. A runtime that compiles the graph
    at fixed shapes computes them once, when compiling (those of constants alone it folds in any case)."""
    ids = node_ids(graph)
    constant = constant_tensors(graph) - {i.name for i in graph.input}  # a fed initializer is no constant
    shaped: set[str] = set()
    found = set()
    for index, node in enumerate(graph.node):
        inputs = [t for t in node.input if t]
        if node.op_type in _NONDETERMINISTIC:
            continue
        if node.op_type in ("Shape", "Size") or (
                any(t in shaped for t in inputs) and all(t in shaped or t in constant for t in inputs)):
            shaped.update(t for t in node.output if t)
            found.add(ids[index])
    return frozenset(found)


def has_unique_names(graph: onnx.GraphProto) -> bool:
    """Whether every node has a name of its own (runtimes report nodes by name)."""
    names = [node.name for node in graph.node]
    return all(names) and len(set(names)) == len(names)


def attributes_json(node: onnx.NodeProto) -> str:
    """A node's scalar, string and list attributes as sorted JSON (tensors and subgraphs left out)."""
    from onnx import AttributeProto, helper

    values: dict[str, Any] = {}
    for attribute in node.attribute:
        if attribute.type in (AttributeProto.TENSOR, AttributeProto.GRAPH, AttributeProto.TENSORS,
                              AttributeProto.GRAPHS, AttributeProto.SPARSE_TENSOR, AttributeProto.SPARSE_TENSORS,
                              AttributeProto.TYPE_PROTO, AttributeProto.TYPE_PROTOS):
            continue
        value = helper.get_attribute_value(attribute)
        if isinstance(value, bytes):
            value = value.decode("utf-8", "replace")
        elif isinstance(value, list):
            value = [v.decode("utf-8", "replace") if isinstance(v, bytes) else v for v in value]
        values[attribute.name] = value
    return json.dumps(values, sort_keys=True)


class Cover:
    """Assigns the nodes of one ONNX graph to kernels (see the module docstring)."""

    def __init__(self, graph: onnx.GraphProto) -> None:
        self.ids = node_ids(graph)
        self.producer = {t: self.ids[i] for i, node in enumerate(graph.node) for t in node.output if t}
        self.inputs = {self.ids[i]: [t for t in node.input if t] for i, node in enumerate(graph.node)}
        self.outputs = {self.ids[i]: [t for t in node.output if t] for i, node in enumerate(graph.node)}
        self.op_types = {self.ids[i]: node.op_type for i, node in enumerate(graph.node)}
        self.consumers: dict[str, list[str]] = {}
        for index, node in enumerate(graph.node):
            for tensor in node.input:
                self.consumers.setdefault(tensor, []).append(self.ids[index])
        self.constants = constant_tensors(graph)
        self.claimed: set[str] = set()

    def claim(self, seeds: Iterable[str]) -> None:
        """Mark ``seeds`` as accounted for: named by the runtime for some kernel, or computed when it compiled the
        graph (no other kernel absorbs them)."""
        self.claimed.update(seeds)

    def absorb(self, seeds: Collection[str], alive: Collection[str] = ()) -> tuple[str, ...]:
        """``seeds`` and the unclaimed nodes upstream of them, up to a tensor in ``alive``, a graph input, an
        initializer or a claimed node; the absorbed nodes become claimed. In graph order."""
        covered = set(seeds)
        pending = list(seeds)
        while pending:
            for tensor in self.inputs.get(pending.pop(), ()):
                node = self.producer.get(tensor)
                if tensor in alive or node is None or node in covered or node in self.claimed:
                    continue
                covered.add(node)
                pending.append(node)
        self.claimed.update(covered)
        return tuple(n for n in self.ids if n in covered)

    def join(self, covered: Collection[str], reads: Collection[str], activation: str = "") -> tuple[str, ...]:
        """``covered`` and the unclaimed nodes downstream of it whose inputs are all its results, tensors in
        ``reads`` (what the kernel reads besides constants, as ONNX tensors) or constants, at least one from
        ``reads``; then the node of op type ``activation`` (the activation the kernel says it applies last) that
        alone consumes the last joined node's results. The joined nodes become claimed. In graph order."""
        joined = set(covered)
        pending = list(covered)
        while pending:
            for tensor in self.outputs.get(pending.pop(), ()):
                for node in self.consumers.get(tensor, ()):
                    inputs = self.inputs[node]
                    if node not in joined and node not in self.claimed and any(t in reads for t in inputs) and all(
                            t in reads or t in self.constants or self.producer.get(t) in joined for t in inputs):
                        joined.add(node)
                        pending.append(node)
        added = [n for n in self.ids if n in joined and n not in covered]
        if activation and added:
            results = self.outputs[added[-1]]
            consumers = {n for t in results for n in self.consumers.get(t, ())}
            if len(consumers) == 1:
                node = consumers.pop()
                if node not in self.claimed and self.op_types[node] == activation and all(
                        t in results or t in self.constants for t in self.inputs[node]):
                    joined.add(node)
        self.claimed.update(joined)
        return tuple(n for n in self.ids if n in joined)


def resolve(name: str, by_name: Mapping[str, str]) -> str | None:
    """The ONNX node a runtime's layer name stands for: a node name or output tensor name (``by_name``), else the
    same for the name without its trailing ``/part``s (runtimes name the pieces of a decomposed node so)."""
    while True:
        if name in by_name:
            return by_name[name]
        if "/" not in name.strip("/"):
            return None
        name = name.rstrip("/").rpartition("/")[0]


def names_of(graph: onnx.GraphProto) -> dict[str, str]:
    """Layer name -> ONNX node id: every output tensor's name, then every node name (names win)."""
    ids = node_ids(graph)
    by_name = {t: ids[i] for i, node in enumerate(graph.node) for t in node.output if t}
    by_name.update({node.name: ids[i] for i, node in enumerate(graph.node) if node.name})
    return by_name



def fed_shapes(model: onnx.ModelProto, inputs: Mapping[str, Collection[int]]) -> dict[str, tuple[int, ...]]:
    """The shape of every tensor of ``model`` that ONNX shape inference fixes when its graph inputs have the shapes
    ``inputs`` (the batch included), initializers included: the shapes a runtime's kernels read, as both a profile
    and a plan give them (weights, inline or external, enter inference as typed inputs: it reads only the small
    initializers that hold shapes)."""
    import onnx
    from onnx import helper

    skeleton = onnx.ModelProto()
    skeleton.CopyFrom(model)
    declared = {value.name for value in skeleton.graph.input}
    kept = []
    for tensor in skeleton.graph.initializer:
        if holds_shape(tensor):
            kept.append(tensor)
        elif tensor.name not in declared:
            skeleton.graph.input.append(helper.make_tensor_value_info(tensor.name, tensor.data_type, list(tensor.dims)))
    del skeleton.graph.initializer[:]
    skeleton.graph.initializer.extend(kept)
    skeleton.ir_version = max(skeleton.ir_version, 4)  # IR 4: initializers need not be inputs
    for value in skeleton.graph.input:
        if value.name in inputs:
            dims = value.type.tensor_type.shape.dim
            del dims[:]
            for size in inputs[value.name]:
                dims.add().dim_value = int(size)
    del skeleton.graph.value_info[:]
    inferred = onnx.shape_inference.infer_shapes(skeleton).graph
    shapes = {t.name: tuple(t.dims) for t in model.graph.initializer}
    for value in (*inferred.input, *inferred.value_info, *inferred.output):
        dims = value.type.tensor_type.shape.dim
        if value.type.HasField("tensor_type") and value.type.tensor_type.HasField("shape") and all(
                d.HasField("dim_value") for d in dims):
            shapes.setdefault(value.name, tuple(int(d.dim_value) for d in dims))
    return shapes
