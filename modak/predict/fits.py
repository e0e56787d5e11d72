"""Where fitted performance models are kept, by the key of what they were fit on.

A fit is a file of :mod:`modak.predict.forest`'s plain arrays, named by its key: the digest of the data it was fit
on and of the model's format version (each model's ``FIT_FORMAT``, raised when its fit would give other arrays),
never of modak's source bytes, so that a docstring changes no fit and the same data give the same key on every
clone. Two places hold them:

* modak's cache, ``<cache>/<model>/<key>.forest``: what a plan reads (the newest :data:`KEEP_FITS` are kept);
* ``perfmodels/fits/<model>-<key>.forest.xz``, shipped: the fit of the shipped measurements alone, so that the
  first plan on a fresh machine decompresses it (about a second) instead of fitting (a minute on 2 cores).
  ``python -m benchmarks.tools.ship_fits`` writes them; ``tests/test_shipped_fits.py`` checks that they are the fits
  of the shipped data, byte for byte.

A fit just made is read back from its file before it is used, so a plan is the same whether its model was fit in
this process or loaded.
"""

from __future__ import annotations

import hashlib
import lzma
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from modak.paths import cache_dir, data_dir, keep_newest, write_atomic

KEEP_FITS = 4  # fitted models kept in the cache per model (one per distinct training data)
SHIPPED_FOLDER = "fits"  # under perfmodels/
SUFFIX = ".forest"
_DAMAGED = (OSError, ValueError, KeyError, TypeError, lzma.LZMAError)

Fitted = TypeVar("Fitted")


def fit_key(model: str, version: int, *parts: str) -> str:
    """The key of a fit of ``model`` at format ``version`` on the data named by ``parts`` (their keys)."""
    digest = hashlib.sha256(f"{model}\0{version}".encode())
    for part in parts:
        digest.update(b"\0" + part.encode())
    return digest.hexdigest()[:32]


def shipped_path(model: str, key: str) -> Path:
    """Where the shipped fit of ``model`` named ``key`` is (whether or not it exists)."""
    return data_dir("perfmodels") / SHIPPED_FOLDER / f"{model}-{key}{SUFFIX}.xz"


def cached_fit(model: str, key: str, load: Callable[[Path], Fitted], fit: Callable[[], Fitted],
               save: Callable[[Fitted, Path], None], folder: Path | None = None, refit: bool = False) -> Fitted:
    """The fit of ``model`` named ``key``: read from ``folder`` (default: modak's cache), else from the shipped fit of
    that key, else ``fit()`` (also with ``refit``), saved into ``folder`` and read back. A damaged file is fit
    again and rewritten."""
    folder = folder if folder is not None else cache_dir() / model
    path = folder / f"{key}{SUFFIX}"
    if not refit:
        try:
            return load(path)
        except _DAMAGED:
            pass
        try:
            write_atomic(path, lzma.decompress(shipped_path(model, key).read_bytes()))
            return load(path)
        except _DAMAGED:
            pass
    save(fit(), path)
    keep_newest(folder, f"*{SUFFIX}", KEEP_FITS)  # the fit just saved is the newest
    return load(path)


def ship(model: str, key: str, fitted: Path) -> Path:
    """Write the fit in file ``fitted`` as ``model``'s shipped fit named ``key``, replacing the model's other shipped
    fits; returns its path."""
    target = shipped_path(model, key)
    for old in target.parent.glob(f"{model}-*{SUFFIX}.xz"):
        if old != target:
            old.unlink()
    write_atomic(target, lzma.compress(fitted.read_bytes(), preset=6), mode=0o644)
    return target
