"""Synthetic layers for ``modak probe --kernels``: an operator vocabulary beyond the zoo's own layers.

A kernel model learns only the kinds and sizes it has seen. Drawn from the zoo alone, a kind that one family of
models runs (attention's softmax, a recurrent cell, an upsampling) is unknown for a model of another, and a layer
larger than any in the zoo is past its kind's range. nn-Meter samples each kernel's configurations from a prior
range, not from the models it is tested on; this module does the same for the ONNX runtimes: each
:data:`OPERATORS` entry builds a small ONNX graph (one operator, or one with the activation or the neighbours a
runtime fuses it with) from sizes drawn log-uniformly over ranges typical of CNNs, transformers, recommenders and
recurrent models. The batch is the graph's symbolic first dimension; every input is a float tensor; the weights are
seeded random values. The runtimes then say which kernels each graph becomes, as they do for a zoo layer.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import onnx

SYNTHETIC_BATCHES = (1, 4, 16, 64)  # the batch sizes a synthetic layer is drawn at
MAX_WEIGHTS = 4_000_000  # floats of weights in one synthetic graph, at most
MAX_ACTIVATIONS = 16_000_000  # floats in one input or output tensor (at the batch drawn), at most


@dataclass(frozen=True)
class SyntheticGraph:
    """One synthetic layer: the operator it was drawn for, its graph and the batch size it runs at."""

    operator: str
    graph: onnx.ModelProto
    batch_size: int


def _sizes(rng: random.Random, low: int, high: int, multiple: int = 1) -> int:
    """A size drawn log-uniformly from [low, high], rounded to ``multiple``."""
    value = math.exp(rng.uniform(math.log(low), math.log(high)))
    return max(multiple, int(round(value / multiple)) * multiple)


class _Graph:
    """A graph being built: float inputs of the batch, seeded weights, nodes."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.inputs: list = []
        self.weights: list = []
        self.nodes: list = []
        self.count = 0
        self.weight_floats = 0

    def input(self, dims: list[int]) -> str:
        from onnx import TensorProto, helper

        name = f"x{len(self.inputs)}"
        self.inputs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, ["batch", *dims]))
        return name

    def weight(self, dims: list[int], scale: float | None = None) -> str:
        import numpy as np
        from onnx import numpy_helper

        name = f"w{len(self.weights)}"
        fan_in = max(1, math.prod(dims[1:]) if len(dims) > 1 else dims[0])
        values = np.random.default_rng(self.rng.randrange(2**32)).standard_normal(dims).astype(np.float32)
        self.weights.append(numpy_helper.from_array(values * (scale or 1 / math.sqrt(fan_in)), name))
        self.weight_floats += math.prod(dims)
        return name

    def constant(self, values: float | list, dtype: str = "int64") -> str:
        import numpy as np
        from onnx import numpy_helper

        name = f"c{len(self.weights)}"
        self.weights.append(numpy_helper.from_array(np.array(values, dtype=dtype), name))
        return name

    def node(self, op: str, inputs: list[str], **attributes: Any) -> str:
        from onnx import helper

        self.count += 1
        output = f"t{self.count}"
        self.nodes.append(helper.make_node(op, inputs, [output], name=f"{op.lower()}_{self.count}", **attributes))
        return output

    def activation(self, x: str, name: str) -> str:
        if name == "relu":
            return self.node("Relu", [x])
        if name == "relu6":
            return self.node("Clip", [x, self.constant(0.0, "float32"), self.constant(6.0, "float32")])
        if name == "swish":
            return self.node("Mul", [x, self.node("Sigmoid", [x])])
        if name == "gelu":  # the erf form that exporters write and both runtimes fuse
            scaled = self.node("Div", [x, self.constant(math.sqrt(2.0), "float32")])
            half = self.node("Mul", [x, self.constant(0.5, "float32")])
            return self.node("Mul", [half, self.node("Add", [self.node("Erf", [scaled]),
                                                                self.constant(1.0, "float32")])])
        return x

    def model(self, output: str) -> onnx.ModelProto:
        import onnx
        from onnx import helper

        from modak.workload.zoo import IR_VERSION, OPSET

        graph = helper.make_graph(self.nodes, "synthetic", self.inputs, [], self.weights)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
        model.ir_version = IR_VERSION
        inferred = onnx.shape_inference.infer_shapes(model)
        model.graph.output.append(next(v for v in inferred.graph.value_info if v.name == output))
        onnx.checker.check_model(model)
        return model


def _conv(g: _Graph) -> str:
    rng = g.rng
    depthwise = rng.random() < 0.3
    channels = _sizes(rng, 8, 512, 8)
    out = channels if depthwise else _sizes(rng, 8, 512, 8)
    kernel = rng.choice((1, 3, 3, 5, 7) if not depthwise else (3, 5))
    stride = rng.choice((1, 1, 2))
    side = _sizes(rng, 7, 128)
    x = g.input([channels, side, side])
    w = g.weight([out, 1 if depthwise else channels, kernel, kernel])
    y = g.node("Conv", [x, w, g.weight([out], 0.1)], kernel_shape=[kernel, kernel], strides=[stride, stride],
               pads=[kernel // 2] * 4, group=channels if depthwise else 1)
    return g.activation(y, rng.choice(("relu", "relu", "relu6", "swish", "none")))


def _conv_transpose(g: _Graph) -> str:
    rng = g.rng
    channels, out, side = _sizes(rng, 8, 256, 8), _sizes(rng, 8, 256, 8), _sizes(rng, 4, 64)
    kernel = rng.choice((2, 4))
    x = g.input([channels, side, side])
    y = g.node("ConvTranspose", [x, g.weight([channels, out, kernel, kernel]), g.weight([out], 0.1)],
               kernel_shape=[kernel, kernel], strides=[2, 2], pads=[(kernel - 2) // 2] * 4)
    return g.activation(y, rng.choice(("relu", "none")))


def _dense(g: _Graph) -> str:
    rng = g.rng
    sequence = rng.choice((None, _sizes(rng, 8, 256)))
    features, out = _sizes(rng, 16, 2048, 8), _sizes(rng, 16, 2048, 8)
    x = g.input([features] if sequence is None else [sequence, features])
    y = g.node("Add", [g.node("MatMul", [x, g.weight([features, out])]), g.weight([out], 0.1)])
    return g.activation(y, rng.choice(("relu", "gelu", "none", "none")))


def _attention(g: _Graph) -> str:
    rng = g.rng
    heads, sequence, width = rng.choice((1, 2, 4, 8, 12)), _sizes(rng, 8, 256), rng.choice((16, 32, 64))
    q, k, v = g.input([heads, sequence, width]), g.input([heads, width, sequence]), g.input([heads, sequence, width])
    scores = g.node("Div", [g.node("MatMul", [q, k]), g.constant(math.sqrt(width), "float32")])
    if rng.random() < 0.5:  # an additive mask, as causal and padded attention add one
        scores = g.node("Add", [scores, g.weight([1, sequence, sequence], 1.0)])
    return g.node("MatMul", [g.node("Softmax", [scores], axis=-1), v])


def _heads(g: _Graph) -> str:
    rng = g.rng
    heads, sequence, width = rng.choice((2, 4, 8, 12)), _sizes(rng, 8, 256), rng.choice((16, 32, 64))
    x = g.input([sequence, heads * width])
    split = g.node("Reshape", [x, g.constant([0, sequence, heads, width])])
    return g.node("Transpose", [split], perm=[0, 2, 1, 3])


def _norm(g: _Graph) -> str:
    rng = g.rng
    sequence, width = _sizes(rng, 1, 256), _sizes(rng, 32, 1024, 8)
    x = g.input([sequence, width])
    if rng.random() < 0.5:
        x = g.node("Add", [x, g.input([sequence, width])])  # the residual a transformer adds before its norm
    return g.node("LayerNormalization", [x, g.weight([width], 1.0), g.weight([width], 0.1)], axis=-1)


def _elementwise(g: _Graph) -> str:
    rng = g.rng
    shape = rng.choice(([_sizes(rng, 8, 256, 8), _sizes(rng, 4, 64), _sizes(rng, 4, 64)],
                        [_sizes(rng, 1, 256), _sizes(rng, 16, 1024, 8)], [_sizes(rng, 16, 8192)]))
    x = g.input(shape)
    op = rng.choice(("Relu", "Tanh", "Sigmoid", "Erf", "Exp", "Clip", "LeakyRelu", "HardSigmoid", "Add", "Sub",
                     "Mul", "Div", "Add2", "Mul2"))
    if op in ("Add", "Sub", "Mul", "Div"):  # with a broadcast weight (a bias, a scale)
        return g.node(op, [x, g.weight([shape[0], *[1] * (len(shape) - 1)], 1.0)])
    if op in ("Add2", "Mul2"):  # two activations (a residual, a gate)
        return g.node(op[:-1], [x, g.input(shape)])
    if op == "Clip":
        return g.activation(x, "relu6")
    return g.node(op, [x])


def _pool(g: _Graph) -> str:
    rng = g.rng
    channels, side = _sizes(rng, 8, 512, 8), _sizes(rng, 7, 112)
    x = g.input([channels, side, side])
    op = rng.choice(("MaxPool", "AveragePool", "GlobalAveragePool", "ReduceMean"))
    if op == "GlobalAveragePool":
        return g.node(op, [x])
    if op == "ReduceMean":
        return g.node(op, [x], axes=[2, 3], keepdims=0)
    kernel = rng.choice((2, 3))
    return g.node(op, [x], kernel_shape=[kernel, kernel], strides=[2, 2], pads=[kernel // 2 - (kernel == 2)] * 4)


def _resize(g: _Graph) -> str:
    rng = g.rng
    x = g.input([_sizes(rng, 8, 256, 8), _sizes(rng, 4, 64), _sizes(rng, 4, 64)])
    return g.node("Resize", [x, "", g.constant([1.0, 1.0, 2.0, 2.0], "float32")], mode="nearest")


def _cumsum(g: _Graph) -> str:
    rng = g.rng
    x = g.input([_sizes(rng, 8, 2048)])
    return g.node("CumSum", [x, g.constant(1)])


def _concat(g: _Graph) -> str:
    rng = g.rng
    side = _sizes(rng, 4, 64)
    a = g.input([_sizes(rng, 8, 256, 8), side, side])
    b = g.input([_sizes(rng, 8, 256, 8), side, side])
    return g.node("Concat", [a, b], axis=1)


def _recurrent(g: _Graph) -> str:
    rng = g.rng
    op = rng.choice(("LSTM", "GRU"))
    sequence, features, hidden = _sizes(rng, 4, 128), _sizes(rng, 8, 512, 8), _sizes(rng, 16, 512, 8)
    gates = 4 if op == "LSTM" else 3
    x = g.node("Transpose", [g.input([sequence, features])], perm=[1, 0, 2])  # batch-major in, time-major ONNX
    outputs = g.node(op, [x, g.weight([1, gates * hidden, features]), g.weight([1, gates * hidden, hidden]),
                          g.weight([1, 2 * gates * hidden], 0.1)], hidden_size=hidden)
    return g.node("Transpose", [g.node("Squeeze", [outputs, g.constant([1])])], perm=[1, 0, 2])


OPERATORS: Mapping[str, Callable[[_Graph], str]] = {
    "conv": _conv, "conv_transpose": _conv_transpose, "dense": _dense, "attention": _attention, "heads": _heads,
    "norm": _norm, "elementwise": _elementwise, "pool": _pool, "resize": _resize, "cumsum": _cumsum,
    "concat": _concat, "recurrent": _recurrent,
}
"""Each operator's graph builder: it draws its sizes from the graph's random source and returns its output."""


def synthetic_graphs(count: int, seed: int = 0) -> list[SyntheticGraph]:
    """``count`` synthetic layers, the operators in turn, each with sizes and a batch drawn from ``seed``'s stream;
    a draw with more than :data:`MAX_WEIGHTS` weights or :data:`MAX_ACTIVATIONS` floats in a tensor is drawn
    again."""
    import onnx

    rng = random.Random(seed)
    names = sorted(OPERATORS)
    graphs: list[SyntheticGraph] = []
    while len(graphs) < count:
        operator = names[len(graphs) % len(names)]
        g = _Graph(rng)
        output = OPERATORS[operator](g)
        batch = rng.choice(SYNTHETIC_BATCHES)
        model = g.model(output)
        inferred = onnx.shape_inference.infer_shapes(model)
        tensors = [*inferred.graph.input, *inferred.graph.value_info, *inferred.graph.output]
        largest = max((_floats(t, batch) for t in tensors), default=0)
        if g.weight_floats <= MAX_WEIGHTS and largest <= MAX_ACTIVATIONS:
            graphs.append(SyntheticGraph(operator, model, batch))
    return graphs


def _floats(tensor: onnx.ValueInfoProto, batch: int) -> int:
    """Elements of ``tensor`` at ``batch`` (its symbolic dimensions taken as the batch)."""
    dims = tensor.type.tensor_type.shape.dim
    return math.prod(d.dim_value if d.HasField("dim_value") else batch for d in dims)
