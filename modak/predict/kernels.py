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

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from modak.candidates.catalog import Recipe
from modak.candidates.enumerate import Candidate
from modak.hardware.ceilings import TargetCeilings
from modak.image.kernels import Kernel
from modak.predict.base import Prediction, PredictionRequest, Widening
from modak.predict.kernel_model import KernelModel, Walked
from modak.predict.kernel_names import PREDICTOR
from modak.predict.kernel_terms import MachineCeilings
from modak.predict.learned import NEW_MACHINE_SPREAD
from modak.predict.roofline import RooflinePredictor
from modak.spec.models import Task
from modak.workload.analysis import WorkloadProfile

# The kernels a runtime plans for a workload, given the candidate and its threads (the seam tests fill by hand).
KernelsOf = Callable[[WorkloadProfile, Candidate, int], Sequence[Kernel]]


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
                 ("calibration", c.calibration))
        bound = max((("compute", c.compute_s), ("memory", c.memory_s), ("overhead", c.dispatch_s)),
                    key=lambda t: t[1])[0]
        return Prediction(c.step_s, c.low_s, c.high_s, physics.compile_seconds, terms, bound, c.predictor,
                          run_spread=c.run_spread,
                          widening=Widening(new_machine=0.0 if c.known_machine else NEW_MACHINE_SPREAD))
