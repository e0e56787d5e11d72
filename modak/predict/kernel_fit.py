"""Fitting the operator-level model (:mod:`modak.predict.kernels`): the kernel rows checked, a model per kernel
kind (its prior, and the share of its correction chosen on folds of whole models), a step's kernel estimates,
the dispatch and profiling costs, and the calibration of composed steps out of fold."""

from __future__ import annotations

import functools
import itertools
import json
import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from modak.candidates.enumerate import Candidate
from modak.errors import InputError
from modak.image.kernels import OP_CLASSES, Kernel
from modak.measurements.kernels import KernelRow, Reconciliation, probed_from
from modak.predict.forest import TreeEnsemble
from modak.spec.models import Precision

if TYPE_CHECKING:
    from sklearn.ensemble import RandomForestRegressor

from modak.predict.kernel_terms import (
    Example,
    KindModel,
    MachineCeilings,
    attribute_values,
    features,
    intensity,
    parameters_key,
    per_call_seconds,
    prior_coefficients,
    prior_seconds,
    roofline_seconds,
    row_candidate,
    sized,
)

KERNEL_TREES = 30  # trees per kind's forest
# The shares of a kind's correction it may apply (0: the prior alone), and the folds of whole models that choose one
# on the kind's own rows; a kind profiled in fewer models than folds keeps the prior alone.
CORRECTION_SHARES = (0.0, 0.25, 0.5, 0.75, 1.0)
SHARE_FOLDS = 3
SHARE_TREES = 10  # trees per fold's forest: enough to choose among the shares, at a third of a fit's cost
FOLDS = 5  # calibration folds, by model
MIN_CALIBRATION = 5  # out-of-fold steps of a runtime and device before its interval is trusted
EXTRAPOLATED_SHARE = 0.1  # of a step's kernel time, at most, in kernels past their kind's limit
# A kernel row measured this many times faster than its FLOPs allow at the machine's peak is not learned from: its
# row covers nodes the kernel did not run (perfmodels/README.md, "The twelfth round").
ATTRIBUTION_LIMIT = 3.0
# A step whose kernels average under this many times the runtime's profiling cost per kernel is not composed from
# them: their profiled times are mostly the profiler's own (perfmodels/README.md, "Operator-level model").
PROFILER_MARGIN = 2.0
KindKey = tuple[str, str, str]  # runtime, device, kernel kind
RuntimeKey = tuple[str, str]  # runtime, device
Corrections = dict[KindKey, dict[tuple[float, ...], tuple[float, float]]]  # per kind: columns -> trees' (mean, sd)
# runtime, device, parameters (sorted JSON; ALL_PARAMETERS: every launch of the runtime and device)
CalibrationKey = tuple[str, str, str]
ALL_PARAMETERS = ""


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


def kind_groups(rows: Sequence[KernelRow], pooled: bool = True) -> list[tuple[KindKey, tuple[KernelRow, ...]]]:
    """The :func:`attributable` ``rows`` of each (runtime, device, kernel kind) and, where ``pooled``, of each
    (runtime, device, op class) over its kinds (kind :func:`class_kind`), in key order."""
    by_kind: dict[KindKey, list[KernelRow]] = {}
    for row in filter(attributable, rows):
        by_kind.setdefault((row.runtime, row.device, row.kernel.kind), []).append(row)
        if pooled:
            by_kind.setdefault((row.runtime, row.device, class_kind(row.kernel.op)), []).append(row)
    return [(key, tuple(group)) for key, group in sorted(by_kind.items())]


def fit_kinds(rows: Sequence[KernelRow], seed: int = 0, pooled: bool = True) -> dict[KindKey, KindModel]:
    """One model per group of :func:`kind_groups` (:func:`fit_kind`)."""
    return {key: fit_kind(group, seed) for key, group in kind_groups(rows, pooled)}


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


KindFits = dict[tuple[tuple[int, ...], int], tuple[tuple[KernelRow, ...], KindModel]]
"""Kinds already fit, by the identities of their rows and the seed (each with its rows, which keeps them alive, so
an identity stays theirs): what :func:`fit_kind_sets` fits once and finds again."""


def fit_kind_sets(row_sets: Sequence[Sequence[KernelRow]], seed: int = 0, jobs: int = 1,
                  fitted: KindFits | None = None) -> list[dict[KindKey, KindModel]]:
    """:func:`fit_kinds` of each of ``row_sets``, each distinct group of rows fit once, in up to ``jobs`` processes (in
    this one where the system cannot start a pool, e.g. without shared memory for its semaphores). A kind whose rows
    a calibration fold leaves as they are (the held-out models ran none of its kernels) is the same fit; so is one an
    evaluation's folds repeat, where the caller keeps ``fitted`` across its calls. Each kind's fit is seeded by
    ``seed`` and depends on its rows alone, so the models are the same whatever ``jobs`` and ``fitted``."""
    from concurrent.futures import ProcessPoolExecutor

    fitted = {} if fitted is None else fitted
    groups = [kind_groups(rows) for rows in row_sets]
    todo: dict[tuple[tuple[int, ...], int], tuple[KernelRow, ...]] = {}
    for key, group in ((_identity(group, seed), group) for set_groups in groups for _, group in set_groups):
        if key not in fitted:
            todo.setdefault(key, group)
    try:
        pool = ProcessPoolExecutor(min(jobs, len(todo))) if jobs > 1 and len(todo) > 1 else None
    except (OSError, NotImplementedError):
        pool = None
    fit = functools.partial(fit_kind, seed=seed)
    if pool is None:
        models = list(map(fit, todo.values()))
    else:
        with pool:
            models = list(pool.map(fit, todo.values(), chunksize=8))
    fitted.update((key, (group, model)) for (key, group), model in zip(todo.items(), models))
    return [{kind: fitted[_identity(group, seed)][1] for kind, group in set_groups} for set_groups in groups]


def _identity(group: tuple[KernelRow, ...], seed: int) -> tuple[tuple[int, ...], int]:
    return tuple(map(id, group)), seed


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
