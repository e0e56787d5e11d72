"""The perf store under concurrent writers, and files that are not a perf store.

Concurrency is tested with real processes on one SQLite file: several writers adding rows at once, several
processes opening (creating or migrating) one store at once, and two real ``modak bench`` runs.
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import re
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from modak.errors import EXIT_BAD_INPUT, InputError
from modak.measurements.store import COLUMNS, Measurement, PerfStore

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "mnist-cnn-cpu"
WRITERS = 4
ROWS_EACH = 40


def _row(writer: int, index: int) -> Measurement:
    """A distinct configuration per (writer, index)."""
    values: dict[str, object] = {c: None for c in COLUMNS}
    values.update(machine="m", microarchitecture="x86_64", cores=2, peak_fp32_gflops=1.0, bandwidth_gbs=1.0,
                  model=f"writer{writer}", task="inference", batch_size=index, input_shapes="{}", flops=1.0,
                  bytes=1.0, forward_flops=1.0, parameters=1, nodes=1, op_class_flops="{}", op_class_bytes="{}",
                  runtime="onnxruntime", device="cpu", precision="fp32", params="{}", status="ok", repeats=1,
                  versions="{}", measured_at="2026-01-01T00:00:00+00:00", protocol=2, launches=1)
    return Measurement(**values)


def _add_rows(path: str, writer: int, start: multiprocessing.synchronize.Barrier) -> None:
    start.wait()
    with PerfStore(Path(path)) as store:
        for index in range(ROWS_EACH):  # one transaction per row: as many chances to collide as possible
            store.add([_row(writer, index)])


def _open(path: str, start: multiprocessing.synchronize.Barrier) -> None:
    start.wait()
    with PerfStore(Path(path)) as store:
        store.rows()


def _run_all(target: object, path: Path, count: int) -> list[int]:
    """``count`` processes running ``target(path, ...)``, released together; their exit codes."""
    context = multiprocessing.get_context("spawn")  # fresh interpreters, as separate modak commands would be
    start = context.Barrier(count)
    processes = [context.Process(target=target, args=(str(path), *((i,) if target is _add_rows else ()), start))
                 for i in range(count)]
    for process in processes:
        process.start()
    for process in processes:
        process.join(timeout=300)
    return [p.exitcode for p in processes]


@pytest.mark.slow
def test_concurrent_writers_lose_no_row(tmp_path: Path) -> None:
    """Writers in separate processes, each adding rows one transaction at a time, all from a fresh file."""
    path = tmp_path / "perf.sqlite"
    assert _run_all(_add_rows, path, WRITERS) == [0] * WRITERS
    with PerfStore(path) as store:
        rows = store.rows()
    assert len(rows) == WRITERS * ROWS_EACH
    assert {(r.model, r.batch_size) for r in rows} == {(f"writer{w}", i) for w in range(WRITERS)
                                                      for i in range(ROWS_EACH)}


@pytest.mark.parametrize("old", [False, True], ids=["fresh", "schema-1"])
def test_concurrent_opens_create_or_migrate_once(tmp_path: Path, old: bool) -> None:
    """Processes opening one store at once: a fresh file is created, and a store of schema 1 gains its columns,
    without "duplicate column name" or "database is locked" (both happened before the schema change became one
    ``BEGIN IMMEDIATE`` transaction and the switch to WAL was retried)."""
    path = tmp_path / "perf.sqlite"
    if old:
        db = sqlite3.connect(path)
        db.execute(f"CREATE TABLE measurements ({', '.join(COLUMNS[:COLUMNS.index('measured_at') + 1])})")
        db.commit()
        db.close()
    assert _run_all(_open, path, 6) == [0] * 6
    db = sqlite3.connect(path)
    assert [row[1] for row in db.execute("PRAGMA table_info(measurements)")] == list(COLUMNS)
    assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    db.close()


@pytest.mark.slow
def test_two_bench_runs_share_one_store(tmp_path: Path) -> None:
    """Two real ``modak bench`` processes (two batch sizes of the example, so that their rows differ) writing
    one store at once: both succeed and every row each printed is in the store."""
    store = tmp_path / "perf.sqlite"
    processes = []
    for batch in (16, 32):
        folder = tmp_path / f"b{batch}"
        folder.mkdir()
        job = yaml.safe_load((EXAMPLE / "job.yaml").read_text())
        job["model"]["batch_size"] = batch
        job["target"] = str(EXAMPLE / "target.yaml")
        (folder / "job.yaml").write_text(yaml.safe_dump(job))
        processes.append(subprocess.Popen(
            [sys.executable, "-m", "modak", "bench", str(folder / "job.yaml"), "--candidates", "top-2",
             "--launches", "1", "--min-seconds", "0.1", "--budget", "0.2", "--store", str(store), "--json"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    printed = []
    for process in processes:
        stdout, stderr = process.communicate(timeout=600)
        assert process.returncode == 0, stderr
        printed += [(r["batch_size"], r["params"]) for r in json.loads(stdout)]
    with PerfStore(store) as perf:
        stored = [(r.batch_size, r.params) for r in perf.rows()]
    assert len(printed) == 4 and sorted(stored) == sorted(printed)


def _sqlite_of_another_application(path: Path) -> None:
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT)")
    db.execute("INSERT INTO users (name) VALUES ('ada')")
    db.commit()
    db.close()


def _wrong_measurements_table(path: Path) -> None:
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE measurements (id INTEGER PRIMARY KEY, value REAL)")
    db.commit()
    db.close()


NOT_STORES = {
    "random-bytes": (lambda p: p.write_bytes(hashlib.sha512(b"modak").digest() * 64), "not a modak perf store"),
    "csv": (lambda p: p.write_text(",".join(COLUMNS) + "\n"), "not a modak perf store"),
    "another-application": (_sqlite_of_another_application, "without a measurements table (tables: users)"),
    "wrong-columns": (_wrong_measurements_table, "its measurements table lacks 35 of the store's columns"),
}


@pytest.mark.parametrize("kind", sorted(NOT_STORES))
def test_a_file_that_is_not_a_store_is_an_input_error_and_stays_unchanged(tmp_path: Path, kind: str) -> None:
    write, message = NOT_STORES[kind]
    path = tmp_path / ("perf.csv" if kind == "csv" else "perf.sqlite")
    write(path)
    before = path.read_bytes()
    with pytest.raises(InputError, match=re.escape(message)) as raised:
        PerfStore(path)
    assert str(raised.value).startswith(f"{path}: ")
    # The command line: one line naming the file, exit 2, no traceback (plan reads the store; bench writes it).
    for command in ("plan", "bench"):
        result = subprocess.run([sys.executable, "-m", "modak", command, str(EXAMPLE / "job.yaml"), "--store",
                                 str(path)], capture_output=True, text=True, cwd=ROOT)
        assert result.returncode == EXIT_BAD_INPUT, result.stderr
        assert result.stderr.strip() == f"modak: error: {raised.value}"
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name]  # no -wal or -shm file beside it either


def test_opening_a_current_store_to_read_it_writes_nothing(tmp_path: Path) -> None:
    """Reading a store of this modak's schema leaves its file as it was (bytes and modification time), so that
    what is kept under the file's identity (the warm plan's keys of its rows) holds; a store of an older schema is
    still brought up to date on opening."""
    path = tmp_path / "perf.sqlite"
    with PerfStore(path) as store:
        store.add([_row(0, 0)])
    before = path.read_bytes(), path.stat().st_mtime_ns
    with PerfStore(path) as store:
        assert len(store.rows()) == 1 and store.kernel_rows() == [] and store.reconciliations() == []
    assert (path.read_bytes(), path.stat().st_mtime_ns) == before
    assert not path.with_name("perf.sqlite-wal").exists()
    with sqlite3.connect(path) as db:
        db.execute("UPDATE meta SET value = '3' WHERE key = 'schema_version'")
    db.close()
    with PerfStore(path):
        pass
    with sqlite3.connect(path) as db:
        assert db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone() == ("4",)
    db.close()
