"""The GPU model (#68): a GPU step as its host launches, its host copies and its device time, and which of them
bounds it.

A GPU runs what the host launched, asynchronously: a step takes the longer of the host's launches and the
device's kernels, plus the host copies its inputs and outputs make on the same stream::

    step = transfer + max(launch, compute + memory)
    launch = nodes * node_us + call_us                 (cuda_graphs: nodes * graph_node_us + call_us)
    transfer = input bytes / host-to-device + output bytes / device-to-host   (pinned or pageable, the io lever)

``compute`` and ``memory`` are the roofline's (:func:`device_seconds`: per op class, FLOPs over the precision's
peak times the recipe's efficiency, or bytes over bandwidth, whichever is larger). ``node_us`` is the launch term:
per runtime, task, whether autocast adds cast kernels (bf16 and fp16 do; fp32 and TF32 launch the model's kernels
alone) and whether the step replays a CUDA graph, fit on the GPU rows of ``perfmodels/`` (:func:`fit_launch`:
the one value that best explains the rows' steps in log, given their device and transfer times); a key without
rows takes the recipe's prior (``node_overhead_us``, ``graph_node_overhead_us``). The host link is the target's
probed bandwidths (``gpus.peaks.h2d_pinned_gbs`` ...) or, unprobed, its PCIe generation's
(``recipes/hardware/gpus.yaml`` ``host_link``, ``interconnects.yaml``) with pageable copies at
:data:`PAGEABLE_SHARE` of it. The regime is the largest of the four terms.

A CUDA graph's capture counts as compile time (``capture_seconds`` + ``capture_seconds_per_node`` x nodes, the
recipe's), as compile times do: the plan's objective spreads it over the job's steps.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from modak.candidates.catalog import DevicePerformance, Recipe
from modak.candidates.enumerate import Candidate
from modak.hardware.ceilings import Ceilings, HostLink, TargetCeilings
from modak.measurements.store import Measurement
from modak.predict.base import Prediction, PredictionRequest
from modak.predict.roofline import _FUSABLE, UNCERTAINTY_CATALOG, UNCERTAINTY_MEASURED, op_seconds, parameter_effects
from modak.spec.models import Precision
from modak.workload.analysis import WorkloadProfile

Regime = Literal["launch", "transfer", "compute", "memory"]
REGIMES: tuple[Regime, ...] = ("launch", "transfer", "compute", "memory")
CAST_PRECISIONS = frozenset({Precision.bf16, Precision.fp16})  # autocast: cast kernels beside the model's own
# The grid the launch term is fit on: µs per node, log-spaced (a fit at an end of it says so in its key's note)
LAUNCH_GRID_US = tuple(0.1 * 1.05 ** i for i in range(190))  # 0.1 .. ~1000 µs
MIN_FIT_ROWS = 2  # rows of a key below which the recipe's prior stands
INPUT_ITEM_BYTES = 4  # an input element where the analysis gave no input bytes (float32, int32 ids alike)
PREDICTOR = "gpu-terms"


@dataclass(frozen=True)
class LaunchKey:
    """What a launch term is fit per: the runtime, the task, whether autocast casts, whether a graph replays."""

    runtime: str
    task: str
    casts: bool
    graphs: bool

    @classmethod
    def of(cls, candidate: Candidate, task: str) -> LaunchKey:
        return cls(candidate.runtime, task, candidate.precision in CAST_PRECISIONS,
                   candidate.param("cuda_graphs") is True)


@dataclass(frozen=True)
class LaunchFit:
    """A key's fitted µs per node, the rows it was fit on and the spread of their log errors (90th percentile)."""

    node_us: float
    rows: int
    log_error_p90: float


@dataclass(frozen=True)
class GpuRow:
    """What the launch fit needs of one measured GPU step: its key, nodes, the measured step, and the device and
    transfer seconds the model gives it (computed from the row's own ceilings)."""

    key: LaunchKey
    model: str
    nodes: int
    step_s: float
    device_s: float
    transfer_s: float
    call_us: float


@dataclass(frozen=True)
class GpuTerms:
    """One GPU step's terms (seconds) and its regime."""

    launch_s: float
    transfer_s: float
    compute_s: float
    memory_s: float

    @property
    def step_s(self) -> float:
        return self.transfer_s + max(self.launch_s, self.compute_s + self.memory_s)

    @property
    def regime(self) -> Regime:
        values = dict(zip(REGIMES, (self.launch_s, self.transfer_s, self.compute_s, self.memory_s)))
        return max(REGIMES, key=lambda r: values[r])  # the first of equals, in REGIMES' order


def device_seconds(class_flops: Mapping[str, float], class_bytes: Mapping[str, float], perf: DevicePerformance,
                   effects: Mapping[str, float], precision: Precision, peak_gflops: float,
                   bandwidth_gbs: float) -> tuple[float, float]:
    """(compute, memory) seconds of a step's FLOPs and bytes per op class on a GPU: each class's larger of FLOPs
    over ``peak_gflops`` times its efficiency and bytes (fp32-sized, scaled to ``precision``; fusable classes less
    the fusion) over ``bandwidth_gbs`` times the memory efficiency, into its bucket."""
    bandwidth = bandwidth_gbs * 1e9 * perf.memory_efficiency * effects.get("memory", 1.0)
    fusion = perf.fusion * effects.get("fusion", 1.0)
    compute = memory = 0.0
    for op_class in sorted(set(class_flops) | set(class_bytes)):
        efficiency = min(1.0, perf.compute_efficiency.get(op_class, perf.compute_efficiency["default"])
                         * effects.get(f"compute.{op_class}", 1.0) * effects.get("compute", 1.0))
        moved = class_bytes.get(op_class, 0.0) * ((1.0 - fusion) if op_class in _FUSABLE else 1.0)
        c, m = op_seconds(class_flops.get(op_class, 0.0), moved, precision, peak_gflops * 1e9 * efficiency,
                          bandwidth)
        if c >= m:
            compute += c
        else:
            memory += m
    return compute, memory


def prior_node_us(perf: DevicePerformance, key: LaunchKey) -> float:
    """The recipe's launch prior for ``key``: per replayed node in a graph, else per node (training: per forward
    node of the whole step, as :func:`modak.predict.roofline.overhead_seconds` counts it)."""
    if key.graphs and perf.graph_node_overhead_us is not None:
        return perf.graph_node_overhead_us
    if key.task == "training":
        return perf.training_node_overhead_us if perf.training_node_overhead_us is not None \
            else 3 * perf.node_overhead_us
    return perf.node_overhead_us


def call_us(perf: DevicePerformance, task: str) -> float:
    if task == "training" and perf.training_call_overhead_us is not None:
        return perf.training_call_overhead_us
    return perf.call_overhead_us


def fit_launch(rows: Sequence[GpuRow]) -> dict[LaunchKey, LaunchFit]:
    """Per key with at least :data:`MIN_FIT_ROWS` rows: the µs per node of :data:`LAUNCH_GRID_US` whose model
    steps (``transfer + max(nodes * us + call, device)``) are closest to the measured in squared log error (the
    smallest such value of a tie)."""
    by_key: dict[LaunchKey, list[GpuRow]] = {}
    for row in rows:
        by_key.setdefault(row.key, []).append(row)
    fits: dict[LaunchKey, LaunchFit] = {}
    for key, group in sorted(by_key.items(), key=lambda item: repr(item[0])):
        if len(group) < MIN_FIT_ROWS:
            continue

        def errors(us: float, group: list[GpuRow] = group) -> list[float]:
            return [math.log((r.transfer_s + max((r.nodes * us + r.call_us) * 1e-6, r.device_s)) / r.step_s)
                    for r in group]
        best = min(LAUNCH_GRID_US, key=lambda us: (sum(e * e for e in errors(us)), us))
        spread = sorted(abs(e) for e in errors(best))
        fits[key] = LaunchFit(round(best, 4), len(group), spread[min(len(spread) - 1, int(0.9 * len(spread)))])
    return fits


def host_bytes(workload: WorkloadProfile) -> tuple[float, float]:
    """(input, output) bytes a step copies between host and GPU: the analysis's graph inputs and outputs (inputs
    from their shapes at :data:`INPUT_ITEM_BYTES` each where it gave none)."""
    inputs = workload.input_bytes or workload.batch_size * INPUT_ITEM_BYTES * sum(
        math.prod(shape) for shape in workload.input_shapes.values())
    if workload.task.value == "training":  # the step returns its loss only
        return float(inputs), 4.0
    return float(inputs), float(workload.output_bytes)


def transfer_seconds(link: HostLink, input_bytes: float, output_bytes: float, pinned: bool) -> float:
    """Seconds of copying ``input_bytes`` to the GPU and ``output_bytes`` back over ``link``."""
    h2d, d2h = (link.h2d_pinned_gbs, link.d2h_pinned_gbs) if pinned else (link.h2d_pageable_gbs,
                                                                         link.d2h_pageable_gbs)
    return input_bytes / (h2d * 1e9) + output_bytes / (d2h * 1e9)


def gpu_peak_gflops(ceilings: Ceilings, precision: Precision) -> float:
    return ceilings.peak_gflops[precision]


@dataclass
class GpuPredictor:
    """The GPU model as a predictor: every GPU candidate (None for a CPU one, which the next predictor answers).
    ``rows`` loads the GPU rows the launch term is fit on (read on the first GPU prediction only: a CPU plan never
    reads them); ``catalog`` the recipes, to compute the rows' device times."""

    rows: Callable[[], Sequence[Measurement]]
    catalog: Mapping[str, Recipe]
    name: str = PREDICTOR
    _fits: dict[LaunchKey, LaunchFit] | None = field(default=None, repr=False)

    @property
    def fits(self) -> dict[LaunchKey, LaunchFit]:
        if self._fits is None:
            self._fits = fit_launch([r for r in map(lambda m: gpu_row(m, self.catalog), self.rows()) if r])
        return self._fits

    def terms(self, workload: WorkloadProfile, ceilings: TargetCeilings, candidate: Candidate,
              recipe: Recipe) -> GpuTerms:
        assert ceilings.gpu is not None
        perf = recipe.performance["gpu"]
        task = workload.task.value
        effects = parameter_effects(recipe, candidate)
        ratio_f = workload.flops / workload.forward_flops if workload.forward_flops else 1.0
        ratio_b = workload.bytes / workload.forward_bytes if workload.forward_bytes else 1.0
        flops: dict[str, float] = {}
        moved: dict[str, float] = {}
        for op in workload.ops:
            flops[op.op_class] = flops.get(op.op_class, 0.0) + op.flops * ratio_f
            moved[op.op_class] = moved.get(op.op_class, 0.0) + op.bytes * ratio_b
        compute, memory = device_seconds(flops, moved, perf, effects, candidate.precision,
                                         gpu_peak_gflops(ceilings.gpu, candidate.precision), ceilings.gpu.bandwidth_gbs)
        key = LaunchKey.of(candidate, task)
        fitted = self.fits.get(key)
        node_us = fitted.node_us if fitted else prior_node_us(perf, key)
        launch = (len(workload.ops) * node_us + call_us(perf, task)) * 1e-6
        link = ceilings.gpu.host_link or HostLink.unknown()
        transfer = transfer_seconds(link, *host_bytes(workload), pinned=candidate.param("io") == "pinned")
        return GpuTerms(launch, transfer, compute, memory)

    def predict(self, workload: WorkloadProfile, ceilings: TargetCeilings, candidate: Candidate,
                recipe: Recipe) -> Prediction | None:
        if candidate.device != "gpu" or ceilings.gpu is None or "gpu" not in recipe.performance:
            return None
        perf = recipe.performance["gpu"]
        terms = self.terms(workload, ceilings, candidate, recipe)
        fitted = self.fits.get(LaunchKey.of(candidate, workload.task.value))
        width = math.exp(max(fitted.log_error_p90, math.log(1.25))) if fitted and terms.regime == "launch" else (
            UNCERTAINTY_MEASURED if ceilings.gpu.measured else UNCERTAINTY_CATALOG)
        nodes = len(workload.ops)
        effects = parameter_effects(recipe, candidate)
        compile_s = (perf.compile_seconds + perf.compile_seconds_per_node * nodes) * effects.get("compile", 1.0)
        if candidate.param("cuda_graphs") is True:
            compile_s += perf.capture_seconds + perf.capture_seconds_per_node * nodes
        step = terms.step_s
        named = (("launch_s", terms.launch_s), ("transfer_s", terms.transfer_s), ("compute_s", terms.compute_s),
                 ("memory_s", terms.memory_s), ("overhead_s", terms.launch_s),
                 ("peak_gflops", gpu_peak_gflops(ceilings.gpu, candidate.precision)),
                 ("bandwidth_gbs", ceilings.gpu.bandwidth_gbs), ("flops", float(workload.flops)),
                 ("bytes", float(workload.bytes)), ("launch_fit_rows", float(fitted.rows if fitted else 0)))
        bound = "overhead" if terms.regime in ("launch", "transfer") else terms.regime
        return Prediction(step, step / width, step * width, compile_s, named, bound, self.name,
                          regime=terms.regime)

    def predict_many(self, workload: WorkloadProfile, ceilings: TargetCeilings,
                     requests: list[PredictionRequest]) -> list[Prediction | None]:
        return [self.predict(workload, ceilings, candidate, recipe) for candidate, recipe in requests]


TF32_OF_BF16 = 0.5  # TF32's tensor-core rate against bf16's (A100, H100: a row carries fp32 and bf16 peaks only)


def gpu_row(row: Measurement, catalog: Mapping[str, Recipe]) -> GpuRow | None:
    """The launch fit's view of a measured GPU row (None: not an ok GPU row of a runtime in ``catalog``). The
    device time is computed at the row's probed peaks; the transfer from its input shapes at the target's
    catalog link, pageable or pinned as its ``io`` (rows carry no output bytes: the fit counts the inputs only, a
    lower bound of the copies, which batch-1 steps, whose launch the fit is decided by, barely have)."""
    if row.device != "gpu" or row.status != "ok" or not row.step_median_s or row.runtime not in catalog:
        return None
    recipe = catalog[row.runtime]
    if "gpu" not in recipe.performance:
        return None
    perf = recipe.performance["gpu"]
    params = json.loads(row.params or "{}")
    precision = Precision(row.precision)
    candidate = Candidate(row.runtime, "gpu", precision, tuple(sorted(params.items())), None)
    peak = {Precision.fp32: row.peak_fp32_gflops, Precision.tf32: (row.peak_bf16_gflops or 0) * TF32_OF_BF16}.get(
        precision, row.peak_bf16_gflops or row.peak_fp32_gflops)
    compute, memory = device_seconds(json.loads(row.op_class_flops or "{}"), json.loads(row.op_class_bytes or "{}"),
                                     perf, parameter_effects(recipe, candidate), precision, peak, row.bandwidth_gbs)
    shapes = json.loads(row.input_shapes or "{}")
    inputs = row.batch_size * INPUT_ITEM_BYTES * sum(math.prod(shape) for shape in shapes.values())
    link = HostLink.of_catalog(row.gpu)
    transfer = transfer_seconds(link, inputs, 0.0, pinned=params.get("io") == "pinned")
    key = LaunchKey(row.runtime, row.task, precision in CAST_PRECISIONS, params.get("cuda_graphs") is True)
    return GpuRow(key, row.model, row.nodes, row.step_median_s, compute + memory, transfer, call_us(perf, row.task))
