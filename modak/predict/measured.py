"""The kernel model's predictions of one job corrected by the job's own runs measured on its target (#40).

On a model family the kernel rows have never seen, the kernel model's error is mostly the model's own and is shared
by the configurations of one runtime and precision (perfmodels/README.md, "The nineteenth round"). Each kernel-model
prediction is multiplied by measured / predicted of the candidates measured on the target (``modak bench``,
``modak tune``): the geometric mean over those of its runtime, device and precision, else of its runtime and device.
Measured on another machine, the ratio hardly transfers, so only the target's rows count.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import replace

from modak.candidates.enumerate import Candidate
from modak.measurements.store import Measurement, as_json
from modak.predict.base import Prediction
from modak.predict.kernel_names import PREDICTOR, TRANSFER_PREDICTOR

CORRECTION_TERM = "measured_correction"  # the factor a prediction was multiplied by
CORRECTED = (PREDICTOR, TRANSFER_PREDICTOR)  # the predictors whose predictions are corrected
Group = tuple[str, ...]  # (runtime, device, precision) or (runtime, device)


def measures(row: Measurement, candidate: Candidate) -> bool:
    """Whether ``row`` measured ``candidate``: the same runtime, device, precision and parameters."""
    return ((row.runtime, row.device, row.precision, row.params)
            == (candidate.runtime, candidate.device, candidate.precision.value, as_json(dict(candidate.params))))


def _groups(candidate: Candidate) -> tuple[Group, Group]:
    return (candidate.runtime, candidate.device, candidate.precision.value), (candidate.runtime, candidate.device)


def corrections(candidates: Sequence[Candidate], predictions: Sequence[Prediction | None],
                measured: Sequence[Measurement]) -> dict[Group, tuple[float, int]]:
    """Per group of :func:`_groups`: the geometric mean of measured / predicted step over the candidates with a
    kernel-model prediction and a row among ``measured`` (the latest, status ok), and how many there were."""
    ratios: dict[Group, list[float]] = {}
    for candidate, prediction in zip(candidates, predictions):
        if prediction is None or prediction.predictor not in CORRECTED:
            continue
        rows = [r for r in measured if r.status == "ok" and measures(r, candidate)]
        if rows:
            for group in _groups(candidate):
                ratios.setdefault(group, []).append(rows[-1].step_s / prediction.step_seconds)
    return {group: (statistics.geometric_mean(values), len(values)) for group, values in ratios.items()}


def corrected(candidates: Sequence[Candidate], predictions: Sequence[Prediction | None],
              factors: Mapping[Group, tuple[float, int]]) -> list[Prediction | None]:
    """Each kernel-model prediction times the factor of its candidate's first group in ``factors``
    (:func:`corrections`), the factor kept as the term :data:`CORRECTION_TERM`; the others as they are. Corrected by
    its own runtime, device and precision's runs, the interval is the one calibrated for such corrected steps
    (:attr:`Prediction.run_spread`); by its runtime's other precisions', the uncorrected interval scaled."""
    result: list[Prediction | None] = []
    for candidate, p in zip(candidates, predictions):
        group = next((g for g in _groups(candidate) if g in factors), None)
        if p is None or p.predictor not in CORRECTED or group is None:
            result.append(p)
            continue
        found = factors[group][0]
        step = p.step_seconds * found
        low, high = ((step * p.run_spread[0], step * p.run_spread[1]) if len(group) == 3 and p.run_spread
                     else (p.low_seconds * found, p.high_seconds * found))
        result.append(replace(p, step_seconds=step, low_seconds=low, high_seconds=high,
                              members=tuple(m * found for m in p.members),
                              terms=(*p.terms, (CORRECTION_TERM, found))))
    return result


def describe(factors: Mapping[Group, tuple[float, int]], target: str) -> str | None:
    """The plan's reason for the corrections (None without any): each runtime and precision's factor and runs."""
    precise = {g: f for g, f in factors.items() if len(g) == 3}
    if not precise:
        return None
    return (f"the kernel model's predictions were corrected by this workload's runs measured on target '{target}': "
            + "; ".join(f"{runtime}/{precision} x{factor:.2f} ({runs} run{'s' if runs > 1 else ''})"
                        for (runtime, _, precision), (factor, runs) in sorted(precise.items()))
            + " (a precision without runs takes its runtime's factor over all of its runs, and its interval scaled;"
            " one with runs, the interval of steps corrected by such runs)")
