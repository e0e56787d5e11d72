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

:func:`profile` reads the CPU plugin's performance counters; :func:`execution_kernels` maps the executed nodes of the
compiled model's execution graph to the ONNX nodes they cover.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from modak.image.kernels import Kernel, KernelTime, Profile
from modak.image.onnx_nodes import Cover, names_of, resolve, shape_static_nodes
from modak.image.runtimes.base import PROFILE_WARMUP_STEPS, TOLERANCE, Adapter, RunRequest, relative_error

if TYPE_CHECKING:
    import numpy as np
    import onnx

_PRECISION = {"bf16": "bf16", "fp16": "f16"}
_HINTS = ("LATENCY", "THROUGHPUT")
# A multi-stream compile counts as wrong when its outputs differ from a one-stream compile's by more than a tenth
# of the precision's tolerance (fp32: 1e-4; compiles that agree differ by ~1e-6, the wrong ones by 9e-4 or more).
# With one compile in five wrong, eight attempts all wrong is about one start in 400,000.
COMPILE_ATTEMPTS = 8
# Layer types of the nodes OpenVINO inserts to convert layouts and precisions (an ONNX Cast it runs as a Convert
# keeps the Cast's name): kernels of class data_movement that cover no ONNX node.
CONVERSIONS = frozenset({"Reorder", "Convert"})


class WaveSession:
    """Infer requests of ``compiled`` started together and waited for together, one batch of ``batch_size`` each."""

    def __init__(self, compiled: Any, requests: list[Any], batch_size: int) -> None:
        self.compiled = compiled
        self.requests = requests
        self.batch_size = batch_size
        self.batches_per_step = len(requests)
        self.runs = [0] * len(requests)  # inferences each request ran (profiling reads counters averaged over them)

    def run(self, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        """One wave over ``feeds``: k batches (k <= ``batches_per_step``) on the first k requests."""
        import numpy as np
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
            self.runs[index] += 1
        for request in used:
            request.wait()
        count = len(used[0].model_outputs)
        return [np.concatenate([np.array(r.get_output_tensor(i).data) for r in used]) for i in range(count)]


def prepare(request: RunRequest, inputs: dict[str, np.ndarray]) -> WaveSession:
    """The candidate's compiled model and its wave of infer requests."""
    return _prepare(request, inputs, {})


def _prepare(request: RunRequest, inputs: dict[str, np.ndarray], extra: dict[str, Any]) -> WaveSession:
    """:func:`prepare` with ``extra`` plugin properties besides the candidate's (profiling's ``PERF_COUNT``)."""
    import numpy as np
    import openvino as ov

    core = ov.Core()
    model = read_model(core, request, {name: feed.shape for name, feed in inputs.items()})
    config = {**compile_config(request), **extra}
    device = "GPU" if request.device == "gpu" else "CPU"

    def compile_session(overrides: dict[str, Any]) -> WaveSession:
        compiled = core.compile_model(model, device, {**config, **overrides})
        depth = max(1, int(compiled.get_property("OPTIMAL_NUMBER_OF_INFER_REQUESTS")))
        return WaveSession(compiled, [compiled.create_infer_request() for _ in range(depth)], request.batch_size)

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


def read_model(core: Any, request: RunRequest, input_shapes: Mapping[str, tuple[int, ...]]) -> Any:
    """The request's ONNX graph read by ``core``, reshaped to ``input_shapes`` (the batch included)."""
    import openvino as ov

    model = core.read_model(request.onnx_path)
    model.reshape({port.get_any_name(): ov.PartialShape(list(input_shapes[port.get_any_name()]))
                   for port in model.inputs})
    return model


def compile_config(request: RunRequest) -> dict[str, Any]:
    """The plugin properties of the candidate (its performance hint, precision and threads)."""
    hint = str(request.params.get("performance_hint", "LATENCY")).upper()
    if hint not in _HINTS:
        raise ValueError(f"performance_hint must be one of {', '.join(_HINTS)}, got {hint!r}")
    config: dict[str, Any] = {"PERFORMANCE_HINT": hint,
                              "INFERENCE_PRECISION_HINT": _PRECISION.get(request.precision, "f32")}
    if request.threads:
        config["INFERENCE_NUM_THREADS"] = int(request.threads)
    return config


def planned_kernels(request: RunRequest, input_shapes: Mapping[str, tuple[int, ...]]) -> tuple[Kernel, ...]:
    """The kernels the CPU plugin would run for the request on inputs of ``input_shapes`` (the batch included):
    those :func:`profile` reports (:func:`execution_kernels`), from a compile alone."""
    import onnx
    import openvino as ov

    core = ov.Core()
    compiled = core.compile_model(read_model(core, request, input_shapes), "CPU", compile_config(request))
    graph = onnx.load(request.onnx_path, load_external_data=False).graph
    return tuple(kernel for _, kernel in execution_kernels(compiled.get_runtime_model(), graph))


def profile(request: RunRequest, inputs: dict[str, np.ndarray], steps: int) -> Profile:
    """Per-kernel times of one step, from the CPU plugin's performance counters (``PERF_COUNT``) of the session
    :func:`prepare` makes: warm-up, then ``steps`` profiled waves. A kernel is an executed node of the compiled
    model's execution graph (:func:`execution_kernels`).

    The plugin reports each node's mean over all inferences of a request's graph so far, in whole microseconds: a
    kernel's time is the growth of its total over the profiled waves (mean x inferences, after minus before) per
    wave, averaged over the wave's infer requests and divided by the batches a wave runs (as the step time is)."""
    import numpy as np
    import onnx

    session = _prepare(request, inputs, {"PERF_COUNT": True})
    feeds = {name: np.concatenate([batch] * session.batches_per_step) for name, batch in inputs.items()}
    for _ in range(PROFILE_WARMUP_STEPS):
        session.run(feeds)
    before = [(runs, _counters(r)) for runs, r in zip(session.runs, session.requests)]
    walls: list[float] = []
    for _ in range(steps):
        start = time.perf_counter()
        session.run(feeds)
        walls.append((time.perf_counter() - start) / session.batches_per_step)
    per_step: dict[str, float] = {}
    for (runs_before, old), runs, infer_request in zip(before, session.runs, session.requests):
        for name, mean in _counters(infer_request).items():
            grown = max(0.0, mean * runs - old.get(name, 0.0) * runs_before) / steps
            per_step[name] = per_step.get(name, 0.0) + grown / len(session.requests) / session.batches_per_step
    graph = onnx.load(request.onnx_path, load_external_data=False).graph
    kernels = execution_kernels(session.compiled.get_runtime_model(), graph)
    times = tuple(KernelTime(kernel, per_step.get(name, 0.0)) for name, kernel in kernels)
    notes: tuple[str, ...] = ("OpenVINO counts whole microseconds: a kernel shorter than one may count as 0",)
    if session.batches_per_step > 1:
        notes += (f"{session.batches_per_step} streams: a kernel's time is its mean over the streams' infer "
                  f"requests, divided by {session.batches_per_step}",)
    return Profile(source="openvino-counters", steps=steps, step_seconds=statistics.median(walls), kernels=times,
                   notes=notes)


def _counters(infer_request: Any) -> dict[str, float]:
    """An infer request's performance counters: node name -> mean seconds per inference so far."""
    return {c.node_name: c.real_time.total_seconds() for c in infer_request.get_profiling_info()}


def execution_kernels(runtime_model: Any, graph: onnx.GraphProto) -> tuple[tuple[str, Kernel], ...]:
    """The executed nodes of a compiled model's execution graph (``get_runtime_model()``), by their name there, as
    kernels of ``graph`` (the ONNX graph it was read from): kind ``<layerType>:<primitiveType>`` (``Convolution:
    brgconv_avx512_f32``), input shapes, output layouts and runtime precision as attributes.

    ``originalLayersNames`` names the layers a node fused, as OpenVINO named them: an ONNX node's name, an output
    tensor's name where the node has none, those with ``/part`` suffixes for a decomposed node, or a name of
    OpenVINO's own for a node its transformations rewrote (the ``Multiply_N`` of a Conv+BatchNorm fusion). It
    leaves some fused layers out (a MatMul+Add FullyConnected is named after the Add). The names that resolve to
    ONNX nodes seed an executed node's kernel, which then absorbs the unclaimed ONNX nodes upstream
    (:class:`modak.image.onnx_nodes.Cover`): the Conv that the fusion renamed, the MatMul left unnamed. A node that is
    not executed (a Reshape done in place, a constant) keeps the ONNX nodes of its own exact names from being
    absorbed. Nodes that name nothing cover no ONNX node: the reorders OpenVINO inserts (:data:`CONVERSIONS`), and
    some parts of a decomposed node (the MVN of a LayerNormalization, whose scale and shift carry its name).
    Whether a node is executed comes from the compile alone (:func:`_executed`; nodes that compute constants are
    not), so that a plan reports the kernels a profile does. The graph is compiled at the request's static shapes,
    so the ONNX nodes whose results the shapes fix (:func:`modak.image.onnx_nodes.shape_static_nodes`:
    DETR's first decoder layer, on its learned queries) are computed when compiling, where no layer names them:
    they are claimed first, so that no kernel absorbs them."""
    by_name = names_of(graph)
    cover = Cover(graph)
    cover.claim(shape_static_nodes(graph))
    layers = []
    constant: set[str] = set()  # the nodes that compute constants (once, when compiling)
    for op in runtime_model.get_ordered_ops():
        info = op.get_rt_info()
        sources = [value.get_node().get_friendly_name() for value in op.input_values()]
        if info["layerType"].astype(str) == "Const" or (sources and all(s in constant for s in sources)):
            constant.add(op.get_friendly_name())
        executed = _executed(info) and op.get_friendly_name() not in constant
        names = [n for n in info["originalLayersNames"].astype(str).split(",") if n]
        seeds = {node for node in (resolve(n, by_name) if executed else by_name.get(n) for n in names) if node}
        cover.claim(seeds)
        if executed:
            layers.append((op, info, seeds))
    kernels = []
    for op, info, seeds in layers:
        shapes = tuple(tuple(d.get_length() if d.is_static else -1 for d in port.get_partial_shape())
                       for port in op.inputs())
        attributes = json.dumps({"output_layouts": info["outputLayouts"].astype(str),
                                 "runtime_precision": info["runtimePrecision"].astype(str)}, sort_keys=True)
        layer = info["layerType"].astype(str)
        nodes = cover.absorb(seeds) if seeds else ()
        kernels.append((op.get_friendly_name(), Kernel(
            kind=f"{layer}:{info['primitiveType'].astype(str)}",
            op="data_movement" if not nodes and layer in CONVERSIONS else "", nodes=nodes, shapes=shapes,
            attributes=attributes)))
    return tuple(kernels)


def _executed(info: Any) -> bool:
    """Whether a node of the execution graph runs a kernel in each inference, from what compiling says (its
    performance counter's ``not_executed`` needs a run): not a graph input or output, and a primitive of its own
    (an in-place Reshape's is ``unknown``)."""
    return info["layerType"].astype(str) not in ("Input", "Output") and not info[
        "primitiveType"].astype(str).startswith("unknown")


def gemm(n: int, threads: int, precision: str) -> Callable[[], Any]:
    """OpenVINO's MatMul on the CPU plugin, its inference precision hinted."""
    import numpy as np
    import openvino
    from openvino import opset13

    a, b = (opset13.parameter([n, n], openvino.Type.f32) for _ in range(2))
    model = openvino.Model([opset13.matmul(a, b, False, False)], [a, b])
    compiled = openvino.Core().compile_model(model, "CPU", {
        "INFERENCE_NUM_THREADS": threads, "INFERENCE_PRECISION_HINT": "bf16" if precision == "bf16" else "f32",
        "PERFORMANCE_HINT": "LATENCY"})
    request = compiled.create_infer_request()
    inputs = [np.random.default_rng(0).standard_normal((n, n), dtype=np.float32) for _ in range(2)]
    return lambda: request.infer(inputs)


class OpenVino(Adapter):
    name = "openvino"
    framework = "openvino"
    packages = ("openvino",)
    kernels = "onnx"  # its runtime model (planned_kernels)
    run_settings = ("threads",)
    profiles_as_planned = True
    cut_graphs = True
    gemm_precisions = ("fp32", "bf16")
    prepare = staticmethod(prepare)
    profile = staticmethod(profile)
    planned_kernels = staticmethod(planned_kernels)
    gemm = staticmethod(gemm)
