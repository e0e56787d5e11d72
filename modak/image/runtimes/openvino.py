"""OpenVINO: the ONNX graph reshaped to the request's static batch, compiled for the CPU plugin.

Parameters: ``performance_hint`` (``LATENCY``: one stream, one request at a time; ``THROUGHPUT``: several
streams that each run their own request), ``threads`` (``INFERENCE_NUM_THREADS``). Precision bf16 sets
``INFERENCE_PRECISION_HINT`` to ``bf16`` (else ``f32``, so that a plugin default never lowers fp32 runs).

A step is one "wave": the plugin's optimal number of infer requests (``OPTIMAL_NUMBER_OF_INFER_REQUESTS``,
one per stream), each on one batch of the request's size, started together and all waited for; the
outputs returned are the first request's (every request has the same inputs). The session's
``batches_per_step`` says how many batches a step completes; the time per batch, comparable with every other
runtime's step, is the step time divided by it (whoever times ``run`` must divide, as
``getattr(session, "batches_per_step", 1)``):

- LATENCY: one stream, so one request: a step is one batch, ``batches_per_step == 1``.
- THROUGHPUT: N streams each run their own batch concurrently (the way a server with N requests in flight
  uses the machine): a step is N batches, ``batches_per_step == N``. The latency of one batch is the whole
  step time; the time per batch at full load is the step time / N.

Compilation happens in :func:`prepare`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from modak.image.runtimes.base import RunRequest

_PRECISION = {"bf16": "bf16", "fp16": "f16"}
_HINTS = ("LATENCY", "THROUGHPUT")


class WaveSession:
    """Infer requests started together and waited for together; ``run`` returns the first one's outputs."""

    def __init__(self, requests: list[Any]) -> None:
        self.requests = requests
        self.batches_per_step = len(requests)

    def run(self) -> list[np.ndarray]:
        for request in self.requests:
            request.start_async()
        for request in self.requests:
            request.wait()
        first = self.requests[0]
        return [np.array(first.get_output_tensor(i).data) for i in range(len(first.model_outputs))]


def prepare(request: RunRequest, inputs: dict[str, np.ndarray]) -> WaveSession:
    import openvino as ov

    hint = str(request.params.get("performance_hint", "LATENCY")).upper()
    if hint not in _HINTS:
        raise ValueError(f"performance_hint must be one of {', '.join(_HINTS)}, got {hint!r}")
    core = ov.Core()
    model = core.read_model(request.onnx_path)
    model.reshape({port.get_any_name(): ov.PartialShape(list(inputs[port.get_any_name()].shape))
                   for port in model.inputs})
    config: dict[str, Any] = {"PERFORMANCE_HINT": hint,
                              "INFERENCE_PRECISION_HINT": _PRECISION.get(request.precision, "f32")}
    if request.threads:
        config["INFERENCE_NUM_THREADS"] = int(request.threads)
    device = "GPU" if request.device == "gpu" else "CPU"
    compiled = core.compile_model(model, device, config)
    depth = max(1, int(compiled.get_property("OPTIMAL_NUMBER_OF_INFER_REQUESTS")))
    requests = []
    for _ in range(depth):
        infer = compiled.create_infer_request()
        for port in compiled.inputs:
            infer.set_tensor(port, ov.Tensor(np.ascontiguousarray(inputs[port.get_any_name()])))
        requests.append(infer)
    return WaveSession(requests)
