"""Resolve a job's ``model`` section to an ONNX file and per-sample input shapes.

Errors point at the job file's ``model.*`` fields. Importing this module does not import torch; only a zoo
model that is not cached yet needs it (to export).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from modak.errors import InputError, ModakError, did_you_mean, short_reason
from modak.image.deployment import MODEL_FILE
from modak.image.zoo import get_entry
from modak.paths import cache_dir, write_atomic
from modak.spec.document import SpecDocument
from modak.spec.loader import LoadedJob
from modak.spec.models import Task
from modak.workload import analysis, shapes, usercode_child, zoo
from modak.workload.analysis import OpStats, WorkloadProfile, analyze, load_model, step_profile
from modak.workload.usercode import UserModel, load_user_model

if TYPE_CHECKING:
    import onnx

_ONNX = ("model", "onnx")
_SHAPE = ("model", "input_shape")


@dataclass(frozen=True)
class ModelSource:
    """The job's model as an ONNX file; ``input_shapes`` are per sample (no batch dimension); ``data_files`` are
    the external data files the graph references, relative to the ONNX file's folder (checked to be there).
    ``user``: the user's own model (``model.pytorch``, ``model.exported``), whose ONNX file is its export, or
    None (``onnx_path`` too) where no exporter could export it."""

    name: str
    onnx_path: Path | None
    input_shapes: dict[str, list[int]]
    zoo: str | None
    data_files: tuple[str, ...] = ()
    user: UserModel | None = None


def resolve_model(loaded: LoadedJob, user: UserModel | None = None) -> ModelSource:
    """The ONNX file of the job's model (a zoo model is exported on first use, then cached; the user's own model
    is exported in a child process, then cached: ``user`` if already loaded)."""
    spec, doc = loaded.job.model, loaded.job_doc
    if _is_user(loaded):
        return _resolve_user(loaded, user or load_user_model(loaded))
    if spec.zoo is not None:
        import onnx

        source = _resolve_zoo(spec.zoo, spec.input_shape, doc)
        path, field = source.onnx_path, ("model", "zoo")
        assert path is not None
        model = onnx.load(path, load_external_data=False)  # modak's own export: checked when made
    else:
        assert spec.onnx is not None  # a model is a zoo name or an ONNX file (the spec's validator)
        path = doc.resolve(spec.onnx, _ONNX)
        if not path.is_file():
            raise doc.error(_ONNX, f"file not found: {path}" if not path.exists() else f"not a file: {path}")
        field = _ONNX
        model = _load_checked(path, doc, field)
        source = ModelSource(path.stem, path, _graph_shapes(model, spec.input_shape, spec.batch_size, doc), None)
    return replace(source, data_files=_data_files(model, path, doc, field))


def load_analysis(loaded: LoadedJob, optimizer: str = "sgd_momentum") -> tuple[ModelSource, WorkloadProfile]:
    """Resolve the job's model and analyze it at the job's batch size for the job's task.

    The result is cached by the ONNX file's identity (path, size, modification time) and everything else the
    analysis reads, so planning the same model again neither imports onnx nor reads the graph. A batch size of
    ``auto`` is an input error: the plan chooses it (:func:`modak.batching.choose_batch`), analysing each batch."""
    batch = loaded.job.model.batch_size
    if not isinstance(batch, int):  # 'auto'
        raise loaded.job_doc.error(("model", "batch_size"), "the analysis needs a number: 'auto' is chosen by `modak "
                                                           "plan` (the batch it chose is its workload.batch_size)")
    user = load_user_model(loaded) if _is_user(loaded) else None
    key = _analysis_key(loaded, optimizer, user)
    cached = _cached_analysis(key) if key else None
    if cached is not None:
        source, profile = cached
        return replace(source, user=user), profile
    source = resolve_model(loaded, user)
    if source.onnx_path is None:
        assert source.user is not None
        shapes = {k: tuple(v) for k, v in source.input_shapes.items()}
        profile = step_profile(source.name, loaded.job.task, batch, shapes, source.user.counted_ops(batch),
                               source.user.parameters, source.user.parameter_bytes, optimizer)
    else:
        try:
            profile = analyze(source.onnx_path, batch, source.input_shapes, loaded.job.task, optimizer,
                              name=source.name)
        except InputError as exc:
            raise loaded.job_doc.error(_source_field(loaded), exc.message) from None
    key = key or _analysis_key(loaded, optimizer, user)
    if key:
        onnx_path = str(source.onnx_path) if source.onnx_path else None
        write_atomic(cache_dir() / "analysis" / f"{key}.json", json.dumps(
            {"source": {**asdict(replace(source, user=None)), "onnx_path": onnx_path}, "profile": asdict(profile)}))
    return source, profile


def _is_user(loaded: LoadedJob) -> bool:
    return loaded.job.model.pytorch is not None or loaded.job.model.exported is not None


def _source_field(loaded: LoadedJob) -> tuple[str, ...]:
    """The job's field that names its model."""
    spec = loaded.job.model
    return next(("model", name) for name in ("zoo", "pytorch", "exported", "onnx") if getattr(spec, name) is not None)


def _resolve_user(loaded: LoadedJob, user: UserModel) -> ModelSource:
    """The user's own model: its ONNX export, or none (the analysis then reads the flop counter's ops) where no
    exporter could export it."""
    spec = loaded.job.model
    name = (f"{Path(spec.pytorch.module).stem if spec.pytorch.module.endswith('.py') else spec.pytorch.module}"
            f".{spec.pytorch.factory}" if spec.pytorch is not None else Path(spec.exported or "").stem)
    source = ModelSource(name, user.onnx_path, user.input_shapes, None, user=user)
    if user.onnx_path is None:
        return source
    import onnx

    model = onnx.load(user.onnx_path, load_external_data=False)  # modak's own export: checked when made
    return replace(source, data_files=_data_files(model, user.onnx_path, loaded.job_doc, _source_field(loaded)))


def _analysis_key(loaded: LoadedJob, optimizer: str, user: UserModel | None = None) -> str | None:
    """What a job's analysis depends on, hashed; None while its ONNX file does not exist (a zoo model not yet
    exported) or cannot be read. The user's own model (``user``) is its export's result."""
    spec = loaded.job.model
    try:
        if user is not None:
            path = user.folder / usercode_child.RESULT_FILE
        elif spec.zoo:
            path = zoo.export_path(spec.zoo, _zoo_overrides(spec.zoo, spec.input_shape))
        else:
            assert spec.onnx is not None  # a model is a zoo name, an ONNX file or the user's own (the validator)
            path = loaded.job_doc.resolve(spec.onnx, _ONNX)
        stat = path.stat()
    except (OSError, ModakError):
        return None
    digest = hashlib.sha256(json.dumps(
        [str(path), stat.st_size, stat.st_mtime_ns, stat.st_ino, spec.zoo, spec.input_shape, spec.batch_size,
         loaded.job.task, optimizer]).encode())
    for file in (Path(__file__), Path(analysis.__file__), Path(shapes.__file__),
                 Path(shapes.__file__).with_name("shapes_child.py"), analysis.OP_TABLE_FILE):
        digest.update(file.read_bytes())
    return digest.hexdigest()[:32]


def _cached_analysis(key: str) -> tuple[ModelSource, WorkloadProfile] | None:
    """A cached analysis whose external data files are all still there, or None."""
    try:
        data = json.loads((cache_dir() / "analysis" / f"{key}.json").read_text())
        onnx_path = data["source"]["onnx_path"]
        source = ModelSource(**{**data["source"], "onnx_path": Path(onnx_path) if onnx_path else None,
                                "data_files": tuple(data["source"]["data_files"])})
        stored = data["profile"]
        profile = WorkloadProfile(**{**stored, "task": Task(stored["task"]),
                                     "input_shapes": {k: tuple(v) for k, v in stored["input_shapes"].items()},
                                     "ops": tuple(OpStats(**op) for op in stored["ops"]),
                                     "unknown_shapes": tuple(stored["unknown_shapes"])})
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if source.onnx_path is None:
        return source, profile
    folder = source.onnx_path.parent
    return (source, profile) if all((folder / name).is_file() for name in source.data_files) else None


def _resolve_zoo(name: str, input_shape: Any, doc: SpecDocument) -> ModelSource:
    try:
        entry = get_entry(name)
    except InputError as exc:
        raise doc.error(("model", "zoo"), exc.message) from None
    try:
        overrides = _zoo_overrides(name, input_shape)
    except InputError as exc:
        raise doc.error(_SHAPE, exc.message) from None
    for key, shape in overrides.items():
        try:
            entry.shapes({key: shape})
        except InputError as exc:
            loc = _SHAPE + (key,) if isinstance(input_shape, dict) else _SHAPE
            raise doc.error(loc, exc.message) from None
    try:
        path = zoo.export_onnx(name, overrides)
    except InputError as exc:
        raise doc.error(_SHAPE if overrides else ("model", "zoo"), exc.message) from None
    shapes = {key: list(shape) for key, shape in entry.shapes(overrides).items()}
    return ModelSource(name, path, shapes, name)


def _zoo_overrides(name: str, input_shape: Any) -> dict[str, list[int]]:
    """The job's ``input_shape`` of zoo model ``name`` as a mapping from input name to per-sample shape."""
    if isinstance(input_shape, list):
        inputs = get_entry(name).input_shapes
        if len(inputs) != 1:
            raise InputError(f"zoo model '{name}' has inputs {', '.join(inputs)}: give input_shape as a mapping "
                             "from input name to per-sample shape")
        return {next(iter(inputs)): input_shape}
    return dict(input_shape) if isinstance(input_shape, dict) else {}


def _load_checked(path: Path, doc: SpecDocument, field: tuple[str, ...]) -> onnx.ModelProto:
    """The model at ``path`` (graph only, within modak's limits), after ``onnx.checker``; a bad file is an error
    at ``field`` that names it."""
    import onnx

    try:
        model = load_model(path)
    except InputError as exc:
        raise doc.error(field, f"{path}: {exc.message}") from None
    try:
        onnx.checker.check_model(str(path))
    except Exception as exc:  # ValidationError, missing external data
        raise doc.error(field, f"{path}: not a valid ONNX model: {short_reason(exc)}") from None
    return model


def _data_files(model: onnx.ModelProto, path: Path, doc: SpecDocument, field: tuple[str, ...]) -> tuple[str, ...]:
    """The external data files ``model`` references: each must be a file in the model's folder (it is copied
    into the image beside the model) and not named like the model in the image."""
    folder = path.parent.resolve()
    locations = sorted({entry.value for tensor in _tensors(model.graph) for entry in tensor.external_data
                        if entry.key == "location"})
    for location in locations:
        try:
            data = (folder / location).resolve()
            usable = location != MODEL_FILE and data.is_relative_to(folder) and data.is_file()
        except (OSError, RuntimeError, ValueError):  # a name too long, a loop of links, a NUL byte
            usable = False
        if not usable:
            raise doc.error(field, f"external data {location!r} of {path} must be a file in the model's folder "
                                   f"(and not named {MODEL_FILE})")
    return tuple(Path(location).as_posix() for location in locations)


def _tensors(graph: onnx.GraphProto) -> Iterator[onnx.TensorProto]:
    """Every tensor stored in ``graph``: initializers and tensor attributes, subgraphs included."""
    yield from graph.initializer
    for node in graph.node:
        for attribute in node.attribute:
            if attribute.HasField("t"):
                yield attribute.t
            yield from attribute.tensors
            if attribute.HasField("g"):
                yield from _tensors(attribute.g)
            for subgraph in attribute.graphs:
                yield from _tensors(subgraph)


def _graph_shapes(model: onnx.ModelProto, input_shape: Any, batch: int | Literal["auto"],
                  doc: SpecDocument) -> dict[str, list[int]]:
    """Per-sample shapes of the graph inputs: from ``model.input_shape`` where given, else from the graph."""
    weights = {t.name for t in model.graph.initializer}
    inputs = {vi.name: vi for vi in model.graph.input if vi.name not in weights}
    if not inputs:
        raise doc.error(_ONNX, "the model has no inputs")
    given: dict[str, list[int]] = {}
    if isinstance(input_shape, list):
        if len(inputs) != 1:
            raise doc.error(_SHAPE, f"the model has inputs {', '.join(inputs)}: give input_shape as a mapping "
                                    "from input name to per-sample shape")
        given = {next(iter(inputs)): input_shape}
    elif isinstance(input_shape, dict):
        for key in input_shape:
            if key not in inputs:
                raise doc.error(_SHAPE + (key,), f"the model has no input '{key}'{did_you_mean(key, inputs)}")
        given = dict(input_shape)
    shapes = {}
    for name, vi in inputs.items():
        loc = _SHAPE + (name,) if isinstance(input_shape, dict) and name in given else _SHAPE
        loc = _ONNX if input_shape is None else loc
        shapes[name] = _input_shape(vi, given.get(name), batch, doc, loc)
    return shapes


def _input_shape(vi: onnx.ValueInfoProto, given: list[int] | None, batch: int | Literal["auto"], doc: SpecDocument,
                 loc: tuple[str, ...]) -> list[int]:
    """One input's per-sample shape, checked against the graph's declaration (dimension 0 is the batch)."""
    if not vi.type.HasField("tensor_type"):
        raise doc.error(_ONNX, f"input '{vi.name}' is not a tensor; only tensor inputs are supported")
    has_shape = vi.type.tensor_type.HasField("shape")
    dims = list(vi.type.tensor_type.shape.dim)
    if has_shape and not dims:
        raise doc.error(_ONNX, f"input '{vi.name}' is a scalar; modak needs a leading batch dimension")
    if has_shape and dims[0].HasField("dim_value") and dims[0].dim_value != batch:
        raise doc.error(("model", "batch_size"), f"input '{vi.name}' has a fixed batch size of {dims[0].dim_value} "
                                                 "in the model; use that batch_size or re-export with a dynamic batch")
    if not has_shape:
        if given is None:
            raise doc.error(loc, f"input '{vi.name}' has no shape in the model; give model.input_shape")
        return list(given)
    if given is not None:
        if len(given) != len(dims) - 1:
            raise doc.error(loc, f"input '{vi.name}' has {len(dims)} dimensions (batch first), so its per-sample "
                                 f"shape needs {len(dims) - 1} values, got {given}")
        for index, (dim, value) in enumerate(zip(dims[1:], given), 1):
            if dim.HasField("dim_value") and dim.dim_value != value:
                raise doc.error(loc, f"input '{vi.name}' has a fixed dimension {index} of {dim.dim_value} in "
                                     f"the model, not {value}")
        return list(given)
    shape = []
    for index, dim in enumerate(dims[1:], 1):
        if not dim.HasField("dim_value"):
            label = f" '{dim.dim_param}'" if dim.dim_param else ""
            raise doc.error(loc, f"input '{vi.name}' has a symbolic dimension{label} (dimension {index}); "
                                 "give its per-sample shape in model.input_shape")
        shape.append(dim.dim_value)
    return shape
