"""The kernels a runtime would run for a job's graph, as the runtime itself reports them at plan time (#40 item 2).

Nothing runs the model; modak writes no fusion rule of its own:

* ``onnxruntime``: an InferenceSession with the candidate's session options
  (:func:`modak.image.runtimes.onnxruntime.session_options`) writes its optimized graph
  (``optimized_model_filepath``); one kernel per optimized node, ``kind`` its op type (``FusedConv``, ...; a node
  of another domain than ONNX's, such as ``com.microsoft.nchwc``, says so in its attributes).
* ``openvino``: the CPU plugin compiles the graph at the job's batch with the candidate's precision hint and
  threads; one kernel per node of its runtime model (``kind``: its ``primitiveType``, ``execType`` in older
  releases), less parameters, results and constants (nodes that only compute constants).
* ``pytorch``, ``torch-compile`` (its eager ops): the aten ops of one step (inference, or training: forward,
  loss, backward, optimizer update) run on ``meta`` tensors, with ``torch.utils.flop_counter``'s FLOPs where it
  knows the op and the bytes of their tensors; no ONNX nodes. A zoo model is traced here; the user's own model
  only in a child process (:mod:`modak.workload.kernels_child`).

The ONNX nodes of a kernel (of the original graph, named as :mod:`modak.workload.analysis` names them): the runtime
names some (ONNX Runtime: the producers of the original tensors a node writes, seen through its NCHWc renames and
reorders; OpenVINO: ``originalLayersNames``). A named node's producer that no kernel names and whose output only
that node reads was fused into the same kernel (ONNX Runtime folds a BatchNormalization into its Conv; OpenVINO
renames the Conv it folds one into). A node still uncovered belongs to the last-run kernel covering one of its
producers (an epilogue fused into it, as ONNX Runtime's NCHWc Conv takes the Add and Relu after it). Nodes that
only compute constants are folded by the runtimes and covered by none. A kernel's FLOPs and bytes are the sums of
its nodes' :class:`~modak.workload.analysis.OpStats`, its shapes the original graph's inferred shapes at the job's
batch.

Answers are cached as JSON under ``modak.paths.cache_dir() / "kernels"``, keyed by the model (the ONNX graph's
digest, whose weights do not change what runs; the zoo name; the digests of the user's files), the runtime and its
version, the batch, input shapes, precision, threads, the candidate's parameters, the task and loss, and the code
the answer comes from.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import math
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from modak.errors import ModakError, short_reason
from modak.image.kernels import OP_CLASSES, Kernel
from modak.paths import cache_dir, write_atomic
from modak.workload.analysis import OpStats, analyze, load_model, tensor_shapes

if TYPE_CHECKING:
    import onnx

    from modak.image.runtimes.base import RunRequest
    from modak.spec.loader import LoadedJob

# runtime -> the package whose version the answer depends on
PACKAGES = {"onnxruntime": "onnxruntime", "openvino": "openvino", "pytorch": "torch", "torch-compile": "torch"}
TORCH_RUNTIMES = ("pytorch", "torch-compile")
TRACE = "trace"  # the key of the user model child's request that asks for a trace: batch, params, task, loss
_CHILD = "modak.workload.kernels_child"
# ONNX Runtime's NCHWc transformer names a node after the original tensor it computed when converted + this; the
# add (a "Sum" input after the bias) and "activation" it fuses afterwards come after that tensor
_NCHWC = "_nchwc"
_NCHWC_SUM = 3
_ATTRIBUTE_TYPES = (2, 3, 7, 8)  # INT, STRING, INTS, STRINGS: what a kernel's cost may depend on (not float values)
_OPENVINO_SKIPPED = ("Input", "Output", "Const")  # layer types that run no kernel
# aten op name (substring) -> op class, first match wins; other ops are elementwise
_ATEN_CLASSES = (
    ("convolution", "conv"), ("mm", "matmul"), ("matmul", "matmul"), ("linear", "matmul"),
    ("scaled_dot_product", "matmul"), ("lstm", "recurrent"), ("gru", "recurrent"), ("rnn", "recurrent"),
    ("norm", "normalization"), ("pool", "pooling"), ("view", "data_movement"), ("reshape", "data_movement"),
    ("transpose", "data_movement"), ("permute", "data_movement"), ("expand", "data_movement"),
    ("clone", "data_movement"), ("copy", "data_movement"), ("cat", "data_movement"), ("stack", "data_movement"),
    ("split", "data_movement"), ("unbind", "data_movement"), ("select", "data_movement"),
    ("slice", "data_movement"), ("index", "data_movement"), ("gather", "data_movement"),
    ("embedding", "data_movement"), ("empty", "data_movement"), ("zeros", "data_movement"),
    ("ones", "data_movement"), ("squeeze", "data_movement"), ("flatten", "data_movement"),
)
_ATEN = "aten::"
_ATEN_TRANSPOSE = "aten::t"  # a 2-D transpose, whose name is in too many others to match as a part


class UnreportedGraph(ModakError):
    """The runtime cannot say which kernels it would run for this model (no report for the runtime or the model,
    or the runtime failed to build it): predict without kernels."""


def planned_kernels(runtime: str, onnx_path: Path | None, batch_size: int, input_shapes: Mapping[str, Sequence[int]],
                    precision: str, threads: int, *, params: Mapping[str, Any] | None = None,
                    zoo: str | None = None, user: LoadedJob | None = None, task: str = "inference",
                    loss: str | None = None) -> tuple[Kernel, ...]:
    """The kernels ``runtime`` (on the CPU) would run for one step of ``task`` of the graph at ``onnx_path`` at
    ``batch_size`` (``input_shapes``: per sample, as :func:`modak.workload.analysis.analyze` takes them), at
    ``precision`` and ``threads`` (0: the runtime's default) and the candidate's ``params`` (absent ones: the
    runtime's defaults), in the order the runtime runs them. The PyTorch runtimes trace zoo model ``zoo``, or the
    user's own model of job ``user`` in a child process (:mod:`modak.workload.kernels_child`; ``onnx_path`` is
    then unused, None where no exporter could export it), a training step with the job's built-in ``loss``; the
    ONNX runtimes infer. Cached (see the module docstring); raises :class:`UnreportedGraph` where there is no
    answer."""
    if runtime not in PACKAGES:
        raise UnreportedGraph(f"{runtime} does not report its kernels at plan time")
    if task != "inference" and runtime not in TORCH_RUNTIMES:
        raise UnreportedGraph(f"{runtime} runs no {task} step")
    if runtime in TORCH_RUNTIMES and zoo is None and user is None:
        raise UnreportedGraph(f"{runtime} traces a zoo model or the user's own, not an ONNX file")
    if loss is not None and ":" in loss:
        raise UnreportedGraph(f"{runtime}: a training step with the user's own loss function is not traced at plan "
                              "time")
    if runtime not in TORCH_RUNTIMES and onnx_path is None:
        raise UnreportedGraph(f"{runtime} runs an ONNX graph; the model has none")
    shapes = {name: [int(d) for d in dims] for name, dims in input_shapes.items()}
    chosen = dict(params or {})
    own = runtime in TORCH_RUNTIMES and zoo is None  # the user's own PyTorch model
    key = _key(runtime, _model_identity(runtime, onnx_path, zoo, user), batch_size, shapes, precision, threads,
               chosen, task, loss)
    file = cache_dir() / "kernels" / f"{key}.json"
    cached = _read_cache(file)
    if cached is not None:
        return cached
    try:
        if own:
            assert user is not None
            kernels = _user_kernels(user, batch_size, chosen, task, loss)
        elif runtime in TORCH_RUNTIMES:
            assert zoo is not None
            kernels = _aten_kernels(zoo, batch_size, shapes, chosen, task, loss)
        else:
            assert onnx_path is not None
            kernels = _onnx_kernels(runtime, Path(onnx_path), batch_size, shapes, precision, threads, chosen)
    except ModakError:
        raise
    except Exception as exc:  # the runtime's own errors: an op it lacks, a graph it refuses
        raise UnreportedGraph(f"{runtime} could not report its kernels: {short_reason(exc)}") from None
    write_atomic(file, json.dumps({"kernels": [asdict(k) for k in kernels]}, sort_keys=True))
    return kernels


def _model_identity(runtime: str, path: Path | None, zoo: str | None, user: LoadedJob | None) -> Any:
    """What the model is, for the cache: the zoo name (the PyTorch runtimes' zoo models; the code digest covers
    the architectures), the digests of the user's files and arguments, or the ONNX graph's digest."""
    from modak.workload.usercode import model_digests

    if runtime in TORCH_RUNTIMES:
        return {"zoo": zoo} if zoo is not None else model_digests(user) if user is not None else None
    try:
        return hashlib.sha256(Path(path or "").read_bytes()).hexdigest()
    except OSError as exc:
        raise UnreportedGraph(f"cannot read {path}: {exc.strerror or exc}") from None


def _key(runtime: str, model: Any, batch_size: int, shapes: dict[str, list[int]], precision: str, threads: int,
         params: dict[str, Any], task: str, loss: str | None) -> str:
    """The cache key: the model's identity and everything else the answer depends on."""
    try:
        version = importlib.metadata.version(PACKAGES[runtime])
    except importlib.metadata.PackageNotFoundError:
        raise UnreportedGraph(f"{runtime} is not installed here ({PACKAGES[runtime]})") from None
    fields = {"model": model, "runtime": runtime, "version": version, "batch": batch_size, "shapes": shapes,
              "precision": precision, "threads": threads, "params": params, "task": task, "loss": loss,
              "code": _code_digest(runtime)}
    return hashlib.sha256(json.dumps(fields, sort_keys=True, default=str).encode()).hexdigest()[:32]


def _code_digest(runtime: str) -> str:
    """The digest of the code an answer comes from: this module, the runtime's module in the image (its session
    options, its step) and, for the PyTorch runtimes, the zoo's architectures and the user model's children."""
    from modak.image import runtimes, zoo

    module = "pytorch" if runtime in TORCH_RUNTIMES else runtime
    files = [Path(__file__), Path(runtimes.__file__ or "").with_name(f"{module}.py")]
    if runtime in TORCH_RUNTIMES:  # files read, not imported (zoo_models would import torch)
        here = Path(__file__)
        files += [Path(zoo.__file__ or ""), Path(zoo.__file__ or "").with_name("zoo_models.py"),
                  here.with_name("kernels_child.py"), here.with_name("usercode_child.py")]
    digest = hashlib.sha256()
    for file in files:
        digest.update(file.read_bytes())
    return digest.hexdigest()


def _read_cache(file: Path) -> tuple[Kernel, ...] | None:
    """The cached kernels in ``file``, or None (absent or unreadable: asked again)."""
    try:
        return tuple(_decode(k) for k in json.loads(file.read_text())["kernels"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _decode(data: dict[str, Any]) -> Kernel:
    return Kernel(kind=str(data["kind"]), op=str(data["op"]), nodes=tuple(str(n) for n in data["nodes"]),
                  shapes=tuple(tuple(int(d) for d in s) for s in data["shapes"]), attributes=str(data["attributes"]),
                  flops=float(data["flops"]), bytes=float(data["bytes"]))


# --- the original graph -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class _Graph:
    """The original ONNX graph's dataflow: node ``i`` is ``nodes[i]``, named ``names[i]`` as the analysis names it."""

    nodes: tuple[onnx.NodeProto, ...]
    names: tuple[str, ...]
    producer: Mapping[str, int]  # tensor -> the node writing it
    consumers: Mapping[str, tuple[int, ...]]  # tensor -> the nodes reading it (once per input that reads it)
    data_inputs: tuple[tuple[str, ...], ...]  # each node's inputs that are not constants
    constant: frozenset[int]  # nodes that only compute constants
    tensors: frozenset[str]  # every tensor name of the graph
    outputs: frozenset[str]  # the graph's outputs
    by_name: Mapping[str, int]

    @classmethod
    def of(cls, model: onnx.ModelProto) -> _Graph:
        graph = model.graph
        constant_tensors = {t.name for t in graph.initializer}
        producer: dict[str, int] = {}
        consumers: dict[str, tuple[int, ...]] = {}
        data_inputs, constant = [], set()
        for index, node in enumerate(graph.node):
            inputs = [t for t in node.input if t]
            for tensor in inputs:
                consumers[tensor] = (*consumers.get(tensor, ()), index)
            producer.update((t, index) for t in node.output if t)
            data = tuple(t for t in inputs if t not in constant_tensors)
            data_inputs.append(data)
            if not data:
                constant.add(index)
                constant_tensors.update(t for t in node.output if t)
        tensors = {vi.name for vi in graph.input} | set(producer) | set(consumers)
        names = tuple(node.name or f"{node.op_type}_{i}" for i, node in enumerate(graph.node))
        return cls(tuple(graph.node), names, producer, consumers, tuple(data_inputs), frozenset(constant),
                   frozenset(tensors), frozenset(vi.name for vi in graph.output),
                   {name: i for i, name in enumerate(names)})

    def resolve(self, name: str) -> int | None:
        """The node a runtime means by ``name``: a node of that name, or the producer of a tensor of that name."""
        return self.by_name.get(name, self.producer.get(name))


def _cover(graph: _Graph, seeds: Sequence[Iterable[int]], stop: frozenset[str] = frozenset()) -> list[list[int]]:
    """The original nodes each kernel covers, from the nodes the runtime names for it (``seeds``, one entry per
    kernel in the order the runtime runs them; see the module docstring). ``stop``: tensors the runtime keeps
    (never inside a fused kernel, as the graph's outputs)."""
    owner: dict[int, int] = {}
    for kernel, seed in enumerate(seeds):
        for node in seed:
            if node not in graph.constant:
                owner.setdefault(node, kernel)
    frontier = list(owner.items())
    while frontier:  # producers fused away into a named node's kernel
        node, kernel = frontier.pop()
        for tensor in graph.data_inputs[node]:
            producer = graph.producer.get(tensor)
            if (producer is None or producer in owner or producer in graph.constant or tensor in stop
                    or tensor in graph.outputs or len(graph.consumers[tensor]) != 1):
                continue
            owner[producer] = kernel
            frontier.append((producer, kernel))
    for node in range(len(graph.nodes)):  # epilogues fused into the last-run kernel that feeds them
        if node in owner or node in graph.constant:
            continue
        feeding = [owner[p] for t in graph.data_inputs[node] if (p := graph.producer.get(t)) is not None and p in owner]
        if feeding:
            owner[node] = max(feeding)
    covered: list[list[int]] = [[] for _ in seeds]
    for node in sorted(owner):
        covered[owner[node]].append(node)
    return covered


def _kernel(kind: str, covered: list[int], graph: _Graph, stats: Sequence[OpStats],
            shapes: Iterable[tuple[int, ...]], attributes: dict[str, Any], added: bool = True) -> Kernel:
    """A kernel covering original nodes ``covered``: its op class from the costliest of them, FLOPs and bytes
    their sums. A kernel covering none moves data where the runtime ``added`` it (a layout reorder, a
    conversion); otherwise (a piece of a node the runtime split, named after no original node) its class is
    unknown."""
    if covered:
        costliest = max(covered, key=lambda i: (stats[i].flops, stats[i].bytes))
        op_class = stats[costliest].op_class
    else:
        op_class = "data_movement" if added else "other"
    return Kernel(kind=kind, op=op_class if op_class in OP_CLASSES else "other",
                  nodes=tuple(graph.names[i] for i in covered), shapes=tuple(shapes),
                  attributes=json.dumps(attributes, sort_keys=True),
                  flops=float(sum(stats[i].flops for i in covered)), bytes=float(sum(stats[i].bytes for i in covered)))


def _attributes(node: onnx.NodeProto) -> dict[str, Any]:
    """A node's integer and string attributes."""
    from onnx import helper

    values = {}
    for attribute in node.attribute:
        if attribute.type in _ATTRIBUTE_TYPES:
            value = helper.get_attribute_value(attribute)
            value = value.decode() if isinstance(value, bytes) else value
            values[attribute.name] = [v.decode() if isinstance(v, bytes) else v for v in value] if isinstance(
                value, list) else value
    return values


def _onnx_kernels(runtime: str, path: Path, batch_size: int, shapes: dict[str, list[int]], precision: str,
                  threads: int, params: dict[str, Any]) -> tuple[Kernel, ...]:
    model = load_model(path)
    if model.functions:
        import onnx.inliner  # a submodule `import onnx` does not load

        model = onnx.inliner.inline_local_functions(model)
    graph = _Graph.of(model)
    stats = analyze(model, batch_size, shapes).ops
    known = tensor_shapes(model, batch_size, shapes)
    if runtime == "onnxruntime":
        from modak.image.runtimes.base import RunRequest

        request = RunRequest(runtime=runtime, device="cpu", precision=precision, params=params, threads=threads,
                             task="inference", onnx_path=str(path), zoo=None, batch_size=batch_size,
                             input_shapes=shapes, workdir="")
        return _onnxruntime(request, graph, stats, known)
    return _openvino(path, graph, stats, known, precision, threads, params)


# --- ONNX Runtime -----------------------------------------------------------------------------------------

def _onnxruntime(request: RunRequest, graph: _Graph, stats: Sequence[OpStats],
                 shapes: Mapping[str, tuple[int, ...]]) -> tuple[Kernel, ...]:
    import onnx
    import onnxruntime as ort

    from modak.image.runtimes.onnxruntime import session_options

    with tempfile.TemporaryDirectory(prefix="modak-kernels-") as folder:
        options = session_options(request)
        options.optimized_model_filepath = str(Path(folder) / "optimized.onnx")
        options.log_severity_level = 3  # not the warning that an NCHWc graph is for this CPU only
        # the weights apart: only the graph is read back
        options.add_session_config_entry("session.optimized_model_external_initializers_file_name", "weights.bin")
        options.add_session_config_entry("session.optimized_model_external_initializers_min_size_in_bytes", "1024")
        ort.InferenceSession(request.onnx_path, options, providers=["CPUExecutionProvider"])
        optimized = onnx.load(options.optimized_model_filepath, load_external_data=False)
    nodes = list(optimized.graph.node)
    weights = {t.name: tuple(t.dims) for t in optimized.graph.initializer}
    alias: dict[str, str] = {}  # optimized tensor -> the original tensor it holds (in another layout)

    def original(tensor: str) -> str | None:
        return tensor if tensor in graph.tensors else alias.get(tensor)

    for node in nodes:
        prefix = node.name.removesuffix(_NCHWC)
        if prefix != node.name and prefix in graph.tensors and node.output[0] not in graph.tensors:
            alias[node.output[0]] = _nchwc_output(node, prefix, graph, original)
        if node.op_type == "ReorderInput" and (held := original(node.input[0])):
            alias.setdefault(node.output[0], held)
        if node.output and original(node.output[0]) is None and (named := _named_after(node.name, graph)) is not None:
            alias[node.output[0]] = graph.nodes[named].output[0]
    for node in reversed(nodes):
        if node.op_type == "ReorderOutput" and (held := original(node.output[0])):
            alias.setdefault(node.input[0], held)
    kept = frozenset(t for node in nodes for name in (*node.input, *node.output) if name and (t := original(name)))
    seeds = []
    for node in nodes:
        reads = {original(t) for t in node.input if t}
        seeds.append({graph.producer[t] for name in node.output if (t := original(name)) is not None
                      and t not in reads and t in graph.producer})
    kernels = []
    for node, covered in zip(nodes, _cover(graph, seeds, kept)):
        attributes = _attributes(node)
        if node.domain not in ("", "ai.onnx"):
            attributes["domain"] = node.domain
        held_shapes = [shapes.get(original(t) or "", weights.get(t, ())) for t in node.input if t]
        kernels.append(_kernel(node.op_type, covered, graph, stats, held_shapes, attributes))
    return tuple(kernels)


def _named_after(name: str, graph: _Graph) -> int | None:
    """The original node a runtime's node is named after: its name, or the name before a ``/``-separated tail that
    the runtime added (ONNX Runtime names a fusion ``<its last node>/<the fusion>/``)."""
    while name:
        if (node := graph.by_name.get(name)) is not None:
            return node
        name = name.rstrip("/").rpartition("/")[0]
    return None


def _nchwc_output(node: onnx.NodeProto, tensor: str, graph: _Graph, original: Any) -> str:
    """The original tensor an NCHWc node writes: the one it is named after, then the sum and the activation it
    took in after, each the only reader of the tensor before."""
    def only_reader(tensor: str) -> onnx.NodeProto | None:
        readers = graph.consumers.get(tensor, ())
        return graph.nodes[readers[0]] if len(readers) == 1 and graph.nodes[readers[0]].output else None

    addend = original(node.input[_NCHWC_SUM]) if len(node.input) > _NCHWC_SUM and node.input[_NCHWC_SUM] else None
    if addend and (reader := only_reader(tensor)) and addend in reader.input:
        tensor = reader.output[0]
    activation = _attributes(node).get("activation")
    producer = graph.producer.get(tensor)
    if activation and (producer is None or graph.nodes[producer].op_type != activation) and (
            reader := only_reader(tensor)) and reader.op_type == activation:
        tensor = reader.output[0]
    return tensor


# --- OpenVINO ---------------------------------------------------------------------------------------------

def _openvino(path: Path, graph: _Graph, stats: Sequence[OpStats], shapes: Mapping[str, tuple[int, ...]],
              precision: str, threads: int, params: dict[str, Any]) -> tuple[Kernel, ...]:
    import openvino as ov

    from modak.image.runtimes.openvino import _PRECISION

    core = ov.Core()
    model = core.read_model(str(path))
    model.reshape({port.get_any_name(): ov.PartialShape(list(shapes[port.get_any_name()])) for port in model.inputs})
    config: dict[str, Any] = {"PERFORMANCE_HINT": str(params.get("performance_hint", "LATENCY")).upper(),
                              "INFERENCE_PRECISION_HINT": _PRECISION.get(precision, "f32")}
    if threads:
        config["INFERENCE_NUM_THREADS"] = int(threads)
    runtime_model = core.compile_model(model, "CPU", config).get_runtime_model()
    constant: set[str] = set()  # friendly names of the nodes that only compute constants
    ran = []
    for op in runtime_model.get_ordered_ops():
        info = {key: op.get_rt_info()[key].astype(str) for key in op.get_rt_info()}
        sources = [value.get_node().get_friendly_name() for value in op.input_values()]
        layer = info.get("layerType", op.get_type_name())
        if layer == "Const" or (sources and all(s in constant for s in sources)):
            constant.add(op.get_friendly_name())
        elif layer not in _OPENVINO_SKIPPED:
            ran.append((op, info))
    seeds = [{node for name in info.get("originalLayersNames", "").split(",")
              if name and (node := graph.resolve(name)) is not None} for _, info in ran]
    kernels = []
    for (op, info), covered in zip(ran, _cover(graph, seeds)):
        attributes: dict[str, Any] = {}
        if covered:
            costliest = max(covered, key=lambda i: (stats[i].flops, stats[i].bytes))
            attributes = _attributes(graph.nodes[costliest])
        attributes.update(layer=info.get("layerType", ""), layout=info.get("outputLayouts", ""),
                          precision=info.get("runtimePrecision", ""))
        op_shapes = [tuple(op.get_input_partial_shape(i).to_shape()) if op.get_input_partial_shape(i).is_static
                     else () for i in range(op.get_input_size())]
        kind = info.get("primitiveType") or info.get("execType") or info.get("layerType", op.get_type_name())
        added = not info.get("originalLayersNames")
        kernels.append(_kernel(kind, covered, graph, stats, op_shapes, attributes, added))
    return tuple(kernels)


# --- PyTorch ----------------------------------------------------------------------------------------------

def _aten_kernels(zoo: str, batch_size: int, shapes: dict[str, list[int]], params: dict[str, Any], task: str,
                  loss: str | None) -> tuple[Kernel, ...]:
    """The aten ops of one step of zoo model ``zoo`` (modak's own code: traced in-process)."""
    from modak.image.zoo import get_entry, make_inputs

    model = get_entry(zoo).build(shapes)
    return trace_step(model, make_inputs(zoo, batch_size, shapes), params, task, loss)


def _user_kernels(user: LoadedJob, batch_size: int, params: dict[str, Any], task: str,
                  loss: str | None) -> tuple[Kernel, ...]:
    """The aten ops of one step of the user's own model, traced in a child process (the user's code never runs
    in the planner's)."""
    from modak.errors import InputError
    from modak.workload.usercode import run_child

    work = {"batch": batch_size, "params": params, "task": task, "loss": loss}
    try:
        result = run_child(user, _CHILD, {TRACE: work})
    except InputError as exc:
        raise UnreportedGraph(f"pytorch could not trace the model on meta tensors: {exc.message}") from None
    return tuple(_decode(k) for k in result["kernels"])


def trace_step(model: Any, batch: Mapping[str, Any], params: Mapping[str, Any], task: str,
               loss: str | None) -> tuple[Kernel, ...]:
    """The aten ops of one step of ``model`` on ``batch`` (input name -> tensor, in call order), both moved to
    ``meta`` tensors, as the PyTorch runtime builds the step (:func:`modak.image.runtimes.pytorch.build_session`):
    the forward pass, or for training the forward pass, the built-in ``loss``, the backward pass and the SGD update
    of a steady step (after the one that makes the momentum buffers)."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten
    from torch.utils.flop_counter import flop_registry

    from modak.image.runtimes.base import RunRequest
    from modak.image.runtimes.pytorch import _loss, training_optimizer

    kernels: list[Kernel] = []

    def nbytes(value: torch.Tensor) -> int:  # at fp32 for floating point, as the analysis counts
        return value.numel() * (4 if value.is_floating_point() else value.element_size())

    class Recorder(TorchDispatchMode):
        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            kwargs = kwargs or {}
            out = func(*args, **kwargs)
            name = func._schema.name
            if not name.startswith(_ATEN):  # the profiler's record_function markers
                return out
            count = flop_registry.get(func._overloadpacket)
            tensors = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
            outputs = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
            op_class = "data_movement" if name == _ATEN_TRANSPOSE else next(
                (c for key, c in _ATEN_CLASSES if key in name), "elementwise")
            attributes = {"args": [_plain(a) for a in args], **{k: _plain(v) for k, v in sorted(kwargs.items())}}
            if tensors and tensors[0].dim() == 4 and not tensors[0].is_contiguous() and tensors[0].is_contiguous(
                    memory_format=torch.channels_last):
                attributes["layout"] = "channels_last"
            kernels.append(Kernel(kind=name, op=op_class, shapes=tuple(tuple(t.shape) for t in tensors),
                                  attributes=json.dumps(attributes, sort_keys=True),
                                  flops=float(count(*args, out_val=out, **kwargs)) if count else 0.0,
                                  bytes=float(sum(nbytes(t) for t in (*tensors, *outputs)))))
            return out

    model = model.to("meta")
    feeds = {name: tensor.to("meta") for name, tensor in batch.items()}
    if params.get("channels_last"):
        model = model.to(memory_format=torch.channels_last)
        feeds = {name: t.contiguous(memory_format=torch.channels_last) if t.dim() == 4 else t
                 for name, t in feeds.items()}
    if task == "inference":
        model.eval()
        with torch.no_grad(), Recorder():
            model(*feeds.values())
        return tuple(kernels)
    request = RunRequest(runtime="pytorch", device="cpu", precision="fp32", params=dict(params), threads=None,
                         task=task, onnx_path="", zoo=None, batch_size=0, input_shapes={}, workdir="", loss=loss)
    loss_of = _loss(request, torch.device("meta"))
    model.train()
    optimizer = training_optimizer(model.parameters())

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        loss_of(model(*feeds.values()), feeds).backward()
        optimizer.step()

    step()
    with Recorder():
        step()
    return tuple(kernels)


def _plain(value: Any) -> Any:
    """An aten argument as JSON: tensors as ``"tensor"``, numbers, strings, lists of them; anything else by name."""
    import torch

    if isinstance(value, torch.Tensor):
        return "tensor"
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    return str(value)
