"""The operator-level performance model (#40): a step composed from the kernels its runtime runs.

A kernel's time per call is an additive roofline prior times a learned correction, per (runtime, device, kernel
kind). The prior is ``c + a * compute_s + b * memory_s``: a fixed cost per call and the kernel's roofline terms on
the machine's measured ceilings at the candidate's threads and precision (compute: FLOPs / the peak share of its
threads; memory: bytes / the bandwidth share), fit non-negative to the kind's profiled calls in relative error
(:func:`prior_coefficients`). A small random forest then learns log(measured / prior) from the kernel's size
relative to the machine (:func:`features`). The prior grows with the kernel's work and the correction is bounded by
what it was fit on, so a kernel larger than its kind's profiles extrapolates along its roofline, not by a learned
ratio. Only a share of the correction is applied (:data:`CORRECTION_SHARES`), chosen per kind on its own rows by
folds of whole models (:func:`correction_share`): a correction that splits on one zoo's shapes may not transfer to a
model unlike them. A kernel past :data:`EXTRAPOLATION_LIMIT` times its kind's largest profiled FLOPs or bytes, or
that factor outside the range of its profiled FLOPs per byte (where its kind's calls could not tell compute from
memory time), is extrapolated. ``a`` and ``b`` are relative to the ceilings, so they transfer to a machine with other
ceilings.

Each op class (:data:`modak.image.kernels.OP_CLASSES`) of a runtime and device also has a model pooled over its kinds'
rows (:func:`class_kind`). It answers a kernel that its kind would extrapolate and the pool would not (OpenVINO's
depthwise convolutions at batch 8, profiled only at batch 1). A step is not composed where extrapolated kernels hold
more than :data:`EXTRAPOLATED_SHARE` of its kernel time. A kernel of a kind no profile has shown is not priced from
its class: such a kind marks a model unlike the profiled ones, whose other kernels the kind models price worse too
(perfmodels/README.md, "The fourteenth round").

A step is the sum over the kernels the runtime plans for it (:func:`modak.workload.kernels.planned_kernels`), plus a
dispatch time per kernel (per runtime and device: the median over the profiled launches' reconciliations of
(unprofiled step - kernel sum) / kernels, at least 0), times exp(the median calibration residual). The interval is the
10th to 90th percentile of the out-of-fold residuals log(measured step / composed step) of the reconciled steps
(kernel models fit without the step's model), of the candidate's parameters where they have enough steps, else of
its runtime and device. A step corrected by a measured run of its workload's runtime, device and precision
(:mod:`modak.predict.measured`) has the interval of such corrected steps out of fold (:func:`calibrate_runs`).

All of this is fit per machine kind (:class:`MachineModel`): a machine's steps are composed by its own kind's model.
A machine without kernel rows of its own is composed by the nearest known machine's model
(:meth:`MachineCeilings.distance`), transferred by its ceilings: its interval is widened by
:data:`modak.predict.learned.NEW_MACHINE_SPREAD` and the predictor's name says so.

Coverage: it answers only where the runtime and device have kernel rows at the candidate's precision, every
planned kernel's kind has a model for the runtime and device (no time is invented for a kernel no profile has
shown), little of the step is extrapolated, the kernels stand out of the
profiler's own cost per kernel (:data:`PROFILER_MARGIN`), the runtime and device's steps are
calibrated (at least :data:`MIN_CALIBRATION` residuals), and the task is inference (the planned kernels are the
forward graph's). Elsewhere it returns None, and the next predictor answers.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import json
import math
import os
import statistics
from array import array
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, cast

from modak.candidates.candidate import DeviceKind
from modak.candidates.catalog import Recipe
from modak.candidates.enumerate import Candidate
from modak.errors import InputError
from modak.hardware.ceilings import TargetCeilings
from modak.image.kernels import OP_CLASSES, Kernel
from modak.measurements.kernels import KernelRow, Reconciliation, probed_from, whole_step
from modak.measurements.store import Measurement
from modak.paths import write_atomic
from modak.predict import fits
from modak.predict.base import Prediction, PredictionRequest
from modak.predict.forest import TreeEnsemble, encode_arrays, load_arrays
from modak.predict.learned import NEW_MACHINE_SPREAD, Z80, machine_kind, machine_signature
from modak.predict.roofline import RooflinePredictor, op_seconds, thread_shares
from modak.spec.models import Precision, Task
from modak.workload.analysis import WorkloadProfile

if TYPE_CHECKING:
    from sklearn.ensemble import RandomForestRegressor

KERNEL_TREES = 30  # trees per kind's forest
# The shares of a kind's correction it may apply (0: the prior alone), and the folds of whole models that choose one
# on the kind's own rows; a kind profiled in fewer models than folds keeps the prior alone.
CORRECTION_SHARES = (0.0, 0.25, 0.5, 0.75, 1.0)
SHARE_FOLDS = 3
SHARE_TREES = 10  # trees per fold's forest: enough to choose among the shares, at a third of a fit's cost
# A kernel the profiler timed at 0 (ONNX Runtime and OpenVINO report whole microseconds) took under its resolution:
# it is learned as half of it.
RESOLUTION_FLOOR_S = 0.5e-6
FOLDS = 5  # calibration folds, by model
MIN_CALIBRATION = 5  # out-of-fold steps of a runtime and device before its interval is trusted
ROOFLINE_FLOOR_S = 1e-9  # the roofline time of a kernel with neither FLOPs nor bytes (its efficiency is its time)
# How far past the largest FLOPs or bytes of a kind's profiled calls a kernel of that kind is still answered
# (perfmodels/README.md, "Operator-level model": the sweep behind it).
EXTRAPOLATION_LIMIT = 4.0
EXTRAPOLATED_SHARE = 0.1  # of a step's kernel time, at most, in kernels past their kind's limit
RECURRENT_GATES = (3, 4)  # a GRU's and an LSTM's gates: the rows of their weights per hidden unit
# A kernel row measured this many times faster than its FLOPs allow at the machine's peak is not learned from: its
# row covers nodes the kernel did not run (perfmodels/README.md, "The twelfth round").
ATTRIBUTION_LIMIT = 3.0
# The weight that holds a kind's fixed cost per call to zero where its calls cannot tell it from the roofline terms
# (all of one size): a penalty of (c / median call) ** 2 times this, against the calls' squared relative errors.
FIXED_COST_PENALTY = 0.1
# A step whose kernels average under this many times the runtime's profiling cost per kernel is not composed from
# them: their profiled times are mostly the profiler's own (perfmodels/README.md, "Operator-level model").
PROFILER_MARGIN = 2.0
# The runtimes whose kernels at plan time are the kernels their profiles show, by construction (one mapping of
# the runtime's own graph per runtime: ONNX Runtime's optimized graph, OpenVINO's runtime model, PyTorch's
# dispatched aten ops on fake CPU tensors). torch.compile's profiles are Inductor's fused kernels, which its plan
# (the eager ops) does not name: the forest answers for it.
PLANNED_AS_PROFILED = frozenset({"onnxruntime", "openvino", "pytorch"})
PREDICTOR = "kernels"  # its name in plans, and its fits' (modak.predict.fits)
FIT_FORMAT = 1  # raise when a fit of the same rows would give other arrays (the key of shipped and cached fits)
TRANSFER_PREDICTOR = "kernels-transfer"  # on a machine without kernel rows, by its ceilings
# What each name means, for the plan's reasons.
NOTES = {PREDICTOR: f"{PREDICTOR}: the sum over the kernels the runtime plans for the step, each of a kind profiled "
                    "on this machine",
         TRANSFER_PREDICTOR: f"{TRANSFER_PREDICTOR}: the same from the nearest profiled machine's kernel rows, by "
                             "the ceilings, with a wider interval"}

KindKey = tuple[str, str, str]  # runtime, device, kernel kind
RuntimeKey = tuple[str, str]  # runtime, device
Corrections = dict[KindKey, dict[tuple[float, ...], tuple[float, float]]]  # per kind: columns -> trees' (mean, sd)
Walked = dict[tuple, Corrections]  # per machine model (its key)
# runtime, device, parameters (sorted JSON; ALL_PARAMETERS: every launch of the runtime and device)
CalibrationKey = tuple[str, str, str]
ALL_PARAMETERS = ""
# The kernels a runtime plans for a workload, given the candidate and its threads (the seam tests fill by hand).
KernelsOf = Callable[[WorkloadProfile, Candidate, int], Sequence[Kernel]]


@dataclass(frozen=True)
class MachineCeilings:
    """What the kernel model needs of a machine (a CPU node's share or one GPU): its cores and measured ceilings,
    read as the learned model reads a row (bf16 and fp16 at the bf16 peak where measured, others at fp32)."""

    device: str
    name: str | None  # the CPU microarchitecture or GPU model, where it says what kind of machine it is
    cores: int
    fp32_gflops: float
    bf16_gflops: float | None
    bandwidth_gbs: float

    def peak_gflops(self, precision: Precision) -> float:
        if precision in (Precision.bf16, Precision.fp16) and self.bf16_gflops:
            return self.bf16_gflops
        return self.fp32_gflops

    @property
    def signature(self) -> tuple:
        return machine_signature(self.device, self.cores, self.fp32_gflops, self.bandwidth_gbs)

    @property
    def kind(self) -> tuple | None:
        return machine_kind(self.device, self.name, self.cores, bool(self.bf16_gflops))

    @property
    def key(self) -> tuple:
        """What the kernel model fits apart (:class:`MachineModel`): the machine's kind, or its signature where its
        name does not say."""
        return self.kind if self.kind is not None else self.signature

    def distance(self, other: MachineCeilings) -> tuple[bool, bool, float]:
        """How far ``other`` (of the same device class) is from this machine, for transfer, in order: whether its
        native bf16 differs, whether its name does, then the sum of |log ratio| of the cores, fp32 peak and
        bandwidth."""
        return (bool(self.bf16_gflops) != bool(other.bf16_gflops), self.name != other.name,
                sum(abs(math.log(a / b)) for a, b in ((self.cores, other.cores), (self.fp32_gflops, other.fp32_gflops),
                                                     (self.bandwidth_gbs, other.bandwidth_gbs))))

    @classmethod
    def of_row(cls, row: Measurement | KernelRow | Reconciliation) -> MachineCeilings:
        """The ceilings a whole-model row, a kernel row or a reconciliation carries (the same columns)."""
        return cls(row.device, row.gpu if row.device == "gpu" else row.microarchitecture, row.cores,
                   row.peak_fp32_gflops, row.peak_bf16_gflops, row.bandwidth_gbs)

    @classmethod
    def of_target(cls, ceilings: TargetCeilings, device: str) -> MachineCeilings:
        """The ceilings of a target's CPU or GPU (no kind where they are the catalog's, as the learned model)."""
        own = ceilings.gpu if device == "gpu" and ceilings.gpu else ceilings.cpu
        return cls(device, own.name if own.measured else None, ceilings.cores, own.peak_gflops[Precision.fp32],
                   own.peak_gflops.get(Precision.bf16), own.bandwidth_gbs)


@dataclass(frozen=True)
class Recurrence:
    """What a recurrent kernel (an LSTM or GRU layer) repeats: its ``steps`` (time steps times sequences),
    ``directions``, ``gates`` x ``hidden`` rows of its weights and its ``inputs`` per step."""

    steps: int
    directions: int
    gates: int
    hidden: int
    inputs: int

    @property
    def flops(self) -> float:
        """Multiply-adds of the input and recurrent projections, every step and direction."""
        return 2.0 * self.steps * self.directions * self.gates * self.hidden * (self.inputs + self.hidden)

    @property
    def bytes(self) -> float:
        """fp32 bytes moved: the recurrent weights once per step and direction (a step needs the last one's state),
        the input weights once, the inputs and outputs."""
        return 4.0 * (self.steps * self.directions * self.gates * self.hidden ** 2
                      + self.directions * self.gates * self.hidden * self.inputs
                      + self.steps * (self.inputs + self.directions * self.hidden))


def recurrence(kernel: Kernel) -> Recurrence | None:
    """The recurrence of ``kernel`` where its shapes hold an LSTM's or GRU's weights, as all three CPU runtimes
    pass them: an input weight ``(..., gates * hidden, inputs)`` then a recurrent weight ``(..., gates * hidden,
    hidden)`` (a leading axis of directions, where there is one) with :data:`RECURRENT_GATES`; its steps from the
    first input ``(sequence, batch, inputs)`` (either order), else from the analysis' FLOPs. None for any other
    kernel. The steps count every sequence of a batch (exact at batch 1, where every profiled recurrent kernel was:
    the layout that names the batch differs between runtimes)."""
    shapes = kernel.shapes
    for w, r in zip(shapes[1:], shapes[2:]):
        if len(w) < 2 or len(w) != len(r) or not r[-1] or w[-2] != r[-2] \
                or r[-2] not in {g * r[-1] for g in RECURRENT_GATES}:
            continue
        hidden, gates, inputs = r[-1], r[-2] // r[-1], w[-1]
        directions = r[0] if len(r) == 3 else 1
        x = shapes[0]
        if len(x) == 3 and x[-1] == inputs:
            steps = x[0] * x[1]
        elif kernel.flops:  # the runtime did not report the input's shape
            steps = round(kernel.flops / (2 * directions * gates * hidden * (inputs + hidden)))
        else:
            return None
        return Recurrence(steps, directions, gates, hidden, inputs) if steps > 0 else None
    return None


def sized(kernel: Kernel) -> Kernel:
    """``kernel`` with the work its roofline terms are priced by. A recurrent kernel (:func:`recurrence`): its FLOPs
    (the analysis' where it costed the kernel's node) and the bytes it moves, the recurrent weights once per step (the
    analysis counts each weight once, and a runtime's own ``RNNSeq`` or ``mkldnn_rnn_layer`` covers no node it
    costed): a step's time grows with what it reads, which one recurrent model teaches another (perfmodels/README.md,
    "The eleventh round"). Any other kernel where the analysis costed none of its nodes (no FLOPs, no bytes: e.g.
    OpenVINO's ``Reorder``): the bytes of its tensors as fp32, its inputs and an output the size of the first, so its
    time can grow with its size."""
    recurrent = recurrence(kernel)
    if recurrent is not None:
        return replace(kernel, flops=kernel.flops or recurrent.flops, bytes=recurrent.bytes)
    if kernel.flops or kernel.bytes or not kernel.shapes:
        return kernel
    return replace(kernel, bytes=4.0 * (sum(math.prod(s) for s in kernel.shapes) + math.prod(kernel.shapes[0])))


def parameters_key(params: Mapping[str, object]) -> str:
    """A candidate's parameters as a calibration key: what the kernels alone do not show (streams, wait policy)."""
    return json.dumps(dict(params), sort_keys=True)


def per_call_seconds(row: KernelRow) -> float:
    """A kernel row's measured seconds per call, at least :data:`RESOLUTION_FLOOR_S`."""
    return max(row.seconds / row.calls, RESOLUTION_FLOOR_S)


def row_candidate(row: KernelRow | Reconciliation) -> Candidate:
    """The candidate a kernel row or reconciliation was profiled with."""
    return Candidate(row.runtime, cast(DeviceKind, row.device), Precision(row.precision),
                     tuple(json.loads(row.params).items()), row.threads or None)


def roofline_seconds(kernel: Kernel, machine: MachineCeilings, candidate: Candidate) -> tuple[float, float]:
    """(compute, memory) seconds of one call of ``kernel`` on ``machine`` at the candidate's threads and precision."""
    compute_share, bandwidth_share = thread_shares(candidate, machine.cores)
    return op_seconds(kernel.flops, kernel.bytes, candidate.precision,
                      machine.peak_gflops(candidate.precision) * 1e9 * compute_share,
                      machine.bandwidth_gbs * 1e9 * bandwidth_share)


Example = tuple[list[float], float, float]  # a kernel's columns and roofline terms (:func:`features`)


@functools.lru_cache(maxsize=4096)
def attribute_values(attributes: str) -> Mapping[str, float]:
    """A kernel's numeric attributes (a number, or a list of numbers: the magnitude of their product), as log1p
    (read once per distinct attributes: a model repeats its layers)."""
    data = json.loads(attributes)
    values: dict[str, float] = {}
    for key, value in (data.items() if isinstance(data, dict) else ()):
        numbers = value if isinstance(value, list) else [value]
        if numbers and all(isinstance(v, int | float) and not isinstance(v, bool) for v in numbers):
            values[key] = math.log1p(abs(math.prod(numbers)))
    return MappingProxyType(values)


def features(kernel: Kernel, machine: MachineCeilings, candidate: Candidate,
             attribute_keys: Sequence[str]) -> Example:
    """The efficiency model's columns for ``kernel`` and its roofline terms (compute and memory seconds,
    :func:`roofline_seconds`).

    Columns: log FLOPs, log bytes, log intensity, log(compute / memory seconds) (where the kernel sits against the
    machine's ridge point), the threads' share of the cores, one-hot precision, log elements of the first input,
    then the kind's numeric attributes (``attribute_keys``)."""
    compute_s, memory_s = roofline_seconds(kernel, machine, candidate)
    attributes = attribute_values(kernel.attributes)
    elements = math.prod(kernel.shapes[0]) if kernel.shapes else 0
    columns = [math.log1p(kernel.flops), math.log1p(kernel.bytes), math.log(intensity(kernel)),
               math.log(max(compute_s, ROOFLINE_FLOOR_S) / max(memory_s, ROOFLINE_FLOOR_S)),
               candidate.threads / machine.cores if candidate.threads else 1.0,
               *(float(candidate.precision is p) for p in Precision), math.log1p(elements),
               *(attributes.get(key, 0.0) for key in attribute_keys)]
    return columns, compute_s, memory_s


@dataclass(frozen=True)
class KindModel:
    """The model of one (runtime, device, kernel kind): its prior's coefficients (fixed seconds per call, per compute
    second, per memory second), the largest FLOPs and bytes it was fit on, the correction forest, the attributes
    it has columns for and the share of the correction it applies (:func:`correction_share`)."""

    attribute_keys: tuple[str, ...]
    prior: tuple[float, float, float]
    max_flops: float
    max_bytes: float
    intensities: tuple[float, float]  # the least and greatest FLOPs per byte it was fit on
    forest: TreeEnsemble
    rows: int
    share: float

    def prior_seconds(self, compute_s: float, memory_s: float) -> float:
        """The prior's seconds per call of a kernel with these roofline terms."""
        return prior_seconds(self.prior, compute_s, memory_s)

    def within(self, kernel: Kernel) -> bool:
        """Whether ``kernel`` is within :data:`EXTRAPOLATION_LIMIT` of the FLOPs, bytes and (where it has FLOPs) FLOPs
        per byte the kind was fit on: its prior splits a call's time between compute and memory only as far as its
        calls' mixes of the two tell them apart. A kernel without FLOPs is all memory time, whatever its size."""
        low, high = self.intensities
        return (kernel.flops <= EXTRAPOLATION_LIMIT * self.max_flops
                and kernel.bytes <= EXTRAPOLATION_LIMIT * self.max_bytes
                and (not kernel.flops or low / EXTRAPOLATION_LIMIT <= intensity(kernel) <= EXTRAPOLATION_LIMIT * high))


def intensity(kernel: Kernel) -> float:
    """``kernel``'s FLOPs per byte (as the efficiency model's column: one of each added, so an empty kernel is 1)."""
    return (kernel.flops + 1) / (kernel.bytes + 1)


def prior_seconds(prior: tuple[float, float, float], compute_s: float, memory_s: float) -> float:
    """``c + a * compute_s + b * memory_s`` of ``prior`` = (c, a, b), at least :data:`ROOFLINE_FLOOR_S`."""
    fixed, per_compute, per_memory = prior
    return max(fixed + per_compute * compute_s + per_memory * memory_s, ROOFLINE_FLOOR_S)


def prior_coefficients(seconds: Sequence[float], compute_s: Sequence[float],
                       memory_s: Sequence[float]) -> tuple[float, float, float]:
    """Non-negative (c, a, b) of ``seconds ~ c + a * compute_s + b * memory_s`` in relative error, with c held to zero
    by :data:`FIXED_COST_PENALTY` where the calls cannot tell it apart (one size)."""
    import numpy as np
    from scipy.optimize import nnls

    t = np.asarray(seconds, dtype=float)
    design = np.column_stack([np.ones(len(t)), compute_s, memory_s]) / t[:, None]
    penalty = np.array([[math.sqrt(FIXED_COST_PENALTY) / float(np.median(t)), 0.0, 0.0]])
    coefficients, _ = nnls(np.vstack([design, penalty]), np.concatenate([np.ones(len(t)), [0.0]]))
    if not coefficients.any():  # neither term explains anything: a fixed cost, the median call
        return float(np.median(t)), 0.0, 0.0
    return float(coefficients[0]), float(coefficients[1]), float(coefficients[2])


def _launch(row: KernelRow | Reconciliation) -> tuple:
    """What ties kernel rows to their profiled launch's reconciliation."""
    return (row.machine, row.runtime, row.device, row.threads, row.precision, row.params, row.model, row.batch_size,
            row.session)


def check_rows(rows: Sequence[KernelRow], reconciliations: Sequence[Reconciliation]) -> None:
    """Refuse a damaged kernel table: an :class:`InputError` naming the row (``kernel_rows[i]`` or
    ``reconciliations[i]``, counted from 1) and its field."""
    tables: tuple[tuple[str, Sequence[KernelRow | Reconciliation]], ...] = (
        ("kernel_rows", rows), ("reconciliations", reconciliations))
    for table, items in tables:
        for i, row in enumerate(items, 1):
            problem = (_kernel_row_problem(row) if isinstance(row, KernelRow) else _reconciliation_problem(row)) \
                or _launch_problem(row)
            if problem is not None:
                field, what = problem
                raise InputError(f"{what} ({row.machine}, {row.runtime}, {row.model})", field=f"{table}[{i}].{field}")


def _kernel_row_problem(row: KernelRow) -> tuple[str, str] | None:
    kernel = row.kernel
    if not kernel.kind.strip():
        return "kernel.kind", "no kernel kind"
    if kernel.op not in OP_CLASSES:
        return "kernel.op", f"unknown op class '{kernel.op}' of kind '{kernel.kind}' (known: {', '.join(OP_CLASSES)})"
    if not math.isfinite(row.seconds) or row.seconds < 0:
        return "seconds", f"{row.seconds!r} is not a time"
    if row.calls < 1:
        return "calls", f"{row.calls} calls"
    for field, value in (("kernel.flops", kernel.flops), ("kernel.bytes", kernel.bytes)):
        if not math.isfinite(value) or value < 0:
            return field, f"{value!r} is not a count"
    try:
        attribute_values(kernel.attributes)
    except json.JSONDecodeError as exc:
        return "kernel.attributes", f"not JSON: {exc}"
    return None


def _reconciliation_problem(rec: Reconciliation) -> tuple[str, str] | None:
    if not math.isfinite(rec.step_s) or rec.step_s <= 0:
        return "step_s", f"{rec.step_s!r} is not a positive time"
    if not math.isfinite(rec.kernel_s) or rec.kernel_s < 0:
        return "kernel_s", f"{rec.kernel_s!r} is not a time"
    if rec.kernels < 1:
        return "kernels", f"{rec.kernels} kernels"
    return None


def _launch_problem(row: KernelRow | Reconciliation) -> tuple[str, str] | None:
    if row.precision not in {p.value for p in Precision}:
        return "precision", f"unknown precision '{row.precision}'"
    if row.threads < 0:
        return "threads", f"{row.threads} threads"
    if row.cores < 1:
        return "cores", f"{row.cores} cores"
    for field, value in (("peak_fp32_gflops", row.peak_fp32_gflops), ("peak_bf16_gflops", row.peak_bf16_gflops),
                         ("bandwidth_gbs", row.bandwidth_gbs)):
        if value is not None and not (math.isfinite(value) and value > 0):
            return field, f"{value!r} is not a positive ceiling"
    try:
        params = json.loads(row.params)
    except json.JSONDecodeError as exc:
        return "params", f"not JSON: {exc}"
    return None if isinstance(params, dict) else ("params", "not a JSON object of parameters")


def attributable(row: KernelRow) -> bool:
    """Whether ``row``'s measured time per call is at least 1 / :data:`ATTRIBUTION_LIMIT` of its compute roofline
    (its FLOPs at the machine's peak, at its threads and precision): the FLOPs of the nodes mapped to it could have
    run in that time."""
    compute_s, _ = roofline_seconds(sized(row.kernel), MachineCeilings.of_row(row), row_candidate(row))
    return compute_s <= ATTRIBUTION_LIMIT * per_call_seconds(row)


def class_kind(op: str) -> str:
    """The kind name of the model pooled over an op class's kinds (no runtime names a kernel in brackets)."""
    return f"[{op}]"


def fit_kinds(rows: Sequence[KernelRow], seed: int = 0, pooled: bool = True) -> dict[KindKey, KindModel]:
    """One model per (runtime, device, kernel kind) of the :func:`attributable` ``rows`` (:func:`fit_kind`) and, where
    ``pooled``, one per (runtime, device, op class) over its kinds' rows (kind :func:`class_kind`)."""
    by_kind: dict[KindKey, list[KernelRow]] = {}
    for row in filter(attributable, rows):
        by_kind.setdefault((row.runtime, row.device, row.kernel.kind), []).append(row)
        if pooled:
            by_kind.setdefault((row.runtime, row.device, class_kind(row.kernel.op)), []).append(row)
    return {key: fit_kind(group, seed) for key, group in sorted(by_kind.items())}


def fit_kind(rows: Sequence[KernelRow], seed: int = 0) -> KindModel:
    """The model of one kind's ``rows``: the prior's coefficients, a forest of log(measured per call / prior) and
    the share of it to apply (:func:`correction_share`)."""
    keys = tuple(sorted({k for r in rows for k in attribute_values(r.kernel.attributes)}))
    kernels = [sized(row.kernel) for row in rows]
    examples = [features(kernel, MachineCeilings.of_row(row), row_candidate(row), keys)
                for row, kernel in zip(rows, kernels)]
    seconds = [per_call_seconds(row) for row in rows]
    prior, fitted = _prior_and_correction(examples, seconds, seed)
    return KindModel(keys, prior, max(k.flops for k in kernels), max(k.bytes for k in kernels),
                     (min(map(intensity, kernels)), max(map(intensity, kernels))), TreeEnsemble.from_sklearn(fitted),
                     len(rows), correction_share(rows, examples, seconds, seed))


def _prior_and_correction(examples: Sequence[Example], seconds: Sequence[float], seed: int,
                          trees: int = KERNEL_TREES) -> tuple[tuple[float, float, float], RandomForestRegressor]:
    """The prior's coefficients on ``examples`` and a forest of ``trees`` of log(``seconds`` / prior) on their
    columns."""
    import numpy as np
    from sklearn.ensemble import RandomForestRegressor

    prior = prior_coefficients(seconds, [c for _, c, _ in examples], [m for _, _, m in examples])
    y = [math.log(t / prior_seconds(prior, c, m)) for t, (_, c, m) in zip(seconds, examples)]
    fitted = RandomForestRegressor(n_estimators=trees, min_samples_leaf=2, random_state=seed)
    fitted.fit(np.array([columns for columns, _, _ in examples]), np.array(y))
    return prior, fitted


def correction_share(rows: Sequence[KernelRow], examples: Sequence[Example], seconds: Sequence[float],
                     seed: int = 0) -> float:
    """The share of its correction a kind applies, of :data:`CORRECTION_SHARES`: the one whose predictions of each
    of :data:`SHARE_FOLDS` folds of the kind's models (a probed layer with the model it was cut from), fit on the
    other folds with :data:`SHARE_TREES` trees, have the least mean |log error| weighted by the rows' time per step
    (:func:`per_call_seconds` times calls; the smallest share of those within rounding of it); 0 for a kind
    profiled in fewer models than folds."""
    models = sorted({probed_from(row.model) for row in rows})
    if len(models) < SHARE_FOLDS:
        return 0.0
    errors = [0.0] * len(CORRECTION_SHARES)
    for fold in range(SHARE_FOLDS):
        held = set(models[fold::SHARE_FOLDS])
        test = [i for i, row in enumerate(rows) if probed_from(row.model) in held]
        train = [i for i, row in enumerate(rows) if probed_from(row.model) not in held]
        prior, fitted = _prior_and_correction([examples[i] for i in train], [seconds[i] for i in train], seed,
                                              SHARE_TREES)
        corrections = fitted.predict([examples[i][0] for i in test])
        for i, correction in zip(test, corrections):
            _, compute_s, memory_s = examples[i]
            residual = math.log(seconds[i] / prior_seconds(prior, compute_s, memory_s))
            for j, share in enumerate(CORRECTION_SHARES):
                errors[j] += seconds[i] * rows[i].calls * abs(residual - share * correction)
    weight = sum(t * row.calls for t, row in zip(seconds, rows))
    means = [error / weight for error in errors]
    return next(share for share, mean in zip(CORRECTION_SHARES, means) if math.isclose(mean, min(means), abs_tol=1e-9))


@dataclass(frozen=True)
class KernelEstimate:
    """One kernel's predicted seconds per call, whether it is compute-bound, whether it is past its kind's
    :data:`EXTRAPOLATION_LIMIT`, and the spread of its kind's trees (the standard deviation of their log
    corrections: wide where the kernel is unlike the rows the kind was fit on)."""

    seconds: float
    compute_bound: bool
    extrapolated: bool
    spread: float = 0.0


def kernel_seconds(kinds: Mapping[KindKey, KindModel], runtime: str, device: str, kernels: Sequence[Kernel],
                   machine: MachineCeilings, candidate: Candidate,
                   walked: Corrections | None = None) -> list[KernelEstimate] | None:
    """Each kernel's estimate, by its kind's model, or by its op class's pooled model where the kind's would
    extrapolate and the class's would not; None where a kind has no model. ``walked``: the corrections of rows already
    walked (by the models of ``kinds``), filled in with this call's: the candidates of one plan share most kernel
    rows."""
    kernels = [sized(k) for k in kernels]
    by_model: dict[KindKey, list[int]] = {}
    for i, kernel in enumerate(kernels):
        key = (runtime, device, kernel.kind)
        if key not in kinds:
            return None
        if not kinds[key].within(kernel):
            pooled = (runtime, device, class_kind(kernel.op))
            if pooled in kinds and kinds[pooled].within(kernel):
                key = pooled
        by_model.setdefault(key, []).append(i)
    walked = {} if walked is None else walked
    results = [KernelEstimate(0.0, False, False)] * len(kernels)
    for key, indices in by_model.items():
        model = kinds[key]
        examples = {i: features(kernels[i], machine, candidate, model.attribute_keys) for i in indices}
        corrections = walked.setdefault(key, {})
        rows = [row for row in dict.fromkeys(tuple(columns) for columns, _, _ in examples.values())
                if row not in corrections]  # a layer repeated, or walked for another candidate: once
        if rows:
            corrections.update(zip(rows, map(_mean_sd, zip(*model.forest.predict_trees(rows)))))
        for i, (columns, compute_s, memory_s) in examples.items():
            mean, spread = corrections[tuple(columns)]
            results[i] = KernelEstimate(model.prior_seconds(compute_s, memory_s) * math.exp(model.share * mean),
                                        compute_s >= memory_s, not model.within(kernels[i]), spread)
    return results


def _mean_sd(values: Sequence[float]) -> tuple[float, float]:
    """Mean and population standard deviation in plain floats (``statistics``' exact arithmetic costs a plan's
    predictions more than its walks)."""
    mean = math.fsum(values) / len(values)
    return mean, math.sqrt(math.fsum((v - mean) ** 2 for v in values) / len(values))


def mostly_within(estimates: Sequence[KernelEstimate], calls: Sequence[int] | None = None) -> bool:
    """Whether kernels past their kind's limit hold at most :data:`EXTRAPOLATED_SHARE` of the kernel time (each
    estimate times its ``calls``, default one)."""
    counts = calls or [1] * len(estimates)
    total = sum(e.seconds * n for e, n in zip(estimates, counts))
    return sum(e.seconds * n for e, n in zip(estimates, counts) if e.extrapolated) <= EXTRAPOLATED_SHARE * total


def dispatch_seconds(reconciliations: Iterable[Reconciliation]) -> dict[RuntimeKey, float]:
    """Per (runtime, device): the median over profiled launches of (step - kernel sum) / kernels, at least 0 (where
    profiling inflates the kernels past the step, the calibration takes up the difference)."""
    remainders: dict[RuntimeKey, list[float]] = {}
    for rec in reconciliations:
        remainders.setdefault((rec.runtime, rec.device), []).append((rec.step_s - rec.kernel_s) / rec.kernels)
    return {key: max(0.0, statistics.median(values)) for key, values in remainders.items()}


def profiling_seconds(reconciliations: Iterable[Reconciliation]) -> dict[RuntimeKey, float]:
    """Per (runtime, device): the profiler's own cost per kernel, the median over profiled launches of
    (profiled step - step) / kernels, at least 0."""
    costs: dict[RuntimeKey, list[float]] = {}
    for rec in reconciliations:
        costs.setdefault((rec.runtime, rec.device), []).append(max(0.0, rec.profiled_step_s - rec.step_s) / rec.kernels)
    return {key: statistics.median(values) for key, values in costs.items()}


def above_profiler(kernel_s: float, kernels: int, profiling_s: float) -> bool:
    """Whether kernels taking ``kernel_s`` in all stand out of the profiler's own cost per kernel (by
    :data:`PROFILER_MARGIN`)."""
    return kernel_s >= PROFILER_MARGIN * profiling_s * kernels


def model_folds(reconciliations: Sequence[Reconciliation]) -> list[frozenset[str]]:
    """The models held out by each calibration fold: the reconciled steps' models in :data:`FOLDS` folds (none with
    fewer than two models)."""
    models = sorted({rec.model for rec in reconciliations})
    folds = min(FOLDS, len(models))
    return [] if folds < 2 else [frozenset(models[fold::folds]) for fold in range(folds)]


def fold_rows(rows: Sequence[KernelRow], held: frozenset[str]) -> list[KernelRow]:
    """The kernel rows a fold's kinds are fit on: those of the models it does not hold out."""
    return [r for r in rows if r.model not in held]


def out_of_fold_steps(rows: Sequence[KernelRow], reconciliations: Sequence[Reconciliation],
                      dispatch: Mapping[RuntimeKey, float], profiling: Mapping[RuntimeKey, float],
                      folds: Sequence[tuple[frozenset[str], Mapping[KindKey, KindModel]]]
                      ) -> list[tuple[Reconciliation, float]]:
    """Each reconciled step with its step composed (before calibration) by the kinds of the fold that holds out its
    model (``folds``: each fold's held-out models, :func:`model_folds`, and its kinds fit on :func:`fold_rows`). A
    step whose kinds the other folds do not cover, or whose kernels do not stand out of the profiler's cost, is left
    out."""
    by_launch: dict[tuple, list[KernelRow]] = {}
    for row in rows:
        by_launch.setdefault(_launch(row), []).append(row)
    steps = []
    for held, kinds in folds:
        for rec in reconciliations:
            own = by_launch.get(_launch(rec), [])
            if rec.model not in held or not own:
                continue
            times = kernel_seconds(kinds, rec.runtime, rec.device, [r.kernel for r in own],
                                   MachineCeilings.of_row(rec), row_candidate(rec))
            if times is None or not mostly_within(times, [r.calls for r in own]):
                continue
            kernel_s = sum(e.seconds * r.calls for e, r in zip(times, own))
            if not above_profiler(kernel_s, sum(r.calls for r in own), profiling[(rec.runtime, rec.device)]):
                continue
            steps.append((rec, kernel_s + rec.kernels * dispatch[(rec.runtime, rec.device)]))
    return steps


def fit_kind_sets(row_sets: Sequence[Sequence[KernelRow]], seed: int = 0,
                  jobs: int = 1) -> list[dict[KindKey, KindModel]]:
    """:func:`fit_kinds` of each of ``row_sets``, in up to ``jobs`` processes (in this one where the system cannot
    start a pool, e.g. without shared memory for its semaphores): each kind's fit is seeded, so the models are the
    same whatever ``jobs``."""
    from concurrent.futures import ProcessPoolExecutor

    try:
        pool = ProcessPoolExecutor(min(jobs, len(row_sets))) if jobs > 1 and len(row_sets) > 1 else None
    except (OSError, NotImplementedError):
        pool = None
    if pool is None:
        return [fit_kinds(rows, seed) for rows in row_sets]
    with pool:
        return list(pool.map(functools.partial(fit_kinds, seed=seed), row_sets))


def _deciles(values: Sequence[float]) -> tuple[float, float]:
    deciles = statistics.quantiles(values, n=10, method="inclusive")
    return deciles[0], deciles[-1]


def calibrate(steps: Sequence[tuple[Reconciliation, float]]) -> dict[CalibrationKey, tuple[float, float, float]]:
    """Per (runtime, device, parameters) and per (runtime, device) (parameters :data:`ALL_PARAMETERS`), each with at
    least :data:`MIN_CALIBRATION` of them: the 10th, 50th and 90th percentiles of log(measured step / composed step)
    over the :func:`out_of_fold_steps`. Per parameters, it learns what the kernels do not show: two hints or wait
    policies that run the same kernels in steps of different lengths."""
    residuals: dict[CalibrationKey, list[float]] = {}
    for rec, composed in steps:
        for params in (ALL_PARAMETERS, parameters_key(json.loads(rec.params))):
            residuals.setdefault((rec.runtime, rec.device, params), []).append(math.log(rec.step_s / composed))
    quantiles = {}
    for key, values in residuals.items():
        if len(values) >= MIN_CALIBRATION:
            low, high = _deciles(values)
            quantiles[key] = (low, statistics.median(values), high)
    return quantiles


def calibration_of(calibration: Mapping[CalibrationKey, tuple[float, float, float]], runtime: str, device: str,
                   params: Mapping[str, object]) -> tuple[float, float, float]:
    """The quantiles a candidate's step is calibrated by: its parameters' where they have enough steps, else its
    runtime and device's."""
    return calibration.get((runtime, device, parameters_key(params))) or calibration[(runtime, device, ALL_PARAMETERS)]


def calibrate_runs(steps: Sequence[tuple[Reconciliation, float]],
                   calibration: Mapping[CalibrationKey, tuple[float, float, float]]) -> dict[RuntimeKey,
                                                                                              tuple[float, float]]:
    """Per (runtime, device) with at least :data:`MIN_CALIBRATION` of them: the 10th and 90th percentiles of the
    error of a calibrated step once corrected by another candidate's measured step of the same workload (machine,
    model, task, batch), runtime, device and precision, as :mod:`modak.predict.measured` corrects the plan's:
    log(measured / calibrated) of the one minus the other's, over ordered pairs of :func:`out_of_fold_steps` of a
    calibrated runtime and device."""
    groups: dict[tuple, list[float]] = {}
    for rec, composed in steps:
        if (rec.runtime, rec.device, ALL_PARAMETERS) not in calibration:
            continue
        mid = calibration_of(calibration, rec.runtime, rec.device, json.loads(rec.params))[1]
        groups.setdefault((rec.machine, rec.model, rec.task, rec.batch_size, rec.runtime, rec.device, rec.precision),
                          []).append(math.log(rec.step_s / composed) - mid)
    residuals: dict[RuntimeKey, list[float]] = {}
    for (*_, runtime, device, _), errors in groups.items():
        residuals.setdefault((runtime, device), []).extend(a - b for a, b in itertools.permutations(errors, 2))
    return {key: _deciles(values) for key, values in residuals.items() if len(values) >= MIN_CALIBRATION}


@dataclass(frozen=True)
class KernelData:
    """Kernel rows and reconciliations (each with its machine's ceilings) to fit on, named by a ``key`` that
    changes whenever they do (as :class:`modak.predict.learned.TrainingData`): a cached fit is found by the key
    alone."""

    key: str
    load: Callable[[], tuple[Sequence[KernelRow], Sequence[Reconciliation]]]

    @classmethod
    def of(cls, rows: Sequence[KernelRow], reconciliations: Sequence[Reconciliation]) -> KernelData:
        """Data in memory, keyed by their values."""
        digest = hashlib.sha256()
        for item in (*rows, *reconciliations):
            digest.update(repr(item).encode())
        return cls(digest.hexdigest(), lambda: (rows, reconciliations))


@dataclass(frozen=True, eq=False)
class MachineModel:
    """The kernel model of one machine kind (:attr:`MachineCeilings.key`): a model per kind; dispatch, the
    profiler's cost per kernel, calibration and the calibration of steps corrected by a run (:func:`calibrate_runs`)
    per (runtime, device); the precisions and machines (signatures and kinds) with kernel rows per (runtime, device);
    and the ceilings most of its rows carry (what another machine is compared with,
    :meth:`MachineCeilings.distance`)."""

    key: tuple
    ceilings: MachineCeilings
    kinds: Mapping[KindKey, KindModel]
    dispatch: Mapping[RuntimeKey, float]
    profiling: Mapping[RuntimeKey, float]
    calibration: Mapping[CalibrationKey, tuple[float, float, float]]
    run_calibration: Mapping[RuntimeKey, tuple[float, float]]
    precisions: Mapping[RuntimeKey, frozenset[str]]
    signatures: Mapping[RuntimeKey, frozenset[tuple]]
    machine_kinds: Mapping[RuntimeKey, frozenset[tuple]]

    @staticmethod
    def training_sets(rows: Sequence[KernelRow], reconciliations: Sequence[Reconciliation]) -> list[list[KernelRow]]:
        """The kernel rows :meth:`fit` needs kinds fit on, in its order: all of ``rows``, then each calibration fold's
        (:func:`model_folds`, :func:`fold_rows`)."""
        return [list(rows), *(fold_rows(rows, held) for held in model_folds(reconciliations))]

    @classmethod
    def fit(cls, rows: Sequence[KernelRow], reconciliations: Sequence[Reconciliation],
            fits: Sequence[Mapping[KindKey, KindModel]]) -> MachineModel:
        """Fit on one machine kind's checked ``rows`` (at least one) and whole-step ``reconciliations``, given the
        kinds ``fits`` on each of :meth:`training_sets` (:func:`fit_kind_sets`)."""
        dispatch = dispatch_seconds(reconciliations)
        precisions: dict[RuntimeKey, set[str]] = {}
        signatures: dict[RuntimeKey, set[tuple]] = {}
        kinds: dict[RuntimeKey, set[tuple]] = {}
        machines = [MachineCeilings.of_row(row) for row in rows]
        for row, machine in zip(rows, machines):
            precisions.setdefault((row.runtime, row.device), set()).add(row.precision)
            signatures.setdefault((row.runtime, row.device), set()).add(machine.signature)
            if machine.kind is not None:
                kinds.setdefault((row.runtime, row.device), set()).add(machine.kind)
        ceilings = Counter(machines).most_common(1)[0][0]
        profiling = profiling_seconds(reconciliations)
        steps = out_of_fold_steps(rows, reconciliations, dispatch, profiling,
                                  list(zip(model_folds(reconciliations), fits[1:])))
        calibration = calibrate(steps)
        return cls(ceilings.key, ceilings, fits[0], dispatch, profiling, calibration,
                   calibrate_runs(steps, calibration),
                   {k: frozenset(v) for k, v in precisions.items()}, {k: frozenset(v) for k, v in signatures.items()},
                   {k: frozenset(v) for k, v in kinds.items()})

    def header(self) -> dict:
        """The model's plain values, for :meth:`KernelModel.save` (its kinds' forests are saved beside)."""
        c = self.ceilings
        return {
            "key": list(self.key),
            "ceilings": [c.device, c.name, c.cores, c.fp32_gflops, c.bf16_gflops, c.bandwidth_gbs],
            "kinds": [[*key, list(model.attribute_keys), list(model.prior), model.max_flops, model.max_bytes,
                       list(model.intensities), model.rows, model.share] for key, model in sorted(self.kinds.items())],
            "dispatch": [[*key, value] for key, value in sorted(self.dispatch.items())],
            "profiling": [[*key, value] for key, value in sorted(self.profiling.items())],
            "calibration": [[*key, *values] for key, values in sorted(self.calibration.items())],
            "run_calibration": [[*key, *values] for key, values in sorted(self.run_calibration.items())],
            "precisions": [[*key, sorted(values)] for key, values in sorted(self.precisions.items())],
            "signatures": [[*key, sorted(map(list, values))] for key, values in sorted(self.signatures.items())],
            "machine_kinds": [[*key, sorted(map(list, values))] for key, values in sorted(self.machine_kinds.items())],
        }

    @classmethod
    def of_header(cls, header: Mapping, arrays: Mapping[str, array], prefix: str) -> MachineModel:
        """The model :meth:`header` wrote, its kinds' forests read from ``arrays`` under ``prefix``."""
        device, name, cores, fp32, bf16, bandwidth = header["ceilings"]
        return cls(tuple(header["key"]),
                   MachineCeilings(str(device), name, int(cores), float(fp32), bf16 and float(bf16), float(bandwidth)),
                   _SavedKinds(header["kinds"], arrays, prefix),
                   {(r, d): float(v) for r, d, v in header["dispatch"]},
                   {(r, d): float(v) for r, d, v in header["profiling"]},
                   {(r, d, k): (float(a), float(b), float(c)) for r, d, k, a, b, c in header["calibration"]},
                   {(r, d): (float(a), float(b)) for r, d, a, b in header["run_calibration"]},
                   {(r, d): frozenset(str(p) for p in v) for r, d, v in header["precisions"]},
                   {(r, d): frozenset(tuple(s) for s in v) for r, d, v in header["signatures"]},
                   {(r, d): frozenset(tuple(s) for s in v) for r, d, v in header["machine_kinds"]})

    def answers(self, key: RuntimeKey, precision: Precision) -> bool:
        """Whether the runtime and device are calibrated and have kernel rows at ``precision``."""
        return (*key, ALL_PARAMETERS) in self.calibration and precision.value in self.precisions.get(key, frozenset())

    def knows(self, key: RuntimeKey, machine: MachineCeilings) -> bool:
        """Whether the runtime and device have kernel rows of ``machine`` (its ceilings, or its kind)."""
        return (machine.signature in self.signatures.get(key, frozenset())
                or machine.kind is not None and machine.kind in self.machine_kinds.get(key, frozenset()))

    def compose(self, kernels: Sequence[Kernel], machine: MachineCeilings, candidate: Candidate, known: bool,
                walked: Corrections | None = None) -> Composition | None:
        """:meth:`KernelModel.compose` by this machine's model (``known``: whether ``machine`` is of its kind; if
        not, the interval is widened by :data:`NEW_MACHINE_SPREAD`)."""
        key = (candidate.runtime, candidate.device)
        times = kernel_seconds(self.kinds, *key, kernels, machine, candidate, walked) if kernels else None
        if (times is None or not mostly_within(times)
                or not above_profiler(sum(e.seconds for e in times), len(kernels), self.profiling[key])):
            return None
        return self.composition(times, candidate, known)

    def composition(self, times: Sequence[KernelEstimate], candidate: Candidate, known: bool) -> Composition:
        """The step of kernels taking ``times`` (one estimate per kernel): their sum plus the runtime's dispatch per
        kernel, times the calibration's factor, and its interval (:meth:`compose`; ``kernels_held_out --floor``
        passes a step's own profiled kernel times, to tell the kernels' error from the composition's)."""
        key = (candidate.runtime, candidate.device)
        calibration = calibration_of(self.calibration, *key, dict(candidate.params))
        dispatch_s = len(times) * self.dispatch[key]
        compute_s = sum(e.seconds for e in times if e.compute_bound)
        memory_s = sum(e.seconds for e in times if not e.compute_bound)
        low_q, mid_q, high_q = calibration
        # The calibration's quantiles hold the error of steps like those it was fit on; the kernels' trees spread
        # where a step's kernels are unlike the kinds' rows (a new family's), weighted by their time.
        spread = sum(e.seconds * e.spread for e in times) / max(sum(e.seconds for e in times), ROOFLINE_FLOOR_S)
        widen = (Z80 * spread) ** 2 + (0.0 if known else (Z80 * NEW_MACHINE_SPREAD) ** 2)
        step = (compute_s + memory_s + dispatch_s) * math.exp(mid_q)
        runs = self.run_calibration.get(key)
        return Composition(step, step / math.exp(math.sqrt((mid_q - low_q) ** 2 + widen)),
                           step * math.exp(math.sqrt((high_q - mid_q) ** 2 + widen)), compute_s, memory_s,
                           dispatch_s, len(times), math.exp(mid_q), known,
                           None if runs is None else (math.exp(runs[0]), math.exp(runs[1])))


@dataclass(frozen=True, eq=False)
class KernelModel:
    """The fitted kernel model: a :class:`MachineModel` per machine kind with kernel rows. A machine is answered by
    its own kind's model; one of no kind with rows for the runtime, device and precision by the nearest such
    machine's (:meth:`MachineCeilings.distance`), transferred by its ceilings. Machines are fit apart because two
    CPUs' kernels reach different shares of their ceilings, bf16 most of all: pooled, they blur each other
    (perfmodels/README.md, "The ninth round")."""

    machines: tuple[MachineModel, ...]

    @classmethod
    def fit(cls, rows: Sequence[KernelRow], reconciliations: Sequence[Reconciliation], seed: int = 0,
            jobs: int = 1) -> KernelModel:
        """Fit a model per machine kind of ``rows`` and ``reconciliations`` (on the ceilings they carry), the kinds
        of all of them in up to ``jobs`` processes (:func:`fit_kind_sets`: the same models whatever ``jobs``); a
        damaged table is an InputError."""
        check_rows(rows, reconciliations)
        # What a step adds to its kernels (dispatch, the profiler's cost, the calibration) is learned from whole
        # models' steps: a probed layer's session is mostly the fixed cost of a run.
        by_machine: dict[tuple, tuple[list[KernelRow], list[Reconciliation]]] = {}
        for row in rows:
            if row.runtime in PLANNED_AS_PROFILED:
                by_machine.setdefault(MachineCeilings.of_row(row).key, ([], []))[0].append(row)
        for rec in reconciliations:
            key = MachineCeilings.of_row(rec).key
            if rec.runtime in PLANNED_AS_PROFILED and whole_step(rec) and key in by_machine:
                by_machine[key][1].append(rec)
        machines = [by_machine[key] for key in sorted(by_machine, key=repr)]
        sets = [MachineModel.training_sets(*machine) for machine in machines]
        fitted = iter(fit_kind_sets([training for machine_sets in sets for training in machine_sets], seed, jobs))
        return cls(tuple(MachineModel.fit(*machine, [next(fitted) for _ in machine_sets])
                         for machine, machine_sets in zip(machines, sets)))

    @classmethod
    def cached(cls, data: KernelData, folder: Path | None = None, refit: bool = False) -> KernelModel:
        """:meth:`fit` on ``data``, or the saved fit of the same data key and format from ``folder`` (default: modak's
        cache) or the shipped fits (:func:`modak.predict.fits.cached_fit`); a missing or unreadable file, or ``refit``,
        fits and rewrites it."""
        return fits.cached_fit(PREDICTOR, fits.fit_key(PREDICTOR, FIT_FORMAT, data.key), cls.load,
                               lambda: cls.fit(*data.load(), jobs=len(os.sched_getaffinity(0))), KernelModel.save,
                               folder, refit)

    def save(self, path: Path) -> None:
        """Write the model (plain arrays and a JSON header, :mod:`modak.predict.forest`), atomically."""
        arrays: dict[str, array] = {}
        for j, machine in enumerate(self.machines):
            for i, (_, model) in enumerate(sorted(machine.kinds.items())):
                arrays |= model.forest.arrays(f"m{j}kind{i}")
        write_atomic(path, encode_arrays({"machines": [m.header() for m in self.machines]}, arrays))

    @classmethod
    def load(cls, path: Path) -> KernelModel:
        """A model written by :meth:`save`."""
        header, arrays = load_arrays(path)
        return cls(tuple(MachineModel.of_header(h, arrays, f"m{j}") for j, h in enumerate(header["machines"])))

    def calibrated(self, runtime: str, device: str) -> bool:
        """Whether some machine's steps of the runtime and device are calibrated (without which it answers
        nothing)."""
        return any((runtime, device, ALL_PARAMETERS) in m.calibration for m in self.machines)

    def answering(self, key: RuntimeKey, machine: MachineCeilings, precision: Precision) -> MachineModel | None:
        """The machine model that answers ``machine``'s steps of the runtime and device at ``precision``: of those
        calibrated with kernel rows at it (:meth:`MachineModel.answers`), the one that knows ``machine``, else the
        nearest; None where none answers."""
        able = [m for m in self.machines if m.answers(key, precision)]
        own = next((m for m in able if m.knows(key, machine)), None)
        return own or min(able, key=lambda m: machine.distance(m.ceilings), default=None)

    def compose(self, kernels: Sequence[Kernel], machine: MachineCeilings, candidate: Candidate,
                walked: Walked | None = None) -> Composition | None:
        """The step of ``kernels`` (one call each) for ``candidate`` on ``machine``, by :meth:`answering`'s model;
        None where no machine's model answers the runtime, device and precision, a kernel's kind has no model in
        it (or there are no kernels), too much of the step is extrapolated, or the kernels are too short to stand
        out of the profiler's cost. ``walked``: per machine model, as :func:`kernel_seconds` takes it."""
        key = (candidate.runtime, candidate.device)
        model = self.answering(key, machine, candidate.precision)
        if model is None:
            return None
        return model.compose(kernels, machine, candidate, model.knows(key, machine),
                             None if walked is None else walked.setdefault(model.key, {}))


class _SavedKinds(Mapping[KindKey, KindModel]):
    """The kind models of a saved :class:`MachineModel`, each decoded (and its arrays checked) when first asked: a
    plan asks for the few dozen kinds its candidates run, of hundreds."""

    def __init__(self, entries: Sequence[Sequence], arrays: Mapping[str, array], prefix: str) -> None:
        self._entries = {(str(e[0]), str(e[1]), str(e[2])): (i, e) for i, e in enumerate(entries)}
        self._arrays = arrays
        self._prefix = prefix
        self._decoded: dict[KindKey, KindModel] = {}

    def __getitem__(self, key: KindKey) -> KindModel:
        if key not in self._decoded:
            i, (_, _, _, keys, prior, max_flops, max_bytes, intensities, rows, share) = self._entries[key]
            self._decoded[key] = KindModel(
                tuple(keys), (float(prior[0]), float(prior[1]), float(prior[2])), float(max_flops), float(max_bytes),
                (float(intensities[0]), float(intensities[1])),
                TreeEnsemble.from_arrays(self._arrays, f"{self._prefix}kind{i}"), int(rows), float(share))
        return self._decoded[key]

    def __iter__(self) -> Iterator[KindKey]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: object) -> bool:
        return key in self._entries




@dataclass(frozen=True)
class Composition:
    """A step composed from its kernels: the calibrated step and interval, and the sums behind them (kernel seconds
    of compute- and memory-bound kernels, dispatch), before the calibration's factor."""

    step_s: float
    low_s: float
    high_s: float
    compute_s: float
    memory_s: float
    dispatch_s: float
    kernels: int
    calibration: float  # exp(median out-of-fold residual): what multiplies the sums
    known_machine: bool  # False: transferred by ceilings, the interval widened
    run_spread: tuple[float, float] | None  # the interval's factors once corrected by a run (Prediction.run_spread)

    @property
    def predictor(self) -> str:
        return PREDICTOR if self.known_machine else TRANSFER_PREDICTOR


@dataclass(frozen=True)
class KernelPredictor:
    """The :class:`modak.predict.base.Predictor` of the kernel model, for one model graph (:meth:`for_model`)."""

    model: KernelModel
    onnx_path: Path | None = None
    zoo: str | None = None  # the model's zoo name (the PyTorch runtimes trace zoo models)
    kernels_of: KernelsOf | None = None  # default: the runtime's report of ``onnx_path`` or ``zoo``
    name: str = PREDICTOR

    def for_model(self, onnx_path: Path | None, zoo: str | None = None) -> KernelPredictor:
        """This predictor for the model at ``onnx_path`` (zoo model ``zoo``; :func:`modak.predict.base.for_model`)."""
        return replace(self, onnx_path=onnx_path, zoo=zoo)

    def planned(self, workload: WorkloadProfile, candidate: Candidate, threads: int) -> Sequence[Kernel]:
        """The kernels the candidate's runtime plans for one step of ``workload`` (none without a graph)."""
        if self.kernels_of is not None:
            return self.kernels_of(workload, candidate, threads)
        from modak.workload.kernels import UnreportedGraph, planned_kernels

        try:
            return planned_kernels(candidate.runtime, self.onnx_path, workload.batch_size, workload.input_shapes,
                                   candidate.precision.value, threads, params=dict(candidate.params), zoo=self.zoo)
        except UnreportedGraph:  # the runtime cannot say (no graph, a user's own module): the next predictor answers
            return ()

    def predict(self, workload: WorkloadProfile, ceilings: TargetCeilings, candidate: Candidate,
                recipe: Recipe) -> Prediction | None:
        return self.predict_many(workload, ceilings, [(candidate, recipe)])[0]

    def predict_many(self, workload: WorkloadProfile, ceilings: TargetCeilings,
                     requests: Sequence[PredictionRequest]) -> list[Prediction | None]:
        """:meth:`predict` of each request, each distinct kernel row's trees walked once across them."""
        walked: Walked = {}
        return [self._predict(workload, ceilings, candidate, recipe, walked) for candidate, recipe in requests]

    def _predict(self, workload: WorkloadProfile, ceilings: TargetCeilings, candidate: Candidate, recipe: Recipe,
                 walked: Walked) -> Prediction | None:
        if workload.task is not Task.inference or not self.model.calibrated(candidate.runtime, candidate.device):
            return None
        kernels = self.planned(workload, candidate, candidate.threads or ceilings.cores)
        c = self.model.compose(kernels, MachineCeilings.of_target(ceilings, candidate.device), candidate, walked)
        if c is None:
            return None
        physics = RooflinePredictor().predict(workload, ceilings, candidate, recipe)
        own = {"compute_s", "memory_s", "overhead_s"}
        terms = (("compute_s", c.compute_s), ("memory_s", c.memory_s), ("overhead_s", c.dispatch_s),
                 *(t for t in physics.terms if t[0] not in own), ("kernels", float(c.kernels)),
                 ("calibration", c.calibration), ("new_machine_spread", 0.0 if c.known_machine else NEW_MACHINE_SPREAD))
        bound = max((("compute", c.compute_s), ("memory", c.memory_s), ("overhead", c.dispatch_s)),
                    key=lambda t: t[1])[0]
        return Prediction(c.step_s, c.low_s, c.high_s, physics.compile_seconds, terms, bound, c.predictor,
                          run_spread=c.run_spread)
