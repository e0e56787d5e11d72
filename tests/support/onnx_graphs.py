"""Small hand-built ONNX graphs shared by the tests."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def write_onnx(path: Path, input_name: str = "x", external: bool = False) -> None:
    """A MatMul + Relu graph with a dynamic batch; ``external`` puts its weights in ``<name>.data``."""
    weight = numpy_helper.from_array(np.ones((4, 2), np.float32), "W")
    graph = helper.make_graph(
        [helper.make_node("MatMul", [input_name, "W"], ["h"]), helper.make_node("Relu", ["h"], ["y"])], "tiny",
        [helper.make_tensor_value_info(input_name, TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 2])], [weight])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save_model(model, path, save_as_external_data=external, location=f"{path.name}.data", size_threshold=0)


CONV_BN_RELU_NODES = ("conv", "bn", "relu", "pool", "flat", "fc")


def write_conv_bn_relu(path: Path, named: bool = True) -> None:
    """Conv -> BatchNormalization -> Relu -> MaxPool -> Flatten -> MatMul on x [N, 8, 16, 16] (a dynamic batch),
    the nodes named :data:`CONV_BN_RELU_NODES` (``named``) or not at all."""
    rng = np.random.default_rng(0)

    def weight(name: str, *shape: int, low: float = -1.0) -> onnx.TensorProto:
        return numpy_helper.from_array(rng.uniform(low, 1.0, shape).astype(np.float32), name)

    initializers = [weight("w", 16, 8, 3, 3), weight("b", 16), weight("scale", 16), weight("shift", 16),
                    weight("mean", 16), weight("var", 16, low=0.5), weight("w_fc", 16 * 8 * 8, 10)]
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c", "scale", "shift", "mean", "var"], ["n"]),
             helper.make_node("Relu", ["n"], ["r"]),
             helper.make_node("MaxPool", ["r"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("Flatten", ["p"], ["f"]),
             helper.make_node("MatMul", ["f", "w_fc"], ["y"])]
    for node, name in zip(nodes, CONV_BN_RELU_NODES):
        node.name = name if named else ""
    graph = helper.make_graph(nodes, "conv_bn_relu",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 8, 16, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 10])], initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save_model(model, path)
