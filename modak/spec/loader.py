"""Load Job/Target YAML into typed models; every problem becomes one ``FILE:LINE: field: message``."""

from __future__ import annotations

import enum
import re
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import msgspec
import yaml

from modak.errors import InputError, did_you_mean
from modak.limits import MAX_SPEC_BYTES, MAX_STRING_CHARS, MAX_YAML_CHARS, MAX_YAML_DEPTH, MAX_YAML_NODES, read_bounded
from modak.paths import data_dir
from modak.spec.document import Loc, SpecDocument, dotted
from modak.spec.fields import PATTERN_MESSAGE, PATTERN_MESSAGES
from modak.spec.models import AUTO_BATCH, Job, Metric, Task
from modak.spec.resolve import ResolvedFiles, resolve_files
from modak.spec.target import Target

M = TypeVar("M", bound=msgspec.Struct)
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

    @property
    def here(self) -> bool:
        """Whether the target is the machine modak runs on, where it can measure the candidates itself."""
        return self.target_doc.local


def load_job(job_path: str | Path, target_path: str | Path | None = None,
             local_machine: LocalMachine | None = None) -> LoadedJob:
    """Load a job and its target (``target_path`` overrides the job's ``target`` field), then resolve and check
    every file they refer to (:func:`modak.spec.resolve.resolve_files`). ``local_machine`` describes the machine
    modak runs on, for a target ``local`` and a target file's ``cpu: local``."""
    job, job_doc = load_spec(job_path, Job)
    _check_auto_batch(job, job_doc)
    if job.loss is not None and job.task is not Task.training:
        raise job_doc.error(("loss",), "the loss is what a training step measures: an inference job has none")
    if job.scaling is not None and job.task is not Task.training:
        raise job_doc.error(("scaling",), "data-parallel scaling is for training jobs (an inference job scales by "
                                          "running more replicas, each its own job)")
    if job.scaling is not None and not (job.entrypoint and job.entrypoint.command):
        raise job_doc.error(("scaling",), "scaling runs the job's own training script once per worker (torchrun "
                                          "gives each process RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR); modak's "
                                          "runner trains in one process: give entrypoint.command")
    if target_path is None:
        if job.target is None:
            raise job_doc.error((), "no target: add a 'target:' field or pass --target FILE (or 'local')")
        target_file = Path(LOCAL) if job.target == LOCAL else job_doc.resolve(job.target, ("target",))
        if job.target != LOCAL and not target_file.is_file():
            raise job_doc.error(("target",), f"target file not found: {target_file}")
    else:
        target_file = Path(target_path)
    if str(target_file) == LOCAL and not target_file.exists():
        if local_machine is None:
            raise job_doc.error(("target",), "target 'local' is not available here")
        document = {"apiVersion": "modak/v1", "kind": "Target", "name": LOCAL, **local_machine()}
        target, target_doc = validate(document, Target), SpecDocument(Path.cwd() / LOCAL, local=True)
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
    """Parse and validate one spec file as ``model``, within the limits of :mod:`modak.limits` (a Target's
    ``cpu: local`` from ``local_machine``)."""
    path = Path(path)
    raw = read_bounded(path, MAX_SPEC_BYTES, "a YAML spec file")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"not UTF-8 text: {exc.reason} at byte {exc.start}", path,
                         raw[:exc.start].count(b"\n") + 1) from None
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
        doc = SpecDocument(path, lines, local=True)
    try:
        return validate(data, model), doc
    except msgspec.ValidationError as exc:
        raise _located(exc, doc, model, data) from None


def validate(data: Any, model: type[M]) -> M:
    """``data`` (plain YAML/JSON values, or specs) as a ``model``: every field's type and constraints and the
    model's own checks; a problem raises :class:`msgspec.ValidationError` (the loader locates it in its file)."""
    return msgspec.convert(data, model)


def read_catalog(name: str) -> Any:
    """A shipped catalog file under ``recipes/`` (trusted data, not user input), e.g. ``hardware/cpus.yaml``."""
    return yaml.load((data_dir("recipes") / name).read_text(encoding="utf-8"), Loader=_Loader)


def parse_yaml(text: str, path: Path) -> tuple[Any, dict[Loc, int]]:
    """YAML to plain data plus a map from key path to 1-based line; duplicate keys are errors, and so is a
    document beyond the limits of :mod:`modak.limits` (checked before anything is constructed)."""
    try:
        _check_structure(text, path)  # checks that every character is printable
        loader = _Loader(text)
        node = loader.get_single_node()
    except yaml.reader.ReaderError as exc:
        raise InputError(f"YAML syntax error: character U+{exc.character:04X} is not allowed", path,
                         text.count("\n", 0, exc.position) + 1) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        problem = getattr(exc, "problem", None) or str(exc)
        raise InputError(f"YAML syntax error: {problem}", path, mark.line + 1 if mark else None) from None
    try:
        if node is None:
            raise InputError("empty file", path)
        lines: dict[Loc, int] = {}
        _index_lines(node, (), lines, path, _Budget(), ())
        data = loader.construct_document(node)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        raise InputError(f"YAML error: {getattr(exc, 'problem', exc)}", path, mark.line + 1 if mark else None) from None
    except (ValueError, IndexError, TypeError, OverflowError) as exc:  # a tagged value its tag cannot read: !!float ''
        raise InputError(f"YAML error: a tagged value cannot be read ({type(exc).__name__}: {exc})", path) from None
    finally:
        loader.dispose()
    return data, lines


# libyaml's parser where PyYAML has it (about 10x faster than the pure-Python one), the same safe constructor.
_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _check_structure(text: str, path: Path) -> None:
    """Refuse a document of more than :data:`MAX_YAML_NODES` nodes (aliases not expanded) or nested deeper than
    :data:`MAX_YAML_DEPTH`, from its event stream: the parser keeps its own stack, while composing recurses, so
    depth must be refused before anything is composed."""
    loader = _Loader(text)
    depth = nodes = 0
    try:
        while (event := loader.get_event()) is not None and not isinstance(event, yaml.StreamEndEvent):
            if isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
                depth -= 1
                continue
            if isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
                depth += 1
            elif not isinstance(event, (yaml.ScalarEvent, yaml.AliasEvent)):
                continue
            nodes += 1
            if depth > MAX_YAML_DEPTH or nodes > MAX_YAML_NODES:
                what = (f"nested deeper than {MAX_YAML_DEPTH} levels" if depth > MAX_YAML_DEPTH
                        else f"more than {MAX_YAML_NODES:,} YAML nodes")
                raise InputError(f"{what} (the limit of a spec file)", path, event.start_mark.line + 1)
    finally:
        loader.dispose()


@dataclass
class _Budget:
    """What the walk over a document has used so far, aliases expanded."""

    nodes: int = 0
    chars: int = 0


def _index_lines(node: yaml.Node, loc: Loc, lines: dict[Loc, int], path: Path, budget: _Budget,
                 parents: tuple[yaml.Node, ...]) -> None:
    """Record the line of every key path under ``node``, expanding aliases (an alias is its anchor's node
    object again) within the limits of :mod:`modak.limits`."""
    line = node.start_mark.line + 1
    field = dotted(loc) or None
    if any(node is parent for parent in parents):
        raise InputError("an alias refers to a node that contains it (a recursive structure)", path, line, field)
    budget.nodes += 1
    if len(parents) >= MAX_YAML_DEPTH:
        raise InputError(f"nested deeper than {MAX_YAML_DEPTH} levels, aliases expanded (the limit of a spec file)",
                         path, line, field)
    if budget.nodes > MAX_YAML_NODES:
        raise InputError(f"more than {MAX_YAML_NODES:,} YAML nodes, aliases expanded (the limit of a spec file)",
                         path, line, field)
    lines[loc] = line
    parents = parents + (node,)
    if isinstance(node, yaml.ScalarNode):
        _check_string(node, path, loc, budget)
    elif isinstance(node, yaml.MappingNode):
        seen: set[str] = set()
        for key_node, value_node in node.value:
            if not isinstance(key_node, yaml.ScalarNode):
                raise InputError("a key must be a plain value, not a mapping or a list", path,
                                 key_node.start_mark.line + 1, field)
            _check_string(key_node, path, loc, budget)
            key = key_node.value
            if key in seen:
                raise InputError("duplicate key", path, key_node.start_mark.line + 1, dotted(loc + (key,)))
            seen.add(key)
            _index_lines(value_node, loc + (key,), lines, path, budget, parents)
            lines[loc + (key,)] = key_node.start_mark.line + 1
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            _index_lines(item, loc + (index,), lines, path, budget, parents)


def _check_string(node: yaml.ScalarNode, path: Path, loc: Loc, budget: _Budget) -> None:
    """Count a scalar's characters; refuse one longer than :data:`MAX_STRING_CHARS` or a document whose strings
    add up to more than :data:`MAX_YAML_CHARS`."""
    budget.chars += len(node.value)
    if len(node.value) > MAX_STRING_CHARS:
        problem = f"a string of {len(node.value):,} characters, more than the limit of {MAX_STRING_CHARS:,}"
    elif budget.chars > MAX_YAML_CHARS:
        problem = f"more than {MAX_YAML_CHARS:,} characters of strings, aliases expanded (the limit of a spec file)"
    else:
        return
    raise InputError(problem, path, node.start_mark.line + 1, dotted(loc) or None)


# msgspec's message: what is wrong, then where (`` - at `$.a.b[0]` ``; a mapping's key: `` - at `key` in `$.a` ``).
_WHERE = re.compile(r"^(?P<message>.*?)(?: - at (?P<key>`key` in )?`(?P<path>\$[^`]*)`)?$", re.DOTALL)
_STEP = re.compile(r"\.([A-Za-z_][A-Za-z0-9_]*)|\[(\d+|\.\.\.)\]")
_FIELD = re.compile(r"^Object (contains unknown|missing required) field `(?P<name>[^`]*)`$")
_PATTERN = re.compile(r"^Expected `str` matching regex (?P<pattern>.*)$", re.DOTALL)  # the pattern's repr()
_PATTERN_MESSAGES = {repr(pattern): message for pattern, message in PATTERN_MESSAGES.items()}
_TYPE = re.compile(r"`([a-z| ]+)`")  # msgspec's names of kinds of value, e.g. `int | null`
_TYPE_WORDS = {"int": "an integer", "float": "a number", "str": "a string", "bool": "true or false", "null": "null",
               "array": "a list", "object": "a mapping"}


def _located(exc: msgspec.ValidationError, doc: SpecDocument, model: type[msgspec.Struct], data: Any) -> InputError:
    """The validation error, located in ``doc`` and phrased for a person. An unknown field is reported first, the
    earliest in the file: it is usually a typo that causes the other errors (a required field missing)."""
    unknown = sorted(_unknown_fields(model, data, ()), key=lambda loc: doc.line_of(loc) or 0)
    if unknown:
        loc = unknown[0]
        fields = _field_names(_annotation_at(model, loc[:-1]))
        return doc.error(loc, f"unknown field{did_you_mean(str(loc[-1]), fields, cutoff=0.6)}")
    where = _WHERE.match(str(exc))
    assert where is not None  # the pattern matches any text
    message = where["message"]
    loc, annotation, value = _follow(model, data, where["path"] or "$", bool(where["key"]))
    if field := _FIELD.match(message):  # a missing one (the unknown ones are found above)
        return doc.error(loc + (field["name"],), "required field is missing")
    if pattern := _PATTERN.match(message):
        known = _PATTERN_MESSAGES.get(pattern["pattern"])
        message = f"{known}, got {value!r}" if known else f"invalid value {value!r}: {PATTERN_MESSAGE}"
    elif message.startswith("Invalid enum value"):
        message = f"expected {_alternatives(annotation)}, got {value!r}"
    elif message.startswith("Expected "):
        message = _TYPE.sub(lambda m: " or ".join(_TYPE_WORDS.get(t, t) for t in m[1].split(" | ")),
                            message.replace("Expected ", "expected ", 1))
        if ", got " not in message:
            message += f", got {value!r}"
    return doc.error(loc, message)


def _follow(model: Any, data: Any, path: str, key: bool) -> tuple[Loc, Any, Any]:
    """msgspec's error ``path`` into ``data`` as a location, with the annotation and the value found there. A
    mapping's entry (``[...]``, or its key where ``key``) is the first of its entries that fails alone."""
    loc: list[str | int] = []
    annotation: Any = model
    steps: list[Any] = [m[1] or (int(m[2]) if m[2].isdigit() else ...) for m in _STEP.finditer(path)]
    for step in steps + ([...] if key else []):
        if step is ...:
            mapping = _mapping_of(annotation)
            step = next((k for k in data if _fails({k: data[k]}, mapping)), None) if isinstance(data, dict) else None
            if step is None:
                break
        loc.append(step)
        annotation = _descend(annotation, step)
        if isinstance(data, dict):
            data = data.get(step)
        else:
            data = data[step] if isinstance(data, list) and isinstance(step, int) and 0 <= step < len(data) else None
    return tuple(loc), annotation, data


def _unknown_fields(annotation: Any, data: Any, loc: Loc) -> list[Loc]:
    """Every key of ``data`` that no spec model on its way has as a field."""
    found: list[Loc] = []
    if isinstance(data, dict):
        fields = _field_names(annotation)  # none: a mapping of any keys
        for key, value in data.items():
            if fields and key not in fields:
                found.append(loc + (key,))
            else:
                found += _unknown_fields(_descend(annotation, str(key)), value, loc + (key,))
    elif isinstance(data, list):
        for index, value in enumerate(data):
            found += _unknown_fields(_descend(annotation, index), value, loc + (index,))
    return found


def _annotation_at(model: Any, loc: Loc) -> Any:
    annotation = model
    for part in loc:
        annotation = _descend(annotation, part)
    return annotation


def _fails(data: Any, annotation: Any) -> bool:
    try:
        msgspec.convert(data, annotation)
    except msgspec.ValidationError:
        return True
    return False


def _mapping_of(annotation: Any) -> Any:
    """The ``dict[...]`` alternative of ``annotation`` (``dict[str, Any]`` if it has none)."""
    return next((a for a in _flatten(annotation) if typing.get_origin(a) is dict), dict[str, Any])


_KINDS = {kind: _TYPE_WORDS[name] for kind, name in ((int, "int"), (float, "float"), (str, "str"), (bool, "bool"),
                                                      (list, "array"), (tuple, "array"), (dict, "object"))}


def _alternatives(annotation: Any) -> str:
    """What ``annotation`` accepts, for a person: its literal values and kinds of value."""
    words: list[str] = []
    for option in _flatten(annotation):
        if typing.get_origin(option) is typing.Literal:
            words += [repr(v) for v in typing.get_args(option)]
        elif isinstance(option, type) and issubclass(option, enum.Enum):
            words += [repr(member.value) for member in option]
        elif isinstance(option, type) and issubclass(option, msgspec.Struct):
            words.append("a mapping")
        elif (kind := _KINDS.get(typing.get_origin(option) or option)) is not None:
            words.append(kind)
    return " or ".join(", ".join(words).rsplit(", ", 1)) if words else "another value"


def _field_names(annotation: Any) -> list[str]:
    """Field names of the spec models ``annotation`` may be."""
    return [f.encode_name for m in _flatten(annotation) if isinstance(m, type) and issubclass(m, msgspec.Struct)
            for f in msgspec.structs.fields(m)]


def _descend(annotation: Any, part: str | int) -> Any:
    for option in _flatten(annotation):
        if isinstance(option, type) and issubclass(option, msgspec.Struct) and isinstance(part, str):
            for f in msgspec.structs.fields(option):
                if f.encode_name == part:
                    return f.type
        origin = typing.get_origin(option)
        if origin in (list, tuple) and isinstance(part, int):
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
