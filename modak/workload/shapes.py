"""The shapes ONNX shape inference leaves unknown, filled in for :func:`modak.workload.analysis.analyze`.

Each step fills only what the steps before it left unknown:

1. ``symbolic``: ONNX Runtime's symbolic shape inference (``auto_merge``) on the skeleton (fixed input shapes),
   where onnxruntime is installed;
2. ``run``: one run of the graph in ONNX Runtime at the analysed batch, every unknown tensor a graph output, in a
   child process (:mod:`modak.workload.shapes_child`) within :data:`~modak.limits.SHAPE_RUN_SECONDS` and
   :data:`~modak.limits.SHAPE_RUN_MEMORY_BYTES`. Inline weights keep their values; the graph's inputs and the
   weights held as external data are random in [0, 1) where floating-point, zeros otherwise (valid indices);
3. ``guessed``: in graph order, each tensor still unknown is as large as the largest tensor of its node already
   sized (else the graph's largest input), in the dimensions ONNX left unknown.

A graph that strict ONNX shape inference finds contradicting itself is an :class:`InputError` before any of them.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Any

from modak.errors import InputError, short_reason
from modak.limits import SHAPE_RUN_MEMORY_BYTES, SHAPE_RUN_SECONDS

if TYPE_CHECKING:
    import onnx

Dims = tuple[int, ...]
Partial = tuple[int | None, ...] | None  # dimensions, None where unknown; None: the rank too
TensorType = tuple[int, Partial]  # onnx.TensorProto element type (0: unknown), dimensions
_CHILD = "modak.workload.shapes_child"


class ShapeSource(str, Enum):
    """Where a shape came from, surest first."""

    onnx = "onnx"
    symbolic = "symbolic"
    run = "run"
    guessed = "guessed"


@dataclass(frozen=True)
class FilledShapes:
    """Every tensor's element type and dimensions, and the source of each that ONNX shape inference did not give."""

    types: Mapping[str, tuple[int, Dims]]
    sources: Mapping[str, ShapeSource]

    def source(self, tensors: Sequence[str]) -> ShapeSource:
        """The least sure source of the shapes of ``tensors``."""
        order = list(ShapeSource)
        return max((self.sources.get(t, ShapeSource.onnx) for t in tensors), key=order.index,
                   default=ShapeSource.onnx)


def complete(dims: Partial) -> Dims | None:
    """``dims`` where every dimension is known, else None."""
    return None if dims is None or None in dims else tuple(d for d in dims if d is not None)


def value_types(graph: onnx.GraphProto) -> dict[str, TensorType]:
    """The element type and (partial) dimensions of every tensor ``graph`` declares: inputs, value_info, outputs."""
    types: dict[str, TensorType] = {}
    for vi in (*graph.input, *graph.value_info, *graph.output):
        tensor_type = vi.type.tensor_type
        dims = tuple(d.dim_value if d.HasField("dim_value") else None for d in tensor_type.shape.dim) \
            if tensor_type.HasField("shape") else None
        types[vi.name] = (tensor_type.elem_type, dims)
    return types


def fill(model: onnx.ModelProto, skeleton: onnx.ModelProto, inferred: Mapping[str, TensorType],
         costed: Sequence[Sequence[str]]) -> FilledShapes:
    """The types of ``inferred`` (ONNX shape inference's on ``skeleton``, the skeleton of ``model``) with the tensors
    each node of ``model`` is costed at (``costed``, per node in graph order) filled in."""
    types = {name: (elem, dims) for name, (elem, partial) in inferred.items()
             if elem and (dims := complete(partial)) is not None}
    unknown = list(dict.fromkeys(t for tensors in costed for t in tensors if t not in types))
    sources: dict[str, ShapeSource] = {}
    if not unknown:
        return FilledShapes(types, sources)
    contradiction = _strict_reason(skeleton)
    if contradiction:
        raise InputError(f"ONNX shape inference failed: {contradiction}")
    for source in (ShapeSource.symbolic, ShapeSource.run):
        found = _symbolic(skeleton, unknown) if source is ShapeSource.symbolic else _run(model, skeleton, unknown)
        for name in unknown:
            if name in found:
                types[name], sources[name] = found[name], source
        unknown = [t for t in unknown if t not in types]
        if not unknown:
            return FilledShapes(types, sources)
    weights = {t.name for t in model.graph.initializer}
    largest_input = max((math.prod(types[vi.name][1]) for vi in model.graph.input
                         if vi.name not in weights and vi.name in types), default=1)
    for tensors, node in zip(costed, model.graph.node):
        sized = [math.prod(types[t][1]) for t in (*node.input, *node.output) if t in types]
        elements = max(sized, default=largest_input)
        for name in tensors:
            if name not in types:
                elem, partial = inferred.get(name, (0, None))
                types[name], sources[name] = (elem, _sized(partial, elements)), ShapeSource.guessed
    return FilledShapes(types, sources)


def _sized(partial: Partial, elements: int) -> Dims:
    """``partial`` with its unknown dimensions holding ``elements`` elements in all (the first of them the rest,
    the others 1); a rank unknown: one dimension."""
    if partial is None:
        return (elements,)
    if None not in partial:  # known, but not its element type
        return tuple(d for d in partial if d is not None)
    known = math.prod(d for d in partial if d is not None)
    rest = max(1, -(-elements // known)) if known else 1
    first = partial.index(None)
    return tuple(d if d is not None else (rest if i == first else 1) for i, d in enumerate(partial))


def _strict_reason(skeleton: onnx.ModelProto) -> str:
    """Why strict ONNX shape inference refuses ``skeleton`` (the graph contradicts itself), or empty."""
    import onnx

    try:
        onnx.shape_inference.infer_shapes(skeleton, check_type=True, strict_mode=True, data_prop=True)
    except Exception as exc:
        return short_reason(exc)
    return ""


def _symbolic(skeleton: onnx.ModelProto, wanted: Sequence[str]) -> dict[str, tuple[int, Dims]]:
    """The types ONNX Runtime's symbolic shape inference fixes (none without onnxruntime, or where it fails).

    Its steps are called one by one: ``SymbolicShapeInference.infer_shapes`` writes the model into the working
    folder when some shape stays unknown."""
    inference_class = _symbolic_inference()
    if inference_class is None:
        return {}
    try:
        inference = inference_class(int_max=2**31 - 1, auto_merge=True, guess_output_rank=False, verbose=0)
        inference._preprocess(skeleton)
        while inference.run_:
            inference._infer_impl()
        inference._update_output_from_vi()
        graph = inference.out_mp_.graph
    except Exception:  # an op it cannot infer, an assertion of its own, another onnxruntime's internals
        return {}
    names = set(wanted)
    return {name: (elem, dims) for name, (elem, partial) in value_types(graph).items()
            if name in names and elem and (dims := complete(partial)) is not None}


@functools.cache
def _symbolic_inference() -> Any:
    """ONNX Runtime's ``SymbolicShapeInference`` (None without onnxruntime), its module loaded from its file: the
    package ``onnxruntime.tools`` imports torch where torch is installed (seconds), which the module does not need."""
    spec = importlib.util.find_spec("onnxruntime")
    if spec is None or spec.origin is None:
        return None
    path = Path(spec.origin).with_name("tools") / "symbolic_shape_infer.py"
    module_spec = importlib.util.spec_from_file_location("modak_symbolic_shape_infer", path)
    if module_spec is None or module_spec.loader is None:
        return None
    module = importlib.util.module_from_spec(module_spec)
    try:
        module_spec.loader.exec_module(module)
    except (ImportError, OSError):  # no sympy; another onnxruntime's layout
        return None
    return getattr(module, "SymbolicShapeInference", None)


def _run(model: onnx.ModelProto, skeleton: onnx.ModelProto, wanted: Sequence[str]) -> dict[str, tuple[int, Dims]]:
    """The types of the ``wanted`` tensors in one run of the graph in ONNX Runtime, in a child process within
    :data:`SHAPE_RUN_SECONDS` and :data:`SHAPE_RUN_MEMORY_BYTES` (none without onnxruntime, or where it fails)."""
    import onnx

    if importlib.util.find_spec("onnxruntime") is None:
        return {}
    with tempfile.TemporaryDirectory(prefix="modak-shapes-") as name:
        folder = Path(name)
        run = _run_model(model, skeleton, wanted)
        try:
            onnx.save_model(run, folder / "model.onnx")
        except (ValueError, OSError):  # protobuf's 2 GiB, a full disk
            return {}
        inputs = {vi.name: [vi.type.tensor_type.elem_type, [d.dim_value for d in vi.type.tensor_type.shape.dim]]
                  for vi in run.graph.input}
        (folder / "request.json").write_text(json.dumps({"inputs": inputs, "memory_bytes": SHAPE_RUN_MEMORY_BYTES}))
        package_parent = str(Path(__file__).resolve().parents[2])  # modak itself, for ``-m``
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (package_parent, os.environ.get("PYTHONPATH"))
                                                           if p)}
        child = subprocess.Popen([sys.executable, "-m", _CHILD, str(folder)], stdin=subprocess.DEVNULL,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, start_new_session=True)
        try:
            child.wait(timeout=SHAPE_RUN_SECONDS)
        except subprocess.TimeoutExpired:
            _kill(child)
            return {}
        except BaseException:  # Ctrl-C: the child and what it started end with the analysis
            _kill(child)
            raise
        try:
            found = json.loads((folder / "result.json").read_text())
        except (OSError, ValueError):  # the child crashed or ran out of memory before it wrote its result
            return {}
    return {name: (elem, tuple(dims)) for name, (elem, dims) in found.items() if elem}


def _kill(child: subprocess.Popen[bytes]) -> None:
    os.killpg(child.pid, signal.SIGKILL)
    child.wait()


def _run_model(model: onnx.ModelProto, skeleton: onnx.ModelProto, outputs: Sequence[str]) -> onnx.ModelProto:
    """``skeleton`` with the ``outputs`` as its outputs and ``model``'s weights that hold their data inline as
    initializers again (the others stay inputs)."""
    import onnx

    inline = {t.name: t for t in model.graph.initializer if t.data_location != onnx.TensorProto.EXTERNAL}
    run = onnx.ModelProto()
    run.CopyFrom(skeleton)
    inputs = [vi for vi in run.graph.input if vi.name not in inline]
    run.graph.initializer.extend(inline[vi.name] for vi in run.graph.input if vi.name in inline)
    del run.graph.input[:]
    run.graph.input.extend(inputs)
    del run.graph.output[:]
    run.graph.output.extend(onnx.ValueInfoProto(name=name) for name in outputs)
    return run
