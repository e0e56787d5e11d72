"""ONNX Runtime: intra/inter-op threads and their wait policy, graph optimization level, execution mode; CPU or CUDA
provider."""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from modak.image.deployment import WAIT_VARIABLE
from modak.image.runtimes.base import FunctionSession, RunRequest

_LEVELS = {"disabled": "ORT_DISABLE_ALL", "basic": "ORT_ENABLE_BASIC", "extended": "ORT_ENABLE_EXTENDED",
           "all": "ORT_ENABLE_ALL"}


def prepare(request: RunRequest, inputs: dict[str, np.ndarray]) -> FunctionSession:
    """An InferenceSession configured from the candidate's parameters (any batch size the graph accepts)."""
    import onnxruntime as ort

    providers = ["CUDAExecutionProvider"] if request.device == "gpu" else ["CPUExecutionProvider"]
    session = ort.InferenceSession(request.onnx_path, session_options(request), providers=providers)
    if request.device == "gpu" and "CUDAExecutionProvider" not in session.get_providers():
        raise RuntimeError("ONNX Runtime has no CUDA execution provider here (install onnxruntime-gpu)")
    open_batch = all(not isinstance(i.shape[0], int) for i in session.get_inputs() if i.shape)
    return FunctionSession(lambda feeds: session.run(None, dict(feeds)), open_batch)


def session_options(request: RunRequest) -> Any:
    """The ``onnxruntime.SessionOptions`` of the candidate: its parameters, and the wait policy the launcher set
    (``MODAK_WAIT_POLICY``: ``passive`` turns the intra- and inter-op pools' spinning off)."""
    import onnxruntime as ort

    params = request.params
    options = ort.SessionOptions()
    options.intra_op_num_threads = request.threads or 0
    options.inter_op_num_threads = int(params.get("inter_op_threads", 1))
    level = _LEVELS[params.get("graph_optimization", "all")]
    options.graph_optimization_level = getattr(ort.GraphOptimizationLevel, level)
    options.execution_mode = (ort.ExecutionMode.ORT_PARALLEL if params.get("execution_mode") == "parallel"
                              else ort.ExecutionMode.ORT_SEQUENTIAL)
    spinning = "0" if os.environ.get(WAIT_VARIABLE) == "passive" else "1"
    options.add_session_config_entry("session.intra_op.allow_spinning", spinning)
    options.add_session_config_entry("session.inter_op.allow_spinning", spinning)
    return options
