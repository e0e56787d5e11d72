"""Load Job/Target YAML into typed models; every problem becomes one ``FILE:LINE: field: message``."""

from __future__ import annotations

import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from modak.errors import InputError, did_you_mean
from modak.spec.document import Loc, SpecDocument, dotted
from modak.spec.models import AUTO_BATCH, Job, Metric, Target, Task
from modak.spec.resolve import ResolvedFiles, resolve_files

M = TypeVar("M", bound=BaseModel)
LOCAL = "local"  # a target (file name or `cpu:` value) that is the machine modak runs on: modak.hardware.local
LocalMachine = Callable[[], dict[str, Any]]  # the cpu, memory (and gpus) sections describing the local machine


@dataclass(frozen=True)
class LoadedJob:
    """A validated job with its target, the documents they came from and the files they refer to."""

    job: Job
    target: Target
    job_doc: SpecDocument
    target_doc: SpecDocument
    files: ResolvedFiles


def load_job(job_path: str | Path, target_path: str | Path | None = None,
             local_machine: LocalMachine | None = None) -> LoadedJob:
    """Load a job and its target (``target_path`` overrides the job's ``target`` field), then resolve and check
    every file they refer to (:func:`modak.spec.resolve.resolve_files`). ``local_machine`` describes the machine
    modak runs on, for a target ``local`` and a target file's ``cpu: local``."""
    job, job_doc = load_spec(job_path, Job)
    _check_auto_batch(job, job_doc)
    if target_path is None:
        if job.target is None:
            raise job_doc.error((), "no target: add a 'target:' field or pass --target FILE (or 'local')")
        target_file = Path(LOCAL) if job.target == LOCAL else job_doc.resolve(job.target)
        if job.target != LOCAL and not target_file.is_file():
            raise job_doc.error(("target",), f"target file not found: {target_file}")
    else:
        target_file = Path(target_path)
    if str(target_file) == LOCAL and not target_file.exists():
        if local_machine is None:
            raise job_doc.error(("target",), "target 'local' is not available here")
        document = {"apiVersion": "modak/v1", "kind": "Target", "name": LOCAL, **local_machine()}
        target, target_doc = Target.model_validate(document), SpecDocument(Path.cwd() / LOCAL)
    else:
        target, target_doc = load_spec(target_file, Target, local_machine)
    return LoadedJob(job, target, job_doc, target_doc, resolve_files(job, target, job_doc, target_doc))


def _check_auto_batch(job: Job, doc: SpecDocument) -> None:
    """``batch_size: auto`` trades latency for throughput: only inference jobs that optimize throughput choose it."""
    if job.model.batch_size != AUTO_BATCH:
        return
    if job.task is not Task.inference:
        raise doc.error(("model", "batch_size"), "'auto' is for inference; a training job's batch size changes "
                                                 "what it learns: give a number")
    if job.objective.metric is not Metric.throughput:
        raise doc.error(("model", "batch_size"), f"'auto' chooses the batch with the most samples per second, so it "
                                                 f"needs objective.metric throughput (not "
                                                 f"{job.objective.metric.value}): give a number")


def load_spec(path: str | Path, model: type[M], local_machine: LocalMachine | None = None) -> tuple[M, SpecDocument]:
    """Parse and validate one spec file as ``model`` (a Target's ``cpu: local`` from ``local_machine``)."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputError("file not found", path) from None
    except IsADirectoryError:
        raise InputError("is a directory, expected a YAML file", path) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"cannot read: {exc}", path) from None
    data, lines = parse_yaml(text, path)
    doc = SpecDocument(path, lines)
    if not isinstance(data, dict):
        raise doc.error((), f"expected a mapping with apiVersion/kind, got {type(data).__name__}")
    kind = model.__name__
    if data.get("kind") not in (None, kind) and isinstance(data.get("kind"), str):
        raise doc.error(("kind",), f"expected kind '{kind}', got '{data['kind']}'")
    if model is Target and data.get("cpu") == LOCAL:
        if local_machine is None:
            raise doc.error(("cpu",), "'cpu: local' is not available here")
        data = {**local_machine(), **{k: v for k, v in data.items() if k != "cpu"}}
    try:
        return model.model_validate(data), doc
    except ValidationError as exc:
        raise _first_error(exc, doc, model) from None


def parse_yaml(text: str, path: Path) -> tuple[Any, dict[Loc, int]]:
    """YAML to plain data plus a map from key path to 1-based line; duplicate keys are errors."""
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        problem = getattr(exc, "problem", None) or str(exc)
        raise InputError(f"YAML syntax error: {problem}", path, mark.line + 1 if mark else None) from None
    if node is None:
        raise InputError("empty file", path)
    lines: dict[Loc, int] = {}
    _index_lines(node, (), lines, path)
    loader = yaml.SafeLoader("")
    try:
        data = loader.construct_document(node)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        raise InputError(f"YAML error: {getattr(exc, 'problem', exc)}", path, mark.line + 1 if mark else None) from None
    finally:
        loader.dispose()
    return data, lines


def _index_lines(node: yaml.Node, loc: Loc, lines: dict[Loc, int], path: Path) -> None:
    lines[loc] = node.start_mark.line + 1
    if isinstance(node, yaml.MappingNode):
        seen: set[Any] = set()
        for key_node, value_node in node.value:
            key = key_node.value
            if key in seen:
                raise InputError("duplicate key", path, key_node.start_mark.line + 1, dotted(loc + (key,)))
            seen.add(key)
            _index_lines(value_node, loc + (key,), lines, path)
            lines[loc + (key,)] = key_node.start_mark.line + 1
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            _index_lines(item, loc + (index,), lines, path)


def _first_error(exc: ValidationError, doc: SpecDocument, model: type[BaseModel]) -> InputError:
    """The first validation error, located and phrased for a person."""
    # An unknown field is usually a typo that also causes a "missing" error: report the typo first.
    errors = sorted(exc.errors(), key=lambda e: (e["type"] != "extra_forbidden", doc.line_of(_clean_loc(e["loc"])) or 0))
    error = errors[0]
    loc = _clean_loc(error["loc"])
    kind = error["type"]
    if kind == "extra_forbidden":
        known = _field_names(model, loc[:-1])
        return doc.error(loc, f"unknown field{did_you_mean(str(loc[-1]), known, cutoff=0.6)}")
    if kind == "missing":
        return doc.error(loc, "required field is missing")
    message = error["msg"]
    if kind == "string_pattern_mismatch":
        message = (f"invalid value {error['input']!r}: this field ends up in image tags, labels or scheduler "
                   "directives, so only letters, digits and . _ - (and / : @ in references) are allowed")
    elif kind in ("literal_error", "enum"):
        message = f"expected {message.removeprefix('Input should be ')}, got {error.get('input')!r}"
    elif kind == "value_error":
        message = message.removeprefix("Value error, ")
    return doc.error(loc, message)


def _clean_loc(loc: tuple[Any, ...]) -> Loc:
    """Drop pydantic's union-branch markers (e.g. ``list[...]``, ``constrained-int``) from an error location."""
    return tuple(p for p in loc
                 if isinstance(p, int) or not ("[" in p or "function-" in p or p.startswith("constrained-")))


def _field_names(model: type[BaseModel], loc: Loc) -> list[str]:
    """Field names of the model reached by following ``loc`` from ``model``."""
    current: Any = model
    for part in loc:
        current = _descend(current, part)
        if current is None:
            return []
    models = [t for t in _flatten(current) if isinstance(t, type) and issubclass(t, BaseModel)]
    return [name for m in models for name in m.model_fields]


def _descend(annotation: Any, part: str | int) -> Any:
    for option in _flatten(annotation):
        if isinstance(option, type) and issubclass(option, BaseModel) and isinstance(part, str):
            if part in option.model_fields:
                return option.model_fields[part].annotation
        origin = typing.get_origin(option)
        if origin is list and isinstance(part, int):
            return typing.get_args(option)[0]
        if origin is dict and isinstance(part, str):
            return typing.get_args(option)[1]
    return None


def _flatten(annotation: Any) -> list[Any]:
    """The alternatives of a union (or the annotation itself), with ``Annotated`` unwrapped."""
    if typing.get_origin(annotation) is typing.Annotated:
        annotation = typing.get_args(annotation)[0]
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return [a for arg in typing.get_args(annotation) for a in _flatten(arg)]
    return [annotation]
