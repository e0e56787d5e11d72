"""Kernel rows: the operator-level model's labels (#40), one per kernel of a profiled launch, and the
reconciliation of each profiled launch with its candidate's unprofiled step time.

A profiled launch runs beside the timed launches of a candidate, never mixed with them (profiling inflates
times); its :class:`modak.image.kernels.Profile` becomes one :class:`KernelRow` per kernel and one
:class:`Reconciliation` (:func:`modak.measurements.profiles.kernel_rows`). Both carry the machine with its ceilings
(:data:`CEILINGS`, as its Measurement has them: the kernel model needs no whole-model row of it), runtime, threads
and precision they were measured at.

Both are rows of the perf store (:meth:`modak.measurements.store.PerfStore.add_kernels`) and of CSV files
(``perfmodels/kernels-<machine>.csv``, ``perfmodels/reconcile-<machine>.csv``), one format each: a column per
field, the kernel's as ``kind, op, nodes, shapes, attributes, flops, bytes`` (``nodes`` and ``shapes`` as JSON), an
absent bf16 peak or GPU as an empty field.
A damaged file is an :class:`~modak.errors.InputError` naming its file, line and column.
"""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Generic, TypeVar

from modak.errors import InputError, did_you_mean
from modak.image.kernels import OP_CLASSES, Kernel
from modak.limits import MAX_CSV_BYTES, check_size


@dataclass(frozen=True)
class KernelRow:
    """The time one step of a candidate spent in one kernel, on one machine."""

    machine: str  # the perf store's machine name (as Measurement.machine)
    # the machine's ceilings, as its Measurement has them (the kernel model's roofline terms; a machine measured by
    # kernel probes alone has no whole-model row to take them from)
    microarchitecture: str
    cores: int
    peak_fp32_gflops: float
    peak_bf16_gflops: float | None
    bandwidth_gbs: float
    gpu: str | None
    runtime: str
    device: str  # "cpu" or "gpu"
    threads: int  # 0: the candidate sets none (Measurement.threads None)
    precision: str
    params: str  # JSON: the candidate's parameters (as Measurement.params)
    model: str  # the workload it was profiled in (a kernel's time does not depend on it; splits do)
    batch_size: int
    kernel: Kernel
    seconds: float  # per step, summed over its calls
    calls: int
    source: str  # what reported it (Profile.source)
    session: str  # the bench session (as Measurement.session)
    measured_at: str
    task: str = "inference"  # the workload's task (as Measurement.task): training steps run backward kernels too


@dataclass(frozen=True)
class Reconciliation:
    """One profiled launch against its candidate's unprofiled step: what the kernels add up to, what the
    runtime reported outside any kernel, and the step time profiling did not see."""

    machine: str
    microarchitecture: str  # the machine's ceilings (as KernelRow)
    cores: int
    peak_fp32_gflops: float
    peak_bf16_gflops: float | None
    bandwidth_gbs: float
    gpu: str | None
    runtime: str
    device: str
    threads: int
    precision: str
    params: str
    model: str
    batch_size: int
    step_s: float  # the candidate's unprofiled median step (its Measurement)
    profiled_step_s: float  # the profiled launch's step wall time
    kernel_s: float  # the sum over its kernel rows
    unmapped_s: float  # Profile.unmapped_seconds
    kernels: int  # how many kernel rows
    source: str
    session: str
    measured_at: str
    task: str = "inference"


KERNEL_FIELDS = ("kind", "op", "nodes", "shapes", "attributes", "flops", "bytes")  # a KernelRow's kernel, flattened
KERNEL_COLUMNS = tuple(column for f in fields(KernelRow)
                       for column in (KERNEL_FIELDS if f.name == "kernel" else (f.name,)))
RECONCILE_COLUMNS = tuple(f.name for f in fields(Reconciliation))
CONFIGURATION = ("machine", "runtime", "device", "threads", "precision", "params", "model", "batch_size", "task")
"""The columns of a profiled configuration: its kernel rows and its reconciliation (a new profile replaces them)."""
# The model name of the rows of one layer cut out of a zoo model by ``modak probe --kernels`` (each layer its own
# configuration): its reconciliation is a one-layer session's, no model's step (:func:`whole_step`).
PROBE_MODEL_PREFIX = "probe-"
KERNEL_CSV = "kernels-{machine}.csv"  # the CSV files of one machine's rows (perfmodels/)
RECONCILE_CSV = "reconcile-{machine}.csv"

CEILINGS = ("microarchitecture", "cores", "peak_fp32_gflops", "peak_bf16_gflops", "bandwidth_gbs", "gpu")
"""The machine columns a kernel row and a reconciliation carry, named and typed as a Measurement's."""
OPTIONAL = frozenset({"peak_bf16_gflops", "gpu"})  # columns that may be empty (None): no bf16 peak, no GPU

_INTEGERS = {"threads": 0, "batch_size": 1, "calls": 1, "kernels": 0, "cores": 1}  # column -> its least value
_TIMES = {"seconds", "kernel_s", "unmapped_s"}  # seconds, not negative
_STEPS = {"step_s", "profiled_step_s"}  # seconds, positive
_AMOUNTS = {"flops", "bytes"}  # not negative
_RATES = {"peak_fp32_gflops", "peak_bf16_gflops", "bandwidth_gbs"}  # ceilings, positive
_TEXTS = {"machine", "runtime", "device", "precision", "model", "task", "kind", "microarchitecture"}  # not empty


def column_type(column: str) -> str:
    """The SQLite type of a kernel or reconciliation column."""
    return "INTEGER" if column in _INTEGERS else "REAL" if column in _TIMES | _STEPS | _AMOUNTS | _RATES else "TEXT"


def kernel_record(row: KernelRow) -> dict[str, Any]:
    """``row`` as its columns' values (:data:`KERNEL_COLUMNS`; ``nodes`` and ``shapes`` as JSON)."""
    kernel = row.kernel
    values = {f.name: getattr(row, f.name) for f in fields(KernelRow) if f.name != "kernel"}
    values.update(kind=kernel.kind, op=kernel.op, nodes=_json(list(kernel.nodes)),
                  shapes=_json([list(s) for s in kernel.shapes]), attributes=kernel.attributes,
                  flops=float(kernel.flops), bytes=float(kernel.bytes))
    return {column: values[column] for column in KERNEL_COLUMNS}


def kernel_from_record(values: Mapping[str, Any]) -> KernelRow:
    """The row of :func:`kernel_record`'s values."""
    kernel = Kernel(kind=values["kind"], op=values["op"], nodes=tuple(json.loads(values["nodes"])),
                    shapes=tuple(tuple(int(d) for d in s) for s in json.loads(values["shapes"])),
                    attributes=values["attributes"], flops=float(values["flops"]), bytes=float(values["bytes"]))
    return KernelRow(kernel=kernel, **{f.name: values[f.name] for f in fields(KernelRow) if f.name != "kernel"})


def reconcile_record(row: Reconciliation) -> dict[str, Any]:
    """``row`` as its columns' values (:data:`RECONCILE_COLUMNS`)."""
    return {column: getattr(row, column) for column in RECONCILE_COLUMNS}


def reconcile_from_record(values: Mapping[str, Any]) -> Reconciliation:
    return Reconciliation(**{column: values[column] for column in RECONCILE_COLUMNS})


Row = TypeVar("Row", KernelRow, Reconciliation)


@dataclass(frozen=True)
class _Format(Generic[Row]):
    """One CSV format: its columns and the conversions of a row to and from their values."""

    what: str
    columns: tuple[str, ...]
    record: Callable[[Row], dict[str, Any]]
    build: Callable[[Mapping[str, Any]], Row]


KERNELS = _Format("kernel rows", KERNEL_COLUMNS, kernel_record, kernel_from_record)
RECONCILIATIONS = _Format("reconciliations", RECONCILE_COLUMNS, reconcile_record, reconcile_from_record)


def write_kernel_csv(path: Path, rows: Iterable[KernelRow]) -> int:
    """Write kernel rows as CSV of :data:`KERNEL_COLUMNS`, atomically; how many."""
    return _write(path, KERNELS, rows)


def read_kernel_csv(path: Path) -> list[KernelRow]:
    """The kernel rows of a CSV file :func:`write_kernel_csv` wrote; a damaged file is an :class:`InputError` naming
    its file, line and column."""
    return _read(path, KERNELS)


def write_reconcile_csv(path: Path, rows: Iterable[Reconciliation]) -> int:
    """Write reconciliations as CSV of :data:`RECONCILE_COLUMNS`, atomically; how many."""
    return _write(path, RECONCILIATIONS, rows)


def read_reconcile_csv(path: Path) -> list[Reconciliation]:
    """The reconciliations of a CSV file :func:`write_reconcile_csv` wrote; a damaged file is an
    :class:`InputError` naming its file, line and column."""
    return _read(path, RECONCILIATIONS)


def read_labels_csv(path: Path) -> tuple[list[KernelRow], list[Reconciliation]]:
    """The rows of a CSV file of either format (told apart by its header: the format most of its columns are of)."""
    header = set(_header(path))
    if len(header & set(RECONCILE_COLUMNS)) > len(header & set(KERNEL_COLUMNS)):
        return [], read_reconcile_csv(path)
    return read_kernel_csv(path), []


def is_label_csv(path: Path) -> bool:
    """Whether ``path`` is named as a kernel or reconciliation CSV file (not a file of measurements)."""
    return any(path.name.startswith(pattern.split("{")[0]) for pattern in (KERNEL_CSV, RECONCILE_CSV))


def _json(value: object) -> str:
    return json.dumps(value, separators=(",", ":"))


def _write(path: Path, form: _Format[Row], rows: Iterable[Row]) -> int:
    from modak.paths import write_atomic

    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n", quoting=csv.QUOTE_NONNUMERIC)  # text quoted: a "\r" too
    writer.writerow(form.columns)
    count = 0
    for row in rows:
        writer.writerow(form.record(row)[c] for c in form.columns)
        count += 1
    write_atomic(path, buffer.getvalue())
    return count


def _header(path: Path) -> list[str]:
    with _open(path) as handle:
        try:
            return next(csv.reader(handle), [])
        except (csv.Error, UnicodeDecodeError) as exc:
            raise InputError(f"not a CSV file: {exc}", path, 1) from None


def _open(path: Path) -> io.TextIOWrapper:
    check_size(path, MAX_CSV_BYTES, "the CSV file")
    try:
        return open(path, newline="", encoding="utf-8")
    except FileNotFoundError:
        raise InputError("file not found", path) from None
    except OSError as exc:
        raise InputError(f"cannot read: {exc.strerror or exc}", path) from None


def _read(path: Path, form: _Format[Row]) -> list[Row]:
    with _open(path) as handle:
        reader = csv.DictReader(handle)
        try:
            present = reader.fieldnames or []
            missing = [c for c in form.columns if c not in present]
            if missing:
                raise InputError(f"not a CSV file of {form.what}: missing column{'s' if len(missing) > 1 else ''} "
                                 f"{', '.join(missing)}", path, 1, missing[0])
            rows = []
            for record in reader:
                values = {c: _value(c, record.get(c), path, reader.line_num) for c in form.columns}
                rows.append(form.build(values))
            return rows
        except (csv.Error, UnicodeDecodeError) as exc:
            raise InputError(f"not a CSV file of {form.what}: {exc}", path, reader.line_num + 1) from None


def _value(column: str, text: str | None, path: Path, line: int) -> Any:
    """One field's value; a value its column cannot hold is an error at ``line`` naming ``column``."""
    if text is None:
        raise InputError("fewer fields than columns", path, line, column)
    if column in OPTIONAL and text == "":
        return None

    def bad(message: str) -> InputError:
        return InputError(f"{message}, got {text[:40]!r}", path, line, column)

    if column in _INTEGERS:
        try:
            number = int(text)
        except ValueError:
            raise bad("expected an integer") from None
        if number < _INTEGERS[column]:
            raise bad(f"expected at least {_INTEGERS[column]}")
        return number
    if column in _TIMES | _STEPS | _AMOUNTS | _RATES:
        try:
            value = float(text)
        except ValueError:
            raise bad("expected a number") from None
        if not math.isfinite(value):
            raise bad("expected a finite number")
        if column in _STEPS and value <= 0:
            raise bad("expected a positive number of seconds")
        if column in _RATES and value <= 0:
            raise bad("expected a positive ceiling")
        if value < 0:
            raise bad("a time cannot be negative" if column in _TIMES else "expected a number not negative")
        return value
    if column in _TEXTS and not text:
        raise bad("expected a value")
    if column == "op" and text not in OP_CLASSES:
        raise InputError(f"unknown op class {text[:40]!r}{did_you_mean(text, OP_CLASSES)}", path, line, column)
    if column in _JSON_CHECKS:
        try:
            decoded = json.loads(text)
        except ValueError:
            raise bad("expected JSON") from None
        if not _JSON_CHECKS[column][0](decoded):
            raise bad(f"expected JSON of {_JSON_CHECKS[column][1]}")
    return text


def _is_shape(value: object) -> bool:
    return isinstance(value, list) and all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in value)


_JSON_CHECKS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "nodes": (lambda v: isinstance(v, list) and all(isinstance(n, str) for n in v), "a list of node names"),
    "shapes": (lambda v: isinstance(v, list) and all(_is_shape(s) for s in v), "a list of shapes (lists of sizes)"),
    "attributes": (lambda v: isinstance(v, dict), "an object"),
    "params": (lambda v: isinstance(v, dict), "an object"),
}


def whole_step(reconciliation: Reconciliation) -> bool:
    """Whether ``reconciliation`` is a whole model's step, not a probed layer's (:data:`PROBE_MODEL_PREFIX`)."""
    return not reconciliation.model.startswith(PROBE_MODEL_PREFIX)


def probed_from(model: str) -> str:
    """The model a row's kernels were measured in: a probe layer's zoo model, as its name
    ``probe-<model>-<runtime>-<digest>`` says; any other row's own model."""
    return model[len(PROBE_MODEL_PREFIX):].split("-", 1)[0] if model.startswith(PROBE_MODEL_PREFIX) else model
