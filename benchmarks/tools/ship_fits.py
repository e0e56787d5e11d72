"""(maintenance) Fit the kernel model and the learned model on the shipped measurements alone and ship the fits in
``perfmodels/fits/`` (xz), so that the first plan on a fresh machine loads them instead of fitting
(:mod:`modak.predict.fits`).

Run it after the shipped CSV files, the recipes or a model's fit change (raise that model's ``FIT_FORMAT`` when a fit
of the same rows gives other arrays); ``tests/test_shipped_fits.py`` fails until it has run. It replaces each
model's older shipped fit, and writes ``perfmodels/fits/NUMERICS``: the SIMD kernels NumPy dispatches to and the BLAS
core on the machine that fit them (:func:`numerics`). The same data fit on another kind of CPU round a few sums
otherwise and give a few other splits; the test compares the fits byte for byte only where the numerics are the same.

    python -m benchmarks.tools.ship_fits
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path

from modak.paths import data_dir, write_atomic
from modak.predict import fits
from modak.predict.kernel_model import KernelModel
from modak.predict.kernel_names import PREDICTOR as KERNELS
from modak.predict.learned import PREDICTOR as LEARNED
from modak.predict.learned import LearnedPredictor
from modak.predict.training import kernel_set, training_set

NUMERICS = "NUMERICS"  # in perfmodels/fits/


def numerics() -> dict[str, list[str]]:
    """What decides the rounding of a fit on this machine: the SIMD targets NumPy's dispatch uses here, and each BLAS
    library's core (threadpoolctl's report, as scikit-learn loads them)."""
    import scipy.linalg  # noqa: F401  (the BLAS that scikit-learn's and SciPy's solvers load)
    import threadpoolctl
    from numpy._core._multiarray_umath import __cpu_dispatch__, __cpu_features__

    return {"numpy": [target for target in __cpu_dispatch__ if __cpu_features__.get(target)],
            "blas": sorted(f"{pool['internal_api']} {pool.get('architecture')}"
                           for pool in threadpoolctl.threadpool_info() if pool["user_api"] == "blas")}


def shipped_numerics() -> dict[str, list[str]] | None:
    """The numerics of the machine that fit the shipped fits, or None where the file is missing."""
    try:
        return json.loads((data_dir("perfmodels") / fits.SHIPPED_FOLDER / NUMERICS).read_text())
    except FileNotFoundError:
        return None


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
    write_atomic(data_dir("perfmodels") / fits.SHIPPED_FOLDER / NUMERICS, json.dumps(numerics()) + "\n", mode=0o644)
    print(f"numerics of this machine: {numerics()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
