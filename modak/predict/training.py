"""The learned model's training data: the rows shipped in ``perfmodels/*.csv`` and the local perf store's."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from pathlib import Path

from modak.limits import MAX_CSV_BYTES, check_size
from modak.measurements.kernels import is_label_csv
from modak.measurements.store import Measurement, PerfStore, default_store_path, read_csv
from modak.paths import data_dir
from modak.predict.learned import TrainingData

LOCAL_WEIGHT = 3.0  # rows measured on the user's machines count more than shipped ones


def shipped_files() -> list[Path]:
    """The CSV files of measured rows shipped in ``perfmodels/`` (not its kernel rows' files)."""
    return sorted(p for p in data_dir("perfmodels").glob("*.csv") if not is_label_csv(p))


def shipped_rows() -> list[Measurement]:
    """The measured rows shipped in ``perfmodels/*.csv``."""
    return [row for path in shipped_files() for row in read_csv(path)]


def local_rows(store: Path | None = None) -> list[Measurement]:
    """Rows of the local perf store (``modak bench``), if it exists."""
    path = store or default_store_path()
    if not path.exists():
        return []
    with PerfStore(path) as perf:
        return perf.rows()


def training_data(store: Path | None = None) -> tuple[list[Measurement], list[float]]:
    """Shipped rows plus local rows (a local row replaces a shipped row of the same configuration)."""
    return _merged(shipped_rows(), local_rows(store))


def training_set(store: Path | None = None) -> TrainingData:
    """:func:`training_data` as the learned model's :class:`TrainingData`, keyed by the shipped files' bytes and
    the local rows, so a cached fit is found without parsing the shipped CSV files."""
    local = local_rows(store)
    digest = hashlib.sha256(f"{LOCAL_WEIGHT!r}".encode())
    for path in shipped_files():
        check_size(path, MAX_CSV_BYTES, "the CSV file")
        content = path.read_bytes()
        digest.update(f"{path.name}\0{len(content)}\0".encode())
        digest.update(content)
    digest.update(TrainingData.of(local, [LOCAL_WEIGHT] * len(local)).key.encode())
    return TrainingData(digest.hexdigest(), lambda: _merged(shipped_rows(), local))


def _merged(shipped: list[Measurement], local: list[Measurement]) -> tuple[list[Measurement], list[float]]:
    local_keys = {r.key for r in local}
    shipped = [r for r in shipped if r.key not in local_keys]
    return shipped + local, [1.0] * len(shipped) + [LOCAL_WEIGHT] * len(local)


def ok_rows(rows: Iterable[Measurement]) -> list[Measurement]:
    """The rows that measured a step time (status ok)."""
    return [r for r in rows if r.status == "ok" and r.step_median_s]
