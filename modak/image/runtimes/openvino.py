"""OpenVINO: the ONNX graph reshaped to the request's static batch, compiled for the CPU plugin.

Parameters: ``performance_hint`` (``LATENCY``: one stream, one request at a time; ``THROUGHPUT``: several
streams that each run their own request), ``threads`` (``INFERENCE_NUM_THREADS``). Precision bf16 sets
``INFERENCE_PRECISION_HINT`` to ``bf16`` (else ``f32``, so that a plugin default never lowers fp32 runs).

A step is one "wave": up to the plugin's optimal number of infer requests (``OPTIMAL_NUMBER_OF_INFER_REQUESTS``,
one per stream), each on its own batch of the request's size (consecutive slices of the feeds), started
together and all waited for; the outputs are the requests' outputs concatenated. The session's
``batches_per_step`` says how many batches a full step completes; the time per batch, comparable with every
other runtime's step, is the step time divided by it (whoever times ``run`` must divide, as
``getattr(session, "batches_per_step", 1)``):

- LATENCY: one stream, so one request: a step is one batch, ``batches_per_step == 1``.
- THROUGHPUT: N streams each run their own batch concurrently (the way a server with N requests in flight
  uses the machine): a step is N batches, ``batches_per_step == N``. The latency of one batch is the whole
  step time; the time per batch at full load is the step time / N.

Compilation happens in :func:`prepare`. OpenVINO's CPU plugin (2026.4) sometimes compiles a model wrongly for
several streams: on BERT-small and BERT-base (Ice Lake, 2 streams) one compile in five to ten gave outputs 0.003
to 0.013 off (relative to the largest magnitude) on every stream, for as long as the compiled model lived, while
one-stream compiles of the same models were never off (0 of 80; ViT-Tiny and a wide MLP never, 0 of 40 each). So
a multi-stream compile is checked once against a one-stream compile of the same model on the example batch and
compiled again while they disagree.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from modak.image.runtimes.base import TOLERANCE, RunRequest, relative_error

_PRECISION = {"bf16": "bf16", "fp16": "f16"}
_HINTS = ("LATENCY", "THROUGHPUT")
# A multi-stream compile counts as wrong when its outputs differ from a one-stream compile's by more than a tenth
# of the precision's tolerance (fp32: 1e-4; compiles that agree differ by ~1e-6, the wrong ones by 9e-4 or more).
# With one compile in five wrong, eight attempts all wrong is about one start in 400,000.
COMPILE_ATTEMPTS = 8


class WaveSession:
    """Infer requests started together and waited for together, one batch of ``batch_size`` each."""

    def __init__(self, requests: list[Any], batch_size: int) -> None:
        self.requests = requests
        self.batch_size = batch_size
        self.batches_per_step = len(requests)

    def run(self, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        """One wave over ``feeds``: k batches (k <= ``batches_per_step``) on the first k requests."""
        import openvino as ov

        samples = len(next(iter(feeds.values())))
        used = self.requests[:max(1, -(-samples // self.batch_size))]
        if samples != len(used) * self.batch_size or len(used) > len(self.requests):
            raise ValueError(f"a wave takes a multiple of {self.batch_size} samples, at most "
                             f"{self.batch_size * len(self.requests)}; got {samples}")
        for index, request in enumerate(used):
            part = slice(index * self.batch_size, (index + 1) * self.batch_size)
            for port in request.model_inputs:
                request.set_tensor(port, ov.Tensor(np.ascontiguousarray(feeds[port.get_any_name()][part])))
            request.start_async()
        for request in used:
            request.wait()
        count = len(used[0].model_outputs)
        return [np.concatenate([np.array(r.get_output_tensor(i).data) for r in used]) for i in range(count)]


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

    def compile_session(overrides: dict[str, Any]) -> WaveSession:
        compiled = core.compile_model(model, device, {**config, **overrides})
        depth = max(1, int(compiled.get_property("OPTIMAL_NUMBER_OF_INFER_REQUESTS")))
        return WaveSession([compiled.create_infer_request() for _ in range(depth)], request.batch_size)

    session = compile_session({})
    if session.batches_per_step == 1:
        return session
    streams = session.batches_per_step
    expected = [np.concatenate([output] * streams) for output in compile_session({"NUM_STREAMS": 1}).run(inputs)]
    wave = {name: np.concatenate([batch] * streams) for name, batch in inputs.items()}
    limit = TOLERANCE[request.precision] / 10
    for attempt in range(COMPILE_ATTEMPTS):
        if attempt:
            session = compile_session({})
        error = relative_error(session.run(wave), expected)
        if error <= limit:
            return session
    raise RuntimeError(f"OpenVINO compiled {request.onnx_path} for {streams} streams {COMPILE_ATTEMPTS} times and "
                       f"each compile's outputs differed from a one-stream compile's (the last by {error:.3g}, "
                       f"relative; tolerated {limit:g}): use performance_hint LATENCY")
