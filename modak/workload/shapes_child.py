"""The child process that runs a graph once in ONNX Runtime for the shapes ONNX shape inference left unknown
(``python -m modak.workload.shapes_child FOLDER``; :func:`modak.workload.shapes.fill`).

``FOLDER`` holds ``model.onnx``, whose outputs are the tensors wanted, and ``request.json``: the model's inputs
(element type, dimensions) and the address-space limit (``RLIMIT_AS``, set before onnxruntime is imported). The
inputs are random in [0, 1) where floating-point, zeros otherwise. It writes ``result.json``: each output's
element type and dimensions (a non-tensor output left out). The parent kills it at its deadline.
"""

from __future__ import annotations

import json
import resource
import sys
from pathlib import Path


def main(folder: Path) -> None:
    request = json.loads((folder / "request.json").read_text())
    resource.setrlimit(resource.RLIMIT_AS, (request["memory_bytes"], request["memory_bytes"]))
    import numpy as np
    import onnxruntime
    from onnx import helper

    options = onnxruntime.SessionOptions()
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.enable_cpu_mem_arena = False  # tensors nothing reads any more are freed
    session = onnxruntime.InferenceSession(str(folder / "model.onnx"), options, providers=["CPUExecutionProvider"])
    random = np.random.default_rng(0)
    feeds = {}
    for name, (elem_type, dims) in request["inputs"].items():
        dtype = helper.tensor_dtype_to_np_dtype(elem_type)
        feeds[name] = (random.random(dims).astype(dtype) if np.issubdtype(dtype, np.floating)
                       else np.zeros(dims, dtype))
    names = [output.name for output in session.get_outputs()]
    values = session.run(names, feeds)
    found = {name: [helper.np_dtype_to_tensor_dtype(value.dtype), list(value.shape)]
             for name, value in zip(names, values) if isinstance(value, np.ndarray)}
    (folder / "result.json").write_text(json.dumps(found))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
