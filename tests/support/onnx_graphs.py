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
