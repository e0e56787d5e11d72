"""Honest evaluation of the performance models: hold out one model (or one model family, or one target), fit each
predictor on the rest, then score the held-out rows.

Predictors are a sequence of :class:`PredictorEntry` (a name, "fit on rows" and "predict rows"), so each one is
scored on the same splits and shown side by side: the whole-model forest (one entry per seed), the operator-level
model with the forest as its fallback (:func:`kernels_and_forest`, where there are kernel rows), the same with each
held-out workload's runs on its target correcting it as the plan does (:func:`with_runs`, a :class:`DerivedEntry`
of the same fits) and a physics-only baseline (roofline bound / median utilization of the runtime in the training
fold).

Accuracy on the held-out rows: MAPE of the step time and the shares within +-10% and +-25% of it, the Kendall tau
between predicted and measured ranking of each workload's candidates (model, task, batch and input shapes on one
machine; the median over workloads of three scored rows or more), the share of measured times inside the
predicted 80% interval, and the share of measured ratios to the workload's stock row above the 90th percentile of
the trees' paired ratios (the bound the plan's stock guard trusts). Decisions, per workload with at least two
scored rows: the pick (predicted fastest) against the best (measured fastest) by the ratio of their launches' step
times with its t interval (paired by round when both ran interleaved in one session): a *hit* when the pick is the
best or shown to be within 5% of it (an equivalence test, so any of several rows tied with the best is a hit), a
*miss* when shown to be more than 5% slower, *undecided* when the data cannot tell. Rows of one launch (protocol 1)
give zero-width intervals: the test then reduces to the point ratio. Captured speedup: the pick's speedup over the
stock deployment divided by the best's. Rows a predictor's fit does not cover are counted, not scored; rows an
entry takes as measured (:attr:`Prediction.measured`: a workload's runs) are counted apart, left out of the accuracy
and kept in the decisions at their measured step.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import statistics
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, cast

import numpy as np

from modak.candidates.catalog import Recipe, load_catalog
from modak.errors import InputError
from modak.image.kernels import Kernel
from modak.measurements.kernels import KernelRow, Reconciliation, probed_from
from modak.measurements.stats import EQUIVALENCE_MARGIN, Ratio, ratio
from modak.measurements.store import Measurement
from modak.predict.base import Prediction as PlanPrediction
from modak.predict.base import paired_ratio_p90
from modak.predict.kernel_fit import KindFits
from modak.predict.kernel_model import KernelModel
from modak.predict.kernel_names import PREDICTOR as KERNELS
from modak.predict.kernel_terms import MachineCeilings
from modak.predict.learned import LearnedPredictor, candidate_from_row, example_from_row
from modak.predict.measured import corrected, corrections
from modak.predict.training import ok_rows

HIT, MISS, UNDECIDED = "hit", "miss", "undecided"
LEAVE_ONE_MODEL_OUT, FAMILY_HELD_OUT, LEAVE_ONE_TARGET_OUT = \
    "leave-one-model-out", "family-held-out", "leave-one-target-out"
WITHIN = (0.10, 0.25)  # the relative errors whose shares of rows the scores report

# The model families that "family held out" holds out together: every zoo model belongs to one (tests check it
# against the zoo and the shipped rows). Dense-convolution CNNs (ConvNeXt: the ResNet design modernized) are
# "resnet", depthwise/squeezed ones "mobile-cnn"; the dispatch-overhead probes (chains of small fully connected
# layers) are multilayer perceptrons. A hybrid goes with its task and design goal, not its layers: DETR (a
# transformer over CNN features) is detection, MobileViT (transformers inside a mobile network) mobile-cnn, the
# speech and sound-event models with recurrent layers audio.
FAMILIES: Mapping[str, tuple[str, ...]] = {
    "resnet": ("resnet18", "resnet34", "resnet50", "convnext_atto", "mnist_cnn"),
    "mobile-cnn": ("mobilenet_v2", "efficientnet_b0", "squeezenet", "mobilevit_xxs"),
    "transformer": ("bert_base", "bert_small", "gpt_small", "vit_tiny"),
    "mlp-recommender": ("mlp", "mlp_large", "dlrm_small", "ncf", "chain4", "chain64"),
    "recurrent": ("lstm_lm", "gru_kws"),
    "detection-segmentation": ("yolo_small", "unet_small", "detr_r18"),
    "audio": ("m5_audio", "deepspeech_small", "crnn_sed"),
}
_FAMILY_OF = {model: name for name, models in FAMILIES.items() for model in models}


@dataclass(frozen=True)
class Subset:
    """A predictor's accuracy on the held-out rows one model of a combined entry answered: the rows it predicted of
    them, MAPE, the shares within ±10% and ±25%, and the share in its 80% interval (NaN: no interval)."""

    answerer: str
    rows: int
    mape: float
    within_10: float
    within_25: float
    interval_coverage: float


@dataclass(frozen=True)
class Scores:
    """Metrics of one split for one predictor (fit with ``seed``; None: nothing random)."""

    split: str
    predictor: str
    seed: int | None
    rows: int  # held-out rows scored
    uncovered: int
    answered: tuple[tuple[str, int], ...]  # of an entry of several models: the rows each answered (else empty)
    mape: float
    within_10: float  # share of rows predicted within +-10% of the measured step
    within_25: float
    mape_calibrated: float  # after scaling each workload's predictions by its stock row's measured/predicted
    kendall_tau_median: float
    kendall_tau_noise: float  # the data's own: one launch's ranking against another's (the ceiling for tau)
    interval_coverage: float  # share of measured times inside the predicted 80% interval (NaN: no interval)
    # Share of rows whose measured ratio to their workload's stock row is above the 90th percentile of the trees'
    # paired ratios, the bound the plan's stock guard trusts (10% when calibrated; NaN: no ensemble members)
    stock_ratio_above_p90: float
    workloads: int  # with >= 2 scored rows: the decisions
    hit_rate: float
    undecided: float  # share of workloads the data cannot decide (misses: the rest)
    one_launch: int  # verdicts resting on rows of one launch each (the equivalence test is the point ratio)
    captured_median: float  # (stock / pick) / (stock / best) over workloads with a stock row
    captured_p10: float
    pick_speedup: float  # geometric mean of stock / pick over the same workloads
    no_stock: int  # workloads without a measured stock row (no captured speedup)
    # On the rows each model of the split's combined entry answered (the same rows for every entry): this
    # predictor's accuracy there, so that a fallback's share does not hide how the model in front of it does
    by_answerer: tuple[Subset, ...] = ()
    runs: int = 0  # held-out rows taken as measured (a workload's runs on its target): in the decisions only

    @property
    def miss_rate(self) -> float:
        """Share of workloads whose pick is shown to be more than 5% slower than the best."""
        return max(0.0, 1.0 - self.hit_rate - self.undecided)  # not -0.0 from the floats' rounding


@dataclass(frozen=True)
class Prediction:
    """One held-out row's predicted step seconds, its 80% interval (None: the predictor gives none), its trees'
    step seconds (member i of every row from one tree; empty: no ensemble), for an entry of several models the one
    that answered, and whether the entry took the row as measured (``step_s`` is then its measurement)."""

    step_s: float
    interval: tuple[float, float] | None = None
    trees: tuple[float, ...] = ()
    by: str | None = None
    measured: bool = False
    run_spread: tuple[float, float] | None = None  # the kernel model's (modak.predict.base.Prediction.run_spread)


Predictions = tuple[Prediction | None, ...]  # one per row asked for; None: the fit does not cover the row


@dataclass(frozen=True)
class PredictorEntry:
    """A predictor under evaluation: its name, the seed of its fit (None: nothing random), ``fit`` on the training
    fold's rows and ``predict`` of held-out rows with what ``fit`` returned. An entry that learns from other labels
    too (kernel rows) keeps only those of the fold's (machine, model) pairs, so that a held-out model or target
    stays unseen."""

    name: str
    fit: Callable[[list[Measurement]], Any]
    predict: Callable[[Any, list[Measurement]], Predictions]
    seed: int | None = None


@dataclass(frozen=True)
class DerivedEntry:
    """A predictor scored from another entry's answers on the same held-out rows, without a fit of its own:
    ``derive(rows, base's answers)`` (``base`` comes before it in the entries)."""

    name: str
    base: PredictorEntry
    derive: Callable[[list[Measurement], Predictions], Predictions]

    @property
    def seed(self) -> int | None:
        return self.base.seed


Entry = PredictorEntry | DerivedEntry


@dataclass(frozen=True)
class Decision:
    """The pick of one workload against its measured best."""

    verdict: str  # HIT, MISS or UNDECIDED
    ratio: Ratio  # pick / best
    one_launch: bool  # the verdict rests on two rows of one launch each: a zero-width interval


def family(model: str) -> str:
    """A model's family in :data:`FAMILIES`; a model of none (a user's own) is a family of its own."""
    return _FAMILY_OF.get(model, model)


def launch_times(row: Measurement) -> list[float]:
    """The row's per-launch median step seconds (protocol 1: its one median)."""
    return json.loads(row.launch_medians) if row.launch_medians else [row.step_s]


def decision(pick: Measurement, best: Measurement) -> Decision:
    """Whether ``pick`` is as fast as ``best`` (within ``EQUIVALENCE_MARGIN``), shown to be slower, or neither.
    Paired by round when both rows belong to one session and have >= 2 launches."""
    a, b = launch_times(pick), launch_times(best)
    if pick.step_s <= best.step_s:  # the pick is (tied with) the measured best
        return Decision(HIT, Ratio(1.0, 1.0, 1.0, min(len(a), len(b)), False), False)
    paired = pick.session is not None and pick.session == best.session and min(len(a), len(b)) >= 2
    r = ratio(a, b, paired=paired)
    return Decision(verdict(r), r, len(a) == 1 and len(b) == 1)


def verdict(pick_over_best: Ratio) -> str:
    """HIT: shown within ``EQUIVALENCE_MARGIN`` of the best; MISS: shown slower by more; else UNDECIDED."""
    if pick_over_best.equivalent(EQUIVALENCE_MARGIN):
        return HIT
    return MISS if pick_over_best.low > 1.0 + EQUIVALENCE_MARGIN else UNDECIDED


def stock_row(rows: Iterable[Measurement], catalog: Mapping[str, Recipe]) -> Measurement | None:
    """The row of the stock deployment (the recipe marked stock at its defaults, as the plan keeps it), if any."""
    return next((r for r in rows if r.runtime in catalog and catalog[r.runtime].is_stock(candidate_from_row(r))),
                None)


def stock_ratio_above_p90(row: Measurement, stock: Measurement, row_trees: tuple[float, ...],
                          stock_trees: tuple[float, ...]) -> bool:
    """Whether ``row``'s measured step over ``stock``'s is above the 90th percentile of their trees' paired ratios
    (tree i of both), as the plan's stock guard computes it."""
    return row.step_s / stock.step_s > paired_ratio_p90(row_trees, stock_trees)


def captured_speedup(stock_s: float, pick_s: float, best_s: float) -> float:
    """The pick's speedup over stock as a share of the best's (1: all of it), from their step seconds."""
    return (stock_s / pick_s) / (stock_s / best_s)


def forest(seed: int, catalog: Mapping[str, Recipe]) -> PredictorEntry:
    """The whole-model forest (:class:`LearnedPredictor`) fit with ``seed``; it covers the (runtime, device,
    precision) its training rows cover."""

    def predict(model: LearnedPredictor, rows: list[Measurement]) -> Predictions:
        covered = [r for r in rows if (r.runtime, r.device, r.precision) in model.coverage]
        answers = dict(zip(map(id, covered), model.predict_examples([example_from_row(r, catalog) for r in covered])))
        return tuple(None if (a := answers.get(id(r))) is None else Prediction(a[0], (a[1], a[2]), a[4])
                     for r in rows)

    return PredictorEntry("forest", lambda rows: LearnedPredictor.fit(rows, seed=seed, catalog=catalog), predict,
                          seed)


KernelsOfRow = Callable[[Measurement], Sequence[Kernel]]
"""The kernels a measured row's runtime plans for its step (the seam tests fill by hand)."""


def planned_for_row(row: Measurement) -> Sequence[Kernel]:
    """The kernels the row's runtime plans for its zoo model at its input shapes, batch, precision and threads (the
    model's cached ONNX export, :func:`modak.workload.kernels.planned_kernels`); none for a model not in the zoo."""
    from modak.workload.kernels import UnreportedGraph, planned_kernels
    from modak.workload.zoo import export_onnx

    shapes = {name: tuple(shape) for name, shape in json.loads(row.input_shapes).items()}
    try:
        graph = export_onnx(row.model, shapes)
        return planned_kernels(row.runtime, graph, row.batch_size, shapes, row.precision, row.threads or row.cores,
                               params=json.loads(row.params), zoo=row.model, task=row.task)
    except (InputError, UnreportedGraph):  # a user's own model, or a runtime that cannot say: the forest answers
        return ()


def kernels_and_forest(seed: int, catalog: Mapping[str, Recipe], kernel_rows: Sequence[KernelRow],
                       reconciliations: Sequence[Reconciliation],
                       kernels_of: KernelsOfRow | None = None) -> PredictorEntry:
    """The operator-level model (:class:`modak.predict.kernels.KernelModel`) with the forest (fit with ``seed``) as
    its fallback, as the plan asks them: it scores the rows the forest covers, the kernel model answering the
    inference rows whose planned kernels it covers (:attr:`Prediction.by` says which answered). Each fold's kernel
    model is fit on the kernel rows and reconciliations of the training fold's (machine, model) pairs only (a probe
    layer's by the model it was cut from). Only rows of a machine with kernel rows (in ``kernel_rows``) are asked of
    it: held out by target, they are answered by the other machines' kernel rows, transferred by ceilings. The rows
    of a machine with none are left to the forest: every one would be a transfer, which leave-one-target-out
    measures where it can be held out.
    ``kernels_of``: default :func:`planned_for_row`."""
    whole = forest(seed, catalog)
    plan_of = kernels_of or planned_for_row
    profiled = {r.machine for r in kernel_rows}  # the machines whose rows are asked of the kernel model
    planned: dict[tuple, Sequence[Kernel]] = {}  # each row's planned kernels, asked once over the folds
    kinds: KindFits = {}  # each distinct kind's fit, made once over the folds (most folds leave most kinds' rows)

    def fit(rows: list[Measurement]) -> tuple[set[tuple[str, str]], Any]:
        return {(r.machine, r.model) for r in rows}, whole.fit(rows)

    def composed(model: KernelModel, row: Measurement) -> Prediction | None:
        if row.task != "inference" or not model.calibrated(row.runtime, row.device):
            return None
        key = (row.model, row.input_shapes, row.batch_size, row.runtime, row.precision, row.threads, row.cores,
               row.params)
        if key not in planned:
            planned[key] = tuple(plan_of(row))
        c = model.compose(planned[key], MachineCeilings.of_row(row), candidate_from_row(row))
        return None if c is None else Prediction(c.step_s, (c.low_s, c.high_s), by=KERNELS, run_spread=c.run_spread)

    def predict(fitted: tuple[set[tuple[str, str]], Any], rows: list[Measurement]) -> Predictions:
        pairs, trees = fitted
        def in_fold(row: KernelRow | Reconciliation) -> bool:  # a probe layer's row goes with its model's
            return (row.machine, probed_from(row.model)) in pairs

        model = None
        if any(row.machine in profiled for row in rows):
            model = KernelModel.fit([r for r in kernel_rows if in_fold(r)],
                                    [r for r in reconciliations if in_fold(r)], seed,
                                    jobs=len(os.sched_getaffinity(0)), fitted=kinds)
        return tuple(None if fallback is None
                     else (model is not None and row.machine in profiled and composed(model, row))
                     or replace(fallback, by=whole.name)
                     for row, fallback in zip(rows, whole.predict(trees, rows)))

    return PredictorEntry(f"{KERNELS}+{whole.name}", fit, predict, seed)


def workload_of(row: Measurement) -> tuple:
    """The workload a row measured: its machine, model, task, batch and input shapes (its candidates vary)."""
    return row.machine, row.model, row.task, row.batch_size, row.input_shapes


def with_runs(base: PredictorEntry) -> DerivedEntry:
    """``base`` as the plan uses it once a workload's runs on its target are stored (:mod:`modak.predict.measured`).
    In each held-out workload (machine, model, task, batch, input shapes), the row ``base`` predicts fastest of each
    runtime, device and precision is taken as measured, as ``modak bench --candidates each-runtime`` measures them:
    its step is its measurement. The kernel model's predictions of the workload's other rows are corrected by those
    it answered (:func:`modak.predict.measured.corrections`); the forest's are not."""

    def derive(rows: list[Measurement], answers: Predictions) -> Predictions:
        result = list(answers)
        workloads: dict[tuple, list[int]] = {}
        for i, (r, answer) in enumerate(zip(rows, answers)):
            if answer is not None:
                workloads.setdefault(workload_of(r), []).append(i)
        for members in workloads.values():
            runs: dict[tuple[str, str, str], int] = {}
            for i in sorted(members, key=lambda i: cast(Prediction, answers[i]).step_s):
                runs.setdefault((rows[i].runtime, rows[i].device, rows[i].precision), i)
            candidates = [candidate_from_row(rows[i]) for i in members]
            asked = [_as_plan(cast(Prediction, answers[i])) for i in members]
            measured = set(runs.values())
            fixed = corrected(candidates, asked, corrections(candidates, asked, [rows[i] for i in measured]))
            for i, p in zip(members, fixed):
                answer = cast(Prediction, answers[i])
                if i in measured:
                    result[i] = replace(answer, step_s=rows[i].step_s, interval=None, trees=(), measured=True)
                elif p is not None:
                    result[i] = replace(answer, step_s=p.step_seconds, trees=p.members, interval=None
                                        if answer.interval is None else (p.low_seconds, p.high_seconds))
        return tuple(result)

    return DerivedEntry(f"{base.name}+runs", base, derive)


def _as_plan(answer: Prediction) -> PlanPrediction:
    """A held-out row's answer as the plan's prediction (its predictor the model that answered)."""
    low, high = answer.interval or (answer.step_s, answer.step_s)
    return PlanPrediction(answer.step_s, low, high, 0.0, (), "compute", answer.by or "", answer.trees,
                          answer.run_spread)


def baseline(catalog: Mapping[str, Recipe]) -> PredictorEntry:
    """Physics only: the roofline bound over the median utilization of the row's (runtime, device) in the training
    rows; it covers the (runtime, device) pairs they have."""

    def fit(rows: list[Measurement]) -> dict[tuple[str, str], float]:
        by_pair: dict[tuple[str, str], list[float]] = {}
        for r in rows:
            by_pair.setdefault((r.runtime, r.device), []).append(example_from_row(r, catalog).bound_seconds / r.step_s)
        return {pair: statistics.median(values) for pair, values in by_pair.items()}

    def predict(utilization: dict[tuple[str, str], float], rows: list[Measurement]) -> Predictions:
        return tuple(Prediction(example_from_row(r, catalog).bound_seconds / utilization[(r.runtime, r.device)])
                     if (r.runtime, r.device) in utilization else None for r in rows)

    return PredictorEntry("roofline/median-utilization", fit, predict)


def default_predictors(seeds: int = 1, catalog: Mapping[str, Recipe] | None = None,
                       kernels: tuple[Sequence[KernelRow], Sequence[Reconciliation]] | None = None,
                       kernels_of: KernelsOfRow | None = None) -> tuple[Entry, ...]:
    """The forest fit with seeds ``0 .. seeds - 1``, then with ``kernels`` (kernel rows and reconciliations) the
    kernel model with the forest as its fallback at the same seeds and each of them :func:`with_runs`, then the
    baseline."""
    if seeds < 1:
        raise ValueError("seeds must be >= 1")
    catalog = catalog if catalog is not None else load_catalog()
    operator_level = () if kernels is None else tuple(kernels_and_forest(seed, catalog, *kernels, kernels_of)
                                                      for seed in range(seeds))
    return (*(forest(seed, catalog) for seed in range(seeds)), *operator_level, *map(with_runs, operator_level),
            baseline(catalog))


SPLITS = (LEAVE_ONE_MODEL_OUT, FAMILY_HELD_OUT, LEAVE_ONE_TARGET_OUT)


def splits(rows: Sequence[Measurement]) -> list[tuple[str, Callable[[Measurement], str]]]:
    """The splits and each one's held-out group of a row: its model, its :func:`family`, and (with rows of two
    targets or more) its target (the names in :data:`SPLITS`)."""
    result: list[tuple[str, Callable[[Measurement], str]]] = [(LEAVE_ONE_MODEL_OUT, lambda r: r.model),
                                                               (FAMILY_HELD_OUT, lambda r: family(r.model))]
    if len({r.machine for r in rows}) >= 2:
        result.append((LEAVE_ONE_TARGET_OUT, lambda r: r.machine))
    return result


def evaluate(rows: list[Measurement], predictors: Sequence[Entry] | None = None,
             machine: str | None = None, catalog: Mapping[str, Recipe] | None = None,
             only: str | None = None) -> list[Scores]:
    """Scores of each predictor (default: :func:`default_predictors` with one seed) on each of :func:`splits`
    (``only``: that split alone), split by split; ``machine``: only that target's rows are held out and scored (every
    other row still trains)."""
    catalog = catalog if catalog is not None else load_catalog()
    predictors = predictors if predictors is not None else default_predictors(1, catalog)
    rows = ok_rows(rows)
    results = []
    for split, group_of in splits(rows):
        if only not in (None, split):
            continue
        predicted: list[dict[int, Prediction]] = [{} for _ in predictors]
        scored = 0
        for group in sorted({group_of(r) for r in rows if machine in (None, r.machine)}):
            train = [r for r in rows if group_of(r) != group]
            test = [(i, r) for i, r in enumerate(rows) if group_of(r) == group and machine in (None, r.machine)]
            if not train:
                continue
            scored += len(test)
            held = [r for _, r in test]
            answered: dict[int, Predictions] = {}  # by id of the entry, for the entries derived from it
            for entry, into in zip(predictors, predicted):
                answers = (entry.derive(held, answered[id(entry.base)]) if isinstance(entry, DerivedEntry)
                           else entry.predict(entry.fit(train), held))
                answered[id(entry)] = answers
                into.update((i, answer) for (i, _), answer in zip(test, answers) if answer is not None)
        parts = answerers(predicted)
        for entry, into in zip(predictors, predicted):
            runs = frozenset(i for i, p in into.items() if p.measured)
            scores = score(split, entry.name, rows, {i: p.step_s for i, p in into.items()}, scored - len(into),
                           {i: p.interval for i, p in into.items() if p.interval is not None}, entry.seed,
                           catalog, {i: p.trees for i, p in into.items()},
                           Counter(p.by for i, p in into.items() if p.by is not None and i not in runs), runs)
            results.append(replace(scores, by_answerer=tuple(subset(answerer, rows, into, indices - runs)
                                                             for answerer, indices in parts.items())))
    return results


def answerers(predicted: Sequence[Mapping[int, Prediction]]) -> dict[str, set[int]]:
    """The rows each model answered, of the first entry (in ``predicted``, one mapping per entry) whose predictions
    say which model answered (a combined entry's); empty where no entry says."""
    for into in predicted:
        if any(p.by is not None for p in into.values()):
            parts: dict[str, set[int]] = {}
            for i, p in into.items():
                parts.setdefault(p.by or "", set()).add(i)
            return dict(sorted(parts.items()))
    return {}


def subset(answerer: str, rows: Sequence[Measurement], predicted: Mapping[int, Prediction],
           indices: Iterable[int]) -> Subset:
    """The accuracy of ``predicted`` on the rows ``indices`` (those it predicted of them)."""
    own = [i for i in indices if i in predicted]
    errors = [abs(predicted[i].step_s - rows[i].step_s) / rows[i].step_s for i in own]
    intervals = [(rows[i].step_s, interval) for i in own if (interval := predicted[i].interval) is not None]

    def mean(values: Sequence[float]) -> float:
        return statistics.mean(values) if values else math.nan

    return Subset(answerer, len(own), mean(errors), mean([e <= WITHIN[0] for e in errors]),
                  mean([e <= WITHIN[1] for e in errors]),
                  mean([low <= measured <= high for measured, (low, high) in intervals]))


def score(split: str, name: str, rows: list[Measurement], predicted: dict[int, float], uncovered: int,
          intervals: dict[int, tuple[float, float]], seed: int | None = None,
          catalog: Mapping[str, Recipe] | None = None, trees: Mapping[int, tuple[float, ...]] | None = None,
          answered: Mapping[str, int] | None = None, runs: frozenset[int] = frozenset()) -> Scores:
    """Metrics of ``predicted`` (row index -> step seconds) against the rows' measurements; ``trees``: each
    row's step seconds by tree of the ensemble (member i of every row from one tree); ``answered``: of an entry of
    several models, the rows each answered; ``runs``: rows taken as measured (their step is their measurement), left
    out of every accuracy metric and kept in the decisions."""
    from scipy.stats import kendalltau

    catalog = catalog if catalog is not None else load_catalog()
    errors = [abs(predicted[i] - rows[i].step_s) / rows[i].step_s for i in predicted if i not in runs]
    workloads: dict[tuple, list[int]] = {}
    for i, r in enumerate(rows):
        workloads.setdefault(workload_of(r), []).append(i)
    trees = {i: t for i, t in (trees or {}).items() if len(t) >= 2}  # a quantile needs members
    taus, noise_taus, decisions, captured, speedups, calibrated, above = [], [], [], [], [], [], []
    no_stock = 0
    for everyone in workloads.values():
        members = [i for i in everyone if i in predicted]
        if len(members) < 2:
            continue
        noise = launch_tau([rows[i] for i in members])
        if not math.isnan(noise):
            noise_taus.append(noise)
        fastest = min(predicted[i] for i in members)
        # A tie in the prediction does not say which of the tied rows it means: the pick is the slowest of them.
        pick = rows[max((i for i in members if predicted[i] == fastest), key=lambda i: rows[i].step_s)]
        best = rows[min(members, key=lambda i: rows[i].step_s)]
        decisions.append(decision(pick, best))
        stock = stock_row((rows[i] for i in everyone), catalog)
        if stock is None:
            no_stock += 1
        else:
            captured.append(captured_speedup(stock.step_s, pick.step_s, best.step_s))
            speedups.append(stock.step_s / pick.step_s)
            home = next((i for i in members if rows[i] is stock and i not in runs), None)
            if home is not None:
                factor = stock.step_s / predicted[home]
                calibrated += [abs(predicted[i] * factor - rows[i].step_s) / rows[i].step_s
                               for i in members if i != home and i not in runs]
                above += [stock_ratio_above_p90(rows[i], stock, trees[i], trees[home])
                          for i in members if i != home and i in trees and home in trees and i not in runs]
        ranked = [i for i in members if i not in runs]
        if len(ranked) >= 3:
            tau = kendalltau([predicted[i] for i in ranked], [rows[i].step_s for i in ranked]).statistic
            if not math.isnan(tau):
                taus.append(tau)
    verdicts = [d.verdict for d in decisions]
    within_10, within_25 = (statistics.mean(e <= within for e in errors) if errors else math.nan for within in WITHIN)
    return Scores(split, name, seed, len(predicted) - len(runs), uncovered, tuple(sorted((answered or {}).items())),
                  statistics.mean(errors) if errors else math.nan, within_10, within_25,
                  statistics.mean(calibrated) if calibrated else math.nan,
                  statistics.median(taus) if taus else math.nan,
                  statistics.median(noise_taus) if noise_taus else math.nan,
                  statistics.mean(low <= rows[i].step_s <= high for i, (low, high) in intervals.items()
                                  if i not in runs) if set(intervals) - runs else math.nan,
                  statistics.mean(above) if above else math.nan,
                  len(decisions),
                  verdicts.count(HIT) / len(verdicts) if verdicts else math.nan,
                  verdicts.count(UNDECIDED) / len(verdicts) if verdicts else math.nan,
                  sum(d.one_launch for d in decisions),
                  statistics.median(captured) if captured else math.nan,
                  float(np.percentile(captured, 10)) if captured else math.nan,
                  statistics.geometric_mean(speedups) if speedups else math.nan, no_stock, runs=len(runs))


def launch_tau(rows: list[Measurement]) -> float:
    """Kendall's tau of one workload's configurations ranked by one launch against another launch, averaged over
    the pairs of launches (launch i of every row, as they ran in round i): how far the measurement agrees with
    itself. NaN with fewer than 3 rows of >= 2 launches."""
    from scipy.stats import kendalltau

    times = [launch_times(r) for r in rows]
    times = [t for t in times if len(t) >= 2]
    rounds = min((len(t) for t in times), default=0)
    if len(times) < 3:
        return math.nan
    values = [kendalltau([t[a] for t in times], [t[b] for t in times]).statistic
              for a, b in itertools.combinations(range(rounds), 2)]
    values = [v for v in values if not math.isnan(v)]
    return statistics.mean(values) if values else math.nan


def seed_spread(values: Iterable[float]) -> tuple[float, float, float]:
    """(mean, min, max) of a metric over seeds (NaN values left out; all NaN: NaN)."""
    finite = [v for v in values if not math.isnan(v)]
    return (statistics.mean(finite), min(finite), max(finite)) if finite else (math.nan, math.nan, math.nan)


SUBSET_METRICS = ("mape", "within_10", "within_25", "interval_coverage")  # the fields of a Subset's accuracy
METRICS: tuple[tuple[str, str, str], ...] = (  # (Scores field, label, format), as tables and documents show them
    ("mape", "MAPE", ".1%"),
    ("within_10", "within ±10%", ".1%"),
    ("within_25", "within ±25%", ".1%"),
    ("mape_calibrated", "MAPE, after one stock run", ".1%"),
    ("kendall_tau_median", "Kendall tau, median of workloads", ".2f"),
    ("kendall_tau_noise", "tau, one launch vs another", ".2f"),
    ("interval_coverage", "in the 80% interval", ".1%"),
    ("stock_ratio_above_p90", "ratio to stock above trees' p90", ".1%"),
    ("hit_rate", "hit rate (pick within 5% of best)", ".1%"),
    ("undecided", "undecided (data cannot tell)", ".1%"),
    ("miss_rate", "miss (shown > 5% slower)", ".1%"),
    ("one_launch", "verdicts on one launch each", ".0f"),
    ("captured_median", "captured speedup, median", ".3f"),
    ("captured_p10", "captured speedup, p10", ".3f"),
    ("pick_speedup", "pick over stock, geometric mean", ".2f"),
)


def grouped(scores: Iterable[Scores]) -> dict[tuple[str, str], list[Scores]]:
    """Scores by (split, predictor), in their order: one predictor's runs over its seeds together."""
    groups: dict[tuple[str, str], list[Scores]] = {}
    for s in scores:
        groups.setdefault((s.split, s.predictor), []).append(s)
    return groups
