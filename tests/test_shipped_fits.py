"""The fits shipped in perfmodels/fits/ are those of the shipped measurements, and a fresh machine's first plan loads
them instead of fitting (#65 item 4)."""

from __future__ import annotations

import lzma
import math
from collections.abc import Iterator
from pathlib import Path

import pytest

from benchmarks.tools.ship_fits import numerics, shipped_numerics
from modak.candidates.catalog import load_catalog
from modak.paths import data_dir
from modak.predict import fits
from modak.predict.forest import load_arrays
from modak.predict.kernel_model import FIT_FORMAT as KERNEL_FORMAT
from modak.predict.kernel_model import KernelModel
from modak.predict.kernel_names import PREDICTOR as KERNELS
from modak.predict.learned import PREDICTOR as LEARNED
from modak.predict.learned import LearnedPredictor, fit_key
from modak.predict.training import kernel_set, training_set

SHIP = "python -m benchmarks.tools.ship_fits"


def shipped_keys(tmp_path: Path) -> dict[str, str]:
    """Each model's key of the shipped data alone (no local store)."""
    no_store = tmp_path / "no-store.sqlite"
    kernels = kernel_set(no_store)
    assert kernels is not None
    return {KERNELS: fits.fit_key(KERNELS, KERNEL_FORMAT, kernels.key),
            LEARNED: fit_key(training_set(no_store).key, load_catalog())}


def test_each_model_ships_one_fit_named_by_the_shipped_data(tmp_path: Path) -> None:
    folder = data_dir("perfmodels") / fits.SHIPPED_FOLDER
    keys = shipped_keys(tmp_path)
    assert sorted(p.name for p in folder.glob(f"*{fits.SUFFIX}.xz")) == sorted(
        fits.shipped_path(model, key).name for model, key in keys.items()), f"the shipped data changed: run {SHIP}"


def test_a_fresh_cache_loads_the_shipped_fits_without_fitting(tmp_path: Path, monkeypatch) -> None:
    keys = shipped_keys(tmp_path)

    def no_fit(*_args, **_kwargs):
        raise AssertionError("fit, where the shipped fit was there")

    monkeypatch.setattr(KernelModel, "fit", no_fit)
    monkeypatch.setattr(LearnedPredictor, "fit", no_fit)
    no_store = tmp_path / "no-store.sqlite"
    data = kernel_set(no_store)
    assert data is not None
    KernelModel.cached(data, tmp_path / "kernels")
    LearnedPredictor.cached(training_set(no_store), folder=tmp_path / "learned")
    for model, key in keys.items():
        cached = tmp_path / model / f"{key}{fits.SUFFIX}"
        assert cached.read_bytes() == lzma.decompress(fits.shipped_path(model, key).read_bytes())


def test_a_damaged_cached_or_shipped_fit_is_fit_again(tmp_path: Path, monkeypatch) -> None:
    calls = []

    def fit() -> bytes:
        calls.append(1)
        return b"fitted"

    def load(path: Path) -> bytes:
        data = path.read_bytes()
        if data != b"fitted":
            raise ValueError("damaged")
        return data

    def save(value: bytes, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(value)

    shipped = tmp_path / "perfmodels"
    (shipped / fits.SHIPPED_FOLDER).mkdir(parents=True)
    monkeypatch.setattr(fits, "data_dir", lambda name: tmp_path / name)
    fits.shipped_path("m", "k").write_bytes(b"not xz")
    cache = tmp_path / "cache"
    assert fits.cached_fit("m", "k", load, fit, save, cache) == b"fitted" and len(calls) == 1
    assert fits.cached_fit("m", "k", load, fit, save, cache) == b"fitted" and len(calls) == 1  # cached
    (cache / f"k{fits.SUFFIX}").write_bytes(b"damaged")
    fits.shipped_path("m", "k").write_bytes(lzma.compress(b"fitted"))
    assert fits.cached_fit("m", "k", load, fit, save, cache) == b"fitted" and len(calls) == 1  # the shipped one
    assert fits.cached_fit("m", "k", load, fit, save, cache, refit=True) == b"fitted" and len(calls) == 2


def test_the_key_names_the_data_and_the_format_not_modaks_source() -> None:
    assert fits.fit_key("m", 1, "data") == fits.fit_key("m", 1, "data")
    assert len({fits.fit_key("m", 1, "data"), fits.fit_key("m", 2, "data"), fits.fit_key("n", 1, "data"),
                fits.fit_key("m", 1, "other"), fits.fit_key("m", 1, "da", "ta")}) == 5


@pytest.mark.slow
def test_the_shipped_fits_are_the_fits_of_the_shipped_data(tmp_path: Path) -> None:
    """Fails where a change to a model's fit gives other arrays without a new FIT_FORMAT and a new shipped fit: byte
    for byte on a machine of the numerics that fit them (``perfmodels/fits/NUMERICS``), else the same fit up to
    rounding (:func:`_same_fit_up_to_rounding`)."""
    no_store = tmp_path / "no-store.sqlite"
    data = kernel_set(no_store)
    assert data is not None
    KernelModel.cached(data, tmp_path / KERNELS, refit=True)
    LearnedPredictor.cached(training_set(no_store), folder=tmp_path / LEARNED, refit=True)
    same_numerics = shipped_numerics() == numerics()
    for model, key in shipped_keys(tmp_path).items():
        fitted = tmp_path / model / f"{key}{fits.SUFFIX}"
        shipped = tmp_path / f"shipped-{model}{fits.SUFFIX}"
        shipped.write_bytes(lzma.decompress(fits.shipped_path(model, key).read_bytes()))
        if same_numerics:
            assert fitted.read_bytes() == shipped.read_bytes(), (
                f"{model}: its fit changed: raise its FIT_FORMAT and run {SHIP}")
        else:
            _same_fit_up_to_rounding(model, shipped, fitted)


def _same_fit_up_to_rounding(model: str, shipped: Path, fitted: Path) -> None:
    """The same data fit on a CPU of other numerics (other SIMD kernels round a few sums otherwise) give the same
    header and arrays up to rounding. Measured, Zen 3 against the Emerald Rapids fits: the same names, array lengths
    and non-float header values; 23 of 344 kernel forests and both learned forests split otherwise, with node counts
    within 0.1% and leaf means within 0.003 SD; 5 of 2,844 header floats differ by more than 1% (a calibration
    term by 10%). A change of the fit itself (its features, its trees, its calibration) moves far more."""
    import statistics

    want_header, want = load_arrays(shipped)
    got_header, got = load_arrays(fitted)
    message = f"{model}: its fit changed beyond rounding: raise its FIT_FORMAT and run {SHIP}"
    assert want.keys() == got.keys(), message
    want_leaves, got_leaves = dict(_leaves(want_header)), dict(_leaves(got_header))
    assert want_leaves.keys() == got_leaves.keys(), message
    floats = [k for k, v in want_leaves.items() if isinstance(v, float)]
    assert all(got_leaves[k] == v for k, v in want_leaves.items() if k not in floats), message
    close = sum(math.isclose(want_leaves[k], got_leaves[k], rel_tol=1e-2, abs_tol=1e-9) for k in floats)
    assert close >= 0.99 * len(floats), f"{message} ({len(floats) - close} of {len(floats)} header floats moved)"
    for name, values in want.items():
        if name.endswith((".roots", ".depth")):
            assert len(got[name]) == len(values), message
        elif name.endswith(".value"):
            assert abs(len(got[name]) - len(values)) <= 0.01 * len(values), f"{message} ({name}: node count)"
            spread = statistics.pstdev(values) or 1.0
            assert abs(statistics.fmean(got[name]) - statistics.fmean(values)) <= 0.01 * spread, f"{message} ({name})"


def _leaves(value: object, path: str = "") -> Iterator[tuple[str, object]]:
    """Each scalar of a JSON value, by its path."""
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _leaves(item, f"{path}/{key}")
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from _leaves(item, f"{path}[{i}]")
    else:
        yield path, value
