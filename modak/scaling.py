"""Data-parallel training on several workers (GPUs; nodes for a CPU job): the predicted step time and parallel
efficiency for 1..N workers, the largest N that keeps the job's ``scaling.min_efficiency``, and a fit of the
model to measured step times (``modak scale``).

The model (weak scaling: every worker keeps the job's batch, so N workers train on N x batch samples a step):

* compute: one worker's step, the plan's prediction for its choice (or the measured one-worker step); the
  backward pass is its share of the step's FLOPs (the analysis' rule: twice the forward pass, so about 2/3).
* gradients: S = the trainable parameters x the bytes of the gradient dtype (fp32 under autocast), all-reduced
  every step in buckets of ``bucket_mb`` (DDP's default, 25 MiB), one collective call each.
* all-reduce, NCCL's own alpha-beta tuning model (NVIDIA/nccl ``src/graph/tuning.cc``), for N workers on n nodes
  of g workers each::

      ring: calls x (base + 2(N-n) alpha_intra + 2(n-1) alpha_net)           + 2(N-1)/N x S / beta
      tree: calls x (base + 2((g-1) alpha_intra + ceil(log2 n) alpha_net))   + 2 S / beta

  beta is the slowest link the collective crosses: the intra-node link (NVLink, PCIe) on one node, else the
  lesser of it and the node's network bandwidth (the "bus bandwidth" of nccl-tests' doc/PERFORMANCE.md:
  t = 2(N-1)/N x S / B for a ring). The faster algorithm is taken, as NCCL's tuner takes it.
* overlap: buckets are all-reduced while the backward pass still runs, so a share ``overlap`` of the
  communication hides behind it, at most the backward pass's length: exposed = comm - overlap x min(comm,
  backward). Default: overlap = 1 - bucket/S (the last bucket can only start when the backward pass has ended,
  the gradients assumed to become ready evenly through it).
* step(N) = compute + exposed(N); efficiency(N) = step(1) / step(N).

Defaults come from ``recipes/hardware/interconnects.yaml`` and ``gpus.yaml``; a target's ``network`` overrides
the network's; :func:`fit` fits the parameters the measured points can identify.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Protocol

from modak.allreduce import GRADIENT_BYTES, MIB, Link, Point, ScalingModel, default_overlap, network_link
from modak.documents import SCHEMA_VERSION, duration, encoded, rounded
from modak.documents import scale as scale_doc
from modak.documents.plan import DataParallel as DataParallelRecord
from modak.errors import InputError
from modak.hardware.ceilings import interconnects

if TYPE_CHECKING:
    from modak.candidates.enumerate import Candidate
    from modak.hardware.ceilings import TargetCeilings
    from modak.predict.base import Prediction
    from modak.spec.loader import LoadedJob
    from modak.spec.models import Scaling
    from modak.workload.analysis import WorkloadProfile


class Chosen(Protocol):
    """What the scaling model reads of a plan's choice (:class:`modak.plan.RankedCandidate`)."""

    @property
    def candidate(self) -> Candidate: ...

    @property
    def prediction(self) -> Prediction: ...


class Planned(Protocol):
    """What the scaling model reads of a plan (:class:`modak.plan.Plan`, which decides its worker count with
    :func:`advise` and so cannot be imported here)."""

    @property
    def loaded(self) -> LoadedJob: ...

    @property
    def workload(self) -> WorkloadProfile: ...

    @property
    def ceilings(self) -> TargetCeilings: ...

    @property
    def choice(self) -> Chosen: ...


_SCALE_BOUNDS = (1e-3, 1e3)  # what a fitted factor on a default may be
_PRIOR_WEIGHT = 1e-6  # pulls each fitted factor toward its default where the points do not determine it


# ----------------------------------------------------------------------------------------------------------
# Fitting to measured step times


@dataclass(frozen=True)
class Fit:
    """The model fitted to measured seconds per step by worker count."""

    model: ScalingModel
    fitted: tuple[str, ...]  # parameter names the points determined, in the order they are freed
    kept: tuple[str, ...]  # parameters left at their defaults
    measured: tuple[tuple[int, float], ...]
    notes: tuple[str, ...]

    def residuals(self) -> list[tuple[int, float, float]]:
        """(workers, measured, predicted) per measured point."""
        return [(n, seconds, self.model.predict(n).step_s) for n, seconds in self.measured]

    def record(self) -> scale_doc.Fit:
        """``modak scale``'s ``fit``."""
        return scale_doc.Fit(fitted=list(self.fitted), defaults=list(self.kept), notes=list(self.notes),
                             points=[scale_doc.FitPoint(workers=n, measured_seconds=rounded(m),
                                                        predicted_seconds=rounded(p), error=round(p / m - 1, 6))
                                     for n, m, p in self.residuals()])


PARAMETERS = {
    "compute_seconds": "one worker's step time",
    "overlap": "the share of communication hidden behind the backward pass",
    "network_bandwidth": "the network's bandwidth (beta)",
    "network_latency": "the network's latency per step (alpha)",
    "intra_bandwidth": "the intra-node link's bandwidth (beta)",
    "intra_latency": "the intra-node link's latency per step (alpha)",
}


def fit(model: ScalingModel, measured: Mapping[int, float]) -> Fit:
    """Fit ``model`` to measured seconds per step (workers -> seconds) by least squares on relative errors.

    A one-worker point is the compute time itself. The other points free parameters in this order, one per
    point, the rest staying at their defaults: (compute time, when one worker was not measured), the
    bandwidth of the outermost link the points cross (the network when a point spans nodes, else the
    intra-node link), the overlap, that link's latency, then the inner link's bandwidth when points also lie
    within one node. Two points (1 and 2 workers) thus fit one bandwidth, with overlap and latencies at their
    defaults.
    """
    import numpy as np
    from scipy.optimize import least_squares

    points = tuple(sorted(measured.items()))
    for workers, seconds in points:
        if not (seconds > 0 and math.isfinite(seconds)):
            raise InputError(f"measured step time for {workers} workers must be a positive number of seconds")
        try:
            shape = model.layout(workers)
        except ValueError as exc:
            raise InputError(f"measured point {workers}={seconds:g}: {exc}") from None
        if shape.nodes > 1 and model.network is None:
            raise InputError(f"measured point {workers}={seconds:g}: spans {shape.nodes} nodes, but the target's "
                             "nodes are not connected (network.interconnect none)")
    base = model
    fixed: list[str] = []
    notes: list[str] = []
    if 1 in measured:
        base = replace(base, compute_s=measured[1])
        notes.append(f"compute: the measured one-worker step, {duration(measured[1])} "
                     f"(predicted {duration(model.compute_s)})")
        fixed.append("compute_seconds")
    many = [w for w, _ in points if w > 1]
    spans_nodes = any(model.layout(w).nodes > 1 for w in many)
    within_node = any(model.layout(w).nodes == 1 for w in many)
    outer = "network" if spans_nodes else "intra"
    order = ([] if 1 in measured else ["compute_seconds"]) + [f"{outer}_bandwidth", "overlap", f"{outer}_latency"]
    if spans_nodes and within_node:
        order.append("intra_bandwidth")
    free = order[:len(many)]  # one parameter per point beyond the one-worker step
    kept = tuple(name for name in PARAMETERS if name not in free and name not in fixed
                 and _applies(model, name))
    if not free:
        return Fit(base, tuple(fixed), kept, points, tuple(notes))

    def build(x: Iterable[float]) -> ScalingModel:
        current = base
        for name, value in zip(free, x):
            current = _set(current, base, name, value)
        return current

    def residuals(x: Iterable[float], /) -> Any:
        current = build(x)
        errors = [current.predict(w).step_s / s - 1 for w, s in points]
        prior = [_PRIOR_WEIGHT * (v - _start(base, name)) for name, v in zip(free, x)]
        return np.array(errors + prior)

    low = [0.0 if name == "overlap" else math.log(_SCALE_BOUNDS[0]) for name in free]
    high = [1.0 if name == "overlap" else math.log(_SCALE_BOUNDS[1]) for name in free]
    starts = [[_start(base, name) for name in free]]
    for factor in (-2.0, 2.0):
        starts.append([min(1.0, max(0.0, base.overlap + factor / 8)) if name == "overlap" else factor
                       for name in free])
    best = min((least_squares(residuals, x0, bounds=(low, high), method="trf") for x0 in starts),
               key=lambda r: r.cost)
    fitted_model = build(best.x)
    jacobian = np.asarray(best.jac)  # the residuals' by the free parameters at the fit
    for i, (name, value) in enumerate(zip(free, best.x)):
        # Undetermined: at a bound, or the measured steps hardly depend on it (doubling a factor, or moving the
        # overlap by 0.1, changes none of them by 0.1%).
        slope = float(np.max(np.abs(jacobian[:len(points), i]))) * (0.1 if name == "overlap" else math.log(2))
        loose = bool(value <= low[i] + 1e-6 or value >= high[i] - 1e-6 or slope < 1e-3)
        notes.append(_describe(fitted_model, base, name, value, loose))
    return Fit(fitted_model, tuple(fixed) + tuple(free), kept, points, tuple(notes))


def _applies(model: ScalingModel, name: str) -> bool:
    if name.startswith("intra_"):
        return model.intra is not None
    if name.startswith("network_"):
        return model.network is not None and model.max_nodes > 1
    return True


def _start(base: ScalingModel, name: str) -> float:
    """The default of a free parameter in the fit's coordinates (overlap itself, else log of a factor)."""
    return base.overlap if name == "overlap" else 0.0


def _set(model: ScalingModel, base: ScalingModel, name: str, value: float) -> ScalingModel:
    """``model`` with parameter ``name`` at ``value`` (overlap itself; the others as log of a factor on base)."""
    factor = math.exp(value)
    if name == "overlap":
        return replace(model, overlap=value)
    if name == "compute_seconds":
        return replace(model, compute_s=base.compute_s * factor)
    level, what = name.split("_")
    default, current = (base.intra, model.intra) if level == "intra" else (base.network, model.network)
    assert default is not None and current is not None
    changed = (replace(current, bandwidth_gbs=default.bandwidth_gbs * factor) if what == "bandwidth"
               else replace(current, latency_us=default.latency_us * factor))
    changed = replace(changed, source=f"fitted to the measured steps (default: {default.source})")
    return replace(model, intra=changed) if level == "intra" else replace(model, network=changed)


def _describe(model: ScalingModel, base: ScalingModel, name: str, value: float, loose: bool) -> str:
    bound = (": the measured steps hardly depend on it, so they do not determine it (their communication is "
             "hidden or negligible)" if loose else "")
    if name == "overlap":
        return f"overlap: {value:.2f} fitted (default {base.overlap:.2f}){bound}"
    if name == "compute_seconds":
        return f"compute: {duration(model.compute_s)} per step fitted (predicted {duration(base.compute_s)}){bound}"
    level, what = name.split("_")
    link, default = (model.intra, base.intra) if level == "intra" else (model.network, base.network)
    assert link is not None and default is not None
    where = "intra-node link" if level == "intra" else "network"
    if what == "bandwidth":
        return (f"{where} bandwidth: {link.bandwidth_gbs:.3g} GB/s fitted (default {default.bandwidth_gbs:.3g} "
                f"GB/s){bound}")
    return f"{where} latency: {link.latency_us:.3g} us per step fitted (default {default.latency_us:.3g} us){bound}"


# ----------------------------------------------------------------------------------------------------------
# The model of a plan, and the advice


def scaling_model(plan: Planned, gradient_dtype: str = "fp32", single_node: bool = False) -> ScalingModel:
    """The default model of the plan's choice on its target: one worker per GPU (per node for a CPU choice),
    links from the GPU catalog, the interconnect table and the target's ``network``."""
    from modak.hardware.ceilings import gpu_catalog
    from modak.workload.analysis import BACKWARD_FLOPS

    target, workload = plan.loaded.target, plan.workload
    table = interconnects()
    gpu = plan.choice.candidate.device == "gpu"
    per_node = plan.ceilings.gpu_count if gpu else 1
    intra = None
    if gpu and per_node > 1:
        assert plan.ceilings.gpu is not None
        name = plan.ceilings.gpu.name
        entry = gpu_catalog().get(name, {})
        kind = entry.get("link", table["default_intra_node"])
        if kind == "nvlink":
            intra = Link("nvlink", float(entry["nvlink_gbs"]), float(table["intra_node"]["nvlink"]["latency_us"]),
                         f"{name} NVLink in recipes/hardware/gpus.yaml")
        else:
            spec = table["intra_node"][kind]
            intra = Link(kind, float(spec["bandwidth_gbs"]), float(spec["latency_us"]),
                         f"{name}: {kind} x16 in recipes/hardware/" + ("gpus.yaml" if entry.get("link") else
                                                                      "interconnects.yaml (the default: not in "
                                                                      "gpus.yaml)"))
    kind = target.network.interconnect
    network = None if kind == "none" else network_link(
        kind, target.network.bandwidth_gbps, target.network.latency_us, target.network.efficiency, "the target's")
    nodes = 1 if (network is None or single_node) else target.nodes
    size = workload.parameters * GRADIENT_BYTES[gradient_dtype]
    bucket = float(table["bucket_mb"]) * MIB
    backward = workload.forward_flops * BACKWARD_FLOPS / workload.flops if workload.flops else 2 / 3
    return ScalingModel(
        compute_s=plan.choice.prediction.step_seconds, backward_share=backward, gradient_bytes=float(size),
        overlap=default_overlap(size, bucket), workers_per_node=per_node, max_nodes=nodes, intra=intra,
        network=network, bucket_bytes=bucket, base_latency_us=float(table["base_latency_us"]))


@dataclass(frozen=True)
class ScaleAdvice:
    """``modak scale``'s answer: the table, the chosen worker count and why."""

    job: str
    target: str
    candidate: str
    batch_size: int
    min_efficiency: float
    limit: int | None  # the most workers asked for (scaling.max_workers, --max-workers)
    gradient_dtype: str
    model: ScalingModel  # fitted where measured points were given
    points: tuple[Point, ...]
    chosen: Point
    fit: Fit | None
    reasons: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        """``modak scale --json``: a :class:`~modak.documents.scale.ScaleDocument`."""
        chosen = self.chosen
        return encoded(scale_doc.ScaleDocument(
            schema_version=SCHEMA_VERSION, job=self.job, target=self.target, candidate=self.candidate,
            batch_size=self.batch_size, scaling="weak", min_efficiency=self.min_efficiency, max_workers=self.limit,
            gradient_dtype=self.gradient_dtype, model=self.model.record(),  # type: ignore[arg-type]
            points=[p.record(self.batch_size) for p in self.points],
            chosen=scale_doc.Chosen(workers=chosen.workers, nodes=chosen.nodes, workers_per_node=chosen.per_node,
                                    efficiency=rounded(chosen.efficiency)),
            fit=self.fit.record() if self.fit else None, reasons=list(self.reasons)))


def advise(plan: Planned, scaling: Scaling | None = None, max_workers: int | None = None,
           measured: Mapping[int, float] | None = None, single_node: bool = False) -> ScaleAdvice:
    """Predict 1..N workers for the plan's choice and pick the largest N that keeps ``min_efficiency``.

    ``scaling`` defaults to the job's (or the spec's defaults); ``max_workers`` and ``measured`` add to it (the
    command line's ``--max-workers`` and ``--measured``); ``single_node``: the job script cannot start processes
    on several nodes (no scheduler)."""
    from modak.spec.models import Scaling, Task

    loaded = plan.loaded
    job = loaded.job
    if job.task is not Task.training:
        raise loaded.job_doc.error(("task",), "modak scale predicts data-parallel training; this is an "
                                              f"{job.task.value} job (serve more replicas to scale it)")
    spec = scaling or job.scaling or Scaling()
    points_measured = {**spec.measured, **(measured or {})}
    limit = max_workers or spec.max_workers
    default = scaling_model(plan, spec.gradient_dtype, single_node)
    try:
        result = fit(default, points_measured) if points_measured else None
    except InputError as exc:
        if measured:  # the command line's points
            raise
        raise loaded.job_doc.error(("scaling", "measured"), exc.message) from None
    model = result.model if result else default
    points = tuple(model.predict(n) for n in model.worker_counts(limit))
    chosen = max((p for p in points if p.efficiency >= spec.min_efficiency - 1e-12), key=lambda p: p.workers)
    batch = int(job.model.batch_size)
    advice = ScaleAdvice(job.name, loaded.target.name, plan.choice.candidate.name, batch, spec.min_efficiency,
                         limit, spec.gradient_dtype, model, points, chosen, result, ())
    return replace(advice, reasons=_reasons(advice, plan, single_node))


def _reasons(advice: ScaleAdvice, plan: Planned, single_node: bool) -> tuple[str, ...]:
    model, chosen, batch = advice.model, advice.chosen, advice.batch_size
    target = plan.loaded.target
    worker = "GPU" if plan.choice.candidate.device == "gpu" else "node"
    reasons = []
    after = next((p for p in advice.points if p.workers > chosen.workers), None)
    top = advice.points[-1]
    if after is not None:
        why = (f"{after.workers} workers would give {after.efficiency:.2f} < {advice.min_efficiency:g} "
               f"(min_efficiency)")
    elif top.workers < model.max_workers and advice.limit:
        why = f"max_workers is {advice.limit}"
    elif single_node and target.nodes > 1:
        why = "the job script runs on one node: a target without a scheduler cannot start processes on others"
    elif model.network is None and target.nodes > 1:
        why = "the target's nodes are not connected (network.interconnect none)"
    else:
        why = (f"the target has no more ({target.nodes} node(s) x {model.workers_per_node} GPU(s))" if worker == "GPU"
               else f"the target has no more ({target.nodes} node(s), one worker each)")
    reasons.append(f"chose {chosen.workers} worker(s) ({chosen.nodes} node(s) x {chosen.per_node}): predicted "
                   f"efficiency {chosen.efficiency:.2f} >= {advice.min_efficiency:g}, {duration(chosen.step_s)} per "
                   f"step, {chosen.samples_per_second(batch):.4g} samples/s; {why}")
    reasons.append(f"weak scaling: every worker keeps the job's batch of {batch}, so N workers train on N x {batch} "
                   f"samples per step; efficiency = one worker's step time / N workers' step time")
    reasons.append(f"compute: {duration(model.compute_s)} per step on one {worker} "
                   + (f"(the plan's prediction for {advice.candidate})" if not advice.fit
                      or "compute_seconds" not in advice.fit.fitted else "(from the measured steps)")
                   + f"; the backward pass is {model.backward_share:.0%} of it ({duration(model.backward_s)})")
    reasons.append(f"gradients: {plan.workload.parameters / 1e6:.3g} M parameters x "
                   f"{GRADIENT_BYTES[advice.gradient_dtype]} bytes ({advice.gradient_dtype}) = "
                   f"{model.gradient_bytes / 1e6:.4g} MB all-reduced per step in {model.calls} bucket(s) of "
                   f"{model.bucket_bytes / MIB:g} MiB")
    if model.intra is not None:
        reasons.append(f"within a node: {model.workers_per_node} GPUs over {model.intra.kind}, "
                       f"{model.intra.bandwidth_gbs:.3g} GB/s per GPU and direction, {model.intra.latency_us:.3g} us "
                       f"per step ({model.intra.source})")
    if model.network is not None and model.max_nodes > 1:
        reasons.append(f"between nodes: {model.network.kind}, {model.network.bandwidth_gbs * 8:.3g} Gbit/s per "
                       f"node, {model.network.latency_us:.3g} us per step ({model.network.source})")
    reasons.append(f"overlap: {model.overlap:.2f} of the all-reduce can hide behind the backward pass"
                   + (" (all buckets but the last)" if not advice.fit or "overlap" not in advice.fit.fitted
                      else " (fitted)"))
    if advice.fit:
        kept = ", ".join(advice.fit.kept) or "none"
        reasons.append("fit to the measured steps: " + "; ".join(advice.fit.notes) + f"; at their defaults: {kept}")
        if not plan.loaded.job.scaling or dict(plan.loaded.job.scaling.measured) != dict(advice.fit.measured):
            reasons.append("modak render and build fit to the job's scaling.measured: put these points there for "
                           "the job script to request what this fit chooses")
    return tuple(reasons)


@dataclass(frozen=True)
class DataParallel:
    """The data-parallel layout a plan decided for a training job with ``scaling``: what its job script runs."""

    workers: int
    nodes: int
    per_node: int
    efficiency: float  # predicted
    step_s: float  # predicted, with ``workers`` workers
    min_efficiency: float
    summary: str  # one line: the layout and its predicted efficiency

    def record(self) -> DataParallelRecord:
        """The plan's ``data_parallel``."""
        return DataParallelRecord(workers=self.workers, nodes=self.nodes, workers_per_node=self.per_node,
                                  efficiency=rounded(self.efficiency), step_seconds=rounded(self.step_s),
                                  min_efficiency=self.min_efficiency, summary=self.summary)


def decide(plan: Planned) -> DataParallel | None:
    """The worker count of a training job with ``scaling`` (None for any other job): the largest that keeps its
    ``min_efficiency`` (:func:`advise`), on one node where the target's scheduler cannot start processes on
    others."""
    from modak import schedulers
    from modak.spec.models import Task

    job, target = plan.loaded.job, plan.loaded.target
    if job.scaling is None or job.task is not Task.training:
        return None
    single_node = not schedulers.scheduler(target.scheduler.kind).multi_node
    chosen = advise(plan, single_node=single_node).chosen
    summary = (f"{chosen.workers} data-parallel worker(s), {chosen.nodes} node(s) x {chosen.per_node}: predicted "
               f"efficiency {chosen.efficiency:.2f} (min_efficiency {job.scaling.min_efficiency:g}; modak scale)"
               + ("; one node at most: without a scheduler, the script starts no processes on other nodes"
                  if single_node and target.nodes > 1 else ""))
    return DataParallel(chosen.workers, chosen.nodes, chosen.per_node, chosen.efficiency, chosen.step_s,
                        job.scaling.min_efficiency, summary)
