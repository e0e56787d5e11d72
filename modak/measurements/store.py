"""The perf store: an embedded SQLite database of measurements, exportable to CSV under ``perfmodels/``.

Location: ``$MODAK_STORE`` if set, else ``$XDG_DATA_HOME/modak/perf.sqlite`` (``~/.local/share/modak``).
One row per measured configuration holds the workload's features (from the analysis), the machine's
ceilings, the candidate's parameters and what was measured, so that a row is self-contained training data. Beside
them, the operator-level model's labels: the kernel rows of profiled launches and their reconciliations
(:mod:`modak.measurements.kernels`), a new profile of a configuration replacing its earlier one.

Several processes may use one store at once (two ``modak bench`` runs, say): it is in WAL mode, every write is one
``BEGIN IMMEDIATE`` transaction that waits for another process's (up to :data:`BUSY_TIMEOUT_S`), and so is the
schema's creation or migration on open. A file that is not a perf store is an :class:`~modak.errors.InputError`,
and is left as it was.
"""

from __future__ import annotations

import csv
import json
import os
import sqlite3
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import MISSING, asdict, dataclass, fields
from pathlib import Path
from typing import Annotated, Any

from msgspec import Meta

from modak.errors import InputError
from modak.limits import MAX_CSV_BYTES, check_size
from modak.measurements.kernels import (
    CEILINGS,
    CONFIGURATION,
    KERNEL_COLUMNS,
    OPTIONAL,
    RECONCILE_COLUMNS,
    KernelRow,
    Reconciliation,
    column_type,
    kernel_from_record,
    kernel_record,
    reconcile_from_record,
    reconcile_record,
)

SCHEMA_VERSION = 4  # 2: the measurement protocol's columns (launches, interval, spread, contention); 3: kernels;
# 4: the kernel rows' and reconciliations' machine ceilings


_JSON_TEXT = "a JSON document encoded as a string"


@dataclass(frozen=True)
class Measurement:
    """One measured configuration (a row of the store and of the shipped CSV files)."""

    # where (peaks and bandwidth of the device the candidate ran on: the CPU node or one GPU)
    machine: Annotated[str, Meta(description="the target's name")]
    microarchitecture: str
    cores: int
    peak_fp32_gflops: float
    peak_bf16_gflops: float | None
    bandwidth_gbs: float
    gpu: Annotated[str | None, Meta(description="GPU model when the candidate ran on a GPU")]
    # what
    model: str
    task: Annotated[str, Meta(description="training or inference")]
    batch_size: int
    input_shapes: Annotated[str, Meta(description=_JSON_TEXT)]
    flops: float
    bytes: float
    forward_flops: float
    parameters: int
    nodes: int
    op_class_flops: Annotated[str, Meta(description=f"op class -> FLOPs per step; {_JSON_TEXT}")]
    op_class_bytes: Annotated[str, Meta(description=f"op class -> bytes per step; {_JSON_TEXT}")]
    # how
    runtime: str
    device: Annotated[str, Meta(description="cpu or gpu")]
    precision: Annotated[str, Meta(description="fp32, tf32, bf16, fp16 or int8")]
    params: Annotated[str, Meta(description=
        f"the candidate's parameters (the plan's candidates[].parameters); {_JSON_TEXT}")]
    threads: int | None
    # measured
    status: Annotated[str, Meta(description=
        "ok, incorrect (failed the reference check), error, or contended (a launch ran beside other work even "
        "when launched again: stored, never learned from; see contention)")]
    step_median_s: float | None
    step_p10_s: float | None
    step_p90_s: float | None
    repeats: int
    throughput_per_s: float | None
    compile_s: float | None
    peak_rss_mb: float | None
    max_abs_error: float | None
    error: str | None
    versions: Annotated[str, Meta(description=f"package versions; {_JSON_TEXT}")]
    measured_at: Annotated[str, Meta(description="ISO 8601 UTC")]
    # how the median was obtained (protocol 2: modak/bench/protocol.py; rows of protocol 1 have one launch)
    protocol: Annotated[int, Meta(description=
        "1: one launch, count-based (older rows); 2: interleaved launches timed by duration")] = 1
    launches: Annotated[int, Meta(description="launches the median is taken over")] = 1
    launch_medians: Annotated[str | None, Meta(description=
        "JSON list: each launch's median step seconds, in its session's round order")] = None
    session: Annotated[str | None, Meta(description=
        "the bench/tune run whose interleaved rounds the launches belong to (pairs rows)")] = None
    ci_low_s: Annotated[float | None, Meta(description="90% interval of the step time over launches")] = None
    ci_high_s: float | None = None
    spread: Annotated[float | None, Meta(description="launch-to-launch coefficient of variation")] = None
    contention: Annotated[str | None, Meta(description=
        "JSON list, per launch: other processes' CPU use, steal, load, canary, and why it counts as busy")] = None

    @property
    def step_s(self) -> float:
        """The median step seconds of a row that measured one (:func:`modak.predict.training.ok_rows`)."""
        if self.step_median_s is None:
            raise ValueError(f"a {self.status} row of {self.model} on {self.machine} has no step time")
        return self.step_median_s

    @property
    def interval_s(self) -> tuple[float, float] | None:
        """The 90% confidence interval of the step time over launches, where the row has one."""
        if self.ci_low_s is None or self.ci_high_s is None:
            return None
        return (self.ci_low_s, self.ci_high_s)

    @property
    def key(self) -> tuple:
        """Identity of a configuration: a new measurement of the same key replaces the old one."""
        return (self.machine, self.model, self.task, self.batch_size, self.input_shapes, self.runtime,
                self.device, self.precision, self.params, self.threads)


@dataclass(frozen=True)
class TunedChoice:
    """The winner of ``modak tune`` for one workload on one target: what the plan then chooses."""

    machine: str
    workload: str  # JSON identity of the job's workload (:func:`modak.plan.workload_identity`)
    candidate: str  # the winning candidate's name
    step_s: float  # its measured step time (median over launches) and 90% interval
    ci_low_s: float
    ci_high_s: float
    confident: bool  # every other finalist was confidently slower; False: the budget ran out first
    trials: int  # candidates raced
    rounds: int
    session: str  # the measurement session (its rows are in the store)
    summary: str  # one sentence: how it won
    measured_at: str


COLUMNS = tuple(f.name for f in fields(Measurement))
TUNED_COLUMNS = tuple(f.name for f in fields(TunedChoice))
_INT = {"cores", "batch_size", "parameters", "nodes", "threads", "repeats", "protocol", "launches"}
_FLOAT = {"peak_fp32_gflops", "peak_bf16_gflops", "bandwidth_gbs", "flops", "bytes", "forward_flops",
          "step_median_s", "step_p10_s", "step_p90_s", "throughput_per_s", "compile_s", "peak_rss_mb",
          "max_abs_error", "ci_low_s", "ci_high_s", "spread"}
_DEFAULTS = {f.name: f.default for f in fields(Measurement) if f.default is not MISSING}  # columns added later
_LABEL_TABLES = {"kernels": KERNEL_COLUMNS, "reconciliations": RECONCILE_COLUMNS}  # the operator-level labels
META_COLUMNS = ("key", "value")
# Every table of this modak's schema with the columns it must have (what _migrate creates and _current checks; each
# label table also has the index _configuration_index names).
_TABLES = {"measurements": COLUMNS, "meta": META_COLUMNS, "tuned": TUNED_COLUMNS, **_LABEL_TABLES}
BUSY_TIMEOUT_S = 60.0  # how long a writer waits for another process's transaction on the same store


def _configuration_index(table: str) -> str:
    """The name of a label table's index on its configuration columns."""
    return f"{table}_configuration"


def _sql_type(column: str) -> str:
    return "INTEGER" if column in _INT else "REAL" if column in _FLOAT else "TEXT"


def default_store_path() -> Path:
    """``$MODAK_STORE`` or the per-user data folder."""
    if os.environ.get("MODAK_STORE"):
        return Path(os.environ["MODAK_STORE"])
    base = Path(os.environ.get("XDG_DATA_HOME", Path.home() / ".local" / "share"))
    return base / "modak" / "perf.sqlite"


class PerfStore:
    """SQLite-backed measurements. Use as a context manager or call :meth:`close`."""

    def __init__(self, path: Path | None = None) -> None:
        """Open (or create) the store at ``path``; a file that is not an SQLite database is an input error."""
        self.path = path or default_store_path()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self._db = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_S, isolation_level=None)
        except sqlite3.Error as exc:
            raise InputError(f"cannot open the perf store: {exc}", file=self.path) from None
        try:
            self._check()  # before anything is written: a file that is not a store stays as it was
            self._wal()
            self._migrate()
        except BaseException:
            self._db.close()
            raise

    def _check(self) -> None:
        """Raise :class:`InputError` unless the file is empty or a perf store (of this modak or an older one)."""
        try:
            tables = {row[0] for row in self._db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            present = {row[1] for row in self._db.execute("PRAGMA table_info(measurements)")}
        except sqlite3.DatabaseError as exc:  # "file is not a database", "database disk image is malformed"
            raise InputError(f"not a modak perf store (the SQLite database `modak bench` writes): {exc}",
                             file=self.path) from None
        if tables and "measurements" not in tables:
            raise InputError(f"not a modak perf store: an SQLite database without a measurements table "
                             f"(tables: {', '.join(sorted(tables))})", file=self.path)
        missing = set(COLUMNS) - set(_DEFAULTS) - present
        if tables and missing:
            names = [c for c in COLUMNS if c in missing]
            raise InputError(f"not a modak perf store: its measurements table lacks {len(names)} of the store's "
                             f"columns ({', '.join(names[:3])}{', ...' if len(names) > 3 else ''})", file=self.path)

    def _wal(self) -> None:
        """Write-ahead logging, so that readers never wait for a writer. Switching a fresh file to WAL can fail
        with "database is locked" without waiting (SQLite does not call the busy handler there): retried."""
        deadline = time.monotonic() + BUSY_TIMEOUT_S
        while True:
            try:
                self._db.execute("PRAGMA journal_mode=WAL")
                return
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) or time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def _current(self) -> bool:
        """Whether the store already has this modak's schema: every table and column of :data:`_TABLES`, the
        label tables' indexes, and its schema version. Read only, so that opening a current store to read it writes
        nothing (its file stays as it was, and the warm plan's key of the local rows, kept under the file's
        identity, holds)."""
        present = {name: {row[1] for row in self._db.execute(f"PRAGMA table_info({name})")} for name in _TABLES}
        indexes = {row[0] for row in self._db.execute("SELECT name FROM sqlite_master WHERE type = 'index'")}
        if any(not set(columns) <= present[table] for table, columns in _TABLES.items()):
            return False
        if any(_configuration_index(table) not in indexes for table in _LABEL_TABLES):
            return False
        version = self._db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
        return version is not None and version[0] == str(SCHEMA_VERSION)

    def _migrate(self) -> None:
        """Create the tables, or add the columns a store of an older modak lacks, in one write transaction
        (two processes opening one store at once: the second sees the first's schema and adds nothing); a store
        that is :meth:`_current` is left untouched."""
        if self._current():
            return
        columns = ", ".join(f"{c} {_sql_type(c)}" for c in COLUMNS)
        key = ", ".join(("machine", "model", "task", "batch_size", "input_shapes", "runtime", "device",
                         "precision", "params", "threads"))
        with self._write():
            self._db.execute(f"CREATE TABLE IF NOT EXISTS measurements ({columns}, UNIQUE ({key}))")
            self._db.execute(f"CREATE TABLE IF NOT EXISTS meta ({META_COLUMNS[0]} TEXT PRIMARY KEY, "
                             f"{META_COLUMNS[1]} TEXT)")
            self._db.execute(f"CREATE TABLE IF NOT EXISTS tuned ({', '.join(TUNED_COLUMNS)}, "
                             "PRIMARY KEY (machine, workload))")
            for table, table_columns in _LABEL_TABLES.items():
                typed = ", ".join(f"{c} {column_type(c)}" for c in table_columns)
                self._db.execute(f"CREATE TABLE IF NOT EXISTS {table} ({typed})")
                self._db.execute(f"CREATE INDEX IF NOT EXISTS {_configuration_index(table)} ON {table} "
                                 f"({', '.join(CONFIGURATION)})")
                self._add_ceilings(table, table_columns)
            present = {row[1] for row in self._db.execute("PRAGMA table_info(measurements)")}
            for column in (c for c in COLUMNS if c not in present):  # a store written by an older modak
                default = _DEFAULTS[column]
                self._db.execute(f"ALTER TABLE measurements ADD COLUMN {column} {_sql_type(column)}"
                                 + ("" if default is None else f" DEFAULT {int(default)}"))
            self._db.execute("INSERT OR REPLACE INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))

    def _add_ceilings(self, table: str, columns: tuple[str, ...]) -> None:
        """Add the machine ceilings' columns to a label table of a store of schema 3, filled from the latest
        whole-model row of each row's machine and device (a row of a machine without one keeps none: reading it is
        an error that says so)."""
        present = {row[1] for row in self._db.execute(f"PRAGMA table_info({table})")}
        added = [c for c in columns if c not in present]
        for column in added:
            self._db.execute(f"ALTER TABLE {table} ADD COLUMN {column} {column_type(column)}")
        filled = [c for c in added if c in CEILINGS]
        if filled:
            self._db.execute(f"UPDATE {table} SET " + ", ".join(
                f"{c} = (SELECT m.{c} FROM measurements m WHERE m.machine = {table}.machine "
                f"AND m.device = {table}.device ORDER BY m.rowid DESC LIMIT 1)" for c in filled))

    @contextmanager
    def _write(self) -> Iterator[None]:
        """One write transaction, holding the write lock from its start (``BEGIN IMMEDIATE``): a writer waits
        up to :data:`BUSY_TIMEOUT_S` for another process's transaction instead of failing halfway through."""
        self._db.execute("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            if self._db.in_transaction:  # SQLite may have rolled it back already (a full disk, say)
                self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")

    def __enter__(self) -> PerfStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._db.close()

    def add(self, rows: Iterable[Measurement]) -> int:
        """Insert rows (replacing earlier measurements of the same configuration); returns how many."""
        values = [tuple(asdict(r)[c] for c in COLUMNS) for r in rows]
        placeholders = ", ".join("?" for _ in COLUMNS)
        with self._write():
            self._db.executemany(f"INSERT OR REPLACE INTO measurements ({', '.join(COLUMNS)}) "
                                 f"VALUES ({placeholders})", values)
        return len(values)

    def rows(self, **where: object) -> list[Measurement]:
        """Measurements matching column=value filters, oldest first."""
        unknown = set(where) - set(COLUMNS)
        if unknown:
            raise ValueError(f"unknown columns: {sorted(unknown)}")
        clause = " AND ".join(f"{c} = ?" for c in where)
        query = f"SELECT {', '.join(COLUMNS)} FROM measurements" + (f" WHERE {clause}" if clause else "")
        return [Measurement(*row) for row in self._db.execute(query + " ORDER BY rowid", tuple(where.values()))]

    def add_kernels(self, rows: Iterable[KernelRow], reconciliations: Iterable[Reconciliation] = ()) -> int:
        """Insert kernel rows and reconciliations in one transaction: the rows of a configuration
        (:data:`~modak.measurements.kernels.CONFIGURATION`) replace its earlier kernel rows, and a reconciliation
        its earlier one. Returns how many kernel rows."""
        kernels = [kernel_record(r) for r in rows]
        reconciled = [reconcile_record(r) for r in reconciliations]
        with self._write():
            for table, records in (("kernels", kernels), ("reconciliations", reconciled)):
                columns = _LABEL_TABLES[table]
                where = " AND ".join(f"{c} = ?" for c in CONFIGURATION)
                self._db.executemany(f"DELETE FROM {table} WHERE {where}",
                                     sorted({tuple(r[c] for c in CONFIGURATION) for r in records}))
                self._db.executemany(f"INSERT INTO {table} ({', '.join(columns)}) "
                                     f"VALUES ({', '.join('?' for _ in columns)})",
                                     [tuple(r[c] for c in columns) for r in records])
        return len(kernels)

    def kernel_rows(self, **where: object) -> list[KernelRow]:
        """Kernel rows matching column=value filters (:data:`~modak.measurements.kernels.KERNEL_COLUMNS`), in the
        order stored."""
        return [kernel_from_record(r) for r in self._select("kernels", where)]

    def reconciliations(self, **where: object) -> list[Reconciliation]:
        """Reconciliations matching column=value filters, in the order stored."""
        return [reconcile_from_record(r) for r in self._select("reconciliations", where)]

    def _select(self, table: str, where: dict[str, object]) -> list[dict[str, Any]]:
        """The matching rows of a label table as records; a row without a value it needs (the ceilings of a row
        migrated from schema 3 whose machine had no whole-model row) is an :class:`InputError` naming it."""
        columns = _LABEL_TABLES[table]
        unknown = set(where) - set(columns)
        if unknown:
            raise ValueError(f"unknown columns: {sorted(unknown)}")
        clause = " AND ".join(f"{c} = ?" for c in where)
        query = f"SELECT rowid, {', '.join(columns)} FROM {table}" + (f" WHERE {clause}" if clause else "")
        records = []
        for rowid, *values in self._db.execute(query + " ORDER BY rowid", tuple(where.values())):
            record = dict(zip(columns, values))
            empty = next((c for c in columns if record[c] is None and c not in OPTIONAL), None)
            if empty is not None:
                raise InputError("no value: a row stored before kernel rows carried their machine's ceilings, of "
                                 "a machine without a whole-model row to take them from (profile it again: "
                                 "`modak bench --kernels`)", file=self.path, field=f"{table}[rowid {rowid}].{empty}")
            records.append(record)
        return records

    def record_tuned(self, choice: TunedChoice) -> None:
        """Store ``choice``, replacing an earlier winner for the same workload and target."""
        with self._write():
            self._db.execute(f"INSERT OR REPLACE INTO tuned VALUES ({', '.join('?' for _ in TUNED_COLUMNS)})",
                             tuple(getattr(choice, c) for c in TUNED_COLUMNS))

    def tuned(self, machine: str, workload: str) -> TunedChoice | None:
        """The tuned winner for ``workload`` on ``machine``, if ``modak tune`` recorded one."""
        row = self._db.execute(f"SELECT {', '.join(TUNED_COLUMNS)} FROM tuned WHERE machine = ? AND workload = ?",
                               (machine, workload)).fetchone()
        if row is None:
            return None
        values = dict(zip(TUNED_COLUMNS, row))
        return TunedChoice(**{**values, "confident": bool(values["confident"])})

    def canary_best(self, host: str, canary: str) -> float | None:
        """The fastest quiet ``canary`` seen on ``host``: ``canary`` (:func:`modak.runtime.measure.canary_seconds`)
        or ``core_rtt`` (:func:`modak.runtime.corelink.round_trip_seconds`)."""
        row = self._db.execute("SELECT value FROM meta WHERE key = ?", (f"{canary}_best_s:{host}",)).fetchone()
        return float(row[0]) if row else None

    def record_canary(self, host: str, seconds: float, canary: str) -> None:
        """Remember ``seconds`` if it is the fastest ``canary`` (:meth:`canary_best`) seen on ``host``."""
        with self._write():
            best = self.canary_best(host, canary)
            if best is None or seconds < best:
                self._db.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)",
                                 (f"{canary}_best_s:{host}", repr(seconds)))

    def export_csv(self, path: Path, **where: object) -> int:
        """Write matching rows to ``path`` (atomically); returns how many."""
        rows = self.rows(**where)
        write_csv(path, rows)
        return len(rows)

    def import_csv(self, path: Path) -> int:
        """Add the rows of a CSV written by :meth:`export_csv`."""
        return self.add(read_csv(path))


def write_csv(path: Path, rows: list[Measurement]) -> None:
    """Write rows as CSV of the store's columns, atomically."""
    from modak.paths import write_atomic

    write_atomic(path, _to_csv(rows))


def _to_csv(rows: list[Measurement]) -> str:
    import io

    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(COLUMNS)
    for row in rows:
        writer.writerow(["" if v is None else v for v in (getattr(row, c) for c in COLUMNS)])
    return buffer.getvalue()


def read_csv(path: Path) -> Iterator[Measurement]:
    """Measurements from a CSV file of the store's columns (as shipped under ``perfmodels/``), within
    :data:`modak.limits.MAX_CSV_BYTES`; a bad file or row is an :class:`InputError` naming the file and line."""
    check_size(path, MAX_CSV_BYTES, "the CSV file")
    try:
        with open(path, newline="", encoding="utf-8") as handle:
            reader = csv.DictReader(handle)
            try:
                present = set(reader.fieldnames or ())
                missing = set(COLUMNS) - present - set(_DEFAULTS)
                if missing:
                    raise InputError(f"missing columns {sorted(missing)}", path, 1)
                for record in reader:
                    yield _measurement(record, present, path, reader.line_num)
            except (csv.Error, UnicodeDecodeError) as exc:
                raise InputError(f"not a CSV file of measurements: {exc}", path, reader.line_num + 1) from None
    except FileNotFoundError:
        raise InputError("file not found", path) from None
    except OSError as exc:
        raise InputError(f"cannot read: {exc.strerror or exc}", path) from None


def _measurement(record: dict[str, str | None], present: set[str], path: Path, line: int) -> Measurement:
    """One CSV record as a measurement; a short row or a value of the wrong type is an error at ``line``."""
    values: dict[str, Any] = {}  # each column's type: _parse
    for column in COLUMNS:
        if column not in present:
            continue
        text = record.get(column)
        if text is None:
            raise InputError("fewer fields than columns", path, line, column)
        try:
            values[column] = _parse(column, text)
        except ValueError:
            kind = "an integer" if column in _INT else "a number"
            raise InputError(f"expected {kind}, got {text[:40]!r}", path, line, column) from None
    return Measurement(**values)


def _parse(column: str, text: str) -> object:
    if text == "":
        return None
    if column in _INT:
        return int(text)
    if column in _FLOAT:
        return float(text)
    return text


def as_json(value: object) -> str:
    """Canonical JSON for the store's JSON columns (sorted keys, so equal values compare equal)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


BENCH_SCHEMA = ("bench", "modak bench --json",
                "The measured rows, one per candidate, in the order measured: a JSON array (no schema_version key; the "
                "columns are the perf store's, also its CSV header in perfmodels/*.csv). Progress and the summary go "
                "to stderr.")
