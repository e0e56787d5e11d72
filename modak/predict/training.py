"""The models' training data: the learned model's measured rows shipped in ``perfmodels/*.csv`` and the local perf
store's, and the kernel model's kernel rows and reconciliations shipped in ``perfmodels/kernels-*.csv`` and
``perfmodels/reconcile-*.csv`` and the local perf store's."""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Generic, TypeVar

from modak.errors import InputError
from modak.limits import MAX_CSV_BYTES, check_size
from modak.measurements.kernels import (
    CONFIGURATION,
    KERNEL_CSV,
    RECONCILE_CSV,
    KernelRow,
    Reconciliation,
    is_label_csv,
    read_labels_csv,
)
from modak.measurements.store import Measurement, PerfStore, default_store_path, read_csv
from modak.paths import cache_dir, data_dir, file_digest, file_identity, keep_newest, kept_digest, write_atomic
from modak.predict.data import KernelData, TrainingData

LOCAL_WEIGHT = 3.0  # rows measured on the user's machines count more than shipped ones
LOCAL_KEYS = "local-keys"  # modak's cache folder: the local store's rows' keys, by the store file's identity
KEPT_LOCAL_KEYS = 32
Rows = TypeVar("Rows")


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
    """:func:`training_data` as the learned model's :class:`TrainingData`, keyed by the shipped files (:func:`_key`)
    and the local rows (:class:`LocalRows`), so a cached fit is found without parsing the shipped CSV files or
    reading the local store."""
    local = LocalRows(store or default_store_path(), "rows", local_rows,
                      lambda rows: TrainingData.of(rows, [LOCAL_WEIGHT] * len(rows)).key)
    key = _key(f"{LOCAL_WEIGHT!r}", shipped_files(), local.key())
    return TrainingData(key, lambda: _merged(shipped_rows(), local.rows()))


def shipped_kernel_files() -> list[Path]:
    """The CSV files of kernel rows and reconciliations shipped in ``perfmodels/``."""
    folder = data_dir("perfmodels")
    return sorted(path for pattern in (KERNEL_CSV, RECONCILE_CSV) for path in folder.glob(pattern.format(machine="*")))


def local_kernel_rows(store: Path | None = None) -> tuple[list[KernelRow], list[Reconciliation]]:
    """The kernel rows and reconciliations of the local perf store (``modak bench --kernels``), if it exists."""
    path = store or default_store_path()
    if not path.exists():
        return [], []
    with PerfStore(path) as perf:
        return perf.kernel_rows(), perf.reconciliations()


def kernel_set(store: Path | None = None) -> KernelData | None:
    """The kernel model's data: the shipped kernel rows and reconciliations plus the local store's (a configuration
    profiled locally replaces its shipped rows), keyed by the shipped files (:func:`_key`) and the local rows, so
    that a cached fit is found without parsing the shipped files; None where there are none."""
    files = shipped_kernel_files()
    local = LocalRows(store or default_store_path(), "kernels", local_kernel_rows,
                      lambda rows: KernelData.of(*rows).key)
    if not files and not any(local.rows()):
        return None
    return KernelData(_key("kernels", files, local.key()), lambda: _merged_kernels(files, *local.rows()))


class LocalRows(Generic[Rows]):
    """One kind of the local perf store's rows and their key (the key of :class:`TrainingData` or
    :class:`KernelData`), which a warm plan needs without the rows: the key is kept in modak's cache under the
    store file's identity (:func:`modak.paths.file_identity` of it and of its write-ahead log; any write changes
    one of them, and reading writes nothing), so the rows are read only when the key is not known or a fit needs
    them."""

    def __init__(self, path: Path, kind: str, read: Callable[[Path], Rows], key_of: Callable[[Rows], str]) -> None:
        self.path, self.kind, self._read, self._key_of = path, kind, read, key_of
        self._rows: Rows | None = None
        self._known: str | None = None  # the key found in the cache, which the rows read later must have

    def rows(self) -> Rows:
        """The rows, read once; rows read after their key was taken from the cache must still have it."""
        if self._rows is None:
            rows = self._read(self.path)
            if self._known is not None and self._key_of(rows) != self._known:
                raise InputError("the perf store was written to while this plan read it: plan again",
                                 file=self.path)
            self._rows = rows
        return self._rows

    def key(self) -> str:
        """The rows' key: from the cache where the store is unchanged since it was last read, else from the rows."""
        entry = self._entry()  # before the rows are read: a write after it only leaves an entry never found again
        known = kept_digest(entry) if entry is not None and self._rows is None else None
        if known is not None:
            self._known = known
            return known
        key = self._key_of(self.rows())
        if entry is not None:
            with contextlib.suppress(OSError):
                write_atomic(entry, key)
                keep_newest(entry.parent, "*", KEPT_LOCAL_KEYS)
        return key

    def _entry(self) -> Path | None:
        """The cache file of the store's present content, None where there is no store."""
        try:
            identity = file_identity(self.path)
        except OSError:
            return None
        with contextlib.suppress(OSError):
            identity += "\0" + file_identity(self.path.with_name(self.path.name + "-wal"))
        digest = hashlib.sha256(f"{self.kind}\0{identity}".encode()).hexdigest()[:32]
        return cache_dir() / LOCAL_KEYS / digest


def _key(salt: str, files: Iterable[Path], local: str) -> str:
    """The digest of the shipped ``files``' names and contents (each within the CSV size limit; each file's digest
    cached by :func:`modak.paths.file_digest`, so a plan does not read the megabytes again) and the local rows' key:
    the same on every clone of the same data, which a shipped fit is found by."""
    digest = hashlib.sha256(salt.encode())
    for path in files:
        check_size(path, MAX_CSV_BYTES, "the CSV file")
        digest.update(f"{path.name}\0{file_digest(path)}\0".encode())
    digest.update(local.encode())
    return digest.hexdigest()


def _configuration(row: KernelRow | Reconciliation) -> tuple:
    return tuple(getattr(row, column) for column in CONFIGURATION)


def _merged_kernels(files: Iterable[Path], kernels: list[KernelRow],
                    reconciled: list[Reconciliation]) -> tuple[list[KernelRow], list[Reconciliation]]:
    read = [read_labels_csv(path) for path in files]
    local = {_configuration(r) for r in kernels} | {_configuration(r) for r in reconciled}
    return ([r for shipped, _ in read for r in shipped if _configuration(r) not in local] + kernels,
            [r for _, shipped in read for r in shipped if _configuration(r) not in local] + reconciled)


def _merged(shipped: list[Measurement], local: list[Measurement]) -> tuple[list[Measurement], list[float]]:
    local_keys = {r.key for r in local}
    shipped = [r for r in shipped if r.key not in local_keys]
    return shipped + local, [1.0] * len(shipped) + [LOCAL_WEIGHT] * len(local)


def ok_rows(rows: Iterable[Measurement]) -> list[Measurement]:
    """The rows that measured a step time (status ok)."""
    return [r for r in rows if r.status == "ok" and r.step_median_s]
