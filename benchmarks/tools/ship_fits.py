"""(maintenance) Fit the kernel model and the learned model on the shipped measurements alone and ship the fits in
``perfmodels/fits/`` (xz), so that the first plan on a fresh machine loads them instead of fitting
(:mod:`modak.predict.fits`).

Run it after the shipped CSV files, the recipes or a model's fit change (raise that model's ``FIT_FORMAT`` when a fit
of the same rows gives other arrays); ``tests/test_shipped_fits.py`` fails until it has run. It replaces each
model's older shipped fit.

    python -m benchmarks.tools.ship_fits
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from modak.predict import fits
from modak.predict.kernel_model import PREDICTOR as KERNELS
from modak.predict.kernel_model import KernelModel
from modak.predict.learned import PREDICTOR as LEARNED
from modak.predict.learned import LearnedPredictor
from modak.predict.training import kernel_set, training_set


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        no_store = folder / "no-store.sqlite"  # the shipped rows alone
        data = kernel_set(no_store)
        assert data is not None, "perfmodels/ ships no kernel rows"
        for model, fit in ((KERNELS, lambda out: KernelModel.cached(data, out, refit=True)),
                           (LEARNED, lambda out: LearnedPredictor.cached(training_set(no_store), folder=out,
                                                                         refit=True))):
            start = time.perf_counter()
            out = folder / model
            fit(out)
            (fitted,) = out.glob(f"*{fits.SUFFIX}")
            shipped = fits.ship(model, fitted.name.removesuffix(fits.SUFFIX), fitted)
            print(f"{model}: fit in {time.perf_counter() - start:.1f} s, {fitted.stat().st_size / 1e6:.1f} MB, "
                  f"shipped as {shipped.relative_to(Path.cwd()) if shipped.is_relative_to(Path.cwd()) else shipped} "
                  f"({shipped.stat().st_size / 1e6:.1f} MB)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
