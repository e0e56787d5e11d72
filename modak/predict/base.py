"""The predictor interface: anything that turns (workload, target, candidate) into a predicted step time."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from modak.candidates.catalog import Recipe
from modak.candidates.enumerate import Candidate
from modak.spec.hardware import TargetCeilings
from modak.workload.analysis import WorkloadProfile


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

    def term(self, name: str) -> float:
        return dict(self.terms)[name]


class Predictor(Protocol):
    """Predicts a candidate's step time; returns None where it has no basis (the caller falls back)."""

    name: str

    def predict(self, workload: WorkloadProfile, ceilings: TargetCeilings, candidate: Candidate,
                recipe: Recipe) -> Prediction | None: ...


@dataclass(frozen=True)
class FallbackPredictor:
    """Asks each predictor in turn and uses the first answer (e.g. a learned model, then the roofline)."""

    predictors: tuple[Predictor, ...]

    @property
    def name(self) -> str:
        return "+".join(p.name for p in self.predictors)

    def predict(self, workload: WorkloadProfile, ceilings: TargetCeilings, candidate: Candidate,
                recipe: Recipe) -> Prediction | None:
        for predictor in self.predictors:
            prediction = predictor.predict(workload, ceilings, candidate, recipe)
            if prediction is not None:
                return prediction
        return None
