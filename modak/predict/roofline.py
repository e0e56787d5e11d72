"""Analytic roofline predictor: per op max(FLOPs / peak, bytes / bandwidth) plus runtime overheads.

Peaks and bandwidth come from the target (measured or catalog); the fractions of peak a runtime reaches,
its fusion and its overheads are the recipe's priors, adjusted by the candidate's parameter effects.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from modak.candidates.catalog import Recipe, value_key
from modak.candidates.enumerate import Candidate
from modak.hardware.ceilings import TargetCeilings, bandwidth_share
from modak.predict.base import Prediction
from modak.spec.models import Precision
from modak.workload.analysis import WorkloadProfile

# Bytes per element relative to fp32 for the tensors a precision moves.
_BYTES_SCALE = {Precision.fp32: 1.0, Precision.tf32: 1.0, Precision.bf16: 0.5, Precision.fp16: 0.5,
                Precision.int8: 0.25}
# Op classes whose memory traffic operator fusion removes.
_FUSABLE = frozenset({"elementwise", "normalization"})
# Interval half-widths (a factor) of the priors: wider when the target's ceilings are catalog guesses.
UNCERTAINTY_MEASURED = 2.0
UNCERTAINTY_CATALOG = 2.5


@dataclass(frozen=True)
class RooflinePredictor:
    """The physics-only predictor every candidate can fall back to."""

    name: str = "roofline"

    def predict(self, workload: WorkloadProfile, ceilings: TargetCeilings, candidate: Candidate,
                recipe: Recipe) -> Prediction:
        perf = recipe.performance[candidate.device]
        device = ceilings.gpu if candidate.device == "gpu" else ceilings.cpu
        assert device is not None
        effects = parameter_effects(recipe, candidate)
        compute_share, bandwidth_share = thread_shares(candidate, ceilings.cores)
        peak = device.peak_gflops[candidate.precision] * 1e9 * compute_share
        bandwidth = (device.bandwidth_gbs * 1e9 * perf.memory_efficiency * effects.get("memory", 1.0)
                     * bandwidth_share)
        tuning = tuning_factor(recipe, candidate)
        fusion = perf.fusion * effects.get("fusion", 1.0)
        flop_ratio = workload.flops / workload.forward_flops if workload.forward_flops else 1.0
        byte_ratio = workload.bytes / workload.forward_bytes if workload.forward_bytes else 1.0
        compute_s = memory_s = 0.0
        for op in workload.ops:
            efficiency = perf.compute_efficiency.get(op.op_class, perf.compute_efficiency["default"])
            efficiency = min(1.0, efficiency * effects.get(f"compute.{op.op_class}", 1.0)
                             * effects.get("compute", 1.0) * tuning)
            op_compute, op_memory = op_seconds(
                op.flops * flop_ratio, op.bytes * byte_ratio * ((1.0 - fusion) if op.op_class in _FUSABLE else 1.0),
                candidate.precision, peak * efficiency, bandwidth)
            if op_compute >= op_memory:
                compute_s += op_compute
            else:
                memory_s += op_memory
        overhead_s = overhead_seconds(recipe, candidate, len(workload.ops), workload.task.value == "training")
        step = compute_s + memory_s + overhead_s
        compile_s = ((perf.compile_seconds + perf.compile_seconds_per_node * len(workload.ops))
                     * effects.get("compile", 1.0) + tuning_seconds(recipe, candidate))
        width = UNCERTAINTY_MEASURED if device.measured else UNCERTAINTY_CATALOG
        terms = (("compute_s", compute_s), ("memory_s", memory_s), ("overhead_s", overhead_s),
                 ("peak_gflops", peak / 1e9), ("bandwidth_gbs", bandwidth / 1e9),
                 ("flops", float(workload.flops)), ("bytes", float(workload.bytes)))
        bound = max((("compute", compute_s), ("memory", memory_s), ("overhead", overhead_s)), key=lambda t: t[1])[0]
        return Prediction(step, step / width, step * width, compile_s, terms, bound, self.name)


def thread_shares(candidate: Candidate, cores: int) -> tuple[float, float]:
    """The shares of the device's (peak, bandwidth) a candidate's threads get: on a CPU compute scales with
    cores, and a few cores already saturate much of a socket's bandwidth."""
    if candidate.device != "cpu" or not candidate.threads:
        return 1.0, 1.0
    return candidate.threads / cores, bandwidth_share(candidate.threads, cores)


def overhead_seconds(recipe: Recipe, candidate: Candidate, nodes: int, training: bool) -> float:
    """The runtime's dispatch overhead per step (its priors per graph node and per call, times the candidate's
    parameter effects): what bounds a step of many small ops, where the roofline says next to nothing."""
    perf = recipe.performance[candidate.device]
    if training:  # forward, backward and update launch their own ops
        node_us = perf.training_node_overhead_us if perf.training_node_overhead_us is not None \
            else 3 * perf.node_overhead_us
        call_us = perf.training_call_overhead_us if perf.training_call_overhead_us is not None \
            else perf.call_overhead_us
    else:
        node_us, call_us = perf.node_overhead_us, perf.call_overhead_us
    return (nodes * node_us + call_us) * 1e-6 * parameter_effects(recipe, candidate).get("overhead", 1.0)


def op_seconds(flops: float, fp32_bytes: float, precision: Precision, peak: float,
               bandwidth: float) -> tuple[float, float]:
    """(compute, memory) seconds of ``flops`` at ``peak`` FLOP/s and of moving ``fp32_bytes`` (sized as fp32
    tensors, scaled to ``precision``) at ``bandwidth`` B/s; the roofline time is the larger."""
    return flops / peak, fp32_bytes * _BYTES_SCALE[precision] / bandwidth


def parameter_effects(recipe: Recipe, candidate: Candidate) -> dict[str, float]:
    """The product of the recipe's effect factors for the candidate's parameter values, per term."""
    factors: dict[str, float] = {}
    values = dict(candidate.params)
    for parameter in recipe.parameters:
        if parameter.name not in values:
            continue
        for term, factor in parameter.effects.get(value_key(values[parameter.name]), {}).items():
            factors[term] = factors.get(term, 1.0) * factor
    return factors


def tuning_factor(recipe: Recipe, candidate: Candidate) -> float:
    """Compute-efficiency factor a tuning budget buys, interpolated in log(trials) between catalog points."""
    if recipe.tuning is None:
        return 1.0
    trials = int(candidate.param(recipe.tuning.parameter, 0) or 0)
    points = sorted(recipe.tuning.efficiency.items())
    if trials <= points[0][0]:
        return points[0][1]
    for (t0, e0), (t1, e1) in zip(points, points[1:]):
        if trials <= t1:
            x0, x1, x = (math.log1p(v) for v in (t0, t1, trials))
            return e0 + (e1 - e0) * (x - x0) / (x1 - x0)
    return points[-1][1]


def tuning_seconds(recipe: Recipe, candidate: Candidate) -> float:
    """Time the candidate's tuning budget costs."""
    if recipe.tuning is None:
        return 0.0
    return int(candidate.param(recipe.tuning.parameter, 0) or 0) * recipe.tuning.seconds_per_trial
