"""The child process that runs the user's own model code (``python -m modak.workload.usercode_child REQUEST``).

Started by :mod:`modak.workload.usercode` with a memory limit (``RLIMIT_AS``, set here before torch is imported)
and a wall-clock limit (the parent kills it). It imports the module, calls the factory, loads the weights (or
loads a ``torch.export`` program), runs the model once eagerly, then exports it to ONNX (the dynamo exporter
first, the TorchScript exporter second); when neither can, it counts FLOPs and bytes per leaf module with
``torch.utils.flop_counter``. It writes ``result.json`` into the request's folder: what it made, or the job's
field, the user's file:line and the exception's message. Nothing here is imported by the planner.
"""

from __future__ import annotations

import faulthandler
import importlib
import importlib.util
import io
import json
import resource
import sys
import traceback
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from modak.image.calling import by_keyword, call_model, flatten

EXPORT_BATCH = 2  # exported and counted with a batch of 2, so that no size-1 dimension is mistaken for a constant
OPSET = 18
IR_VERSION = 10  # what onnxruntime reads (see modak.workload.zoo)
PHASE_FILE = "phase"  # the phase the child is in, for the parent's message when it has to stop it
STACK_FILE = "stack"  # where the child's stacks are dumped just before the parent's deadline
RESULT_FILE = "result.json"
MODEL_FILE = "model.onnx"
_OP_CLASSES = (  # leaf module type name (substring) -> op class of modak.workload.analysis, first match wins
    ("ConvTranspose", "conv"), ("Conv", "conv"), ("Linear", "matmul"), ("Bilinear", "matmul"),
    ("LSTM", "recurrent"), ("GRU", "recurrent"), ("RNN", "recurrent"), ("Norm", "normalization"),
    ("Pool", "pooling"), ("Softmax", "softmax"), ("Embedding", "embedding"), ("Flatten", "data_movement"),
    ("Dropout", "data_movement"), ("Identity", "data_movement"), ("Shuffle", "data_movement"))


class UserCodeError(Exception):
    """A failure of the user's code, located at a job field (and a file:line of the user's, if one is in the
    traceback)."""

    def __init__(self, field: str, message: str, exc: BaseException | None = None, root: Path | None = None):
        super().__init__(message)
        self.field = field
        self.message = message
        self.file, self.line = _user_frame(exc, root) if exc is not None else (None, None)


def main(argv: list[str], work: Callable[[dict[str, Any], Path], dict[str, Any]] | None = None) -> int:
    """Do ``work`` (default: :func:`run`) on the request in folder ``argv[1]`` under its limits; write its
    result."""
    folder = Path(argv[1])
    request = json.loads((folder / "request.json").read_text())
    resource.setrlimit(resource.RLIMIT_AS, (request["memory_bytes"], request["memory_bytes"]))
    stack = open(folder / STACK_FILE, "w")  # noqa: SIM115 (open until the process ends)
    faulthandler.dump_traceback_later(max(request["seconds"] - 1.0, 0.5), file=stack)
    try:
        result = (work or run)(request, folder)
    except UserCodeError as exc:
        result = {"ok": False, "field": exc.field, "file": exc.file, "line": exc.line, "message": exc.message}
    except Exception as exc:  # e.g. MemoryError outside the user's calls: reported at the phase it stopped in
        file, line = _user_frame(exc, request_root(request))
        result = {"ok": False, "field": _phase(folder), "file": file, "line": line, "message": describe(exc)}
    (folder / RESULT_FILE).write_text(json.dumps(result))
    return 0


def run(request: dict[str, Any], folder: Path) -> dict[str, Any]:
    """Load the model, run it, export or count it; what was made (paths relative to ``folder``)."""
    import torch

    root = request_root(request)
    model, shapes = load(request, folder)
    field = "model.exported" if request["exported"] else "model.input_shape"
    set_phase(folder, field)
    inputs = example_inputs(request, shapes)
    names = list(inputs)
    keyword = by_keyword(model, names)
    try:
        with torch.no_grad():
            outputs = flatten(call_model(model, names, list(inputs.values()), keyword))
    except Exception as exc:
        message = (f"the model does not run on inputs of per-sample shape {_shapes_text(shapes)} "
                   f"(batch {EXPORT_BATCH}): {describe(exc)}")
        raise UserCodeError(field, message, exc, root) from exc
    if not outputs.tensors:
        raise UserCodeError(field, "the model returns no tensor (" + (", ".join(outputs.dropped) or "None") + ")")
    flat = _flat_module(model, names, keyword)
    set_phase(folder, "model.pytorch.factory" if not request["exported"] else "model.exported")
    failures: list[str] = []
    exporter = None
    for name, export in (("dynamo", _export_dynamo), ("torchscript", _export_torchscript)):
        try:
            export(flat, inputs, outputs.names, folder / MODEL_FILE)
            exporter = name
            break
        except MemoryError:
            raise
        except Exception as exc:  # an exporter's refusal is a reason, not an error
            failures.append(f"{name}: {describe(exc, exporter_cause=True)}")
    counted = None
    if exporter is None:
        try:
            counted = _count(model, lambda: flat(*inputs.values()))
        except Exception as exc:
            raise UserCodeError(field, f"the FLOP counter cannot run the model: {describe(exc)}", exc, root) from exc
    parameters = [p for p in model.parameters()]
    return {"ok": True, "exporter": exporter, "onnx": MODEL_FILE if exporter else None, "failures": failures,
            "input_shapes": shapes, "counted": counted, "torch": torch.__version__, "by_keyword": keyword,
            "outputs": list(outputs.names), "dropped_outputs": list(outputs.dropped),
            "parameters": sum(p.numel() for p in parameters),
            "parameter_bytes": sum(p.numel() * p.element_size() for p in parameters)}


def load(request: dict[str, Any], folder: Path) -> tuple[Any, dict[str, list[int]]]:
    """The user's model (in eval mode) and its per-sample input shapes."""
    set_phase(folder, "model.exported" if request["exported"] else "model.pytorch.module")
    import torch

    from modak.image.zoo import SEED

    torch.manual_seed(SEED)  # as the PyTorch runtimes do: weights the factory initializes are the same there
    if request["exported"]:
        return _load_program(request)
    return _build(request, folder, request_root(request)).eval(), request["input_shapes"]


def example_inputs(request: dict[str, Any], shapes: dict[str, list[int]], batch: int = EXPORT_BATCH
                   ) -> dict[str, Any]:
    """The inputs the model is run, exported and counted on (batch :data:`EXPORT_BATCH`), by
    ``model.input_dtype``: standard normal float32 or float16, int64 ids below their bound (``model.input_high``),
    or random booleans."""
    import torch

    from modak.spec.models import input_types

    def make(shape: list[int], dtype: str, high: int | None) -> Any:
        if dtype == "int64":
            return torch.randint(0, high or 1, (batch, *shape))
        if dtype == "bool":
            return torch.randint(0, 2, (batch, *shape)).bool()
        return torch.randn(batch, *shape, dtype=getattr(torch, dtype))

    types = input_types(request.get("input_dtype"), request.get("input_high"), list(shapes))
    return {name: make(shape, *types[name]) for name, shape in shapes.items()}


def _flat_module(model: Any, names: list[str], keyword: bool) -> Any:
    """``model`` as a module of positional tensors (in the order of ``names``) that returns the tensors of its
    outputs (:func:`modak.image.calling.flatten`): what the exporters and the FLOP counter take."""
    import torch

    class Flat(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, *tensors: Any) -> tuple[Any, ...]:
            return flatten(call_model(self.model, names, tensors, keyword)).tensors

    flat = Flat()
    flat.training = False  # as the model, which is in eval mode (an exported program's module refuses train())
    return flat


def _build(request: dict[str, Any], folder: Path, root: Path) -> Any:
    """Import the module, call the factory with the kwargs, load the weights; the nn.Module."""
    import torch

    sys.path.insert(0, request["search"])
    try:
        module = (_import_file(Path(request["module_file"])) if request["module"].endswith(".py")
                  else importlib.import_module(request["module"]))
    except SyntaxError as exc:
        error = UserCodeError("model.pytorch.module", describe(exc))
        error.file, error.line = exc.filename, exc.lineno
        raise error from None
    except Exception as exc:
        raise UserCodeError("model.pytorch.module", f"importing {request['module']} failed: {describe(exc)}",
                            exc, root) from None
    set_phase(folder, "model.pytorch.factory")
    factory = getattr(module, request["factory"], None)
    if not callable(factory):
        from modak.errors import did_you_mean

        known = [n for n, v in vars(module).items() if callable(v) and not n.startswith("_")
                 and getattr(v, "__module__", None) == module.__name__]
        raise UserCodeError("model.pytorch.factory", f"{request['module']} has no callable "
                                                     f"'{request['factory']}'{did_you_mean(request['factory'], known)}")
    try:
        model = factory(**request["kwargs"])
    except Exception as exc:
        error = UserCodeError("model.pytorch.factory", f"{request['factory']}() raised {describe(exc)}", exc, root)
        if error.file is None and isinstance(exc, TypeError):  # the call itself: the kwargs do not fit
            error.field = "model.pytorch.kwargs"
        raise error from None
    if not isinstance(model, torch.nn.Module):
        raise UserCodeError("model.pytorch.factory", f"{request['factory']}() returned {type(model).__name__}, not "
                                                     "a torch.nn.Module")
    if request["weights"]:
        set_phase(folder, "model.pytorch.weights")
        _load_weights(model, request["weights"])
    return model


def _import_file(path: Path) -> Any:
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module
    spec.loader.exec_module(module)
    return module


def _load_weights(model: Any, path: str) -> None:
    import torch

    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise UserCodeError("model.pytorch.weights", f"{path} cannot be loaded with weights_only=True: "
                                                     f"{describe(exc)}") from None
    if not isinstance(state, dict):
        raise UserCodeError("model.pytorch.weights", f"{path} holds {type(state).__name__}, not a state_dict")
    wanted = set(model.state_dict())
    missing, unexpected = sorted(wanted - set(state)), sorted(set(state) - wanted)
    if missing or unexpected:
        parts = [f"{label} {len(keys)} key(s): {', '.join(keys[:5])}{', ...' if len(keys) > 5 else ''}"
                 for label, keys in (("missing", missing), ("unexpected", unexpected)) if keys]
        raise UserCodeError("model.pytorch.weights", f"{path} does not fit the model: {'; '.join(parts)}")
    try:
        model.load_state_dict(state, strict=True)
    except Exception as exc:
        raise UserCodeError("model.pytorch.weights", f"{path} does not fit the model: "
                                                     f"{' '.join(str(exc).split())[:300]}") from None


def _load_program(request: dict[str, Any]) -> tuple[Any, dict[str, list[int]]]:
    """The ``torch.export`` program's module and its per-sample input shapes (given, or from the program)."""
    import torch

    try:
        program = torch.export.load(request["exported"])
    except Exception as exc:
        raise UserCodeError("model.exported", f"not a torch.export program: {describe(exc)}") from None
    placeholders = [node for node in program.graph.nodes if node.op == "placeholder"
                    and node.name in program.graph_signature.user_inputs]
    shapes = request["input_shapes"]
    if shapes is None:
        shapes = {}
        for node in placeholders:
            value = node.meta.get("val")
            if value is None or not hasattr(value, "shape") or not all(isinstance(d, int) for d in value.shape[1:]):
                raise UserCodeError("model.exported", f"input '{node.name}' has no concrete per-sample shape in "
                                                      "the program: give model.input_shape")
            shapes[node.name] = [int(d) for d in value.shape[1:]]
    return program.module(), shapes


def _export_dynamo(model: Any, inputs: dict[str, Any], outputs: tuple[str, ...], path: Path) -> None:
    import onnx
    import onnxscript.optimizer
    import torch

    batch = torch.export.Dim("batch")
    # Constants folded and the nodes nothing reads removed (a chunk's SequenceConstruct), not optimized: like the
    # zoo's exports (TrainingMode.PRESERVE), the graph keeps its BatchNormalization nodes (the optimizer folds them
    # into the convolutions), so that it shows the architecture.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = torch.onnx.export(model, tuple(inputs.values()), dynamo=True, input_names=list(inputs),
                                    output_names=list(outputs),
                                    dynamic_shapes=(tuple({0: batch} for _ in inputs),),  # forward(*tensors)
                                    opset_version=OPSET,
                                    optimize=False, verbose=False)
        assert program is not None  # dynamo=True returns the program
        onnxscript.optimizer.fold_constants(program.model)
        onnxscript.optimizer.remove_unused_nodes(program.model)
    proto = program.model_proto
    _unsqueeze_scalar_reshapes(onnx, proto)
    _save(onnx, proto, path)


def _unsqueeze_scalar_reshapes(onnx: Any, proto: Any) -> None:
    """``Reshape(scalar, [-1])`` as ``Unsqueeze(scalar, [0])``, its equal: the dynamo exporter builds the shape
    of a ``flatten``/``view`` with a dynamic batch that way, and ONNX shape inference propagates the values of
    Unsqueeze, not of Reshape, so the analysis would not know the view's shape at a fixed batch."""
    scalars = {vi.name for vi in proto.graph.value_info
               if vi.type.tensor_type.HasField("shape") and not vi.type.tensor_type.shape.dim}
    minus_one = {node.output[0] for node in proto.graph.node if node.op_type == "Constant"
                 and [onnx.helper.get_attribute_value(a) for a in node.attribute] == [[-1]]}
    for index, node in enumerate(proto.graph.node):
        if node.op_type == "Reshape" and node.input[0] in scalars and node.input[1] in minus_one:
            axes = f"{node.output[0]}_axes"
            proto.graph.initializer.append(onnx.helper.make_tensor(axes, onnx.TensorProto.INT64, [1], [0]))
            proto.graph.node[index].CopyFrom(onnx.helper.make_node("Unsqueeze", [node.input[0], axes],
                                                                   list(node.output), name=node.name))


def _export_torchscript(model: Any, inputs: dict[str, Any], outputs: tuple[str, ...], path: Path) -> None:
    import onnx
    import torch

    buffer = io.BytesIO()
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        # the TorchScript exporter writes to a file object too; torch's hints name only paths
        torch.onnx.export(model, tuple(inputs.values()), buffer, input_names=list(inputs), dynamo=False,  # type: ignore[arg-type]
                          output_names=list(outputs), opset_version=17,
                          dynamic_axes={name: {0: "batch"} for name in (*inputs, *outputs)},
                          training=torch.onnx.TrainingMode.PRESERVE)
    _save(onnx, onnx.load_from_string(buffer.getvalue()), path)


def _save(onnx: Any, proto: Any, path: Path) -> None:
    proto.ir_version = IR_VERSION
    onnx.save_model(proto, path, save_as_external_data=True, all_tensors_to_one_file=True,
                    location=f"{path.name}.data", size_threshold=1024)
    onnx.checker.check_model(str(path))


def _count(model: Any, forward: Callable[[], Any]) -> list[dict[str, Any]]:
    """FLOPs (``torch.utils.flop_counter``) and bytes per leaf module of ``model`` in one ``forward`` pass at the
    export batch;
    FLOPs outside every leaf module (functional calls in a forward) as one more entry."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    ops: list[dict[str, Any]] = []
    counter = FlopCounterMode(display=False)
    started: dict[int, int] = {}

    def nbytes(value: Any) -> int:
        if isinstance(value, torch.Tensor):
            return value.numel() * value.element_size()
        if isinstance(value, (list, tuple)):
            return sum(nbytes(v) for v in value)
        return 0

    def before(module: Any, args: Any) -> None:
        started[id(module)] = counter.get_total_flops()

    def after(name: str) -> Any:
        def hook(module: Any, args: Any, output: Any) -> None:
            kind = type(module).__name__
            op_class = next((c for key, c in _OP_CLASSES if key in kind), "elementwise")
            flops = counter.get_total_flops() - started.pop(id(module), 0)
            out_bytes = nbytes(output)
            if flops == 0 and op_class in ("elementwise", "normalization", "softmax", "pooling"):
                flops = out_bytes // max(_element_size(output), 1)  # one FLOP per output element
            weights = sum(nbytes(t) for t in (*module.parameters(recurse=False), *module.buffers(recurse=False)))
            ops.append({"name": name, "op_type": kind, "op_class": op_class,
                        "macs": flops // 2 if op_class in ("conv", "matmul", "recurrent") else 0, "flops": flops,
                        "input_bytes": nbytes(args), "weight_bytes": weights, "output_bytes": out_bytes})
        return hook

    handles = []
    for name, module in model.named_modules():
        if not any(True for _ in module.children()):
            handles += [module.register_forward_pre_hook(before), module.register_forward_hook(after(name or "model"))]
    with torch.no_grad(), counter:
        forward()
    for handle in handles:
        handle.remove()
    rest = counter.get_total_flops() - sum(op["flops"] for op in ops if op["op_class"] in ("conv", "matmul",
                                                                                              "recurrent"))
    if rest > 0:
        ops.append({"name": "functional", "op_type": "functional", "op_class": "matmul", "macs": rest // 2,
                    "flops": rest, "input_bytes": 0, "weight_bytes": 0, "output_bytes": 0})
    return ops


def _element_size(value: Any) -> int:
    import torch

    if isinstance(value, torch.Tensor):
        return value.element_size()
    return next((_element_size(v) for v in value), 4) if isinstance(value, (list, tuple)) and value else 4


def describe(exc: BaseException, exporter_cause: bool = False) -> str:
    """``Type: first line`` of an exception (an exporter's: of its innermost cause, which names the problem),
    at most 300 characters."""
    if exporter_cause:
        while exc.__cause__ is not None:
            exc = exc.__cause__
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    text = f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__
    return text if len(text) <= 300 else text[:297] + "..."


def _user_frame(exc: BaseException | None, root: Path | None) -> tuple[str | None, int | None]:
    """The file and line of the last traceback frame inside the user's code (``root``: a folder or a file), the
    file's real path (a staged link resolved)."""
    if exc is None or root is None:
        return None, None
    for frame in reversed(traceback.extract_tb(exc.__traceback__)):
        path = Path(frame.filename)
        if path == root or path.is_relative_to(root):
            return str(path.resolve()), frame.lineno
    return None, None


def request_root(request: dict[str, Any]) -> Path:
    return Path(request["root"])


def set_phase(folder: Path, field: str) -> None:
    (folder / PHASE_FILE).write_text(field)


def _phase(folder: Path) -> str:
    try:
        return (folder / PHASE_FILE).read_text()
    except OSError:
        return "model"


def _shapes_text(shapes: dict[str, list[int]]) -> str:
    return ", ".join(f"{name} {shape}" for name, shape in shapes.items())


if __name__ == "__main__":
    sys.exit(main(sys.argv))
