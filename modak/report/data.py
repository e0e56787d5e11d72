"""What the report shows, as plain data: the roofline of the chosen device, the workload's ops on it, the
chosen candidate's predicted and any measured achieved performance, and a batch/thread trajectory.

Units: intensity in FLOP/byte, performance in GFLOP/s (workload FLOPs per step / seconds per step).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from pathlib import Path

from modak.errors import ModakError
from modak.hardware.ceilings import Ceilings
from modak.measurements.store import Measurement
from modak.plan import Plan
from modak.predict.base import Predictor, for_model, predict_many
from modak.workload.analysis import WorkloadProfile, analyze

MAX_BATCHES = 10  # trajectory points per thread count
MAX_THREAD_COUNTS = 5


@dataclass(frozen=True)
class Roof:
    """The compute roofs (GFLOP/s per precision) and the memory-bandwidth slope (GB/s) of one device."""

    device: str  # "cpu" or "gpu"
    name: str
    peaks: tuple[tuple[str, float], ...]  # (precision, GFLOP/s), highest first
    bandwidth_gbs: float
    measured: bool
    precision: str  # the chosen candidate's precision: the roof the ops are placed under

    @property
    def peak(self) -> float:
        return dict(self.peaks)[self.precision]

    def above(self, point: PerfPoint) -> bool:
        """Whether ``point`` claims more than the roofline allows at its intensity (beyond rounding)."""
        return point.gflops > 1.01 * self.attainable(point.intensity)

    def attainable(self, intensity: float, peak: float | None = None) -> float:
        """GFLOP/s the roofline allows at ``intensity``: min(peak, intensity x bandwidth)."""
        return min(self.peak if peak is None else peak, intensity * self.bandwidth_gbs)


@dataclass(frozen=True)
class TargetPoint:
    """One target of ``modak whatif`` on the time-vs-cost plot (cost None: the target states no price)."""

    label: str
    time: float
    time_low: float
    time_high: float
    cost: float | None
    cost_low: float | None
    cost_high: float | None
    front: bool


@dataclass(frozen=True)
class OpPoint:
    """One operator of the workload on the roofline (forward pass, whole batch)."""

    name: str
    op_type: str
    op_class: str
    flops: int
    bytes: int
    intensity: float
    gflops: float  # attainable under the chosen precision's roof


@dataclass(frozen=True)
class PerfPoint:
    """Achieved performance of a whole step: predicted (with its interval) or measured."""

    label: str
    runtime: str
    intensity: float
    gflops: float
    low_gflops: float
    high_gflops: float
    step_seconds: float
    source: str  # predictor name, or "measured (local store)" / "measured (shipped)"
    machine: str = ""  # where a measured point was measured


@dataclass(frozen=True)
class TrajectoryPoint:
    batch: int
    threads: int | None
    intensity: float
    gflops: float
    step_seconds: float
    predictor: str
    is_job: bool  # the job's own batch and the candidate's own threads


@dataclass(frozen=True)
class Trajectory:
    runtime: str
    candidate: str
    points: tuple[TrajectoryPoint, ...]
    notes: tuple[str, ...]  # batches that could not be analyzed or predicted
    seconds: float = 0.0


def roof_of(plan: Plan) -> Roof:
    """The roofline of the device the chosen candidate runs on."""
    choice = plan.choice.candidate
    device: Ceilings | None = plan.ceilings.gpu if choice.device == "gpu" else plan.ceilings.cpu
    assert device is not None
    peaks = tuple(sorted(((p.value, float(v)) for p, v in device.peak_gflops.items()), key=lambda t: -t[1]))
    return Roof(choice.device, device.name, peaks, float(device.bandwidth_gbs), device.measured,
                choice.precision.value)


def op_points(workload: WorkloadProfile, roof: Roof) -> tuple[list[OpPoint], int]:
    """Ops with FLOPs and bytes, placed at their attainable performance; and how many had none to plot."""
    points = []
    for op in workload.ops:
        if op.flops <= 0 or op.bytes <= 0:
            continue
        intensity = op.flops / op.bytes
        points.append(OpPoint(op.name, op.op_type, op.op_class, op.flops, op.bytes, intensity,
                              roof.attainable(intensity)))
    return points, len(workload.ops) - len(points)


def chosen_point(plan: Plan) -> PerfPoint:
    """The chosen candidate's predicted achieved performance at the workload's overall intensity."""
    return predicted_point(plan, 0)


def predicted_point(plan: Plan, index: int) -> PerfPoint:
    ranked = plan.ranked[index]
    p, flops = ranked.prediction, plan.workload.flops
    return PerfPoint(ranked.candidate.name, ranked.candidate.runtime, plan.workload.arithmetic_intensity,
                     flops / p.step_seconds / 1e9, flops / p.high_seconds / 1e9, flops / p.low_seconds / 1e9,
                     p.step_seconds, p.predictor)


def workload_rows(plan: Plan, store: Path | None = None) -> list[tuple[Measurement, str]]:
    """Measured rows of this workload on the chosen device class of this target's hardware: same model, task,
    batch and input shapes, measured on a machine of the target's name or on the same hardware (CPU: same
    microarchitecture and core count; GPU: same GPU model). A local row replaces a shipped row of the same
    configuration. Each row comes with where it came from."""
    from modak.predict.training import local_rows, ok_rows, shipped_rows

    local = ok_rows(local_rows(store))
    keys = {r.key for r in local}
    rows = [(r, "local store") for r in local] + [(r, "shipped") for r in ok_rows(shipped_rows())
                                                  if r.key not in keys]
    workload, job = plan.workload, plan.loaded.job
    shapes = {k: list(v) for k, v in workload.input_shapes.items()}
    device, ceilings = plan.choice.candidate.device, plan.ceilings

    def same_hardware(r: Measurement) -> bool:
        if r.machine == plan.loaded.target.name:
            return True
        if device == "gpu":
            return ceilings.gpu is not None and r.gpu == ceilings.gpu.name
        return r.microarchitecture == ceilings.microarchitecture and r.cores == ceilings.cores

    def same(r: Measurement) -> bool:
        try:
            row_shapes = json.loads(r.input_shapes)
        except (TypeError, ValueError):
            return False
        return (r.model == workload.model_name and r.task == job.task.value and r.batch_size == workload.batch_size
                and row_shapes == shapes and r.device == device and same_hardware(r))

    return [(r, origin) for r, origin in rows if same(r)]


def measured_points(plan: Plan, store: Path | None = None) -> list[PerfPoint]:
    """Measured achieved performance (workload FLOPs / measured step) of each measured configuration."""
    flops, intensity = plan.workload.flops, plan.workload.arithmetic_intensity
    points = []
    for r, origin in workload_rows(plan, store):
        step = r.step_s  # ok_rows: set and positive
        slow = float(r.step_p90_s or step)
        fast = float(r.step_p10_s or step)
        settings = " ".join(f"{k}={v}" for k, v in json.loads(r.params or "{}").items())
        label = f"{r.runtime}/{r.device}/{r.precision}" + (f" {settings}" if settings else "")
        points.append(PerfPoint(label, r.runtime, intensity, flops / step / 1e9, flops / slow / 1e9,
                                flops / fast / 1e9, step, f"measured ({origin})", r.machine))
    points.sort(key=lambda p: p.step_seconds)
    return points


def batch_sizes(job_batch: int, limit: int = MAX_BATCHES) -> list[int]:
    """1, 2, 4, ... up to 4x the job's batch (the job's batch included), at most ``limit`` values."""
    top = max(1, 4 * job_batch)
    values = sorted({2 ** i for i in range(int(math.log2(top)) + 1)} | {job_batch, top})
    return _thin(values, {1, job_batch, top}, limit)


def thread_counts(threads: int | None, cores: int, limit: int = MAX_THREAD_COUNTS) -> list[int | None]:
    """1, 2, 4, ... cores (the candidate's own count included); [None] where threads do not apply."""
    if not threads:
        return [None]
    values = sorted({2 ** i for i in range(int(math.log2(max(1, cores))) + 1)} | {threads, cores})
    return list(_thin(values, {1, threads, cores}, limit))


def _thin(values: list[int], keep: set[int], limit: int) -> list[int]:
    """At most ``limit`` of the sorted ``values``, evenly spread in log scale, always keeping ``keep``."""
    if len(values) <= limit:
        return values
    chosen = set(keep)
    lo, hi = math.log(values[0]), math.log(values[-1])
    for i in range(limit):
        if len(chosen) >= limit:
            break
        target = lo + (hi - lo) * i / max(1, limit - 1)
        chosen.add(min(values, key=lambda v: abs(math.log(v) - target)))
    return sorted(chosen)


def trajectory(plan: Plan, predictor: Predictor, optimizer: str = "sgd_momentum") -> Trajectory:
    """Predicted achieved performance of the chosen candidate at other batch sizes and thread counts.

    The model is re-analysed at each batch (intensity rises with batch where weights dominate the bytes) and
    each (batch, threads) variant of the chosen candidate is re-predicted with the plan's predictor.
    """
    import time

    start = time.perf_counter()
    chosen, source = plan.choice.candidate, plan.source
    predictor = for_model(predictor, source.onnx_path, source.zoo)  # as the plan's: for this model
    recipe = plan.recipe()
    job = plan.loaded.job
    points: list[TrajectoryPoint] = []
    notes: list[str] = []
    threads = thread_counts(chosen.threads, plan.ceilings.cores)
    for batch in batch_sizes(plan.workload.batch_size):
        if batch == plan.workload.batch_size:
            workload = plan.workload
        elif source.onnx_path is None:
            notes.append(f"batch {batch}: not analysed (the model has no ONNX export; the plan's batch only)")
            continue
        else:
            try:
                workload = analyze(source.onnx_path, batch, source.input_shapes, job.task, optimizer,
                                   name=source.name)
            except ModakError as exc:
                notes.append(f"batch {batch}: not analysed ({exc})")
                continue
        variants = [replace(chosen, threads=t) if t is not None else chosen for t in threads]
        predictions = predict_many(predictor, workload, plan.ceilings, [(v, recipe) for v in variants])
        for t, prediction in zip(threads, predictions):
            if prediction is None or prediction.step_seconds <= 0:
                notes.append(f"batch {batch}" + (f", {t} threads" if t else "") + ": no prediction")
                continue
            points.append(TrajectoryPoint(
                batch, t, workload.arithmetic_intensity, workload.flops / prediction.step_seconds / 1e9,
                prediction.step_seconds, prediction.predictor,
                batch == plan.workload.batch_size and t == chosen.threads))
    return Trajectory(chosen.runtime, chosen.name, tuple(points), tuple(notes), time.perf_counter() - start)
