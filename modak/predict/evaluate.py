"""Honest evaluation of the learned model: leave one model (or one target) out, then score the held-out rows.

Metrics on the held-out rows: MAPE of the step time; per workload (model, task, batch on one machine), the
Kendall tau between predicted and measured ranking of its candidates and the regret of the top-1 pick
(measured time of the predicted best / measured best - 1). Rows whose (runtime, device) the training fold does
not cover are counted, not scored. A physics-only baseline (roofline bound / median utilization of the
runtime in the training fold) is scored on the same rows for comparison.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

import numpy as np

from modak.measurements.store import Measurement, PerfStore, default_store_path, read_csv
from modak.paths import data_dir
from modak.predict.learned import LearnedPredictor, example_from_row

LOCAL_WEIGHT = 3.0  # rows measured on the user's machines count more than shipped ones


@dataclass(frozen=True)
class Scores:
    """Metrics of one evaluation scheme for one predictor."""

    scheme: str
    predictor: str
    rows: int
    uncovered: int
    mape: float
    kendall_tau_median: float
    regret_median: float
    regret_p90: float
    workloads: int
    interval_coverage: float  # share of measured times inside the predicted 80% interval (NaN: no interval)


def shipped_rows() -> list[Measurement]:
    """The measured rows shipped in ``perfmodels/*.csv``."""
    return [row for path in sorted(data_dir("perfmodels").glob("*.csv")) for row in read_csv(path)]


def local_rows(store: Path | None = None) -> list[Measurement]:
    """Rows of the local perf store (``modak bench``), if it exists."""
    path = store or default_store_path()
    if not path.exists():
        return []
    with PerfStore(path) as perf:
        return perf.rows()


def training_data(store: Path | None = None) -> tuple[list[Measurement], list[float]]:
    """Shipped rows plus local rows (a local row replaces a shipped row of the same configuration)."""
    local = local_rows(store)
    local_keys = {r.key for r in local}
    shipped = [r for r in shipped_rows() if r.key not in local_keys]
    return shipped + local, [1.0] * len(shipped) + [LOCAL_WEIGHT] * len(local)


def ok_rows(rows: Iterable[Measurement]) -> list[Measurement]:
    return [r for r in rows if r.status == "ok" and r.step_median_s]


def evaluate(rows: list[Measurement]) -> list[Scores]:
    """Leave-one-model-out (and leave-one-target-out with >= 2 machines) scores, learned vs baseline."""
    rows = ok_rows(rows)
    schemes: list[tuple[str, Callable[[Measurement], str]]] = [("leave-one-model-out", lambda r: r.model)]
    if len({r.machine for r in rows}) >= 2:
        schemes.append(("leave-one-target-out", lambda r: r.machine))
    results = []
    for scheme, group_of in schemes:
        learned: dict[int, float] = {}
        intervals: dict[int, tuple[float, float]] = {}
        baseline: dict[int, float] = {}
        uncovered = 0
        for group in sorted({group_of(r) for r in rows}):
            train = [r for r in rows if group_of(r) != group]
            test = [(i, r) for i, r in enumerate(rows) if group_of(r) == group]
            if not train:
                continue
            model = LearnedPredictor(train)
            covered = [(i, r) for i, r in test if (r.runtime, r.device) in model.coverage]
            uncovered += len(test) - len(covered)
            predictions = model.predict_examples([example_from_row(r) for _, r in covered])
            utilization = _median_utilization(train)
            for (i, r), (step, low, high, _compile) in zip(covered, predictions):
                learned[i] = step
                intervals[i] = (low, high)
                baseline[i] = example_from_row(r).bound_seconds / utilization[(r.runtime, r.device)]
        results.append(score(scheme, "learned", rows, learned, uncovered, intervals))
        results.append(score(scheme, "roofline/median-utilization", rows, baseline, uncovered, {}))
    return results


def _median_utilization(rows: list[Measurement]) -> dict[tuple[str, str], float]:
    by_pair: dict[tuple[str, str], list[float]] = {}
    for r in rows:
        by_pair.setdefault((r.runtime, r.device), []).append(example_from_row(r).bound_seconds / r.step_median_s)
    return {pair: statistics.median(values) for pair, values in by_pair.items()}


def score(scheme: str, name: str, rows: list[Measurement], predicted: dict[int, float], uncovered: int,
          intervals: dict[int, tuple[float, float]]) -> Scores:
    """Metrics of ``predicted`` (row index -> step seconds) against the rows' measured medians."""
    from scipy.stats import kendalltau

    errors = [abs(predicted[i] - rows[i].step_median_s) / rows[i].step_median_s for i in predicted]
    workloads: dict[tuple, list[int]] = {}
    for i in predicted:
        r = rows[i]
        workloads.setdefault((r.machine, r.model, r.task, r.batch_size, r.input_shapes), []).append(i)
    taus, regrets = [], []
    for members in workloads.values():
        if len(members) < 2:
            continue
        measured = [rows[i].step_median_s for i in members]
        guess = [predicted[i] for i in members]
        pick = members[int(np.argmin(guess))]
        regrets.append(rows[pick].step_median_s / min(measured) - 1.0)
        if len(members) >= 3:
            tau = kendalltau(guess, measured).statistic
            if not math.isnan(tau):
                taus.append(tau)
    return Scores(scheme, name, len(predicted), uncovered, statistics.mean(errors) if errors else math.nan,
                  statistics.median(taus) if taus else math.nan,
                  statistics.median(regrets) if regrets else math.nan,
                  float(np.percentile(regrets, 90)) if regrets else math.nan, len(regrets),
                  statistics.mean(low <= rows[i].step_median_s <= high for i, (low, high) in intervals.items())
                  if intervals else math.nan)


def format_scores(scores: list[Scores]) -> str:
    lines = [f"{'scheme':<22} {'predictor':<28} {'rows':>5} {'uncov':>5} {'MAPE':>8} {'tau med':>8} "
             f"{'regret med':>10} {'regret p90':>10} {'workloads':>9} {'in 80% int':>10}"]
    for s in scores:
        lines.append(f"{s.scheme:<22} {s.predictor:<28} {s.rows:5d} {s.uncovered:5d} {s.mape:8.1%} "
                     f"{s.kendall_tau_median:8.2f} {s.regret_median:10.1%} {s.regret_p90:10.1%} {s.workloads:9d} "
                     + (f"{'-':>10}" if math.isnan(s.interval_coverage) else f"{s.interval_coverage:10.1%}"))
    return "\n".join(lines)
