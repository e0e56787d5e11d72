"""The image's runtime API: the model in the image, deployed as the plan decided.

    import modak.runtime

    model = modak.runtime.load()                  # plan, model file and threads of this image and allocation
    outputs = model.run({"input": batch})         # input name -> array with a leading batch dimension
    model.inputs, model.outputs                   # names, per-sample shapes and dtypes (from the ONNX graph)

:func:`load` prepares the plan's runtime with the plan's parameters through the same code that ``modak bench``
timed and the build's smoke test ran (:func:`modak.image.runtimes.base.adapter`), with the threads of the real
allocation (set by the image's entrypoint, :mod:`modak.image.launch`). A session runs batches of exactly the
plan's batch size (times the runtime's ``batches_per_step``): :meth:`Model.run` cuts larger inputs into such
batches and pads the last one, so any number of samples runs at the shape that was measured; a partial batch runs
as it is where :func:`load` found that it can (``any_batch``: a session whose graph leaves the batch open, as ONNX
Runtime's may, and whose one-sample step gives the full batch's first answer).

The image's commands (``modak serve``, ``modak run``, ``modak self-test``, ``modak measure``) are
:mod:`modak.runtime.cli`; the training helper for a user's own PyTorch loop is :mod:`modak.runtime.torch`.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from modak.image.deployment import (
    MODEL_VARIABLE,
    PLAN_VARIABLE,
    PRELOAD,
    WORKDIR_VARIABLE,
    Deployment,
    environment,
    location,
    read_deployment,
)
from modak.image.functions import FunctionOutput
from modak.image.processing import Preprocessor, load_postprocessor, load_preprocessor, sample_items
from modak.image.runtimes.base import (
    TOLERANCE,
    RunRequest,
    Session,
    adapter,
    has_graph,
    make_inputs,
    relative_error,
)

__all__ = ["FeedError", "Model", "TensorSpec", "load", "request_from_environment"]


class FeedError(ValueError):
    """Feeds (arrays by input name) that do not fit the model's inputs (names, shapes, dtypes): the caller's
    mistake, with what was expected. Not :class:`modak.errors.InputError`, a located error in a file modak reads."""


@dataclass(frozen=True)
class TensorSpec:
    """One input or output of the model: name, shape of one sample (-1 where the graph leaves a dimension open)
    and NumPy dtype name."""

    name: str
    shape: tuple[int, ...]
    dtype: str


@dataclass(frozen=True)
class Model:
    """A prepared session of the plan's runtime for the image's model."""

    deployment: Deployment
    request: RunRequest
    session: Session
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    sample_batch: Mapping[str, np.ndarray]  # the deterministic batch it was prepared with (one batch_size)
    prepare_seconds: float = 0.0
    any_batch: bool = False  # a partial batch runs unpadded (:func:`runs_partial_batches`)
    # The job's pre-processing (tokenizer, image processor or the user's function): the model also takes raw
    # items then, as the BYTES input it names (modak.image.processing); and the user's post-processing of them.
    preprocessor: Preprocessor | None = None
    postprocessor: FunctionOutput | None = None

    def encode(self, items: Sequence[bytes | str]) -> dict[str, np.ndarray]:
        """The model's inputs for raw ``items`` (texts, encoded images...) through the job's pre-processing;
        FeedError without one, or where an item does not fit."""
        if self.preprocessor is None:
            raise FeedError("this model has no pre-processing (model.tokenizer, model.image_processor, "
                            "model.preprocess): send its inputs as tensors")
        try:
            return self.check(self.preprocessor.encode(items, {s.name: np.dtype(s.dtype) for s in self.inputs}))
        except ValueError as exc:
            raise FeedError(str(exc)) from None

    def sample_items(self) -> list[bytes | str]:
        """Raw items its pre-processing takes (:func:`modak.image.processing.sample_items`); none without it."""
        return sample_items(self.deployment, Path(self.request.onnx_path).parent)

    def postprocess(self, outputs: Mapping[str, np.ndarray], samples: int) -> dict[str, np.ndarray]:
        """What the user's post-processing makes of ``outputs`` of raw items; the outputs themselves without
        one. FeedError says what it returned that does not fit."""
        if self.postprocessor is None:
            return dict(outputs)
        try:
            return self.postprocessor.decode(outputs, samples)
        except ValueError as exc:
            raise FeedError(str(exc)) from None

    @property
    def batch_size(self) -> int:
        """Samples in one batch of the session (the plan's batch size)."""
        return self.request.batch_size

    @property
    def batches_per_step(self) -> int:
        """Batches one step of the session runs together (OpenVINO's throughput streams; else 1)."""
        return int(getattr(self.session, "batches_per_step", 1))

    @property
    def capacity(self) -> int:
        """The most samples one step runs: ``batch_size * batches_per_step``."""
        return self.batch_size * self.batches_per_step

    def check(self, feeds: Mapping[str, object]) -> dict[str, np.ndarray]:
        """``feeds`` as arrays of the model's dtypes, all with the same number of samples; :class:`FeedError`
        names what does not fit."""
        expected = {spec.name: spec for spec in self.inputs}
        missing, unknown = sorted(set(expected) - set(feeds)), sorted(set(feeds) - set(expected))
        if missing or unknown:
            raise FeedError(f"the model's inputs are {', '.join(expected)}"
                            + (f"; missing {', '.join(missing)}" if missing else "")
                            + (f"; unknown {', '.join(unknown)}" if unknown else ""))
        arrays: dict[str, np.ndarray] = {}
        for name, spec in expected.items():
            array = np.asarray(feeds[name])
            if not np.can_cast(array.dtype, spec.dtype, "same_kind"):
                raise FeedError(f"input {name}: dtype {array.dtype} cannot be converted to the model's {spec.dtype}")
            if array.ndim != len(spec.shape) + 1 or any(
                    want not in (-1, got) for want, got in zip(spec.shape, array.shape[1:])):
                raise FeedError(f"input {name}: shape {list(array.shape)} does not fit [batch, "
                                f"{', '.join(map(str, spec.shape))}]")
            arrays[name] = array.astype(spec.dtype, copy=False)
        counts = {len(a) for a in arrays.values()}
        if len(counts) != 1 or 0 in counts:
            raise FeedError(f"every input needs the same number of samples (at least 1); got "
                            f"{ {n: len(a) for n, a in arrays.items()} }")
        return arrays

    def run(self, feeds: Mapping[str, object]) -> dict[str, np.ndarray]:
        """Outputs by name for any number of samples (one step per ``capacity`` samples; the last batch padded
        unless :attr:`any_batch`)."""
        arrays = self.check(feeds)
        samples = len(next(iter(arrays.values())))
        parts: list[list[np.ndarray]] = []
        for start in range(0, samples, self.capacity):
            chunk = {name: a[start:start + self.capacity] for name, a in arrays.items()}
            taken = len(next(iter(chunk.values())))
            padded = -(-taken // self.batch_size) * self.batch_size
            if padded != taken and not self.any_batch:
                chunk = {name: _pad(a, padded) for name, a in chunk.items()}
            parts.append([np.asarray(o)[:taken] for o in self.session.run(chunk)])
        columns = [np.concatenate(outs) if len(parts) > 1 else outs[0] for outs in zip(*parts)]
        return {spec.name: column for spec, column in zip(self.outputs, columns)}

    def step(self, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        """One step of the session on feeds already in its shape (``capacity`` samples): what is timed."""
        return self.session.run(feeds)

    def example_inputs(self) -> dict[str, np.ndarray]:
        """Deterministic inputs of one full step: :attr:`sample_batch` repeated ``batches_per_step`` times."""
        return {name: np.concatenate([a] * self.batches_per_step) for name, a in self.sample_batch.items()}


def load(plan: str | Path | None = None, model: str | Path | None = None) -> Model:
    """The image's model, prepared as its plan says (paths default to ``$MODAK_PLAN``/``$MODAK_MODEL``, else the
    image's own files).

    Started through the image's entrypoint, the allocation's thread settings are already in the environment;
    otherwise they are applied here, before the runtime is imported (a preloaded allocator cannot be: a note on
    stderr says so)."""
    environ = dict(os.environ)
    if plan is not None:
        environ[PLAN_VARIABLE] = str(plan)
    if model is not None:
        environ[MODEL_VARIABLE] = str(model)
    deployment = read_deployment(location(PLAN_VARIABLE, environ))
    if "MODAK_THREADS" not in environ:
        applied = environment(deployment, environ) if PRELOAD not in deployment.env else _without_preload(
            deployment, environ)
        os.environ.update(applied)
        environ.update(applied)
    opened = open_model(request_from_environment(environ), deployment)
    return replace(opened, any_batch=runs_partial_batches(opened))


def runs_partial_batches(model: Model) -> bool:
    """Whether ``model`` can run fewer samples than a batch unpadded: an inference session whose graph leaves the
    batch dimension open (``open_batch``) and whose step on one sample runs and gives the full batch's first answer
    (a graph can still fix the batch inside, in a Reshape, or mix samples)."""
    if model.request.task != "inference" or not getattr(model.session, "open_batch", False) or model.batch_size < 2:
        return False
    full = model.step(model.sample_batch)
    try:
        one = model.step({name: a[:1] for name, a in model.sample_batch.items()})
    except Exception:  # the runtime's own error: the graph wants its whole batch
        return False
    return (all(np.shape(o)[:1] == (1,) for o in one)
            and relative_error(one, [np.asarray(f)[:1] for f in full]) <= TOLERANCE[model.request.precision])


def open_model(request: RunRequest, deployment: Deployment | None = None) -> Model:
    """A :class:`Model` for ``request`` (what :func:`load` and ``modak measure`` both use)."""
    deployment = deployment or _deployment_of(request)
    sample = make_inputs(request)
    start = time.perf_counter()
    session = adapter(request.runtime).prepare(request, sample)
    prepare_s = time.perf_counter() - start
    if has_graph(request):
        inputs, outputs = _graph_specs(request)
    else:  # the user's own model without an ONNX export: the specs of what it takes and gives
        inputs = tuple(TensorSpec(name, tuple(shape), sample[name].dtype.name)
                       for name, shape in request.input_shapes.items())
        outputs = () if request.task == "training" else tuple(  # (a training step would change the weights)
            TensorSpec(f"output_{index}", tuple(o.shape[1:]), o.dtype.name)
            for index, o in enumerate(session.run(sample)))
    if request.task == "training":
        outputs = (TensorSpec("loss", (), "float32"),)
    folder = Path(request.onnx_path).parent
    return Model(deployment, request, session, inputs, outputs, sample, prepare_s,
                 preprocessor=load_preprocessor(deployment, folder, [spec.name for spec in inputs]),
                 postprocessor=load_postprocessor(deployment, folder))


def request_from_environment(environ: Mapping[str, str] = os.environ) -> RunRequest:
    """The run request of the deployment in ``$MODAK_PLAN``: model file, work folder and the threads the launcher
    set (``$MODAK_THREADS``)."""
    deployment = read_deployment(location(PLAN_VARIABLE, environ))
    threads = environ.get("MODAK_THREADS", "")
    return RunRequest(
        runtime=deployment.runtime, device=deployment.device, precision=deployment.precision,
        params=dict(deployment.params), threads=int(threads) if threads.isdigit() else None, task=deployment.task,
        onnx_path=location(MODEL_VARIABLE, environ), zoo=deployment.zoo,
        pytorch=dict(deployment.pytorch) if deployment.pytorch is not None else None, loss=deployment.loss,
        batch_size=deployment.batch_size, input_shapes={k: list(v) for k, v in deployment.input_shapes.items()},
        workdir=location(WORKDIR_VARIABLE, environ))


def _deployment_of(request: RunRequest) -> Deployment:
    return Deployment(runtime=request.runtime, device=request.device, precision=request.precision,
                      task=request.task, params=dict(request.params), env={}, batch_size=request.batch_size,
                      input_shapes=dict(request.input_shapes), zoo=request.zoo, pytorch=request.pytorch,
                      loss=request.loss)


def _without_preload(deployment: Deployment, environ: Mapping[str, str]) -> dict[str, str]:
    print(f"modak: not started through the image's entrypoint: {deployment.env[PRELOAD]} is not preloaded",
          file=sys.stderr)
    env = dict(deployment.env)
    env.pop(PRELOAD)
    return environment(Deployment(**{**deployment.__dict__, "env": env}), environ)


def _graph_specs(request: RunRequest) -> tuple[tuple[TensorSpec, ...], tuple[TensorSpec, ...]]:
    """Inputs (per-sample shapes from the request) and outputs (from the graph) of the ONNX file."""
    import onnx
    from onnx.helper import tensor_dtype_to_np_dtype

    graph = onnx.load(request.onnx_path, load_external_data=False).graph
    initializers = {i.name for i in graph.initializer}

    def dtype(value: onnx.ValueInfoProto) -> str:
        return np.dtype(tensor_dtype_to_np_dtype(value.type.tensor_type.elem_type)).name

    inputs = tuple(TensorSpec(v.name, tuple(request.input_shapes[v.name]), dtype(v))
                   for v in graph.input if v.name not in initializers)
    outputs = tuple(TensorSpec(v.name, tuple(d.dim_value if d.HasField("dim_value") else -1
                                             for d in v.type.tensor_type.shape.dim[1:]), dtype(v))
                    for v in graph.output)
    return inputs, outputs


def _pad(array: np.ndarray, samples: int) -> np.ndarray:
    """``array`` with its last sample repeated up to ``samples`` samples."""
    return np.concatenate([array, np.repeat(array[-1:], samples - len(array), axis=0)])
