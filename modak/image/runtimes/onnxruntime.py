"""ONNX Runtime: intra/inter-op threads and their wait policy, graph optimization level, execution mode; CPU or CUDA
provider. Its ``profile`` reads the profiler's trace for the kernels' times only; the kernels themselves (kind,
covered ONNX nodes, shapes, attributes) come from the optimized graph (:func:`graph_kernels`), as a plan's do
(:func:`planned_kernels`)."""

from __future__ import annotations

import json
import os
import re
import statistics
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from modak.image.deployment import WAIT_VARIABLE
from modak.image.kernels import Kernel, KernelTime, Profile
from modak.image.onnx_nodes import Cover, attributes_json, fed_shapes, has_unique_names, node_ids
from modak.image.runtimes.base import PROFILE_WARMUP_STEPS, Adapter, FunctionSession, RunRequest

if TYPE_CHECKING:
    import numpy as np
    import onnx

_LEVELS = {"disabled": "ORT_DISABLE_ALL", "basic": "ORT_ENABLE_BASIC", "extended": "ORT_ENABLE_EXTENDED",
           "all": "ORT_ENABLE_ALL"}


def prepare(request: RunRequest, inputs: dict[str, np.ndarray]) -> FunctionSession:
    """An InferenceSession configured from the candidate's parameters (any batch size the graph accepts)."""
    import onnxruntime as ort

    session = ort.InferenceSession(request.onnx_path, session_options(request), providers=providers(request))
    if request.device == "gpu" and "CUDAExecutionProvider" not in session.get_providers():
        raise RuntimeError("ONNX Runtime has no CUDA execution provider here (install onnxruntime-gpu)")
    open_batch = all(not isinstance(i.shape[0], int) for i in session.get_inputs() if i.shape)
    return FunctionSession(lambda feeds: session.run(None, dict(feeds)), open_batch)


def providers(request: RunRequest) -> list[str]:
    """The execution providers of the candidate's device."""
    return ["CUDAExecutionProvider"] if request.device == "gpu" else ["CPUExecutionProvider"]


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


# Node types ONNX Runtime inserts to convert layouts or move tensors between devices (a node of the given graph with
# the same op type keeps its name, so it is not taken for one): kernels of class data_movement that cover no ONNX
# node.
CONVERSIONS = frozenset({"ReorderInput", "ReorderOutput", "Transpose", "Cast", "MemcpyToHost", "MemcpyFromHost"})
_EVENT_SUFFIX = "_kernel_time"  # the profiler's event for a node: "<node name>_kernel_time"
_OWN_DOMAINS = ("", "ai.onnx", "com.microsoft")  # op types named without their domain
# ONNX Runtime's NCHWc transformer names a node "<the ONNX tensor it computes, in NCHWc layout>_nchwc" (made unique
# with "_token_<n>"): the link where a chain of NCHWc nodes passes tensors of its own between them.
_NCHWC_NAME = re.compile(r"(?P<tensor>.+)_nchwc(?:_token_\d+)?")
# A node ONNX Runtime rewrote keeps the ONNX node's name, made unique with "_token_<n>" (a QDQ Conv becomes the
# QLinearConv "conv_token_9", whose tensors are all new).
_KEPT_NAME = re.compile(r"(?P<node>.+?)(?:_token_\d+)?")


@dataclass(frozen=True)
class GraphKernel:
    """A node of ONNX Runtime's optimized graph as a kernel: its name there, its kind (op type, with the domain
    where it is neither ONNX's nor ``com.microsoft``: ``nchwc.Conv``), the ONNX nodes of the given graph it covers,
    its input shapes (those of the ONNX tensors they hold, in the ONNX layout, or of its initializers), its
    attributes, and whether it is a conversion ONNX Runtime inserted (:data:`CONVERSIONS`; it covers none)."""

    name: str
    kind: str
    nodes: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]
    attributes: str
    conversion: bool = False

    def kernel(self, provider: str = "") -> Kernel:
        """As a :class:`Kernel` (op class: ``data_movement`` for a conversion, else left to whoever knows the
        nodes' costs), run by ``provider`` (the CPU's: its kind as is; another's: ``<kind>@<provider>``)."""
        kind = self.kind if provider in ("", "CPUExecutionProvider") else \
            f"{self.kind}@{provider.removesuffix('ExecutionProvider')}"
        return Kernel(kind=kind, op="data_movement" if self.conversion else "", nodes=self.nodes, shapes=self.shapes,
                      attributes=self.attributes)


def graph_kernels(original: onnx.GraphProto, optimized: onnx.GraphProto,
                  shapes: Mapping[str, tuple[int, ...]]) -> tuple[GraphKernel, ...]:
    """Each node of ``optimized`` (ONNX Runtime's optimized form of ``original``, in its order) as a kernel;
    ``shapes``: those of the tensors of ``original`` (:func:`modak.image.onnx_nodes.fed_shapes`).

    A node is seeded with the ONNX node whose name it kept and the ONNX producers of the ONNX tensors it outputs,
    directly or through the conversions after it (a NCHWc convolution's ReorderOutput) or as its NCHWc name says,
    then absorbs the ONNX nodes upstream
    that the optimized graph dropped (:class:`modak.image.onnx_nodes.Cover`): a FusedConv covers the Conv,
    BatchNormalization and Relu it replaced. It also joins the dropped nodes downstream that combine its output with
    another tensor it reads, and then its ``activation``: a NCHWc convolution that sums a residual covers the Add
    and the Relu after it."""
    cover = Cover(original)
    original_names = set(cover.ids)
    alive = ({t for node in optimized.node for t in (*node.input, *node.output)}
             | {v.name for v in optimized.input} | {i.name for i in optimized.initializer})
    consumers: dict[str, list[int]] = {}
    for index, node in enumerate(optimized.node):
        for tensor in node.input:
            consumers.setdefault(tensor, []).append(index)
    conversion = [node.op_type in CONVERSIONS and node.name not in original_names for node in optimized.node]

    def hint(index: int) -> str | None:
        nchwc = _NCHWC_NAME.fullmatch(optimized.node[index].name)
        return nchwc["tensor"] if nchwc and nchwc["tensor"] in cover.producer else None

    def seeds(index: int) -> set[str]:
        tensor = hint(index)
        found = {cover.producer[tensor]} if tensor else set()
        kept = _KEPT_NAME.fullmatch(optimized.node[index].name)
        if kept and kept["node"] in original_names:
            found.add(kept["node"])
        pending, seen = [index], {index}
        while pending:
            for tensor in optimized.node[pending.pop()].output:
                if tensor in cover.producer:
                    found.add(cover.producer[tensor])
                    continue
                for consumer in consumers.get(tensor, ()):
                    if conversion[consumer] and consumer not in seen:
                        seen.add(consumer)
                        pending.append(consumer)
        return found

    producer = {t: i for i, node in enumerate(optimized.node) for t in node.output}
    holds: dict[int, str] = {}  # a node whose NCHWc name is stale: it also computes the nodes it joined

    def as_onnx(tensor: str) -> str | None:
        """The ONNX tensor an optimized-graph tensor holds (in another layout, for a conversion's or a NCHWc
        node's output), where the graph says."""
        while tensor not in cover.producer and tensor not in cover.constants and tensor in producer:
            index = producer[tensor]
            if not conversion[index]:
                return holds.get(index) or hint(index)
            tensor = optimized.node[index].input[0]
        return tensor

    seeded = [set() if conversion[i] else seeds(i) for i in range(len(optimized.node))]
    for nodes in seeded:
        cover.claim(nodes)
    weights = {t.name: tuple(t.dims) for t in optimized.initializer}
    kernels = []
    for index, (node, nodes) in enumerate(zip(optimized.node, seeded)):
        reads = {tensor for tensor in (as_onnx(t) for t in node.input[1:] if t) if tensor} - cover.constants
        absorbed = cover.absorb(nodes, alive) if nodes else ()
        activation = next((a.s.decode() for a in node.attribute if a.name == "activation"), "")
        covered = cover.join(absorbed, reads, activation) if nodes else ()
        if len(covered) > len(absorbed):
            holds[index] = cover.outputs[[n for n in covered if n not in absorbed][-1]][0]
        held = [weights[t] if t in weights else shapes.get(as_onnx(t) or "", ()) for t in node.input if t]
        kernels.append(GraphKernel(name=node.name, kind=kernel_kind(node), nodes=covered, shapes=tuple(held),
                                   attributes=attributes_json(node), conversion=conversion[index]))
    return tuple(kernels)


def kernel_kind(node: onnx.NodeProto) -> str:
    """ONNX Runtime's kind for a node of its optimized graph: its op type, qualified by a domain of its own."""
    return node.op_type if node.domain in _OWN_DOMAINS else f"{node.domain.rpartition('.')[2]}.{node.op_type}"


def profile(request: RunRequest, inputs: dict[str, np.ndarray], steps: int) -> Profile:
    """Per-kernel times of one step, from ONNX Runtime's profiler: the session :func:`prepare` makes, with profiling
    on and its optimized graph written out; warm-up, then ``steps`` profiled steps (medians over them)."""
    with tempfile.TemporaryDirectory(prefix="modak-ort-profile-") as folder:
        session, kernels = _optimized_session(request, {name: feed.shape for name, feed in inputs.items()},
                                              Path(folder), profiled=True)
        for _ in range(PROFILE_WARMUP_STEPS):
            session.run(None, inputs)
        walls = []
        for _ in range(steps):
            start = time.perf_counter()
            session.run(None, inputs)
            walls.append(time.perf_counter() - start)
        events = json.loads(Path(session.end_profiling()).read_text(encoding="utf-8"))
    notes = []
    if request.params.get("execution_mode") == "parallel":
        notes.append("parallel execution mode: kernels overlap, their times may add up to more than the step")
    if request.device == "gpu":
        notes.append("CUDA: a node's time is its launch on the host, not the device's kernel time")
    return parse_trace(events, kernels, steps, statistics.median(walls), tuple(notes))


def planned_kernels(request: RunRequest, input_shapes: Mapping[str, tuple[int, ...]]) -> tuple[GraphKernel, ...]:
    """The kernels the session :func:`prepare` makes would run on inputs of ``input_shapes`` (the batch included):
    what :func:`profile` reports, without running it."""
    with tempfile.TemporaryDirectory(prefix="modak-ort-plan-") as folder:
        return _optimized_session(request, input_shapes, Path(folder), profiled=False)[1]


def _optimized_session(request: RunRequest, input_shapes: Mapping[str, tuple[int, ...]], folder: Path,
                       profiled: bool) -> tuple[Any, tuple[GraphKernel, ...]]:
    """The candidate's session (profiling into ``folder`` where ``profiled``) and the kernels of the optimized
    graph it writes to ``folder`` (:func:`graph_kernels`)."""
    import onnx
    import onnxruntime as ort

    model_path = named_model(request.onnx_path, folder)
    optimized_path = folder / "optimized.onnx"
    options = session_options(request)
    if profiled:
        options.enable_profiling = True
        options.profile_file_prefix = str(folder / "trace")
    options.optimized_model_filepath = str(optimized_path)
    options.log_severity_level = 3  # not the warning that an NCHWc graph is for this CPU only
    # Weights beside the optimized graph, so that a model over protobuf's 2 GB writes too (only its nodes are read)
    options.add_session_config_entry("session.optimized_model_external_initializers_file_name", "optimized.weights")
    session = ort.InferenceSession(model_path, options, providers=providers(request))
    original = onnx.load(model_path, load_external_data=False)
    kernels = graph_kernels(original.graph, onnx.load(optimized_path, load_external_data=False).graph,
                            fed_shapes(original, input_shapes))
    return session, kernels


def parse_trace(events: list[dict[str, Any]], kernels: tuple[GraphKernel, ...], steps: int, step_seconds: float,
                notes: tuple[str, ...] = ()) -> Profile:
    """A :class:`Profile` from ONNX Runtime's trace (its JSON events): the last ``steps`` runs (``model_run``
    events), each node event (``cat == "Node"``) matched to its optimized-graph kernel by name (the k-th event of
    a name in a run to the k-th node of that name; a node without a name, which the profiler calls
    ``<op type>_<its index>``, by op type); per kernel the median over the runs of its time in each. The trace
    gives only the time (and the provider): the kernel, its shapes and attributes are the graph's
    (:class:`GraphKernel`), as a plan gives them. Events of nodes the optimized graph does not have (inside a
    subgraph) are ``unmapped_seconds``."""
    runs = sorted((e for e in events if e.get("name") == "model_run"), key=lambda e: e["ts"])[-steps:]
    if len(runs) < steps:
        raise RuntimeError(f"ONNX Runtime's trace has {len(runs)} runs, {steps} were profiled")
    by_name: dict[str, list[int]] = {}
    for index, kernel in enumerate(kernels):  # (unnamed nodes under "\0<op type>", which no name is)
        by_name.setdefault(kernel.name or f"\0{kernel.kind.rpartition('.')[2]}", []).append(index)
    seconds: list[list[float]] = [[0.0] * len(runs) for _ in kernels]
    calls = [[0] * len(runs) for _ in kernels]
    provider: dict[int, str] = {}
    seen: list[dict[str, int]] = [{} for _ in runs]
    unmapped = [0.0] * len(runs)
    for event in events:
        if event.get("cat") != "Node" or not event.get("name", "").endswith(_EVENT_SUFFIX):
            continue
        run = next((r for r, e in enumerate(runs) if e["ts"] <= event["ts"] <= e["ts"] + e["dur"]), None)
        if run is None:
            continue
        name = event["name"][:-len(_EVENT_SUFFIX)]
        args = event.get("args", {})
        op_type = str(args.get("op_name", ""))
        if name not in by_name and re.fullmatch(rf"{re.escape(op_type)}_\d+", name):
            name = f"\0{op_type}"
        same = by_name.get(name, [])
        occurrence = seen[run][name] = seen[run].get(name, -1) + 1
        duration = float(event["dur"]) * 1e-6
        if not same:
            unmapped[run] += duration
            continue
        index = same[min(occurrence, len(same) - 1)]
        seconds[index][run] += duration
        calls[index][run] += 1
        provider.setdefault(index, str(args.get("provider", "")))
    times = [KernelTime(kernels[index].kernel(provider[index]), seconds=statistics.median(seconds[index]),
                        calls=max(calls[index])) for index in sorted(provider)]
    return Profile(source="onnxruntime-profiler", steps=steps, step_seconds=step_seconds, kernels=tuple(times),
                   unmapped_seconds=statistics.median(unmapped), notes=notes)


def named_model(onnx_path: str, folder: Path) -> str:
    """``onnx_path``, or where its nodes lack names of their own, a copy in ``folder`` with each node named by its
    identifier (:func:`modak.image.onnx_nodes.node_ids`): the profiler reports nodes by name."""
    import onnx

    model = onnx.load(onnx_path, load_external_data=False)
    if has_unique_names(model.graph):
        return onnx_path
    model = onnx.load(onnx_path)
    for node, name in zip(model.graph.node, node_ids(model.graph)):
        node.name = name
    path = folder / "named.onnx"
    onnx.save_model(model, path, save_as_external_data=True, location="named.weights", size_threshold=1024)
    return str(path)


def gemm(n: int, threads: int, precision: str) -> Callable[[], Any]:
    """ONNX Runtime's MatMul (int8: MatMulInteger, uint8 x int8 -> int32, the kernel its quantized models run)."""
    import numpy as np
    import onnxruntime
    from onnx import TensorProto, helper

    integer = precision == "int8"
    a_type, b_type = (TensorProto.UINT8, TensorProto.INT8) if integer else (TensorProto.FLOAT, TensorProto.FLOAT)
    node = helper.make_node("MatMulInteger" if integer else "MatMul", ["a", "b"], ["c"])
    graph = helper.make_graph([node], "gemm", [helper.make_tensor_value_info("a", a_type, [n, n]),
                                               helper.make_tensor_value_info("b", b_type, [n, n])],
                              [helper.make_tensor_value_info("c", TensorProto.INT32 if integer else TensorProto.FLOAT,
                                                             [n, n])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
    session = onnxruntime.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    feeds = ({"a": rng.integers(0, 255, (n, n), dtype=np.uint8), "b": rng.integers(-127, 127, (n, n), dtype=np.int8)}
             if integer else {x: rng.standard_normal((n, n), dtype=np.float32) for x in "ab"})
    return lambda: session.run(None, feeds)


def planned_kernel_rows(request: RunRequest, input_shapes: Mapping[str, tuple[int, ...]]) -> tuple[Kernel, ...]:
    """:func:`planned_kernels` as the kernel model reads them."""
    return tuple(k.kernel() for k in planned_kernels(request, input_shapes))


class OnnxRuntime(Adapter):
    name = "onnxruntime"
    framework = "onnxruntime"
    packages = ("onnxruntime", "onnxruntime-gpu")
    kernels = "onnx"  # its optimized graph (planned_kernels)
    run_settings = ("threads", "inter_op_threads", "wait_policy", "execution_mode", "allocator")
    profiles_as_planned = True
    cut_graphs = True
    gemm_precisions = ("fp32", "int8")
    prepare = staticmethod(prepare)
    profile = staticmethod(profile)
    planned_kernels = staticmethod(planned_kernel_rows)
    gemm = staticmethod(gemm)
