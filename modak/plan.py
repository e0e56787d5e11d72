"""The plan: predict every candidate, rank them for the job's objective, pick one, and say why."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from modak.candidates.catalog import Recipe, load_catalog, value_key
from modak.candidates.enumerate import Candidate, Pruned, enumerate_candidates
from modak.documents import SCHEMA_VERSION, duration, encoded, rounded
from modak.documents import plan as doc
from modak.errors import InputError
from modak.hardware.ceilings import TargetCeilings, target_ceilings
from modak.image.deployment import Deployment
from modak.measurements.store import Measurement, TunedChoice
from modak.predict.base import Prediction, Predictor, for_model, paired_ratio_p90, predict_many
from modak.predict.default import default_predictor
from modak.predict.kernel_names import NOTES as KERNEL_NOTES
from modak.predict.measured import CORRECTED, CORRECTION_TERM, corrected, corrections, measures
from modak.predict.measured import describe as describe_corrections
from modak.spec.loader import LoadedJob
from modak.spec.models import Device, Metric, Precision, Task
from modak.spec.resolve import beside, module_code
from modak.workload.analysis import WorkloadProfile
from modak.workload.processing import ProcessingCost, deployment_fields, measure_processing
from modak.workload.shapes import ShapeSource
from modak.workload.source import ModelSource

if TYPE_CHECKING:
    from modak.quantize.gate import AccuracyCheck
    from modak.scaling import DataParallel

# Bytes of device memory a training step needs per parameter byte (weights, gradients, optimizer state).
TRAINING_STATE_FACTOR = 4
MEMORY_SHARE = 0.9  # of a device's memory that a candidate's parameters, or an auto batch's step, may need
# The stock guard: a candidate replaces the stock deployment unless it may be more than 10% slower (its paired
# ratio to stock above this in more than 1 of 10 trees). Requiring it confidently faster (1.0) kept stock too often:
# on the 29 held-out campaign workloads the pick's geometric mean over the best fell from 1.17 to 1.12 with this
# (perfmodels/README.md, "The stock guard").
STOCK_TOLERANCE = 1.10


class NoCandidate(InputError):
    """No candidate deployment can run the job; ``pruned`` says why each was left out."""

    def __init__(self, message: str, file: Path, pruned: tuple[Pruned, ...]) -> None:
        super().__init__(message, file)
        self.pruned = pruned

    @property
    def limits(self) -> tuple[str, ...]:
        """The limits that left candidates out (``constraints.max_latency_ms``, ``memory``, ...)."""
        return tuple(sorted({p.limit for p in self.pruned if p.limit}))


@dataclass(frozen=True)
class RankedCandidate:
    """A candidate with its prediction and the time the objective ranks it by."""

    candidate: Candidate
    prediction: Prediction
    objective_seconds: float  # step time plus compile/tune time amortized over the job's steps
    accuracy: AccuracyCheck | None = None  # int8: the accuracy gate's figure and the quantized model (passed)
    failed_check: str | None = None  # its output failed the reference check on this target (never chosen): why


@dataclass(frozen=True)
class BatchOption:
    """One batch size ``model.batch_size: auto`` tried: the choice of its plan and its prediction, or the limits
    that excluded the batch."""

    batch_size: int
    candidate: str | None  # the plan's choice at this batch; None when no candidate was within the limits
    objective_seconds: float | None  # the choice's predicted seconds per step (compile amortized as ranked)
    memory_gb: float | None  # the most a step may hold (:func:`step_memory_gb`)
    excluded: str | None  # the limits that excluded the batch; None: within them

    @property
    def samples_per_second(self) -> float | None:
        return self.batch_size / self.objective_seconds if self.objective_seconds else None

    def record(self) -> doc.BatchRow:
        """A row of the plan's ``batches``."""
        def maybe(value: float | None) -> float | None:
            return None if value is None else rounded(value)
        return doc.BatchRow(batch_size=self.batch_size, candidate=self.candidate,
                            objective_seconds=maybe(self.objective_seconds),
                            samples_per_second=maybe(self.samples_per_second), memory_gb=maybe(self.memory_gb),
                            excluded=self.excluded)

    def describe(self) -> str:
        """``64: 20.6k/s (3.1 ms)`` or ``256: excluded (memory)``."""
        rate = self.samples_per_second
        if self.excluded is not None or rate is None or self.objective_seconds is None:
            return f"{self.batch_size}: excluded ({self.excluded})"
        return f"{self.batch_size}: {_count(rate)}/s ({duration(self.objective_seconds)})"


@dataclass(frozen=True)
class Plan:
    """Ranked candidates for one job on one target, the choice, and the reasons for it.

    Self-contained: it carries the job and target (their files resolved), the model source and every ranked
    candidate's recipe: nothing downstream reads the catalog or the specs' files again.
    """

    loaded: LoadedJob
    source: ModelSource
    workload: WorkloadProfile
    ceilings: TargetCeilings
    recipes: Mapping[str, Recipe]  # the recipe of every ranked candidate's runtime
    ranked: tuple[RankedCandidate, ...]
    pruned: tuple[Pruned, ...]
    reasons: tuple[str, ...]
    stock: RankedCandidate | None  # the stock deployment (a recipe marked ``stock``), if it can run the job
    tuned: TunedChoice | None = None  # the winner ``modak tune`` measured for this workload on this target, if chosen
    batches: tuple[BatchOption, ...] = ()  # model.batch_size auto: every batch size tried; () for a given batch
    data_parallel: DataParallel | None = None  # the workers a training job with ``scaling`` runs on (job.sh's)
    processing: ProcessingCost | None = None  # the job's pre- and post-processing, measured here (with_processing)

    @property
    def choice(self) -> RankedCandidate:
        return self.ranked[0]

    def recipe(self, candidate: Candidate | None = None) -> Recipe:
        """The recipe of ``candidate`` (default: the choice)."""
        return self.recipes[(candidate or self.choice.candidate).runtime]

    def model_file(self, candidate: Candidate | None = None) -> Path | None:
        """The ONNX file ``candidate`` (default: the choice) runs: its quantized model for int8, else the job's
        (None: the user's own model that no exporter could export)."""
        candidate = candidate or self.choice.candidate
        if candidate.precision is not Precision.int8:
            return self.source.onnx_path
        check = next((r.accuracy for r in self.ranked if r.candidate == candidate and r.accuracy), None)
        if check is None:
            raise ValueError(f"{candidate.name} is not a ranked int8 candidate of this plan: it has no quantized model")
        return check.model

    def deployment(self, candidate: Candidate | None = None) -> Deployment:
        """``candidate`` (default: the choice) as the image and ``modak bench`` run it."""
        candidate = candidate or self.choice.candidate
        job = self.loaded.job
        return Deployment(
            runtime=candidate.runtime, device=candidate.device, precision=candidate.precision.value,
            task=job.task.value, params=dict(candidate.params), env=self.recipe(candidate).environment(candidate),
            batch_size=self.workload.batch_size, input_shapes={k: list(v) for k, v in self.source.input_shapes.items()},
            zoo=self.source.zoo, pytorch=self._user_deployment(),  # the loss: a built-in, or beside the model file
            loss=beside(job.loss) if job.loss and ":" in job.loss else job.loss, **deployment_fields(self.loaded))

    def user_files(self) -> list[Path]:
        """The user's own files, which the PyTorch runtimes read beside the model file (:attr:`Deployment.pytorch`,
        :attr:`Deployment.loss`): the module file (or its top-level package folder) and the weights, or the
        torch.export program; the loss's module."""
        job, files = self.loaded.job, self.loaded.files
        found = [*([files.exported] if files.exported else []), *([files.weights] if files.weights else [])]
        if job.model.pytorch is not None and files.model_module is not None:
            found.insert(0, module_code(job.model.pytorch.module, files.model_module))
        if job.loss is not None and files.loss_module is not None:
            loss_code = module_code(job.loss.rpartition(":")[0], files.loss_module)
            found += [loss_code] if loss_code not in found else []
        return found

    def _user_deployment(self) -> dict[str, Any] | None:
        """The user's own model as the image's PyTorch runtimes build it (:attr:`Deployment.pytorch`): names of
        the files that :func:`modak.render.ir.build_description` puts beside the model file."""
        spec, files = self.loaded.job.model, self.loaded.files
        if spec.exported is not None:
            return {"program": Path(spec.exported).name, **self._input_types()}
        if spec.pytorch is None:
            return None
        module = spec.pytorch.module
        return {"module": Path(module).name if module.endswith(".py") else module, "factory": spec.pytorch.factory,
                "kwargs": dict(spec.pytorch.kwargs), "weights": files.weights.name if files.weights else None,
                **self._input_types()}

    def _input_types(self) -> dict[str, Any]:
        """The user's model's int64 inputs and their bounds (``input_types``), for the image's example inputs;
        nothing where every input is float32."""
        types = self.loaded.job.model.input_types(list(self.source.input_shapes))
        integer = {name: [dtype, high] for name, (dtype, high) in types.items() if dtype != "float32"}
        return {"input_types": integer} if integer else {}

    def to_dict(self) -> dict[str, Any]:
        """Stable, JSON-ready form (``modak plan --json``, ``plan.json``): a
        :class:`modak.documents.plan.PlanDocument`."""
        job, workload, tuned = self.loaded.job, self.workload, self.tuned
        return encoded(doc.PlanDocument(
            schema_version=SCHEMA_VERSION, job=job.name, target=self.loaded.target.name,
            task=job.task.value,  # type: ignore[arg-type]
            objective=doc.Objective(metric=job.objective.metric.value,  # type: ignore[arg-type]
                                    steps=job.objective.steps),
            workload=doc.Workload(model=workload.model_name, batch_size=workload.batch_size,
                                  parameters=workload.parameters, flops_per_step=workload.flops,
                                  bytes_per_step=workload.bytes,
                                  arithmetic_intensity=round(workload.arithmetic_intensity, 4),
                                  nodes=len(workload.ops), shapes=workload.shapes_record()),
            candidates=[_candidate(rank, r, workload.batch_size) for rank, r in enumerate(self.ranked, 1)],
            pruned=[doc.Pruned(runtime=p.runtime, reason=p.reason) for p in self.pruned],
            choice=self.choice.candidate.name, chosen_by=self.chosen_by,  # type: ignore[arg-type]
            tuned=None if tuned is None else doc.Tuned(
                candidate=tuned.candidate, step_seconds=tuned.step_s,
                interval_seconds=[tuned.ci_low_s, tuned.ci_high_s],
                confident=tuned.confident, trials=tuned.trials, measured_at=tuned.measured_at),
            worth_tuning=[r.candidate.name for r in worth_tuning(self)], deployment=self.deployment().to_dict(),
            batches=[option.record() for option in self.batches], reasons=list(self.reasons),
            model_source=self.source.user.record() if self.source.user is not None else None,
            data_parallel=self.data_parallel.record() if self.data_parallel is not None else None,
            processing=self.processing.record() if self.processing is not None else None))

    @property
    def chosen_by(self) -> str:
        """``measured`` where a race on the target chose (``tuned``: ``modak tune``, or ``modak build`` before it
        chose), else ``predicted``."""
        return "predicted" if self.tuned is None else "measured"

    def digest(self) -> str:
        """sha256 of the plan's JSON: names the decision in image labels."""
        return hashlib.sha256(json.dumps(self.to_dict(), sort_keys=True).encode()).hexdigest()


def workload_identity(loaded: LoadedJob, workload: WorkloadProfile) -> str:
    """What a tuned winner is recorded for: the job's model graph (name and size), task, batch and shapes."""
    return json.dumps({"model": workload.model_name, "task": workload.task.value, "batch_size": workload.batch_size,
                       "input_shapes": {k: list(v) for k, v in workload.input_shapes.items()},
                       "flops": workload.flops, "parameters": workload.parameters, "nodes": len(workload.ops),
                       "precisions": sorted(p.value for p in loaded.job.precision), "device": loaded.job.device.value},
                      sort_keys=True, separators=(",", ":"))


TUNE_TOP = 3  # the model's top candidates that are always worth measuring


def worth_tuning(plan: Plan, top: int = TUNE_TOP) -> list[RankedCandidate]:
    """The candidates worth measuring on the target (``modak tune``'s shortlist): the predicted top ``top``, every
    candidate whose predicted spread (:meth:`Prediction.spread`) overlaps the leader's, and the stock deployment;
    best predicted first. Never a candidate whose output failed the reference check on the target."""
    choosable = sorted((r for r in plan.ranked if r.failed_check is None), key=lambda r: r.objective_seconds)
    leader_slow = choosable[0].prediction.spread()[1]
    return [r for i, r in enumerate(choosable)
            if i < top or r is plan.stock or r.prediction.spread()[0] < leader_slow]


def make_plan(loaded: LoadedJob, source: ModelSource, workload: WorkloadProfile, predictor: Predictor | None = None,
              catalog: Mapping[str, Recipe] | None = None, tuned: TunedChoice | None = None,
              measured: Sequence[Measurement] = ()) -> Plan:
    """Enumerate, predict and rank candidates; raise an :class:`InputError` when none can run. ``measured``: the
    workload's rows on this target. A ``tuned`` winner (``modak tune``) that is still a candidate is chosen over the
    prediction. The kernel model's predictions are corrected by the rows measured ok
    (:mod:`modak.predict.measured`). A candidate whose output failed the reference check (a row of status
    ``incorrect``) stays ranked, last, so that ``modak bench`` can measure it again, but is never chosen."""
    job = loaded.job
    catalog = catalog or load_catalog()
    predictor = for_model(predictor or default_predictor(), source.onnx_path, source.zoo)
    ceilings = target_ceilings(loaded.target, loaded.target_doc)
    if job.device is Device.gpu and ceilings.gpu is None:
        raise loaded.job_doc.error(("device",), f"the job needs a GPU but target '{loaded.target.name}' has none")
    no_onnx = source.user.why_no_onnx() if source.user is not None and source.onnx_path is None else None
    space = enumerate_candidates(loaded, ceilings, catalog, frozenset(op.op_class for op in workload.ops), no_onnx)
    pruned = list(space.pruned)
    fitting: list[Candidate] = []
    for candidate in space.candidates:
        reason = _does_not_fit(workload, ceilings, candidate)
        if reason:
            pruned.append(Pruned(candidate.name, reason, "memory"))
        else:
            fitting.append(candidate)
    predictions = predict_many(predictor, workload, ceilings, [(c, catalog[c.runtime]) for c in fitting])
    factors = corrections(fitting, predictions, measured)
    predictions = corrected(fitting, predictions, factors)
    failed = [r for r in measured if r.status == "incorrect"]
    ranked: list[RankedCandidate] = []
    for candidate, prediction in zip(fitting, predictions):
        if prediction is None:
            pruned.append(Pruned(candidate.name, f"predictor '{predictor.name}' has no prediction"))
            continue
        limit = job.constraints.max_compile_seconds
        if limit is not None and prediction.compile_seconds > limit:
            pruned.append(Pruned(candidate.name, f"predicted compile/tune time {prediction.compile_seconds:.0f} s "
                                                 f"exceeds constraints.max_compile_seconds ({limit:g} s)",
                                 "constraints.max_compile_seconds"))
            continue
        latency = job.constraints.max_latency_ms
        if latency is not None and prediction.step_seconds * 1e3 > latency:
            pruned.append(Pruned(candidate.name, f"predicted step {duration(prediction.step_seconds)} exceeds "
                                                 f"constraints.max_latency_ms ({latency:g} ms)",
                                 "constraints.max_latency_ms"))
            continue
        ranked.append(RankedCandidate(candidate, prediction, objective_seconds(prediction, job.objective.steps),
                                      failed_check=_failed_check(candidate, failed)))
    ranked.sort(key=lambda r: (r.failed_check is not None, r.objective_seconds, r.candidate.name))
    ranked, gate_reasons = _gate_int8(loaded, source, ranked, pruned)
    if not ranked:
        why = "; ".join(f"{p.runtime}: {p.reason}" for p in pruned) or "the catalog is empty"
        raise NoCandidate(f"no candidate deployment can run this job ({why})", loaded.job_doc.path, tuple(pruned))
    if ranked[0].failed_check is not None:
        why = "; ".join(f"{r.candidate.name}: {r.failed_check}" for r in ranked)
        raise NoCandidate(f"every candidate's output failed the reference check on target '{loaded.target.name}' "
                          f"({why}); `modak bench` measures them again", loaded.job_doc.path, tuple(pruned))
    stock = next((r for r in ranked if catalog[r.candidate.runtime].is_stock(r.candidate)), None)
    if stock is not None and stock.failed_check is not None:
        stock = None  # wrong output on this target: nothing to guard against
    fastest = ranked[0]
    winner = next((r for r in ranked if tuned is not None and r.candidate.name == tuned.candidate
                   and r.failed_check is None), None)
    kept_over = None
    if winner is not None:
        ranked = [winner] + [r for r in ranked if r is not winner]
    else:
        tuned = None
        if stock is not None and not _safe_against_stock(fastest, stock, job.objective.steps):
            kept_over = fastest  # the fastest predicted candidate that is safe against stock, else stock, is chosen
            chosen = next((r for r in ranked if _safe_against_stock(r, stock, job.objective.steps)), stock)
            ranked = [chosen] + [r for r in ranked if r is not chosen]
    recipes = {r.candidate.runtime: catalog[r.candidate.runtime] for r in ranked}
    correction = describe_corrections(factors, loaded.target.name)
    reasons = _reasons(loaded, ranked, pruned, stock, kept_over, tuned,
                       (*gate_reasons, *_source_reasons(source), *_shape_reasons(workload),
                        *((correction,) if correction else ())))
    plan = Plan(loaded, source, workload, ceilings, recipes, tuple(ranked), tuple(pruned), reasons, stock, tuned)
    if loaded.job.scaling is None:  # scaling decides nothing then (and its all-reduce model is not imported)
        return plan
    from modak.scaling import decide

    return replace(plan, data_parallel=decide(plan))


def with_processing(plan: Plan) -> Plan:
    """``plan`` with its job's pre- and post-processing measured here at its batch, and said in its reasons."""
    cost = measure_processing(plan.loaded, plan.workload.batch_size)
    return plan if cost is None else replace(plan, processing=cost, reasons=(*plan.reasons, cost.describe()))


def _shape_reasons(workload: WorkloadProfile) -> tuple[str, ...]:
    """Where the shapes ONNX shape inference left unknown came from (:mod:`modak.workload.shapes`), and the nodes
    priced at guessed shapes."""
    counts = workload.shape_sources
    found = [f"{counts[source.value]} node(s) from {how}" for source, how in (
        (ShapeSource.symbolic, "ONNX Runtime's symbolic shape inference"),
        (ShapeSource.run, f"one run of the graph in ONNX Runtime at batch {workload.batch_size}"))
        if counts.get(source.value)]
    reasons = ["shapes ONNX shape inference left unknown: " + ", ".join(found)] if found else []
    guessed = workload.unknown_shapes
    if guessed:
        reasons.append(f"{len(guessed)} node(s) priced at guessed shapes (no source gave them; each unknown tensor as "
                       "large as the largest of its node), so the workload's FLOPs and bytes are estimates: "
                       + ", ".join(guessed[:6]) + (" ..." if len(guessed) > 6 else ""))
    return tuple(reasons)


def _source_reasons(source: ModelSource) -> tuple[str, ...]:
    """Where the user's own model came from and what the analysis read: its ONNX export, or the flop counter."""
    user = source.user
    if user is None:
        return ()
    if user.exporter is not None:
        return ((f"model {user.source}: analysed on its ONNX export (the {user.exporter} exporter, "
                 f"{user.export_seconds:.1f} s on its first plan; cached since), which the ONNX runtimes run"),)
    return ((f"model {user.source}: {user.why_no_onnx()}; the ONNX runtimes are left out, and the PyTorch runtimes "
             "are predicted from torch.utils.flop_counter's FLOPs and the bytes of the parameters and activations"),)


def step_memory_gb(workload: WorkloadProfile) -> float:
    """The most memory one inference step may hold, in GB: the parameters and every operator's output at once (no
    buffer reuse: an upper bound that grows with the batch)."""
    return (workload.parameter_bytes + sum(op.output_bytes for op in workload.ops)) / 1e9


def _gate_int8(loaded: LoadedJob, source: ModelSource, ranked: list[RankedCandidate],
               pruned: list[Pruned]) -> tuple[list[RankedCandidate], tuple[str, ...]]:
    """Quantize and check the int8 methods worth it; ``ranked`` (best first) without the int8 candidates that failed
    the gate or were not checked (added to ``pruned``), and the reasons.

    A method (a runtime's ``quantization`` value) is worth quantizing when its best candidate, at the fast end of
    its predicted spread, beats the best candidate of another precision: only then can it change the decision.
    Quantized models and their figures are cached (:mod:`modak.quantize.gate`), so a later plan pays nothing."""
    int8 = [r for r in ranked if r.candidate.precision is Precision.int8]
    if not int8:
        return ranked, ()
    from modak.quantize.calibration import load_samples  # numerics and runtimes: only a job with int8 needs them
    from modak.quantize.gate import check

    steps = loaded.job.objective.steps
    samples = load_samples(loaded, source)
    rival = next((r for r in ranked if r.candidate.precision is not Precision.int8), None)
    checks: dict[tuple[str, str], AccuracyCheck | None] = {}
    for r in int8:  # best first: a method's first candidate is its best
        method = _method(r.candidate)
        if method not in checks:
            fast = objective_seconds(replace(r.prediction, step_seconds=r.prediction.spread()[0]), steps)
            checks[method] = (check(source, *method, samples, loaded.job.accuracy)
                              if rival is None or fast < rival.objective_seconds else None)
    kept: list[RankedCandidate] = []
    for r in ranked:
        result = checks.get(_method(r.candidate)) if r.candidate.precision is Precision.int8 else None
        if r.candidate.precision is not Precision.int8 or (result is not None and result.passed):
            kept.append(replace(r, accuracy=result))
        elif result is None:
            assert rival is not None
            pruned.append(Pruned(r.candidate.name, f"int8 not quantized, accuracy not checked: slower than "
                                                   f"{rival.candidate.name} even at the fast end of its interval"))
        else:
            pruned.append(Pruned(r.candidate.name, f"failed the accuracy gate: {result.verdict()}"))
    reasons = [f"int8 {runtime} quantization={method}: {'passed' if result.passed else 'failed'} the accuracy "
               f"gate: {result.verdict()}" for (runtime, method), result in checks.items() if result is not None]
    unchecked = [f"{runtime} quantization={method}" for (runtime, method), result in checks.items() if result is None]
    if unchecked and rival is not None:
        reasons.append(f"int8 not quantized (accuracy not checked): {', '.join(unchecked)}: predicted slower than "
                       f"{rival.candidate.name} even at the fast end of the interval")
    if any(result is not None for result in checks.values()) and samples.folder is None:
        reasons.append(f"int8 was calibrated and checked on {samples.count} random inputs (seeded; the job gives no "
                       "calibration.data): the figure says how far int8 outputs move from fp32 on such inputs, not "
                       "the accuracy on your data; give calibration.data for a figure on real samples")
    return kept, tuple(reasons)


def _method(candidate: Candidate) -> tuple[str, str]:
    """An int8 candidate's quantization: (its runtime, the recipe's ``quantization`` value)."""
    return candidate.runtime, str(candidate.param("quantization"))


def _failed_check(candidate: Candidate, failed: Sequence[Measurement]) -> str | None:
    """Why ``candidate`` may not be chosen: the error of its row among ``failed`` (rows of this workload on this
    target that failed the reference check), with when it was measured; None when it has none."""
    row = next((r for r in failed if measures(r, candidate)), None)
    return None if row is None else f"{row.error or 'output differs from the reference'} (measured {row.measured_at})"


def _safe_against_stock(candidate: RankedCandidate, stock: RankedCandidate, steps: int | None) -> bool:
    """Whether ``candidate`` may replace stock: its objective's ratio to stock's is at most ``STOCK_TOLERANCE`` at
    the 90th percentile of the paired ratios (:func:`paired_ratio_high`), or, for a predictor without ensemble
    members, at the slow end of its interval (its 90th percentile step time) against stock's point."""
    if candidate is stock:
        return True
    return paired_ratio_high(candidate, stock, steps) <= STOCK_TOLERANCE


def paired_ratio_high(a: RankedCandidate, b: RankedCandidate, steps: int | None) -> float:
    """The 90th percentile of ``a``'s objective over ``b``'s: member by member where both predictions come from one
    ensemble (member i of both is one tree, so what the trees agree on cancels out), else ``a``'s slow end over
    ``b``'s point."""
    pa, pb = a.prediction, b.prediction
    if _paired(pa, pb):
        ca = pa.compile_seconds / steps if steps else 0.0
        cb = pb.compile_seconds / steps if steps else 0.0
        return paired_ratio_p90([x + ca for x in pa.members], [y + cb for y in pb.members])
    return objective_seconds(replace(pa, step_seconds=pa.high_seconds), steps) / b.objective_seconds


def _paired(a: Prediction, b: Prediction) -> bool:
    """Whether two predictions come from one ensemble, member by member (their ratio can be paired)."""
    return a.predictor == b.predictor and len(a.members) == len(b.members) >= 10


def objective_seconds(prediction: Prediction, steps: int | None) -> float:
    """Seconds per step the objective ranks by: compile/tune time is spread over ``steps`` when known."""
    return prediction.step_seconds + (prediction.compile_seconds / steps if steps else 0.0)


def _does_not_fit(workload: WorkloadProfile, ceilings: TargetCeilings, candidate: Candidate) -> str | None:
    device = ceilings.gpu if candidate.device == "gpu" else ceilings.cpu
    assert device is not None
    factor = TRAINING_STATE_FACTOR if workload.task is Task.training else 1
    needed_gb = workload.parameter_bytes * factor / 1e9
    if needed_gb > MEMORY_SHARE * device.memory_gb:
        return (f"needs ~{needed_gb:.1f} GB for parameters and state, more than {MEMORY_SHARE:.0%} of "
                f"{device.memory_gb:g} GB")
    return None


def _candidate(rank: int, ranked: RankedCandidate, batch: int) -> doc.Candidate:
    c, p = ranked.candidate, ranked.prediction
    return doc.Candidate(
        rank=rank, name=c.name, runtime=c.runtime, device=c.device,  # type: ignore[arg-type]
        precision=c.precision.value,  # type: ignore[arg-type]
        parameters={k: v for k, v in c.params}, threads=c.threads, predictor=p.predictor,
        step_seconds=rounded(p.step_seconds), interval_seconds=[rounded(p.low_seconds), rounded(p.high_seconds)],
        compile_seconds=rounded(p.compile_seconds), objective_seconds=rounded(ranked.objective_seconds),
        throughput_per_second=rounded(batch / ranked.objective_seconds), bound=p.bound,  # type: ignore[arg-type]
        regime=p.regime,  # type: ignore[arg-type]  # GPU candidates only: left out of CPU plans
        roofline={k: rounded(v) for k, v in (*p.terms, *(p.widening.terms() if p.widening else ()))},
        accuracy=ranked.accuracy.record() if ranked.accuracy else None, failed_check=ranked.failed_check)


def _reasons(loaded: LoadedJob, ranked: list[RankedCandidate], pruned: list[Pruned],
             stock: RankedCandidate | None, passed_over: RankedCandidate | None, tuned: TunedChoice | None,
             after_choice: Sequence[str]) -> tuple[str, ...]:
    """Why the plan chose what it chose; ``after_choice``: what the int8 gate and the model's source add right
    after the choice."""
    job = loaded.job
    best = ranked[0]
    p = best.prediction
    physics = [p.term("compute_s"), p.term("memory_s"), p.term("overhead_s")]  # the roofline's split of a step
    share = max(physics) / sum(physics)
    predicted = (f"{best.candidate.name}: predicted {duration(p.step_seconds)} per step of batch "
                 f"{job.model.batch_size} ({p.bound}-bound: {share:.0%} of the roofline step), "
                 f"interval {duration(p.low_seconds)}-{duration(p.high_seconds)} ({p.predictor})")
    reasons = ([f"chose {predicted}"] if tuned is None  # a tuned winner is chosen for its measurement
               else [f"chose {tuned.candidate}: tuned on {loaded.target.name} — {tuned.summary}",
                     f"the model predicted for it: {predicted}"])
    reasons.extend(after_choice)
    if passed_over is not None and stock is not None:  # the fastest predicted may be too slow against stock
        high = paired_ratio_high(passed_over, stock, job.objective.steps)
        how = ("in 9 of 10 of the model's trees, paired" if _paired(passed_over.prediction, stock.prediction)
               else f"at the slow end of its interval ({duration(passed_over.prediction.high_seconds)} per step)")
        doubt = (f"the fastest predicted, {passed_over.candidate.name} at {duration(passed_over.objective_seconds)}, "
                 f"may be slower than stock's {duration(stock.objective_seconds)}: its ratio to stock is up to "
                 f"{high:.2f} {how}, over the {STOCK_TOLERANCE:.2f} the plan accepts")
        if best is stock:
            reasons.append(f"kept the stock deployment: {doubt}; `modak tune` measures both")
        else:
            reasons.append(f"{doubt}; the chosen one is the fastest predicted within it (its ratio to stock is up "
                           f"to {paired_ratio_high(best, stock, job.objective.steps):.2f}); `modak tune` measures "
                           "them")
    if p.widening and p.widening.new_machine:
        reasons.append(f"the model has no measurements of target '{loaded.target.name}' (rows of two workloads or "
                       f"more), so its intervals are widened by the spread of machines it was not fit on; `modak "
                       f"tune` measures the shortlist there, and its rows calibrate the model")
    elif p.widening and p.widening.same_kind:
        reasons.append(f"the model has no measurements with the ceilings of target '{loaded.target.name}', but has "
                       f"of a machine of the same kind (microarchitecture or GPU model, and cores), as another probe "
                       f"of one machine gives: the target's ceilings scale the predictions, and their intervals are "
                       f"widened by the spread between probes of one machine")
    wrong = [r for r in ranked if r.failed_check is not None]
    if wrong:
        reasons.append(f"never chosen: {len(wrong)} candidate(s) whose output failed the reference check on "
                       f"target '{loaded.target.name}': " + "; ".join(f"{r.candidate.name}: {r.failed_check}"
                                                                     for r in wrong)
                       + " (`modak bench --candidates NAME` measures one again)")
    other = next((r for r in ranked[1:] if r.candidate.runtime != best.candidate.runtime and r.failed_check is None),
                 None)
    if other:
        ratio = other.objective_seconds / best.objective_seconds
        reasons.append(f"best other runtime: {other.candidate.name} at {duration(other.objective_seconds)} "
                       f"({ratio:.2f}x the chosen objective)")
        if other.prediction.spread()[0] < p.spread()[1]:
            reasons.append("the two intervals overlap, so the order is uncertain: `modak bench` measures both")
    if _uncorrected_kernels(ranked):
        reasons.append(f"no run of this workload on target '{loaded.target.name}' corrects the kernel model yet: "
                       "`modak bench --candidates each-runtime` measures the predicted best of each runtime and "
                       "precision, and its runs correct the predictions of the other candidates")
    if job.objective.steps:
        amortized = p.compile_seconds / job.objective.steps
        reasons.append(f"compile/tune time {p.compile_seconds:.1f} s over {job.objective.steps} steps adds "
                       f"{duration(amortized)} per step")
    elif p.compile_seconds > 1 and job.objective.metric is not Metric.time_to_solution:
        reasons.append(f"compile/tune time {p.compile_seconds:.1f} s is not counted: the job gives no step count")
    by_precision: dict[tuple[str, str], str] = {(r.candidate.runtime, r.candidate.precision.value):
                                                r.prediction.predictor for r in ranked}
    used: dict[str, set[str]] = {}
    for (runtime, precision), name in by_precision.items():  # a runtime by name unless its precisions differ
        mixed = len({n for (rt, _), n in by_precision.items() if rt == runtime}) > 1
        used.setdefault(name, set()).add(f"{runtime}/{precision}" if mixed else runtime)
    if len(used) > 1 or "roofline" not in used:
        reasons.append("predictors: " + "; ".join(f"{name} for {', '.join(sorted(runtimes))}"
                                                  for name, runtimes in sorted(used.items()))
                       + (" (roofline where measured data does not cover the runtime at that precision on this "
                          "device class)" if "roofline" in used else "")
                       + "".join(f" ({KERNEL_NOTES[name]})" for name in sorted(used) if name in KERNEL_NOTES))
    if pruned:
        reasons.append(f"{len(pruned)} runtime(s)/candidate(s) left out: "
                       + "; ".join(f"{x.runtime} ({x.reason})" for x in pruned[:6])
                       + (" ..." if len(pruned) > 6 else ""))
    if best.candidate.params:
        reasons.append("parameters: " + ", ".join(f"{k}={value_key(v)}" for k, v in best.candidate.params)
                       + (f" (threads resolve to {best.candidate.threads} on this target; the entrypoint "
                          "recomputes them from the real allocation)" if best.candidate.threads else ""))
    return tuple(reasons)


def _uncorrected_kernels(ranked: Sequence[RankedCandidate]) -> bool:
    """Whether the kernel model predicted some candidate and no run measured on the target corrected any
    (:mod:`modak.predict.measured`)."""
    kernels = [r.prediction for r in ranked if r.prediction.predictor in CORRECTED]
    return bool(kernels) and not any(CORRECTION_TERM in dict(p.terms) for p in kernels)


def _count(value: float) -> str:
    return f"{value / 1e6:.3g}M" if value >= 1e6 else f"{value / 1e3:.3g}k" if value >= 1e3 else f"{value:.3g}"

