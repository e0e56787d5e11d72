"""A kernel's terms in the operator-level model (:mod:`modak.predict.kernels`): its roofline times on a
machine's ceilings, the features its learned correction reads, and the per-kind model of prior and correction."""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import cast

from modak.candidates.candidate import DeviceKind
from modak.candidates.enumerate import Candidate
from modak.hardware.ceilings import TargetCeilings
from modak.image.kernels import Kernel
from modak.measurements.kernels import KernelRow, Reconciliation
from modak.measurements.store import Measurement
from modak.predict.forest import TreeEnsemble
from modak.predict.learned import machine_kind, machine_signature
from modak.predict.roofline import op_seconds, thread_shares
from modak.spec.models import Precision

# A kernel the profiler timed at 0 (ONNX Runtime and OpenVINO report whole microseconds) took under its resolution:
# it is learned as half of it.
RESOLUTION_FLOOR_S = 0.5e-6
ROOFLINE_FLOOR_S = 1e-9  # the roofline time of a kernel with neither FLOPs nor bytes (its efficiency is its time)
# How far past the largest FLOPs or bytes of a kind's profiled calls a kernel of that kind is still answered
# (perfmodels/README.md, "Operator-level model": the sweep behind it).
EXTRAPOLATION_LIMIT = 4.0
RECURRENT_GATES = (3, 4)  # a GRU's and an LSTM's gates: the rows of their weights per hidden unit
# The weight that holds a kind's fixed cost per call to zero where its calls cannot tell it from the roofline terms
# (all of one size): a penalty of (c / median call) ** 2 times this, against the calls' squared relative errors.
FIXED_COST_PENALTY = 0.1


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
