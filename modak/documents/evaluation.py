"""What ``modak model eval --json`` prints, as typed records (:data:`SCHEMA`): the cross-validation of the
performance models, one entry per (split, predictor). A metric over several seeds is their mean, with its
[min, max] in ``spread``; a metric with nothing to score is null."""

from __future__ import annotations

from typing import Annotated, Literal

from msgspec import Meta

from modak.documents import Count, Positive, Record


class AnswererAccuracy(Record, frozen=True):
    rows: Annotated[Count, Meta(description="of the rows the model answered, those this predictor predicted")]
    mape: Annotated[float | None, Meta(description="this predictor's MAPE on them")]
    within_10: Annotated[float | None, Meta(description="share of them within +-10%")]
    within_25: Annotated[float | None, Meta(description="share of them within +-25%")]
    interval_coverage: Annotated[float | None, Meta(description="share of them inside this predictor's 80% interval")]


class Entry(Record, frozen=True):
    split: Literal["leave-one-model-out", "family-held-out", "leave-one-target-out"]
    predictor: Annotated[str, Meta(description=
        "the predictor's name: forest (the whole-model random forest), roofline/median-utilization (the "
        "physics-only baseline), ...")]
    seeds: Annotated[list[Count], Meta(description=
        "the seeds of its fits, whose metrics are averaged (empty: nothing random)")]
    rows: Annotated[Count, Meta(description="held-out rows scored")]
    runs: Annotated[Count, Meta(description=
        "held-out rows the predictor took as measured, not predicted (kernels+forest+runs: in each workload, the "
        "row predicted fastest of each runtime, device and precision, whose measurement corrects the kernel "
        "model's predictions of the others, as the plan does with the runs of `modak bench --candidates "
        "each-runtime`): left out of the accuracy, kept in the decisions at their measured step")]
    uncovered: Annotated[Count, Meta(description=
        "held-out rows the predictor's fit does not cover: counted, not scored")]
    answered: Annotated[dict[str, Count], Meta(description=
        "of an entry of several models (kernels+forest: the operator-level model with the whole-model forest as "
        "its fallback), the scored rows each answered; empty for an entry of one model")]
    workloads: Annotated[Count, Meta(description="workloads with >= 2 scored rows: the decisions")]
    no_stock: Annotated[Count, Meta(description=
        "of them, workloads without a measured stock row (no captured speedup)")]
    mape: Annotated[float | None, Meta(description="mean absolute percentage error of the step time (0.1: 10%)")]
    within_10: Annotated[float | None, Meta(description=
        "share of scored rows predicted within +-10% of the measured step")]
    within_25: Annotated[float | None, Meta(description=
        "share of scored rows predicted within +-25% of the measured step")]
    mape_calibrated: Annotated[float | None, Meta(description=
        "MAPE after scaling each workload's predictions by its stock row's measured/predicted")]
    kendall_tau_median: Annotated[float | None, Meta(description=
        "Kendall tau of predicted against measured step time of one workload's candidates (model, task, batch, "
        "input shapes on one machine), per workload with >= 3 scored rows: the median over those workloads (not "
        "pooled)")]
    kendall_tau_noise: Annotated[float | None, Meta(description=
        "the same tau of one launch's ranking against another's (the data's own ceiling), median over workloads")]
    interval_coverage: Annotated[float | None, Meta(description=
        "share of scored rows whose measured step lies inside the predicted 80% interval (null: the predictor "
        "gives none)")]
    stock_ratio_above_p90: Annotated[float | None, Meta(description=
        "share of rows whose measured ratio to the workload's stock row is above the 90th percentile of the "
        "trees' paired ratios (null: no ensemble)")]
    hit_rate: Annotated[float | None, Meta(description=
        "share of workloads (>= 2 scored rows) whose pick is the measured best or shown within 5% of it")]
    undecided: Annotated[float | None, Meta(description="share of workloads the data cannot decide")]
    miss_rate: Annotated[float | None, Meta(description=
        "share of workloads whose pick is shown more than 5% slower than the best")]
    one_launch: Annotated[float | None, Meta(description=
        "verdicts resting on rows of one launch each (the test is the point ratio)")]
    captured_median: Annotated[float | None, Meta(description=
        "(stock / pick) / (stock / best), median over workloads with a stock row")]
    captured_p10: Annotated[float | None, Meta(description="the same, 10th percentile")]
    pick_speedup: Annotated[float | None, Meta(description="stock / pick, geometric mean over the same workloads")]
    by_answerer: Annotated[dict[str, AnswererAccuracy], Meta(description=
        "per model of the split's combined entry (kernels+forest: kernels, forest), this predictor's accuracy on "
        "the rows that model answered: the same rows in every entry of the split, so the operator-level model and "
        "the forest compare on the rows the operator-level model covers; empty where no entry combines models")]
    spread: Annotated[dict[str, Annotated[list[float], Meta(min_length=2, max_length=2)]], Meta(description=
        "with several seeds: each metric's [min, max] over them (keys: the metrics above)")]


class EvaluationDocument(Record, frozen=True):
    schema_version: Literal[1]
    rows: Annotated[Positive, Meta(description="measured rows (shipped and local)")]
    models: Positive
    machines: list[str]
    machine: Annotated[str | None, Meta(description="--machine: only this target's rows are held out and scored")]
    scored: Annotated[Count, Meta(description="rows held out and scored (all, or machine's)")]
    families: Annotated[dict[str, Annotated[list[str], Meta(min_length=1)]], Meta(description=
        "the model families family-held-out holds out together (a model of none is a family of its own)")]
    entries: list[Entry]


SCHEMA = ("model-eval", "modak model eval --json (schema_version 1)",
          "Cross-validation of the performance models: each predictor fit on the rows outside a held-out group (a "
          "model, a model family, a target) and scored on the group's rows, one entry per (split, predictor).")
