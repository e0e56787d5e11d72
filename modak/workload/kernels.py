"""The kernels a runtime would run for a job's graph, as the runtime itself reports them at plan time (#40 item 2).

Nothing runs the model; modak writes no fusion rule of its own. Each runtime's plan comes from the same function
its profile maps kernels with, so a planned kernel and a profiled one have the same kind, shapes and attributes:

* ``onnxruntime``: the session the candidate's ``prepare`` makes writes its optimized graph; one kernel per
  optimized node, the conversions it inserted included
  (:func:`modak.image.runtimes.onnxruntime.planned_kernels`).
* ``openvino``: the CPU plugin compiles the graph as ``prepare`` does; one kernel per executed node of its runtime
  model (:func:`modak.image.runtimes.openvino.planned_kernels`).
* ``pytorch``, ``torch-compile`` (its eager ops): the aten ops of one step (inference, or training: forward,
  loss, backward, optimizer update) run on fake CPU tensors at the candidate's precision (autocast's
  conversions included). ``pytorch``'s inference ops map to the ONNX graph's nodes as its profiles map them
  (:func:`modak.image.runtimes.torch_kernels.onnx_nodes`: the same FLOPs and bytes for a planned op and a profiled one;
  an op mapping to none has neither, in both); elsewhere, and without an ONNX graph, an op has
  ``torch.utils.flop_counter``'s FLOPs where it knows the op and the bytes of its tensors. A zoo model is traced
  here; the user's own model only in a child process (:mod:`modak.workload.kernels_child`).

A kernel's op class, FLOPs and bytes come from the :class:`~modak.workload.analysis.OpStats` of the ONNX nodes it
covers (the costliest node's class; a kernel covering none: its runtime's class, else the one its name says).

Answers are cached as JSON under ``modak.paths.cache_dir() / "kernels"``, keyed by the model (the ONNX graph's
digest, whose weights do not change what runs; the zoo name; the digests of the user's files), the runtime and its
version, the batch, input shapes, precision, the task and loss, the code the answer comes from, and the threads and
the candidate's parameters but for those the runtime declares as settings of how its kernels run, not which
(:attr:`~modak.image.runtimes.base.Adapter.run_settings`): candidates that differ only in those share one answer.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, replace
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from modak.errors import ModakError, short_reason
from modak.image.calling import by_keyword, call_model
from modak.image.kernels import Kernel
from modak.image.runtimes.base import Adapter, adapter
from modak.paths import cache_dir, file_digest, installed, write_atomic
from modak.workload.analysis import OpStats, analyze, covering, load_model, tensor_shapes

if TYPE_CHECKING:

    from modak.image.runtimes.torch_kernels import Argument
    from modak.spec.loader import LoadedJob

TRACE = "trace"  # the key of the user model child's request that asks for a trace: batch, params, task, loss
_CHILD = "modak.workload.kernels_child"
_ATEN = "aten::"


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
    reports = _reporting(runtime)
    traced = reports.kernels == "torch"
    if task != "inference" and not traced:
        raise UnreportedGraph(f"{runtime} runs no {task} step")
    if traced and zoo is None and user is None:
        raise UnreportedGraph(f"{runtime} traces a zoo model or the user's own, not an ONNX file")
    if loss is not None and ":" in loss:
        raise UnreportedGraph(f"{runtime}: a training step with the user's own loss function is not traced at plan "
                              "time")
    if not traced and onnx_path is None:
        raise UnreportedGraph(f"{runtime} runs an ONNX graph; the model has none")
    shapes = {name: [int(d) for d in dims] for name, dims in input_shapes.items()}
    chosen = dict(params or {})
    own = traced and zoo is None  # the user's own PyTorch model
    key = _key(runtime, _model_identity(runtime, onnx_path, zoo, user), batch_size, shapes, precision, threads,
               chosen, task, loss)
    file = cache_dir() / "kernels" / f"{key}.json"
    cached = _read_cache(file)
    if cached is not None:
        return cached
    try:
        # PyTorch's eager forward ops map to the ONNX graph's nodes as its profiles map them
        mapped = traced and reports.profiles_as_planned and task == "inference"
        graph = str(onnx_path) if mapped and onnx_path else None
        if own:
            assert user is not None
            kernels = _user_kernels(user, batch_size, chosen, precision, task, loss, graph)
        elif traced:
            assert zoo is not None
            kernels = _aten_kernels(zoo, batch_size, shapes, chosen, precision, task, loss, graph)
        else:
            assert onnx_path is not None
            kernels = _onnx_kernels(runtime, Path(onnx_path), batch_size, shapes, precision, threads, chosen)
        if graph is not None:
            kernels = _costed(kernels, Path(graph), batch_size, shapes)
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

    if _reporting(runtime).kernels == "torch":
        return {"zoo": zoo} if zoo is not None else model_digests(user) if user is not None else None
    try:
        return file_digest(Path(path or ""))
    except OSError as exc:
        raise UnreportedGraph(f"cannot read {path}: {exc.strerror or exc}") from None


def _key(runtime: str, model: Any, batch_size: int, shapes: dict[str, list[int]], precision: str, threads: int,
         params: dict[str, Any], task: str, loss: str | None) -> str:
    """The cache key: the model's identity and everything else the answer depends on (not the runtime's
    settings of how its kernels run)."""
    reports = _reporting(runtime)
    package = reports.packages[0]
    version = installed().version(package)
    if version is None:
        raise UnreportedGraph(f"{runtime} is not installed here ({package})")
    settings = reports.run_settings
    fields = {"model": model, "runtime": runtime, "version": version, "batch": batch_size, "shapes": shapes,
              "precision": precision, "threads": None if "threads" in settings else threads,
              "params": {name: value for name, value in params.items() if name not in settings}, "task": task,
              "loss": loss, "code": _code_digest(runtime)}
    return hashlib.sha256(json.dumps(fields, sort_keys=True, default=str).encode()).hexdigest()[:32]


def _reporting(runtime: str) -> type[Adapter]:
    """The adapter of ``runtime``, which reports the kernels it plans (else :class:`UnreportedGraph`)."""
    try:
        found = adapter(runtime)
    except KeyError as exc:
        raise UnreportedGraph(str(exc.args[0])) from None
    if found.kernels is None:
        raise UnreportedGraph(f"{runtime} does not report its kernels at plan time")
    return found


@functools.cache
def _code_digest(runtime: str) -> str:
    """The digest of the code an answer comes from: this module, the analysis (the kernels' FLOPs and bytes), the
    runtime's module that plans its kernels (its session options, its step) and, for the traced runtimes, the
    zoo's architectures, the user model's children and how a call becomes a kernel (``torch_kernels``)."""
    from modak.image import zoo

    reports = _reporting(runtime)
    files = [Path(__file__), Path(__file__).with_name("analysis.py"), Path(__file__).with_name("shapes.py"),
             Path(__file__).with_name("shapes_child.py"), reports.source_file(),
             Path(zoo.__file__ or "").with_name("onnx_nodes.py")]
    if reports.kernels == "torch":  # files read, not imported (zoo_models would import torch)
        from modak.image.runtimes import torch_kernels

        here = Path(__file__)
        files += [Path(zoo.__file__ or ""), Path(zoo.__file__ or "").with_name("zoo_models.py"),
                  here.with_name("kernels_child.py"), here.with_name("usercode_child.py"),
                  Path(torch_kernels.__file__ or "")]
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


# --- ONNX Runtime and OpenVINO -------------------------------------------------------------------------

def _onnx_kernels(runtime: str, path: Path, batch_size: int, shapes: dict[str, list[int]], precision: str,
                  threads: int, params: dict[str, Any]) -> tuple[Kernel, ...]:
    """The runtime's own plan (the function its profile maps kernels with), with op classes, FLOPs and bytes from
    the analysis of the nodes each kernel covers."""
    from modak.image.runtimes.base import RunRequest

    fed, _ = _graph_facts(path, batch_size, shapes)
    request = RunRequest(runtime=runtime, device="cpu", precision=precision, params=params, threads=threads,
                         task="inference", onnx_path=str(path), zoo=None, batch_size=batch_size,
                         input_shapes=shapes, workdir="")
    return _costed(adapter(runtime).planned_kernels(request, fed), path, batch_size, shapes)


def _costed(kernels: Sequence[Kernel], path: Path, batch_size: int,
            shapes: dict[str, list[int]]) -> tuple[Kernel, ...]:
    """``kernels`` with op classes, FLOPs and bytes from the analysis of the nodes of the graph at ``path`` each
    covers."""
    _, stats = _graph_facts(path, batch_size, shapes)
    return tuple(covering(k, [stats[n] for n in k.nodes if n in stats]) for k in kernels)


def _graph_facts(path: Path, batch_size: int, shapes: dict[str, list[int]]
                 ) -> tuple[Mapping[str, tuple[int, ...]], Mapping[str, OpStats]]:
    """The shapes of the graph's fed inputs at ``batch_size`` and its analysis' ops by node name: loaded and
    inferred once per process for a plan's candidates (:func:`_analyzed`, keyed by the file's digest)."""
    try:
        digest = file_digest(path)
    except OSError as exc:
        raise UnreportedGraph(f"cannot read {path}: {exc.strerror or exc}") from None
    return _analyzed(str(path), digest, batch_size, json.dumps(shapes, sort_keys=True))


@functools.lru_cache(maxsize=8)
def _analyzed(path: str, digest: str, batch_size: int, shapes: str
              ) -> tuple[Mapping[str, tuple[int, ...]], Mapping[str, OpStats]]:
    """:func:`_graph_facts` of the file at ``path`` whose content is ``digest`` (per-sample ``shapes`` as JSON)."""
    model = load_model(Path(path))
    per_sample = json.loads(shapes)
    inputs = {v.name for v in model.graph.input} - {t.name for t in model.graph.initializer}
    fed = {name: dims for name, dims in tensor_shapes(model, batch_size, per_sample).items() if name in inputs}
    stats = {op.name: op for op in analyze(model, batch_size, per_sample).ops}
    return MappingProxyType(fed), MappingProxyType(stats)


# --- PyTorch ----------------------------------------------------------------------------------------------

def _aten_kernels(zoo: str, batch_size: int, shapes: dict[str, list[int]], params: dict[str, Any], precision: str,
                  task: str, loss: str | None, graph: str | None) -> tuple[Kernel, ...]:
    """The aten ops of one step of zoo model ``zoo`` (modak's own code: traced in-process), mapped to the nodes of
    the ONNX file ``graph`` where one is given."""
    from modak.image.zoo import get_entry, make_inputs

    model = get_entry(zoo).build(shapes)
    return trace_step(model, make_inputs(zoo, batch_size, shapes), params, precision, task, loss, graph)


def _user_kernels(user: LoadedJob, batch_size: int, params: dict[str, Any], precision: str, task: str,
                  loss: str | None, graph: str | None) -> tuple[Kernel, ...]:
    """The aten ops of one step of the user's own model, traced in a child process (the user's code never runs
    in the planner's), mapped to the nodes of the ONNX file ``graph`` where one is given."""
    from modak.errors import InputError
    from modak.workload.usercode import run_child

    work = {"batch": batch_size, "params": params, "precision": precision, "task": task, "loss": loss,
            "graph": graph}
    try:
        result = run_child(user, _CHILD, {TRACE: work})
    except InputError as exc:
        raise UnreportedGraph(f"pytorch could not trace the model on fake tensors: {exc.message}") from None
    return tuple(_decode(k) for k in result["kernels"])


def trace_step(model: Any, batch: Mapping[str, Any], params: Mapping[str, Any], precision: str, task: str,
               loss: str | None, graph: str | None = None) -> tuple[Kernel, ...]:
    """The aten ops of one step of ``model`` on ``batch`` (input name -> tensor, in call order), both made fake
    tensors on the CPU (no data, no compute; composite ops decompose as on the CPU: an LSTM is oneDNN's RNN
    kernel, not its per-timestep math), as the PyTorch runtime builds the step at ``precision``
    (:func:`modak.image.runtimes.pytorch.build_session`: autocast's conversions included): the forward pass, or
    for training the forward pass, the built-in ``loss``, the backward pass and the SGD update of a steady step
    (after the one that makes the momentum buffers). Each op's FLOPs are torch's flop counter's and its bytes its
    tensors' at fp32; with the ONNX file ``graph`` (inference), the forward ops map to its nodes as a profile maps
    them (:func:`modak.image.runtimes.torch_kernels.onnx_nodes`) and carry neither, as a profile's ops do: the caller
    costs them by their nodes."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten
    from torch.utils.flop_counter import flop_registry

    from modak.image.runtimes.base import RunRequest
    from modak.image.runtimes.pytorch import _loss, autocast, training_optimizer
    from modak.image.runtimes.torch_kernels import NO_KERNEL, aten_kernel, inner_scope, onnx_nodes

    kernels: list[Kernel] = []
    mapped = graph is not None and task == "inference"  # its forward ops map to the graph's nodes
    scopes: list[str | None] = [None]  # the ONNX scope of the modules whose forward is running, innermost last
    called: list[tuple[str, str | None]] = []  # each kernel's kind and scope

    def nbytes(value: torch.Tensor) -> int:  # at fp32 for floating point, as the analysis counts
        return value.numel() * (4 if value.is_floating_point() else value.element_size())

    class Recorder(TorchDispatchMode):
        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            kwargs = kwargs or {}
            out = func(*args, **kwargs)
            name = func._schema.name
            if not name.startswith(_ATEN) or name in NO_KERNEL:  # the profiler's record_function markers; aliases
                return out
            arguments = []
            for index, schema in enumerate(func._schema.arguments):
                value = args[index] if index < len(args) else kwargs.get(schema.name, schema.default_value)
                arguments.append(_argument(schema.name, value, str(schema.type)))
            kernel = aten_kernel(name, arguments)
            if not mapped:  # a mapped op is costed by its nodes, by the caller
                count = flop_registry.get(func._overloadpacket)
                tensors = [t for t in tree_flatten((args, kwargs, out))[0] if isinstance(t, torch.Tensor)]
                kernel = replace(kernel, flops=float(count(*args, out_val=out, **kwargs)) if count else 0.0,
                                 bytes=float(sum(map(nbytes, tensors))))
            kernels.append(kernel)
            called.append((name, scopes[-1]))
            return out

    def enter(_module: Any, _args: Any, name: str) -> None:
        scopes.append(inner_scope(scopes[-1], name))

    def leave(_module: Any, _args: Any, _output: Any) -> None:
        scopes.pop()

    if params.get("channels_last"):  # on the real tensors: faking keeps their strides (swapping fakes can fail)
        model = model.to(memory_format=torch.channels_last)
        batch = {name: t.contiguous(memory_format=torch.channels_last) if t.dim() == 4 else t
                 for name, t in batch.items()}
    fake = FakeTensorMode()
    model = model._apply(fake.from_tensor)
    feeds: dict[str, Any] = {name: fake.from_tensor(tensor) for name, tensor in batch.items()}
    keyword = by_keyword(model, list(feeds))
    if task == "inference":
        model.eval()
        hooks = [hook for name, module in model.named_modules()
                 for hook in (module.register_forward_pre_hook(functools.partial(enter, name=name)),
                              module.register_forward_hook(leave))] if mapped else []
        try:
            with fake, torch.no_grad(), autocast("cpu", precision), Recorder():
                call_model(model, list(feeds), list(feeds.values()), keyword)
        finally:
            for hook in hooks:
                hook.remove()
        if graph is None:
            return tuple(kernels)
        nodes = onnx_nodes(called, graph)
        return tuple(replace(k, nodes=nodes.get(i, ())) for i, k in enumerate(kernels))
    request = RunRequest(runtime="pytorch", device="cpu", precision=precision, params=dict(params), threads=None,
                         task=task, onnx_path="", zoo=None, batch_size=0, input_shapes={}, workdir="", loss=loss)
    loss_of = _loss(request, torch.device("cpu"))
    model.train()
    optimizer = training_optimizer(model.parameters())

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        with autocast("cpu", precision):
            batch_loss = loss_of(call_model(model, list(feeds), list(feeds.values()), keyword), feeds)
        batch_loss.backward()
        optimizer.step()

    with fake:
        step()
        with Recorder():
            step()
    return tuple(kernels)


def _argument(name: str, value: Any, schema_type: str) -> Argument:
    """An aten op's argument of type ``schema_type`` as :func:`modak.image.runtimes.torch_kernels.aten_kernel` takes it,
    in the profiler's form (a number passed for a tensor, as to ``mul_``, is the 0-d tensor it is wrapped in)."""
    import torch

    from modak.image.runtimes.torch_kernels import Argument, channels_last

    if isinstance(value, torch.Tensor):
        shape = tuple(int(d) for d in value.shape)
        return Argument(name, (shape,), None, channels_last(shape, list(value.stride())))
    if isinstance(value, (list, tuple)) and value and all(isinstance(v, torch.Tensor) for v in value):
        return Argument(name, ((),))  # as the profiler records a tensor list: without its shapes
    if isinstance(value, (bool, int, float)) and "Tensor" in schema_type:
        return Argument(name, ((),))
    return Argument(name, None, _plain(value))


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
