"""The predictor `modak plan` uses: the kernel model where the runtime's planned kernels are all covered, the GPU
model (:mod:`modak.predict.gpu`: launch, host-transfer and device terms) for every GPU candidate, the learned model
where measured data covers the candidate's runtime and device class, the roofline predictor (wide interval)
elsewhere. Each prediction's ``predictor`` names the one that answered. Its predictions are remembered
(:mod:`modak.predict.memo`)."""

from __future__ import annotations

import functools
from pathlib import Path

from modak.predict.base import FallbackPredictor, Predictor
from modak.predict.roofline import RooflinePredictor


def default_predictor(store: Path | None = None, kernels: bool = True) -> Predictor:
    """The kernel model fit on the shipped ``perfmodels/kernels-*.csv`` and ``reconcile-*.csv`` and the local
    store's kernel rows, where there are any and ``kernels`` (bound to a job's graph by
    :func:`modak.predict.base.for_model`), then the learned model fit on ``perfmodels/*.csv`` and the local store,
    then the roofline; each fit cached by its data, and loaded only when a prediction is not remembered."""
    from modak.candidates.catalog import load_catalog
    from modak.predict.memo import MemoPredictor, identity
    from modak.predict.training import kernel_set, training_set

    data = kernel_set(store) if kernels else None
    rows = training_set(store)
    catalog = load_catalog()

    @functools.cache  # one load of the fits for every model this predictor is bound to (an auto batch's plans)
    def make() -> Predictor:
        from modak.predict.gpu import GpuPredictor
        from modak.predict.kernel_model import KernelModel
        from modak.predict.kernels import KernelPredictor
        from modak.predict.learned import LearnedPredictor, NoTrainingRows

        first: tuple[Predictor, ...] = () if data is None else (KernelPredictor(KernelModel.cached(data)),)
        gpu = GpuPredictor(lambda: [row for row in rows.load()[0] if row.device == "gpu"], catalog)
        try:
            learned = LearnedPredictor.cached(rows, catalog)
        except NoTrainingRows:
            return FallbackPredictor((*first, gpu, RooflinePredictor()))
        return FallbackPredictor((*first, gpu, learned, RooflinePredictor()))

    return MemoPredictor(identity(data.key if data else None, rows.key, catalog=catalog), make)
