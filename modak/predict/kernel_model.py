"""The operator-level model as fitted and stored (:mod:`modak.predict.kernels`): the rows it is fit on, one model
per machine kind, and its fit cached and shipped as arrays (:mod:`modak.predict.fits`)."""

from __future__ import annotations

import math
import os
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from modak.candidates.enumerate import Candidate
from modak.image.kernels import Kernel
from modak.image.runtimes.base import adapters
from modak.measurements.kernels import KernelRow, Reconciliation, whole_step
from modak.paths import write_atomic
from modak.predict import fits
from modak.predict.data import KernelData
from modak.predict.forest import TreeEnsemble, Values, encode_arrays, load_arrays
from modak.predict.kernel_fit import (
    ALL_PARAMETERS,
    CalibrationKey,
    Corrections,
    KernelEstimate,
    KindFits,
    KindKey,
    RuntimeKey,
    above_profiler,
    calibrate,
    calibrate_runs,
    calibration_of,
    check_rows,
    dispatch_seconds,
    fit_kind_sets,
    fold_rows,
    kernel_seconds,
    model_folds,
    mostly_within,
    out_of_fold_steps,
    profiling_seconds,
)
from modak.predict.kernel_names import PREDICTOR, TRANSFER_PREDICTOR
from modak.predict.kernel_terms import ROOFLINE_FLOOR_S, KindModel, MachineCeilings
from modak.predict.learned import NEW_MACHINE_SPREAD, Z80
from modak.spec.models import Precision

FIT_FORMAT = 1  # raise when a fit of the same rows would give other arrays (the key of shipped and cached fits)
Walked = dict[tuple, Corrections]  # per machine model (its key)


@dataclass(frozen=True, eq=False)
class MachineModel:
    """The kernel model of one machine kind (:attr:`MachineCeilings.key`): a model per kind; dispatch, the
    profiler's cost per kernel, calibration and the calibration of steps corrected by a run (:func:`calibrate_runs`)
    per (runtime, device); the precisions and machines (signatures and kinds) with kernel rows per (runtime, device);
    and the ceilings most of its rows carry (what another machine is compared with,
    :meth:`MachineCeilings.distance`)."""

    key: tuple
    ceilings: MachineCeilings
    kinds: Mapping[KindKey, KindModel]
    dispatch: Mapping[RuntimeKey, float]
    profiling: Mapping[RuntimeKey, float]
    calibration: Mapping[CalibrationKey, tuple[float, float, float]]
    run_calibration: Mapping[RuntimeKey, tuple[float, float]]
    precisions: Mapping[RuntimeKey, frozenset[str]]
    signatures: Mapping[RuntimeKey, frozenset[tuple]]
    machine_kinds: Mapping[RuntimeKey, frozenset[tuple]]

    @staticmethod
    def training_sets(rows: Sequence[KernelRow], reconciliations: Sequence[Reconciliation]) -> list[list[KernelRow]]:
        """The kernel rows :meth:`fit` needs kinds fit on, in its order: all of ``rows``, then each calibration fold's
        (:func:`model_folds`, :func:`fold_rows`)."""
        return [list(rows), *(fold_rows(rows, held) for held in model_folds(reconciliations))]

    @classmethod
    def fit(cls, rows: Sequence[KernelRow], reconciliations: Sequence[Reconciliation],
            fits: Sequence[Mapping[KindKey, KindModel]]) -> MachineModel:
        """Fit on one machine kind's checked ``rows`` (at least one) and whole-step ``reconciliations``, given the
        kinds ``fits`` on each of :meth:`training_sets` (:func:`fit_kind_sets`)."""
        dispatch = dispatch_seconds(reconciliations)
        precisions: dict[RuntimeKey, set[str]] = {}
        signatures: dict[RuntimeKey, set[tuple]] = {}
        kinds: dict[RuntimeKey, set[tuple]] = {}
        machines = [MachineCeilings.of_row(row) for row in rows]
        for row, machine in zip(rows, machines):
            precisions.setdefault((row.runtime, row.device), set()).add(row.precision)
            signatures.setdefault((row.runtime, row.device), set()).add(machine.signature)
            if machine.kind is not None:
                kinds.setdefault((row.runtime, row.device), set()).add(machine.kind)
        ceilings = Counter(machines).most_common(1)[0][0]
        profiling = profiling_seconds(reconciliations)
        steps = out_of_fold_steps(rows, reconciliations, dispatch, profiling,
                                  list(zip(model_folds(reconciliations), fits[1:])))
        calibration = calibrate(steps)
        return cls(ceilings.key, ceilings, fits[0], dispatch, profiling, calibration,
                   calibrate_runs(steps, calibration),
                   {k: frozenset(v) for k, v in precisions.items()}, {k: frozenset(v) for k, v in signatures.items()},
                   {k: frozenset(v) for k, v in kinds.items()})

    def header(self) -> dict:
        """The model's plain values, for :meth:`KernelModel.save` (its kinds' forests are saved beside)."""
        c = self.ceilings
        return {
            "key": list(self.key),
            "ceilings": [c.device, c.name, c.cores, c.fp32_gflops, c.bf16_gflops, c.bandwidth_gbs],
            "kinds": [[*key, list(model.attribute_keys), list(model.prior), model.max_flops, model.max_bytes,
                       list(model.intensities), model.rows, model.share] for key, model in sorted(self.kinds.items())],
            "dispatch": [[*key, value] for key, value in sorted(self.dispatch.items())],
            "profiling": [[*key, value] for key, value in sorted(self.profiling.items())],
            "calibration": [[*key, *values] for key, values in sorted(self.calibration.items())],
            "run_calibration": [[*key, *values] for key, values in sorted(self.run_calibration.items())],
            "precisions": [[*key, sorted(values)] for key, values in sorted(self.precisions.items())],
            "signatures": [[*key, sorted(map(list, values))] for key, values in sorted(self.signatures.items())],
            "machine_kinds": [[*key, sorted(map(list, values))] for key, values in sorted(self.machine_kinds.items())],
        }

    @classmethod
    def of_header(cls, header: Mapping, arrays: Mapping[str, Values], prefix: str) -> MachineModel:
        """The model :meth:`header` wrote, its kinds' forests read from ``arrays`` under ``prefix``."""
        device, name, cores, fp32, bf16, bandwidth = header["ceilings"]
        return cls(tuple(header["key"]),
                   MachineCeilings(str(device), name, int(cores), float(fp32), bf16 and float(bf16), float(bandwidth)),
                   _SavedKinds(header["kinds"], arrays, prefix),
                   {(r, d): float(v) for r, d, v in header["dispatch"]},
                   {(r, d): float(v) for r, d, v in header["profiling"]},
                   {(r, d, k): (float(a), float(b), float(c)) for r, d, k, a, b, c in header["calibration"]},
                   {(r, d): (float(a), float(b)) for r, d, a, b in header["run_calibration"]},
                   {(r, d): frozenset(str(p) for p in v) for r, d, v in header["precisions"]},
                   {(r, d): frozenset(tuple(s) for s in v) for r, d, v in header["signatures"]},
                   {(r, d): frozenset(tuple(s) for s in v) for r, d, v in header["machine_kinds"]})

    def answers(self, key: RuntimeKey, precision: Precision) -> bool:
        """Whether the runtime and device are calibrated and have kernel rows at ``precision``."""
        return (*key, ALL_PARAMETERS) in self.calibration and precision.value in self.precisions.get(key, frozenset())

    def knows(self, key: RuntimeKey, machine: MachineCeilings) -> bool:
        """Whether the runtime and device have kernel rows of ``machine`` (its ceilings, or its kind)."""
        return (machine.signature in self.signatures.get(key, frozenset())
                or machine.kind is not None and machine.kind in self.machine_kinds.get(key, frozenset()))

    def compose(self, kernels: Sequence[Kernel], machine: MachineCeilings, candidate: Candidate, known: bool,
                walked: Corrections | None = None) -> Composition | None:
        """:meth:`KernelModel.compose` by this machine's model (``known``: whether ``machine`` is of its kind; if
        not, the interval is widened by :data:`NEW_MACHINE_SPREAD`)."""
        key = (candidate.runtime, candidate.device)
        times = kernel_seconds(self.kinds, *key, kernels, machine, candidate, walked) if kernels else None
        if (times is None or not mostly_within(times)
                or not above_profiler(sum(e.seconds for e in times), len(kernels), self.profiling[key])):
            return None
        return self.composition(times, candidate, known)

    def composition(self, times: Sequence[KernelEstimate], candidate: Candidate, known: bool) -> Composition:
        """The step of kernels taking ``times`` (one estimate per kernel): their sum plus the runtime's dispatch per
        kernel, times the calibration's factor, and its interval (:meth:`compose`; ``kernels_held_out --floor``
        passes a step's own profiled kernel times, to tell the kernels' error from the composition's)."""
        key = (candidate.runtime, candidate.device)
        calibration = calibration_of(self.calibration, *key, dict(candidate.params))
        dispatch_s = len(times) * self.dispatch[key]
        compute_s = sum(e.seconds for e in times if e.compute_bound)
        memory_s = sum(e.seconds for e in times if not e.compute_bound)
        low_q, mid_q, high_q = calibration
        # The calibration's quantiles hold the error of steps like those it was fit on; the kernels' trees spread
        # where a step's kernels are unlike the kinds' rows (a new family's), weighted by their time.
        spread = sum(e.seconds * e.spread for e in times) / max(sum(e.seconds for e in times), ROOFLINE_FLOOR_S)
        widen = (Z80 * spread) ** 2 + (0.0 if known else (Z80 * NEW_MACHINE_SPREAD) ** 2)
        step = (compute_s + memory_s + dispatch_s) * math.exp(mid_q)
        runs = self.run_calibration.get(key)
        return Composition(step, step / math.exp(math.sqrt((mid_q - low_q) ** 2 + widen)),
                           step * math.exp(math.sqrt((high_q - mid_q) ** 2 + widen)), compute_s, memory_s,
                           dispatch_s, len(times), math.exp(mid_q), known,
                           None if runs is None else (math.exp(runs[0]), math.exp(runs[1])))


@dataclass(frozen=True, eq=False)
class KernelModel:
    """The fitted kernel model: a :class:`MachineModel` per machine kind with kernel rows. A machine is answered by
    its own kind's model; one of no kind with rows for the runtime, device and precision by the nearest such
    machine's (:meth:`MachineCeilings.distance`), transferred by its ceilings. Machines are fit apart because two
    CPUs' kernels reach different shares of their ceilings, bf16 most of all: pooled, they blur each other
    (perfmodels/README.md, "The ninth round")."""

    machines: tuple[MachineModel, ...]

    @classmethod
    def fit(cls, rows: Sequence[KernelRow], reconciliations: Sequence[Reconciliation], seed: int = 0,
            jobs: int = 1, fitted: KindFits | None = None) -> KernelModel:
        """Fit a model per machine kind of ``rows`` and ``reconciliations`` (on the ceilings they carry), the kinds
        of all of them in up to ``jobs`` processes (:func:`fit_kind_sets`: the same models whatever ``jobs``, and
        whatever kinds ``fitted`` holds from earlier fits of the same rows); a damaged table is an InputError."""
        check_rows(rows, reconciliations)
        # What a step adds to its kernels (dispatch, the profiler's cost, the calibration) is learned from whole
        # models' steps: a probed layer's session is mostly the fixed cost of a run.
        # Only the runtimes whose kernels at plan time are the kernels their profiles show, by construction (one
        # mapping of the runtime's own graph: ONNX Runtime's optimized graph, OpenVINO's runtime model, PyTorch's
        # dispatched aten ops on fake CPU tensors). torch.compile's profiles are Inductor's fused kernels, which its
        # plan (the eager ops) does not name: the forest answers for it.
        planned = {name for name, runtime in adapters().items() if runtime.profiles_as_planned}
        by_machine: dict[tuple, tuple[list[KernelRow], list[Reconciliation]]] = {}
        for row in rows:
            if row.runtime in planned:
                by_machine.setdefault(MachineCeilings.of_row(row).key, ([], []))[0].append(row)
        for rec in reconciliations:
            key = MachineCeilings.of_row(rec).key
            if rec.runtime in planned and whole_step(rec) and key in by_machine:
                by_machine[key][1].append(rec)
        machines = [by_machine[key] for key in sorted(by_machine, key=repr)]
        sets = [MachineModel.training_sets(*machine) for machine in machines]
        fitted_sets = iter(fit_kind_sets([training for machine_sets in sets for training in machine_sets], seed, jobs,
                                        fitted))
        return cls(tuple(MachineModel.fit(*machine, [next(fitted_sets) for _ in machine_sets])
                         for machine, machine_sets in zip(machines, sets)))

    @classmethod
    def cached(cls, data: KernelData, folder: Path | None = None, refit: bool = False) -> KernelModel:
        """:meth:`fit` on ``data``, or the saved fit of the same data key and format from ``folder`` (default: modak's
        cache) or the shipped fits (:func:`modak.predict.fits.cached_fit`); a missing or unreadable file, or ``refit``,
        fits and rewrites it."""
        return fits.cached_fit(PREDICTOR, fits.fit_key(PREDICTOR, FIT_FORMAT, data.key), cls.load,
                               lambda: cls.fit(*data.load(), jobs=len(os.sched_getaffinity(0))), KernelModel.save,
                               folder, refit)

    def save(self, path: Path) -> None:
        """Write the model (plain arrays and a JSON header, :mod:`modak.predict.forest`), atomically."""
        arrays: dict[str, Values] = {}
        for j, machine in enumerate(self.machines):
            for i, (_, model) in enumerate(sorted(machine.kinds.items())):
                arrays |= model.forest.arrays(f"m{j}kind{i}")
        write_atomic(path, encode_arrays({"machines": [m.header() for m in self.machines]}, arrays))

    @classmethod
    def load(cls, path: Path) -> KernelModel:
        """A model written by :meth:`save`."""
        header, arrays = load_arrays(path)
        return cls(tuple(MachineModel.of_header(h, arrays, f"m{j}") for j, h in enumerate(header["machines"])))

    def calibrated(self, runtime: str, device: str) -> bool:
        """Whether some machine's steps of the runtime and device are calibrated (without which it answers
        nothing)."""
        return any((runtime, device, ALL_PARAMETERS) in m.calibration for m in self.machines)

    def answering(self, key: RuntimeKey, machine: MachineCeilings, precision: Precision) -> MachineModel | None:
        """The machine model that answers ``machine``'s steps of the runtime and device at ``precision``: of those
        calibrated with kernel rows at it (:meth:`MachineModel.answers`), the one that knows ``machine``, else the
        nearest; None where none answers."""
        able = [m for m in self.machines if m.answers(key, precision)]
        own = next((m for m in able if m.knows(key, machine)), None)
        return own or min(able, key=lambda m: machine.distance(m.ceilings), default=None)

    def compose(self, kernels: Sequence[Kernel], machine: MachineCeilings, candidate: Candidate,
                walked: Walked | None = None) -> Composition | None:
        """The step of ``kernels`` (one call each) for ``candidate`` on ``machine``, by :meth:`answering`'s model;
        None where no machine's model answers the runtime, device and precision, a kernel's kind has no model in
        it (or there are no kernels), too much of the step is extrapolated, or the kernels are too short to stand
        out of the profiler's cost. ``walked``: per machine model, as :func:`kernel_seconds` takes it."""
        key = (candidate.runtime, candidate.device)
        model = self.answering(key, machine, candidate.precision)
        if model is None:
            return None
        return model.compose(kernels, machine, candidate, model.knows(key, machine),
                             None if walked is None else walked.setdefault(model.key, {}))


class _SavedKinds(Mapping[KindKey, KindModel]):
    """The kind models of a saved :class:`MachineModel`, each decoded (and its arrays checked) when first asked: a
    plan asks for the few dozen kinds its candidates run, of hundreds."""

    def __init__(self, entries: Sequence[Sequence], arrays: Mapping[str, Values], prefix: str) -> None:
        self._entries = {(str(e[0]), str(e[1]), str(e[2])): (i, e) for i, e in enumerate(entries)}
        self._arrays = arrays
        self._prefix = prefix
        self._decoded: dict[KindKey, KindModel] = {}

    def __getitem__(self, key: KindKey) -> KindModel:
        if key not in self._decoded:
            i, (_, _, _, keys, prior, max_flops, max_bytes, intensities, rows, share) = self._entries[key]
            self._decoded[key] = KindModel(
                tuple(keys), (float(prior[0]), float(prior[1]), float(prior[2])), float(max_flops), float(max_bytes),
                (float(intensities[0]), float(intensities[1])),
                TreeEnsemble.from_arrays(self._arrays, f"{self._prefix}kind{i}"), int(rows), float(share))
        return self._decoded[key]

    def __iter__(self) -> Iterator[KindKey]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: object) -> bool:
        return key in self._entries




@dataclass(frozen=True)
class Composition:
    """A step composed from its kernels: the calibrated step and interval, and the sums behind them (kernel seconds
    of compute- and memory-bound kernels, dispatch), before the calibration's factor."""

    step_s: float
    low_s: float
    high_s: float
    compute_s: float
    memory_s: float
    dispatch_s: float
    kernels: int
    calibration: float  # exp(median out-of-fold residual): what multiplies the sums
    known_machine: bool  # False: transferred by ceilings, the interval widened
    run_spread: tuple[float, float] | None  # the interval's factors once corrected by a run (Prediction.run_spread)

    @property
    def predictor(self) -> str:
        return PREDICTOR if self.known_machine else TRANSFER_PREDICTOR
