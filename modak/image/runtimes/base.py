"""The interface every runtime/graph compiler module implements.

A module ``modak.image.runtimes.<name>`` (the recipe name with ``-`` as ``_``) exposes ``prepare(request,
inputs) -> Session``. ``prepare`` does everything that is paid once (load, compile, tune) for inputs shaped like
``inputs`` (one batch of the request's size); ``Session.run(feeds)`` is one steady-state step on ``feeds``: input
name -> array of ``batch_size * batches_per_step`` samples (``batches_per_step`` is 1 unless a session says
otherwise, as OpenVINO's throughput streams do). :mod:`modak.runtime` puts a user's batches in that shape, padding
a partial batch unless the session says ``open_batch`` and one sample gives the full batch's answer for it.
Parameters and container requirements live in the runtime's recipe (``recipes/runtimes/<name>.yaml``), which the
host reads; this package never does.

A module whose runs leave something a later run reuses (TVM's tuning databases) also exposes
``artifacts(workdir, model_stem, batch_size, image_model_stem) -> dict[str, Path]``: what an earlier run in
``workdir`` (a request's ``workdir``) left for this model and batch, as path relative to the image's work folder
-> host path, named for the image's runner, whose model stem is ``image_model_stem`` (a model's stem is its zoo
name, else its ONNX file's stem). ``modak build`` copies them into the image. :func:`reusable_artifacts` is
``{}`` for the runtimes without it.

A module that can say where a step's time goes also exposes ``profile(request, inputs, steps) ->
modak.image.kernels.Profile``: the candidate prepared as ``prepare`` does, warmed up, then ``steps`` profiled steps,
reported as per-kernel times of one step (:func:`load_profiler`; ``modak measure --profile``).
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from modak.image.kernels import Profile

# Largest error tolerated before a runtime's output counts as wrong, relative to the reference's largest
# magnitude: fp32 leaves room for reassociation, reduced precisions for their mantissas.
TOLERANCE = {"fp32": 1e-3, "tf32": 1e-2, "bf16": 6e-2, "fp16": 3e-2, "int8": 1e-1}
PROFILE_WARMUP_STEPS = 3  # steps a runtime's ``profile`` runs before its profiled ones


@dataclass(frozen=True)
class RunRequest:
    """Everything a runtime needs to build and run one candidate (JSON-serializable)."""

    runtime: str
    device: str
    precision: str
    params: dict[str, Any]
    threads: int | None
    task: str
    onnx_path: str
    zoo: str | None
    batch_size: int
    input_shapes: dict[str, list[int]]
    workdir: str
    seed: int = 0
    extra: dict[str, Any] = field(default_factory=dict)
    pytorch: dict[str, Any] | None = None  # the user's own model (Deployment.pytorch), beside onnx_path
    loss: str | None = None  # the training step's loss (Deployment.loss)

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> RunRequest:
        return cls(**json.loads(text))


class Session(Protocol):
    """A prepared model. ``run`` performs one step on ``feeds`` and returns its outputs in the ONNX graph's order
    (training: ``[loss]``)."""

    def run(self, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]: ...


class Runtime(Protocol):
    def prepare(self, request: RunRequest, inputs: dict[str, np.ndarray]) -> Session: ...


def load_runtime(name: str) -> Runtime:
    """The module implementing runtime ``name``."""
    return importlib.import_module(f"modak.image.runtimes.{name.replace('-', '_')}")  # type: ignore[return-value]


Profiler = Callable[[RunRequest, dict[str, np.ndarray], int], Profile]


def load_profiler(name: str) -> Profiler | None:
    """Runtime ``name``'s ``profile`` (see the module docstring), or None where it reports no profile."""
    return getattr(load_runtime(name), "profile", None)


def reusable_artifacts(name: str, workdir: Path, model_stem: str, batch_size: int,
                       image_model_stem: str) -> dict[str, Path]:
    """Runtime ``name``'s ``artifacts`` (see the module docstring); ``{}`` when it declares none."""
    artifacts = getattr(load_runtime(name), "artifacts", None)
    return dict(artifacts(workdir, model_stem, batch_size, image_model_stem)) if artifacts else {}


def relative_error(output: list[np.ndarray], reference: list[np.ndarray]) -> float:
    """Largest absolute difference over all outputs, relative to the reference's largest magnitude."""
    if len(output) != len(reference):
        return float("inf")
    worst = 0.0
    for out, ref in zip(output, reference):
        out = np.asarray(out, dtype=np.float64)
        ref = np.asarray(ref, dtype=np.float64)
        if out.shape != ref.shape or not np.all(np.isfinite(out)):
            return float("inf")
        scale = max(float(np.max(np.abs(ref))) if ref.size else 0.0, 1e-6)
        worst = max(worst, float(np.max(np.abs(out - ref))) / scale if ref.size else 0.0)
    return worst


def loss_targets(loss: str, output_shape: tuple[int, ...], seed: int) -> np.ndarray:
    """The seeded targets of built-in training loss ``loss`` for a first output of ``output_shape`` (the same in
    every runtime): class labels over its last dimension for cross_entropy, values shaped like it for mse."""
    rng = np.random.default_rng(seed + 1)
    if loss == "cross_entropy":
        return rng.integers(0, output_shape[-1], size=output_shape[:-1]).astype(np.int64)
    return rng.standard_normal(output_shape).astype(np.float32)


def has_graph(request: RunRequest) -> bool:
    """Whether the request has an ONNX graph: all but the user's own model that no exporter could export (whose
    PyTorch runtimes build it from the files beside where the graph would be)."""
    return request.pytorch is None or Path(request.onnx_path).is_file()


def make_inputs(request: RunRequest) -> dict[str, np.ndarray]:
    """Deterministic inputs for the request's ONNX graph: random floats, in-range integer ids (without a graph:
    floats of the request's input shapes)."""
    import onnx

    rng = np.random.default_rng(request.seed)
    bounds = _index_bounds(request)
    if not has_graph(request):
        return {name: rng.integers(0, bounds[name], size=[request.batch_size, *shape]).astype(np.int64)
                if name in bounds else rng.standard_normal([request.batch_size, *shape]).astype(np.float32)
                for name, shape in request.input_shapes.items()}
    model = onnx.load(request.onnx_path, load_external_data=False)
    initializers = {i.name for i in model.graph.initializer}
    inputs: dict[str, np.ndarray] = {}
    for value in model.graph.input:
        if value.name in initializers:
            continue
        shape = [request.batch_size, *request.input_shapes[value.name]]
        elem = value.type.tensor_type.elem_type
        if elem in (onnx.TensorProto.INT64, onnx.TensorProto.INT32):
            high = bounds.get(value.name, int(request.extra.get("int_input_high", 100)))
            dtype = np.int64 if elem == onnx.TensorProto.INT64 else np.int32
            inputs[value.name] = rng.integers(0, high, size=shape).astype(dtype)
        else:
            inputs[value.name] = rng.standard_normal(shape).astype(np.float32)
    return inputs


def _index_bounds(request: RunRequest) -> dict[str, int]:
    """Exclusive upper bounds of the model's integer inputs (token ids, embedding rows): the zoo's, or the user's
    (``model.input_high``, carried as ``input_types``)."""
    if request.pytorch is not None:
        return {name: int(high) for name, (_, high) in request.pytorch.get("input_types", {}).items()}
    if request.zoo is None:
        return {}
    from modak.image.zoo import get_entry

    return dict(get_entry(request.zoo).index_bounds or {})


@dataclass(frozen=True)
class FunctionSession:
    """A session whose step is a plain function (most runtimes need nothing more); ``open_batch``: the graph it
    runs leaves the batch dimension open, so a step may take fewer samples (:func:`modak.runtime.load` checks)."""

    step: Callable[[Mapping[str, np.ndarray]], list[np.ndarray]]
    open_batch: bool = False

    def run(self, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        return self.step(feeds)
