"""What a fitted model is fit on, named by a key that changes whenever the data do and is cheaper to compute than
the data (a hash of the files they are read from): a cached fit, and the predictions made with it
(:mod:`modak.predict.memo`), are found by the key without reading the data."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from modak.measurements.kernels import KernelRow, Reconciliation
from modak.measurements.store import Measurement


@dataclass(frozen=True)
class TrainingData:
    """The learned model's measured rows and their weights."""

    key: str
    load: Callable[[], tuple[Sequence[Measurement], Sequence[float]]]  # the rows and their weights

    @classmethod
    def of(cls, rows: Sequence[Measurement], weights: Sequence[float]) -> TrainingData:
        """Rows in memory, keyed by their values."""
        digest = hashlib.sha256()
        for row, weight in zip(rows, weights, strict=True):
            digest.update(f"{row!r}{weight!r}".encode())
        return cls(digest.hexdigest(), lambda: (rows, weights))


@dataclass(frozen=True)
class KernelData:
    """The kernel model's kernel rows and reconciliations (each with its machine's ceilings)."""

    key: str
    load: Callable[[], tuple[Sequence[KernelRow], Sequence[Reconciliation]]]

    @classmethod
    def of(cls, rows: Sequence[KernelRow], reconciliations: Sequence[Reconciliation]) -> KernelData:
        """Data in memory, keyed by their values."""
        digest = hashlib.sha256()
        for item in (*rows, *reconciliations):
            digest.update(repr(item).encode())
        return cls(digest.hexdigest(), lambda: (rows, reconciliations))
