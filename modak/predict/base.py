"""The predictor interface: anything that turns (workload, target, candidate) into a predicted step time."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol

from modak.candidates.catalog import Recipe
from modak.candidates.enumerate import Candidate
from modak.hardware.ceilings import TargetCeilings
from modak.workload.analysis import WorkloadProfile


@dataclass(frozen=True)
class Widening:
    """The SDs in log step time a prediction's interval was widened by, in quadrature, for what its model has not
    seen: the target (no rows of it, no machine of its kind: CPU microarchitecture or GPU model, and cores), another
    probe of a kind it knows (other ceilings), or the model graph (no rows of it on a target or kind it knows)."""

    new_machine: float = 0.0
    same_kind: float = 0.0
    new_model: float = 0.0

    def terms(self) -> tuple[tuple[str, float], ...]:
        """As the plan's ``roofline`` terms name them."""
        return (("new_machine_spread", self.new_machine), ("same_kind_spread", self.same_kind),
                ("new_model_spread", self.new_model))


@dataclass(frozen=True)
class Prediction:
    """Predicted steady-state step time with an interval, compile/tune time, and the terms behind it."""

    step_seconds: float
    low_seconds: float
    high_seconds: float
    compile_seconds: float
    terms: tuple[tuple[str, float], ...]
    bound: str  # "compute", "memory" or "overhead": the largest term
    predictor: str
    # The ensemble's members' step times (one per tree of the learned model; empty for a predictor without
    # members). Member i of two candidates' predictions comes from the same tree, so their ratio is paired.
    members: tuple[float, ...] = ()
    # The kernel model's: the factors of the step that bound 80% of its interval once the step is corrected by a
    # measured run of its runtime, device and precision (modak.predict.measured); None: the interval is scaled.
    run_spread: tuple[float, float] | None = None
    widening: Widening | None = None  # a predictor that widens its interval for what it has not seen: by how much
    # The GPU model's (modak.predict.gpu): which of launch, transfer, compute or memory bounds the step; None
    # elsewhere (a CPU candidate, a predictor without those terms).
    regime: Literal["launch", "transfer", "compute", "memory"] | None = None

    def term(self, name: str) -> float:
        return dict(self.terms)[name]

    def spread(self) -> tuple[float, float]:
        """The step times the ensemble's members disagree between: their 10th and 90th percentiles (the interval
        for a predictor without members). What orders candidates: unlike the interval, it leaves out the
        uncertainty every candidate on a machine shares (the learned model's widening on a machine it has not seen)."""
        if not self.members:
            return self.low_seconds, self.high_seconds
        deciles = statistics.quantiles(self.members, n=10, method="inclusive")
        return deciles[0], deciles[-1]


def paired_ratio_p90(a: Sequence[float], b: Sequence[float]) -> float:
    """The 90th percentile of ``a`` over ``b`` member by member (member i of both from one tree of an ensemble, so
    what the trees agree on cancels out)."""
    return statistics.quantiles([x / y for x, y in zip(a, b)], n=10, method="inclusive")[-1]


# What a predictor is asked about: a candidate and the recipe it was enumerated from.
PredictionRequest = tuple[Candidate, Recipe]


class Predictor(Protocol):
    """Predicts a candidate's step time; returns None where it has no basis (the caller falls back)."""

    @property
    def name(self) -> str: ...

    def predict(self, workload: WorkloadProfile, ceilings: TargetCeilings, candidate: Candidate,
                recipe: Recipe) -> Prediction | None: ...


def for_model(predictor: Predictor, onnx_path: Path | None, zoo: str | None = None) -> Predictor:
    """``predictor`` for one model: a predictor that reads the model itself (the kernel predictor asks the runtimes
    which kernels it becomes) is bound to its graph ``onnx_path`` (None: the job has no ONNX file) and its zoo name
    (None: not a zoo model; the PyTorch runtimes trace zoo models); others are returned as they are."""
    bind = getattr(predictor, "for_model", None)
    return bind(onnx_path, zoo) if bind is not None else predictor


def predict_many(predictor: Predictor, workload: WorkloadProfile, ceilings: TargetCeilings,
                 requests: list[PredictionRequest]) -> list[Prediction | None]:
    """Predictions for many candidates, in one call where the predictor can batch them."""
    batched = getattr(predictor, "predict_many", None)
    if batched is not None:
        return batched(workload, ceilings, requests)
    return [predictor.predict(workload, ceilings, candidate, recipe) for candidate, recipe in requests]


@dataclass(frozen=True)
class FallbackPredictor:
    """Asks each predictor in turn and uses the first answer (e.g. a learned model, then the roofline)."""

    predictors: tuple[Predictor, ...]

    @property
    def name(self) -> str:
        return "+".join(p.name for p in self.predictors)

    def for_model(self, onnx_path: Path | None, zoo: str | None = None) -> FallbackPredictor:
        return FallbackPredictor(tuple(for_model(p, onnx_path, zoo) for p in self.predictors))

    def predict(self, workload: WorkloadProfile, ceilings: TargetCeilings, candidate: Candidate,
                recipe: Recipe) -> Prediction | None:
        return self.predict_many(workload, ceilings, [(candidate, recipe)])[0]

    def predict_many(self, workload: WorkloadProfile, ceilings: TargetCeilings,
                     requests: list[PredictionRequest]) -> list[Prediction | None]:
        results: list[Prediction | None] = [None] * len(requests)
        for predictor in self.predictors:
            todo = [i for i, r in enumerate(results) if r is None]
            if not todo:
                break
            for i, prediction in zip(todo, predict_many(predictor, workload, ceilings, [requests[i] for i in todo])):
                results[i] = prediction
        return results
