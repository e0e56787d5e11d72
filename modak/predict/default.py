"""The predictor `modak plan` uses: the learned model where measured data covers the candidate's runtime
and device class, the roofline predictor (wide interval) elsewhere."""

from __future__ import annotations

from pathlib import Path

from modak.predict.base import FallbackPredictor, Predictor
from modak.predict.roofline import RooflinePredictor


def default_predictor(store: Path | None = None) -> Predictor:
    """Learned model fit on ``perfmodels/*.csv`` and the local store (cached by that data), then roofline fallback."""
    from modak.predict.learned import LearnedPredictor, NoTrainingRows
    from modak.predict.training import training_set

    try:
        learned = LearnedPredictor.cached(training_set(store))
    except NoTrainingRows:
        return RooflinePredictor()
    return FallbackPredictor((learned, RooflinePredictor()))
