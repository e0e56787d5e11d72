"""The learned performance model: roofline features + scikit-learn, trained on measured rows.

What it learns is the *utilization* a runtime reaches, ``u = physics anchor / measured step time``, where the
anchor is the roofline time of the workload's op classes on the device's measured ceilings (at the candidate's
threads and precision) plus the runtime's dispatch overhead per graph node (the recipe's priors). Utilization is
bounded and transfers across hardware far better than raw latency; physics supplies the scale, and the overhead
term the scale of steps of many small ops, which the roofline alone puts orders of magnitude too fast. A random
forest predicts log(u); the spread of its trees gives the interval (10th to 90th percentile). A second forest
predicts the compile/tune seconds.

It is fit on data (CSV rows shipped in ``perfmodels/`` plus the local perf store); the fit is cached as plain
arrays keyed by that data, so a new row refits it, and no pickled model is ever loaded. Its columns come from the
runtime catalog: one per runtime and precision, and each recipe parameter as its ``feature`` declares.
"""

from __future__ import annotations

import json
import math
import os
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from modak.candidates.candidate import DeviceKind
from modak.candidates.catalog import FeatureKind, Recipe, load_catalog, value_key
from modak.candidates.enumerate import Candidate
from modak.hardware.ceilings import TargetCeilings
from modak.measurements.store import Measurement
from modak.paths import write_atomic
from modak.predict import fits
from modak.predict.base import Prediction, PredictionRequest, Widening
from modak.predict.data import TrainingData
from modak.predict.forest import TreeEnsemble, encode_arrays, load_arrays
from modak.predict.roofline import RooflinePredictor, op_seconds, overhead_seconds, thread_shares, tuning_seconds
from modak.spec.models import Precision
from modak.workload.analysis import WorkloadProfile

if TYPE_CHECKING:
    import numpy as np

TREES = 100
MIN_ROWS = 5  # rows of a (runtime, device, precision) the model needs before it is trusted for it
# The spreads below are SDs of log step time; perfmodels/README.md, "The learned model's calibrated spreads", gives
# the measurements each was calibrated on.
WORKLOAD_SPREAD = 0.24  # one workload's median log error on a new machine around the machine's common offset
WORKLOAD_SPREAD_PRIOR = 2  # that spread counts as if seen on this many workloads
NEW_MACHINE_SPREAD = 0.405  # added in quadrature to the trees' spread on a machine the model was not fit on
NEW_MODEL_SPREAD = 0.245  # the same for a model graph it has no rows of, on a machine it knows
SAME_KIND_SPREAD = 0.13  # the same for another probe of a machine kind it knows (other measured ceilings)
Z80 = statistics.NormalDist().inv_cdf(0.9)  # an 80% interval's half-width in SDs
SHARE_CLASSES = ("conv", "matmul", "recurrent")  # op classes whose FLOP share is a column (see Features)
PREDICTOR = "learned"  # its name in plans, and its fits' (modak.predict.fits)
FIT_FORMAT = 1  # raise when a fit of the same rows would give other arrays (the key of shipped and cached fits)


@dataclass(frozen=True)
class Example:
    """The inputs of one prediction, from a stored row or from (workload, ceilings, candidate)."""

    candidate: Candidate
    cores: int
    peak_gflops: float  # of the device at this precision (whole node / one GPU)
    bandwidth_gbs: float
    task: str
    batch_size: int
    flops: float
    bytes: float
    forward_flops: float
    parameters: int
    nodes: int
    class_flops: dict[str, float]
    class_bytes: dict[str, float]
    machine: tuple  # the device's measured description: (device, cores, fp32 GFLOP/s, GB/s)
    overhead_seconds: float  # the runtime's dispatch overhead per step (roofline.overhead_seconds)
    kind: tuple | None  # what the device is, where its name says it (machine_kind) and its ceilings are measured

    @cached_property
    def bound_seconds(self) -> float:
        """Roofline bound of one step: per op class max(FLOPs / peak, bytes / bandwidth), scaled to the step."""
        compute_share, bandwidth_share = thread_shares(self.candidate, self.cores)
        peak = self.peak_gflops * 1e9 * compute_share
        bandwidth = self.bandwidth_gbs * 1e9 * bandwidth_share
        step_ratio = self.flops / self.forward_flops if self.forward_flops else 1.0
        total = sum(max(op_seconds(self.class_flops.get(c, 0.0), self.class_bytes.get(c, 0.0),
                                   self.candidate.precision, peak, bandwidth))
                    for c in sorted(set(self.class_flops) | set(self.class_bytes)))  # fixed order: same sum
        return max(total * step_ratio, 1e-9)

    @property
    def anchor_seconds(self) -> float:
        """The physics the model scales: roofline bound plus dispatch overhead."""
        return self.bound_seconds + self.overhead_seconds

    @property
    def graph(self) -> tuple:
        """What identifies the model graph, whatever its batch and task: its parameters and nodes."""
        return (self.parameters, self.nodes)

    @property
    def workload(self) -> tuple:
        """What identifies the measured workload (model, batch and task) as the analysis saw it."""
        return (self.task, self.batch_size, self.nodes, self.parameters, self.flops)


@dataclass(frozen=True)
class ParameterFeature:
    """The columns of one parameter (by name, across the catalog's recipes) as its recipes declare them."""

    name: str
    kind: FeatureKind
    values: tuple[str, ...] = ()  # categorical: the value keys, one column each

    def columns(self, example: Example) -> list[float]:
        """This parameter's column values for ``example``."""
        value = example.candidate.param(self.name)
        if self.kind == "categorical":
            chosen = None if value is None else value_key(value)
            return [float(chosen == v) for v in self.values]
        if self.kind == "numeric":
            return [math.log1p(float(value or 0))]
        return [(example.candidate.threads or example.cores) / example.cores]  # threads: share of the cores


@dataclass(frozen=True)
class Features:
    """The model's columns: the physics of workload and device, one-hot runtime and precision, then the
    catalog's parameters. Features that transfer to unseen models: no per-op-class mix beyond the conv, matmul
    and recurrent shares (a richer mix identifies the training models and overfits them under leave-one-model-out;
    without its own share, a recurrent model's loop of small dependent products passes for dense layers and moves
    the MLPs' predictions)."""

    runtimes: tuple[str, ...]
    parameters: tuple[ParameterFeature, ...]

    @classmethod
    def from_catalog(cls, catalog: Mapping[str, Recipe]) -> Features:
        """Columns for every runtime of ``catalog`` and every parameter its recipes make a feature of."""
        kinds: dict[str, FeatureKind] = {}
        values: dict[str, list[str]] = {}
        for recipe in catalog.values():
            for parameter in recipe.parameters:
                kind = kinds.setdefault(parameter.name, parameter.feature)
                if kind != parameter.feature:
                    raise ValueError(f"recipes disagree on the feature of parameter '{parameter.name}': "
                                     f"{kind} and {parameter.feature} ({recipe.name})")
                known = values.setdefault(parameter.name, [])
                known += [key for key in map(value_key, parameter.values) if key not in known]
        return cls(tuple(catalog), tuple(
            ParameterFeature(name, kind, tuple(values[name]) if kind == "categorical" else ())
            for name, kind in kinds.items() if kind != "none"))

    def row(self, example: Example) -> list[float]:
        """The feature vector of ``example``."""
        candidate = example.candidate
        total_flops = max(sum(example.class_flops.values()), 1.0)
        values = [math.log(example.anchor_seconds), math.log(max(example.nodes, 1)), math.log(example.batch_size),
                  float(example.task == "training"), math.log(max(example.flops, 1.0) / max(example.bytes, 1.0)),
                  float(candidate.device == "gpu"),
                  *(example.class_flops.get(c, 0.0) / total_flops for c in SHARE_CLASSES),
                  math.log(max(example.overhead_seconds, 1e-9) / example.bound_seconds)]
        values += [float(candidate.runtime == r) for r in self.runtimes]
        values += [float(candidate.precision is p) for p in Precision]
        for parameter in self.parameters:
            values += parameter.columns(example)
        return values


def machine_signature(device: str, cores: int, fp32_gflops: float, bandwidth_gbs: float) -> tuple:
    """What identifies a machine to the model: its device class, cores and measured ceilings."""
    return (device, cores, round(fp32_gflops, 1), round(bandwidth_gbs, 1))


def machine_kind(device: str, name: str | None, cores: int, native_bf16: bool) -> tuple | None:
    """What kind of machine a device is: (device class, CPU microarchitecture or GPU model, cores, whether it
    computes bf16 natively), or None where the name does not say (no name, or one of archspec's generic levels
    such as ``x86_64_v4``, which CPUs of different vendors and generations share). The bf16 flag tells apart what
    archspec names alike: a VM's Emerald Rapids without AMX is its ``icelake``, with Ice Lake's kernels for fp32 but
    native bf16. Two probes of one machine give different ceilings, not kinds."""
    import archspec.cpu

    if not name:
        return None
    if device == "cpu":
        generic = archspec.cpu.TARGETS.get(name)
        if generic is not None and generic.vendor == "generic":
            return None
    return (device, name, cores, native_bf16)


def candidate_from_row(row: Measurement) -> Candidate:
    """The candidate a stored row measured."""
    device = cast(DeviceKind, row.device)  # a row's device is the one its candidate had
    return Candidate(row.runtime, device, Precision(row.precision), tuple(json.loads(row.params).items()),
                     row.threads)


def example_from_row(row: Measurement, catalog: Mapping[str, Recipe]) -> Example:
    """The example of a stored row (its runtime's recipe from ``catalog``)."""
    peak = row.peak_bf16_gflops if row.precision in ("bf16", "fp16") and row.peak_bf16_gflops else row.peak_fp32_gflops
    candidate = candidate_from_row(row)
    return Example(candidate, row.cores, peak,
                   row.bandwidth_gbs, row.task, row.batch_size, row.flops, row.bytes, row.forward_flops,
                   row.parameters, row.nodes, json.loads(row.op_class_flops), json.loads(row.op_class_bytes),
                   machine_signature(row.device, row.cores, row.peak_fp32_gflops, row.bandwidth_gbs),
                   overhead_seconds(catalog[row.runtime], candidate, row.nodes, row.task == "training"),
                   machine_kind(row.device, row.gpu if row.device == "gpu" else row.microarchitecture, row.cores,
                                bool(row.peak_bf16_gflops)))


def example_from(workload: WorkloadProfile, ceilings: TargetCeilings, candidate: Candidate,
                 recipe: Recipe) -> Example:
    """The example of ``candidate`` (of ``recipe``) for ``workload`` on ``ceilings``."""
    device = ceilings.gpu if candidate.device == "gpu" and ceilings.gpu else ceilings.cpu
    by_class = workload.by_op_class()
    return Example(candidate, ceilings.cores, device.peak_gflops[candidate.precision], device.bandwidth_gbs,
                   workload.task.value, workload.batch_size, float(workload.flops), float(workload.bytes),
                   float(workload.forward_flops), workload.parameters, len(workload.ops),
                   {c: float(g.flops) for c, g in by_class.items()}, {c: float(g.bytes) for c, g in by_class.items()},
                   machine_signature(candidate.device, ceilings.cores, device.peak_gflops[Precision.fp32],
                                     device.bandwidth_gbs),
                   overhead_seconds(recipe, candidate, len(workload.ops), workload.task.value == "training"),
                   machine_kind(candidate.device, device.name, ceilings.cores, Precision.bf16 in device.peak_gflops)
                   if device.measured else None)


def shrunk_offset(workload_medians: list[float]) -> float:
    """A machine's offset from its workloads' median errors: their mean, shrunk (positive-part James-Stein)
    by how much of it the workloads' spread (prior ``WORKLOAD_SPREAD``, pooled with theirs) can explain."""
    k = len(workload_medians)
    if k < 2:
        return 0.0
    mean = statistics.mean(workload_medians)
    spread2 = ((WORKLOAD_SPREAD_PRIOR * WORKLOAD_SPREAD ** 2 + (k - 1) * statistics.variance(workload_medians))
               / (WORKLOAD_SPREAD_PRIOR + k - 1))
    return mean * max(0.0, 1.0 - spread2 / (k * mean * mean)) if mean else 0.0


def _machine_offsets(examples: list[Example], X: np.ndarray, y: np.ndarray, weight: np.ndarray,
                     settings: dict[str, Any]) -> dict[tuple, float]:
    """Per machine, the common offset (log utilization) of its rows from what the other machines' data
    predicts: what physics and the features leave out about a machine, if its workloads agree on it.

    Each workload's median residual (out of sample: from a forest trained without that machine) is one
    piece of evidence, its rows are not independent ones. On a new machine the workloads' own errors
    spread by about ``WORKLOAD_SPREAD`` around the common offset, so the mean of k workloads' medians is
    shrunk James-Stein style, by 1 - spread^2 / (k mean^2), toward zero: one workload alone cannot tell
    a machine's offset from its own error and moves nothing. With data from one machine only there is
    nothing to compare against, and no offset.
    """
    import numpy as np
    from sklearn.ensemble import RandomForestRegressor

    counts: dict[tuple, int] = {}
    for e in examples:
        counts[e.machine] = counts.get(e.machine, 0) + 1
    if len(counts) < 2:
        return {}
    reference = max(sorted(counts), key=lambda m: counts[m])  # the best-known machine anchors the scale
    offsets = {}
    for machine in sorted(counts):
        if machine == reference:
            continue
        own = np.array([e.machine == machine for e in examples])
        others = RandomForestRegressor(**settings).fit(X[~own], y[~own], sample_weight=weight[~own])
        # Predicted in one thread: threads add the trees' predictions up in the order they finish, which moves the
        # last bits, and with them the splits of the forest fit on these offsets (a fit must be the same every time)
        predicted = others.set_params(n_jobs=1).predict(X[own])
        by_workload: dict[tuple, list[float]] = {}
        for e, residual in zip([e for e in examples if e.machine == machine], y[own] - predicted):
            by_workload.setdefault(e.workload, []).append(float(residual))
        offsets[machine] = shrunk_offset([float(np.median(v)) for v in by_workload.values()])
    return offsets


class NoTrainingRows(ValueError):
    """The training data hold no successful measurement."""


def fit_key(data_key: str, catalog: Mapping[str, Recipe]) -> str:
    """What a fit depends on, hashed (:func:`modak.predict.fits.fit_key`): the training data's key, the catalog (its
    columns, and the overhead priors of the anchor) and :data:`FIT_FORMAT`."""
    return fits.fit_key(PREDICTOR, FIT_FORMAT, repr(sorted(catalog.items())), data_key)


def _ones() -> Iterable[float]:
    while True:
        yield 1.0


class LearnedPredictor:
    """Random-forest utilization model; answers only for the (runtime, device, precision) its data covers (int8,
    which no shipped row measures, falls back to the roofline).

    :meth:`fit` trains it with scikit-learn; :meth:`cached` reuses the fit of the same data (and the same code and
    catalog) from modak's cache, where it is kept as plain arrays (:mod:`modak.predict.forest`), never pickled."""

    name = PREDICTOR

    def __init__(self, utilization: TreeEnsemble, compile_: TreeEnsemble, machine_offsets: Mapping[tuple, float],
                 known_machines: Mapping[tuple, tuple | None], known_models: frozenset[tuple],
                 coverage: frozenset[tuple[str, str, str]], rows: int, catalog: Mapping[str, Recipe]) -> None:
        """A fitted model (made by :meth:`fit`, :meth:`cached` or :meth:`load`); ``known_machines`` (signatures of
        rows of two workloads or more, each with its :func:`machine_kind`) and ``known_models`` (model graphs,
        :attr:`Example.graph`): what it was fit on, whose intervals :meth:`unseen_spread` does not widen."""
        self._utilization = utilization
        self._compile = compile_
        self.machine_offsets = dict(machine_offsets)
        self.known_machines = dict(known_machines)
        self.known_models = known_models
        self.coverage = coverage
        self.rows = rows
        self._catalog = catalog
        self.features = Features.from_catalog(catalog)
        self._roofline = RooflinePredictor()

    @classmethod
    def fit(cls, rows: Iterable[Measurement], weights: Sequence[float] | None = None, seed: int = 0,
            catalog: Mapping[str, Recipe] | None = None) -> LearnedPredictor:
        """Fit on ``rows`` (weighted), with columns from ``catalog`` (default: the shipped recipes)."""
        import numpy as np
        from sklearn.ensemble import RandomForestRegressor

        pairs = [(r, w) for r, w in zip(rows, weights if weights is not None else _ones())
                 if r.status == "ok" and r.step_median_s]
        if not pairs:
            raise NoTrainingRows("no successful measurements to learn from")
        rows_ok = [r for r, _ in pairs]
        sample_weight = np.array([w for _, w in pairs], dtype=float)
        catalog = catalog if catalog is not None else load_catalog()
        features = Features.from_catalog(catalog)
        examples = [example_from_row(r, catalog) for r in rows_ok]
        X = np.array([features.row(e) for e in examples])
        log_utilization = np.log([e.anchor_seconds / r.step_s for e, r in zip(examples, rows_ok)])
        # Trees grown in this process's usable cores (threads): the trees are the same whatever their number.
        settings = dict(n_estimators=TREES, min_samples_leaf=2, max_features=0.5, random_state=seed,
                        n_jobs=len(os.sched_getaffinity(0)))
        machine_offsets = _machine_offsets(examples, X, log_utilization, sample_weight, settings)
        # The forest learns utilization on the reference machine's scale: each machine's offset is taken out.
        adjusted = log_utilization - np.array([machine_offsets.get(e.machine, 0.0) for e in examples])
        utilization = RandomForestRegressor(**settings).fit(X, adjusted, sample_weight=sample_weight)
        # Tuning time is the user's budget times a known cost per trial; the forest learns the rest of compile.
        timed = [(x, max(0.0, r.compile_s - tuning_seconds(catalog[e.candidate.runtime], e.candidate)), w)
                 for x, e, r, w in zip(X, examples, rows_ok, sample_weight) if r.compile_s is not None]
        compile_ = RandomForestRegressor(**settings).fit(
            np.array([t[0] for t in timed]), np.log1p([t[1] for t in timed]), sample_weight=[t[2] for t in timed])
        counts: dict[tuple[str, str, str], int] = {}
        for r in rows_ok:
            counts[(r.runtime, r.device, r.precision)] = counts.get((r.runtime, r.device, r.precision), 0) + 1
        coverage = frozenset(key for key, n in counts.items() if n >= MIN_ROWS)
        workloads: dict[tuple, set[tuple]] = {}
        kinds: dict[tuple, tuple | None] = {}
        for e in examples:
            workloads.setdefault(e.machine, set()).add(e.workload)
            kinds[e.machine] = e.kind
        known = {machine: kinds[machine] for machine, seen in workloads.items() if len(seen) >= 2}
        return cls(TreeEnsemble.from_sklearn(utilization), TreeEnsemble.from_sklearn(compile_), machine_offsets,
                   known, frozenset(e.graph for e in examples), coverage, len(rows_ok), catalog)

    @classmethod
    def cached(cls, data: TrainingData, catalog: Mapping[str, Recipe] | None = None, folder: Path | None = None,
               refit: bool = False) -> LearnedPredictor:
        """:meth:`fit` (seed 0) on ``data``, or the saved fit of the same data key, catalog columns and format from
        ``folder`` (default: modak's cache) or the shipped fits, found without loading the rows
        (:func:`modak.predict.fits.cached_fit`). A missing or unreadable file, or ``refit``, fits and rewrites it."""
        known = catalog if catalog is not None else load_catalog()
        return fits.cached_fit(PREDICTOR, fit_key(data.key, known), lambda path: cls.load(path, known),
                               lambda: cls.fit(*data.load(), catalog=known), LearnedPredictor.save, folder, refit)

    def save(self, path: Path) -> None:
        """Write the fitted model to ``path`` (plain arrays and a JSON header, :mod:`modak.predict.forest`),
        atomically."""
        header = {"rows": self.rows, "coverage": sorted(self.coverage),
                  "machine_offsets": [[list(m), offset] for m, offset in sorted(self.machine_offsets.items())],
                  "known_machines": [[list(m), list(kind) if kind else None]
                                     for m, kind in sorted(self.known_machines.items())],
                  "known_models": [list(g) for g in sorted(self.known_models)]}
        write_atomic(path, encode_arrays(header, self._utilization.arrays("utilization")
                                         | self._compile.arrays("compile")))

    @classmethod
    def load(cls, path: Path, catalog: Mapping[str, Recipe]) -> LearnedPredictor:
        """A model written by :meth:`save`."""
        header, arrays = load_arrays(path)
        utilization = TreeEnsemble.from_arrays(arrays, "utilization")
        compile_ = TreeEnsemble.from_arrays(arrays, "compile")
        offsets = {tuple(machine): float(offset) for machine, offset in header["machine_offsets"]}
        coverage = frozenset((runtime, device, precision) for runtime, device, precision in header["coverage"])
        known = {tuple(machine): tuple(kind) if kind else None for machine, kind in header["known_machines"]}
        models = frozenset(tuple(graph) for graph in header["known_models"])
        return cls(utilization, compile_, offsets, known, models, coverage, int(header["rows"]), catalog)

    def _tuning_seconds(self, example: Example) -> float:
        return tuning_seconds(self._catalog[example.candidate.runtime], example.candidate)

    def knows_kind(self, example: Example) -> bool:
        """Whether ``example``'s machine is of the kind (:func:`machine_kind`) of a machine the model knows."""
        return example.kind is not None and example.kind in self.known_machines.values()

    def unseen_spread(self, example: Example) -> tuple[float, float, float]:
        """The SDs in log step time (new machine, same kind, new model) by which ``example``'s interval is widened,
        in quadrature: ``NEW_MACHINE_SPREAD`` on a machine neither in ``known_machines`` nor of a known kind (it
        covers a new model too); ``SAME_KIND_SPREAD`` on another probe of a known kind (:meth:`knows_kind`); and
        ``NEW_MODEL_SPREAD`` for a model graph not in ``known_models`` on a known machine or kind. A target with
        the catalog's ceilings instead of measured ones is of no kind: the same-kind spread was calibrated on probes
        of the machine. Another probe
        takes no machine offset: the offset of a known machine corrects the ceilings it was probed with, and a
        probe of its own measures the machine anew (perfmodels/README.md, "Another probe of a known machine")."""
        same_kind = 0.0
        if example.machine not in self.known_machines:
            if not self.knows_kind(example):
                return NEW_MACHINE_SPREAD, 0.0, 0.0
            same_kind = SAME_KIND_SPREAD
        return 0.0, same_kind, 0.0 if example.graph in self.known_models else NEW_MODEL_SPREAD

    def covers(self, candidate: Candidate) -> bool:
        return (candidate.runtime, candidate.device, candidate.precision.value) in self.coverage

    def predict_examples(self, examples: list[Example]) -> list[tuple[float, float, float, float, tuple[float, ...]]]:
        """(step, low, high, compile, members) seconds each: the forest's mean, its trees' 10th/90th percentiles
        (widened in log by :meth:`unseen_spread`, in quadrature, where machine or model is new to it), compile
        including the tuning budget's cost, and each tree's step time.

        Utilization may exceed 1: the probed GEMM peak is not a hard roof for every kernel (the campaign has
        ONNX Runtime's CNN at 374 GFLOP/s of counted FLOPs against a probed 219.5, as Winograd-style
        convolutions do fewer FLOPs than 2 x MACs), so predictions are not clamped to it."""
        if not examples:
            return []
        X = [self.features.row(e) for e in examples]
        per_tree = self._utilization.predict_trees(X)  # trees x examples
        compile_s = [max(0.0, math.expm1(value)) for value in self._compile.predict(X)]
        results = []
        for i, example in enumerate(examples):
            offset = self.machine_offsets.get(example.machine, 0.0)
            trees = [tree[i] + offset for tree in per_tree]
            deciles = statistics.quantiles(trees, n=10, method="inclusive")  # as numpy.percentile (linear)
            anchor = example.anchor_seconds
            mean = statistics.fmean(trees)
            step = anchor / math.exp(mean)
            widen = Z80 ** 2 * sum(spread ** 2 for spread in self.unseen_spread(example))
            low = step / math.exp(math.sqrt(max(0.0, deciles[-1] - mean) ** 2 + widen))
            high = step * math.exp(math.sqrt(max(0.0, mean - deciles[0]) ** 2 + widen))
            compile_total = compile_s[i] + self._tuning_seconds(example)
            members = tuple(anchor / math.exp(tree) for tree in trees)
            results.append((step, low, high, compile_total, members))
        return results

    def predict(self, workload: WorkloadProfile, ceilings: TargetCeilings, candidate: Candidate,
                recipe: Recipe) -> Prediction | None:
        return self.predict_many(workload, ceilings, [(candidate, recipe)])[0]

    def predict_many(self, workload: WorkloadProfile, ceilings: TargetCeilings,
                     requests: list[PredictionRequest]) -> list[Prediction | None]:
        covered = [i for i, (candidate, _) in enumerate(requests) if self.covers(candidate)]
        examples = [example_from(workload, ceilings, *requests[i]) for i in covered]
        results: list[Prediction | None] = [None] * len(requests)
        for i, example, (step, low, high, compile_s, members) in zip(covered, examples,
                                                                     self.predict_examples(examples)):
            candidate, recipe = requests[i]
            physics = self._roofline.predict(workload, ceilings, candidate, recipe)
            machine, same_kind, model = self.unseen_spread(example)
            terms = physics.terms + (("roofline_bound_s", example.bound_seconds),
                                     ("utilization", example.anchor_seconds / step))
            results[i] = Prediction(step, low, high, compile_s, terms, physics.bound, self.name, members,
                                    widening=Widening(machine, same_kind, model))
        return results
