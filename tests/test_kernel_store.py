"""The operator-level model's labels (#40) on the host: a profiled launch's Profile as kernel rows with FLOPs and
bytes from the analysis of a real ONNX graph and its reconciliation; the perf store's kernel tables; their CSV
files, a damaged one refused with its location (exit 2 through the CLI); and ``modak bench --kernels``."""

from __future__ import annotations

import csv
import dataclasses
import json
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import onnx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper

from modak.cli import main
from modak.errors import EXIT_BAD_INPUT, InputError
from modak.image.kernels import Kernel, KernelTime, Profile
from modak.measurements.kernels import (
    CEILINGS,
    KERNEL_COLUMNS,
    OPTIONAL,
    KernelRow,
    Reconciliation,
    column_type,
    is_label_csv,
    kernel_record,
    read_kernel_csv,
    read_labels_csv,
    read_reconcile_csv,
    write_kernel_csv,
    write_reconcile_csv,
)
from modak.measurements.profiles import kernel_rows
from modak.measurements.store import COLUMNS, Measurement, PerfStore
from modak.workload.analysis import WorkloadProfile, analyze

ROOT = Path(__file__).resolve().parents[1]
CNN = ROOT / "examples" / "mnist-cnn-cpu" / "job.yaml"
BATCH = 2


@pytest.fixture(scope="module")
def graph(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Conv+BatchNorm+ReLU, a global average pool and a Gemm, as an ONNX file."""
    weight = helper.make_tensor("w", TensorProto.FLOAT, [4, 3, 3, 3], [0.1] * 108)
    norm = [helper.make_tensor(name, TensorProto.FLOAT, [4], [value] * 4)
            for name, value in (("scale", 1.0), ("bias", 0.0), ("mean", 0.0), ("var", 1.0))]
    fc = helper.make_tensor("fc_w", TensorProto.FLOAT, [4, 2], [0.5] * 8)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c", "scale", "bias", "mean", "var"], ["b"], name="bn"),
             helper.make_node("Relu", ["b"], ["r"], name="relu"),
             helper.make_node("GlobalAveragePool", ["r"], ["p"], name="pool"),
             helper.make_node("Flatten", ["p"], ["f"], name="flatten"),
             helper.make_node("Gemm", ["f", "fc_w"], ["y"], name="fc")]
    model = helper.make_model(helper.make_graph(
        nodes, "tiny", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 2])], [weight, *norm, fc]))
    path = tmp_path_factory.mktemp("graph") / "tiny.onnx"
    onnx.save(model, path)
    return path


@pytest.fixture(scope="module")
def analysis(graph: Path) -> WorkloadProfile:
    return analyze(graph, BATCH)


def _measurement(step: float | None = 0.004, **changes: Any) -> Measurement:
    values: dict[str, Any] = {c: None for c in COLUMNS}
    values.update(machine="m1", microarchitecture="x86_64", cores=2, peak_fp32_gflops=1.0, bandwidth_gbs=1.0,
                  model="tiny", task="inference", batch_size=BATCH, input_shapes="{}", flops=1.0, bytes=1.0,
                  forward_flops=1.0, parameters=1, nodes=6, op_class_flops="{}", op_class_bytes="{}",
                  runtime="onnxruntime", device="cpu", precision="fp32", params='{"graph_optimization":"all"}',
                  threads=2, status="ok" if step else "error", step_median_s=step, repeats=5, versions="{}",
                  measured_at="2026-01-01T00:00:00+00:00", protocol=2, launches=3, session="s1")
    values.update(changes)
    return Measurement(**values)


def _profile() -> Profile:
    """What a profiled launch of the tiny graph could report: a fused conv, the pool run twice, the Gemm with its
    Flatten, and a reorder that maps to no node."""
    conv = Kernel("FusedConv", "conv", ("conv", "bn", "relu"), ((BATCH, 3, 8, 8), (4, 3, 3, 3)),
                  '{"kernel_shape":[3,3],"pads":[1,1,1,1]}')
    pool = Kernel("GlobalAveragePool", "pooling", ("pool",), ((BATCH, 4, 8, 8),))
    gemm = Kernel("Gemm", "matmul", ("flatten", "fc"), ((BATCH, 4), (4, 2)), '{"transB":0}')
    reorder = Kernel("reorder", "data_movement", (), ((BATCH, 3, 8, 8),), "{}", flops=0.0, bytes=1536.0)
    return Profile("onnxruntime-profiler", 10, 0.005,
                   (KernelTime(conv, 0.003), KernelTime(pool, 0.0004, calls=2), KernelTime(gemm, 0.0002),
                    KernelTime(reorder, 0.0001)), unmapped_seconds=0.0007, notes=("test",))


def _labels(analysis: WorkloadProfile, **changes: Any) -> tuple[tuple[KernelRow, ...], Reconciliation]:
    return kernel_rows(_profile(), _measurement(**changes), analysis, measured_at="2026-01-02T00:00:00+00:00")


# --- a Profile as rows ---------------------------------------------------------------------------------------

def test_kernel_rows_take_flops_bytes_and_op_class_from_the_analysis(analysis: WorkloadProfile) -> None:
    ops = {op.name: op for op in analysis.ops}
    assert ops["conv"].flops > 0 and ops["fc"].flops > 0  # the analysis counted them
    rows, _ = _labels(analysis)
    conv, pool, gemm, reorder = (r.kernel for r in rows)
    assert conv.flops == sum(ops[n].flops for n in ("conv", "bn", "relu"))
    assert conv.bytes == sum(ops[n].bytes for n in ("conv", "bn", "relu"))
    assert (conv.op, conv.nodes) == ("conv", ("conv", "bn", "relu"))
    assert conv.attributes == _profile().kernels[0].kernel.attributes
    assert (pool.flops, pool.bytes) == (ops["pool"].flops / 2, ops["pool"].bytes / 2)  # per call
    assert gemm.op == "matmul" and gemm.flops == ops["flatten"].flops + ops["fc"].flops
    assert reorder == _profile().kernels[3].kernel  # no nodes: as the image reported it
    assert [(r.seconds, r.calls) for r in rows] == [(0.003, 1), (0.0004, 2), (0.0002, 1), (0.0001, 1)]
    for row in rows:
        assert (row.machine, row.runtime, row.device, row.threads, row.precision, row.model, row.batch_size,
                row.task, row.session, row.source) == ("m1", "onnxruntime", "cpu", 2, "fp32", "tiny", BATCH,
                                                       "inference", "s1", "onnxruntime-profiler")
        assert row.params == '{"graph_optimization":"all"}' and row.measured_at == "2026-01-02T00:00:00+00:00"


def test_kernel_rows_and_the_reconciliation_carry_the_measurements_machine_ceilings(
        analysis: WorkloadProfile) -> None:
    ceilings = dict(microarchitecture="sapphirerapids", cores=16, peak_fp32_gflops=51390.0,
                    peak_bf16_gflops=780670.0, bandwidth_gbs=3017.0, gpu="H100-SXM")
    rows, reconciliation = _labels(analysis, device="gpu", **ceilings)
    for row in (*rows, reconciliation):
        assert {c: getattr(row, c) for c in CEILINGS} == ceilings
    rows, reconciliation = _labels(analysis)  # a CPU row: no bf16 peak, no GPU
    assert {c: getattr(reconciliation, c) for c in CEILINGS} == dict(
        microarchitecture="x86_64", cores=2, peak_fp32_gflops=1.0, peak_bf16_gflops=None, bandwidth_gbs=1.0, gpu=None)


def test_the_reconciliation_sets_the_profiled_step_against_the_unprofiled_one(analysis: WorkloadProfile) -> None:
    rows, reconciliation = _labels(analysis)
    assert reconciliation.step_s == 0.004  # the Measurement's median, not the profiled launch's step
    assert reconciliation.profiled_step_s == 0.005
    assert reconciliation.kernel_s == pytest.approx(0.0037) == sum(r.seconds for r in rows)
    assert (reconciliation.unmapped_s, reconciliation.kernels) == (0.0007, 4)
    assert (reconciliation.machine, reconciliation.threads, reconciliation.task, reconciliation.source) == (
        "m1", 2, "inference", "onnxruntime-profiler")


def test_a_profile_that_does_not_match_its_graph_or_row_is_refused(analysis: WorkloadProfile) -> None:
    stray = Profile("x", 1, 0.001, (KernelTime(Kernel("Conv", "conv", ("conv_0",)), 0.001),))
    with pytest.raises(ValueError, match="covers 1 node.* the analysis of tiny does not have: conv_0"):
        kernel_rows(stray, _measurement(), analysis)
    with pytest.raises(ValueError, match="has no step time"):
        _labels(analysis, step=None)
    kernel = Kernel("reorder", "data_movement")
    broken = [(Profile("x", 1, 0.0, ()), "the profiled step took 0.0 s"),
              (Profile("x", 1, 0.001, (KernelTime(kernel, -1e-6),)), "negative or infinite time"),
              (Profile("x", 1, 0.001, (KernelTime(kernel, 1e-6, calls=0),)), "called less than once"),
              (Profile("x", 1, 0.001, (), unmapped_seconds=float("inf")), "negative or infinite time"),
              (Profile("x", 1, 0.001, (KernelTime(Kernel("k", "Conv"), 1e-6),)), "unknown op classes: Conv")]
    for bad, message in broken:
        with pytest.raises(ValueError, match=message):
            kernel_rows(bad, _measurement(), analysis)


# --- the perf store ------------------------------------------------------------------------------------------

def test_the_store_keeps_kernel_rows_and_reconciliations(tmp_path: Path, analysis: WorkloadProfile) -> None:
    rows, reconciliation = _labels(analysis)
    other_rows, other = _labels(analysis, threads=1)  # another configuration
    with PerfStore(tmp_path / "s.sqlite") as store:
        assert store.add_kernels(rows, [reconciliation]) == 4
        assert store.add_kernels(other_rows, [other]) == 4
    with PerfStore(tmp_path / "s.sqlite") as store:  # reopened: what was stored, as it was
        assert store.kernel_rows(threads=2) == list(rows)
        assert store.kernel_rows() == [*rows, *other_rows]
        assert store.reconciliations() == [reconciliation, other]
        assert [r.kernel.kind for r in store.kernel_rows(kind="FusedConv")] == ["FusedConv", "FusedConv"]
        assert store.reconciliations(threads=1) == [other]
        # A new profile of a configuration replaces its rows; the other configuration's stay.
        again = tuple(dataclasses.replace(r, seconds=r.seconds * 2) for r in rows[:2])
        store.add_kernels(again, [dataclasses.replace(reconciliation, profiled_step_s=0.006)])
        assert store.kernel_rows(threads=2) == list(again) and store.kernel_rows(threads=1) == list(other_rows)
        assert [r.profiled_step_s for r in store.reconciliations()] == [0.005, 0.006]
        with pytest.raises(ValueError, match="unknown columns"):
            store.kernel_rows(nosuch=1)


def test_a_store_without_the_kernel_tables_gains_them(tmp_path: Path, analysis: WorkloadProfile) -> None:
    path = tmp_path / "old.sqlite"
    PerfStore(path).close()
    with sqlite3.connect(path) as db:  # as a store of schema 2 is
        db.execute("DROP TABLE kernels")
        db.execute("DROP TABLE reconciliations")
        db.execute("UPDATE meta SET value = '2' WHERE key = 'schema_version'")
    rows, reconciliation = _labels(analysis)
    with PerfStore(path) as store:
        store.add_kernels(rows, [reconciliation])
        assert store.kernel_rows() == list(rows) and store.reconciliations() == [reconciliation]
    with sqlite3.connect(path) as db:
        assert db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone() == ("4",)


def test_a_store_of_schema_3_gains_the_ceilings_from_its_whole_model_rows(tmp_path: Path,
                                                                         analysis: WorkloadProfile) -> None:
    """Its kernel rows of a machine with a whole-model row take that machine's latest ceilings; a row of a machine
    without one is refused when read, naming its table, row and column."""
    path = tmp_path / "old.sqlite"
    rows, reconciliation = _labels(analysis)
    with PerfStore(path) as store:
        store.add([_measurement(cores=1, peak_fp32_gflops=0.5), _measurement(threads=1)])  # the later: m1's ceilings
        store.add_kernels(rows, [reconciliation])
    with sqlite3.connect(path) as db:  # as a store of schema 3 is: no ceilings in the label tables
        for table in ("kernels", "reconciliations"):
            for column in CEILINGS:
                db.execute(f"ALTER TABLE {table} DROP COLUMN {column}")
        db.execute("UPDATE meta SET value = '3' WHERE key = 'schema_version'")
    with PerfStore(path) as store:
        assert store.kernel_rows() == list(rows) and store.reconciliations() == [reconciliation]
    with sqlite3.connect(path) as db:
        assert db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone() == ("4",)
        for table in ("kernels", "reconciliations"):
            for column in CEILINGS:
                db.execute(f"ALTER TABLE {table} DROP COLUMN {column}")
        db.execute("UPDATE kernels SET machine = 'm9' WHERE rowid = 2")
    with PerfStore(path) as store, pytest.raises(InputError) as caught:
        store.kernel_rows()
    assert (caught.value.file, caught.value.field) == (str(path), "kernels[rowid 2].microarchitecture")
    assert caught.value.exit_code == EXIT_BAD_INPUT and "`modak bench --kernels`" in caught.value.message


# --- CSV -----------------------------------------------------------------------------------------------------

def test_csv_files_round_trip(tmp_path: Path, analysis: WorkloadProfile) -> None:
    rows, reconciliation = _labels(analysis)
    assert write_kernel_csv(tmp_path / "kernels-m1.csv", rows) == 4
    assert write_reconcile_csv(tmp_path / "reconcile-m1.csv", [reconciliation]) == 1
    with open(tmp_path / "kernels-m1.csv", newline="") as handle:
        header = next(csv.reader(handle))
    assert tuple(header) == KERNEL_COLUMNS and header[14:21] == ["kind", "op", "nodes", "shapes", "attributes",
                                                                "flops", "bytes"]
    assert read_kernel_csv(tmp_path / "kernels-m1.csv") == list(rows)
    assert read_reconcile_csv(tmp_path / "reconcile-m1.csv") == [reconciliation]
    assert read_labels_csv(tmp_path / "reconcile-m1.csv") == ([], [reconciliation])
    assert read_labels_csv(tmp_path / "kernels-m1.csv") == (list(rows), [])
    assert is_label_csv(tmp_path / "kernels-m1.csv") and is_label_csv(tmp_path / "reconcile-m1.csv")
    assert not is_label_csv(ROOT / "perfmodels" / "cpu-ci-zen3-2c.csv")
    odd = dataclasses.replace(rows[0], source='a "quoted",\r\nline', kernel=dataclasses.replace(
        rows[0].kernel, nodes=("n,1", 'n"2'), attributes='{"layout":"a,b"}'))
    write_kernel_csv(tmp_path / "kernels-odd.csv", [odd])
    assert read_kernel_csv(tmp_path / "kernels-odd.csv") == [odd]


def _damage(path: Path, line: int, column: str, value: str | None) -> None:
    """Set ``column`` of CSV line ``line`` (1: the header) to ``value``; ``None`` drops the column."""
    with open(path, newline="") as handle:
        records = list(csv.reader(handle))
    index = records[0].index(column)
    if value is None:
        records = [r[:index] + r[index + 1:] for r in records]
    else:
        records[line - 1][index] = value
    with open(path, "w", newline="") as handle:
        csv.writer(handle, lineterminator="\n", quoting=csv.QUOTE_ALL).writerows(records)


DAMAGE = [  # file, line, column, value, what the error says
    ("kernels", 1, "seconds", None, "missing column seconds"),
    ("kernels", 3, "flops", "many", "expected a number, got 'many'"),
    ("kernels", 2, "seconds", "-0.001", "a time cannot be negative, got '-0.001'"),
    ("kernels", 4, "calls", "1.5", "expected an integer, got '1.5'"),
    ("kernels", 2, "nodes", '["conv", "bn"', "expected JSON, got"),
    ("kernels", 2, "shapes", '[["2", 3]]', "expected JSON of a list of shapes"),
    ("kernels", 5, "op", "Conv", "unknown op class 'Conv'; did you mean 'conv'?"),
    ("kernels", 2, "bytes", "nan", "expected a finite number"),
    ("reconcile", 1, "profiled_step_s", None, "missing column profiled_step_s"),
    ("reconcile", 2, "kernel_s", "-1e-3", "a time cannot be negative"),
    ("reconcile", 2, "step_s", "0", "expected a positive number of seconds"),
    ("reconcile", 2, "params", "[1]", "expected JSON of an object"),
    ("kernels", 3, "cores", "0", "expected at least 1, got '0'"),
    ("kernels", 2, "microarchitecture", "", "expected a value"),
    ("reconcile", 2, "bandwidth_gbs", "0", "expected a positive ceiling, got '0'"),
    ("reconcile", 2, "peak_bf16_gflops", "-5", "expected a positive ceiling"),
]


@pytest.mark.parametrize(("kind", "line", "column", "value", "message"), DAMAGE,
                         ids=[f"{d[0]}-{d[2]}-{d[3]}" for d in DAMAGE])
def test_a_damaged_file_is_refused_with_its_location(tmp_path: Path, analysis: WorkloadProfile,
                                                     capsys: pytest.CaptureFixture[str], kind: str, line: int,
                                                     column: str, value: str | None, message: str) -> None:
    rows, reconciliation = _labels(analysis)
    good, path = tmp_path / "kernels-m1.csv", tmp_path / f"{kind}-m2.csv"
    write_kernel_csv(good, rows)
    write_reconcile_csv(path, [reconciliation]) if kind == "reconcile" else write_kernel_csv(path, rows)
    _damage(path, line, column, value)
    reader = read_reconcile_csv if kind == "reconcile" else read_kernel_csv
    with pytest.raises(InputError) as caught:
        reader(path)
    assert (caught.value.file, caught.value.line, caught.value.field) == (str(path), line, column)
    assert message in caught.value.message
    store = tmp_path / "s.sqlite"
    capsys.readouterr()
    assert main(["kernels", "import", str(good), str(path), "--store", str(store)]) == EXIT_BAD_INPUT
    assert capsys.readouterr().err == f"modak: error: {path}:{line}: {column}: {caught.value.message}\n"
    with PerfStore(store) as perf:  # all files or none
        assert perf.kernel_rows() == [] and perf.reconciliations() == []


def test_a_file_that_is_no_kernel_table_is_refused_with_its_location(tmp_path: Path, analysis: WorkloadProfile,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    import modak.measurements.kernels as kernels

    rows, _ = _labels(analysis)
    path = tmp_path / "kernels-m1.csv"
    write_kernel_csv(path, rows)
    lines = path.read_text().splitlines()
    path.write_text("\n".join([*lines[:2], lines[2].rpartition(",")[0], *lines[3:]]) + "\n")  # a short line 3
    with pytest.raises(InputError, match=f"^{path}:3: task: fewer fields than columns$"):
        read_kernel_csv(path)
    path.write_text(lines[0] + "\n" + "x" * 200_000 + "\n")
    with pytest.raises(InputError, match=f"^{path}:2: not a CSV file of kernel rows: field larger than"):
        read_kernel_csv(path)
    path.write_text("")
    with pytest.raises(InputError, match=f"^{path}:1: machine: not a CSV file of kernel rows: missing columns "
                                         "machine, microarchitecture, cores, "):
        read_labels_csv(path)
    with pytest.raises(InputError, match=f"^{tmp_path / 'none.csv'}: file not found$"):
        read_labels_csv(tmp_path / "none.csv")
    path.write_text(lines[0] + "\n")
    assert read_kernel_csv(path) == []
    monkeypatch.setattr(kernels, "MAX_CSV_BYTES", 10)
    with pytest.raises(InputError, match=f"^{path}: the CSV file is .* bytes, more than the limit of 10 bytes"):
        read_kernel_csv(path)


@settings(max_examples=100)
@given(column=st.sampled_from(KERNEL_COLUMNS), text=st.text(max_size=30))
def test_any_field_reads_or_is_refused_at_its_location(tmp_path_factory: pytest.TempPathFactory,
                                                       analysis: WorkloadProfile, column: str, text: str) -> None:
    rows, _ = _labels(analysis)
    path = tmp_path_factory.mktemp("fuzz") / "kernels-m1.csv"
    write_kernel_csv(path, rows[:1])
    _damage(path, 2, column, text)
    try:
        (row,) = read_kernel_csv(path)
    except InputError as exc:
        assert (exc.file, exc.field) == (str(path), column) and exc.line in (2, 3)  # 3: a quote left open
    else:
        read = kernel_record(row)[column]
        if column in ("nodes", "shapes"):
            assert json.loads(read) == json.loads(text)
        elif read is None:
            assert column in OPTIONAL and text == ""
        else:
            assert read == {"INTEGER": int, "REAL": float, "TEXT": str}[column_type(column)](text)


def test_the_modak_command_imports_and_exports_kernel_files(tmp_path: Path, analysis: WorkloadProfile) -> None:
    rows, reconciliation = _labels(analysis)
    other_rows, other = _labels(analysis, machine="m2")
    write_kernel_csv(tmp_path / "kernels-a.csv", [*rows, *other_rows])
    write_reconcile_csv(tmp_path / "reconcile-a.csv", [reconciliation, other])
    store = tmp_path / "s.sqlite"

    def modak(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "modak", *args], capture_output=True, text=True, cwd=ROOT)

    done = modak("kernels", "import", str(tmp_path / "kernels-a.csv"), str(tmp_path / "reconcile-a.csv"),
                 "--store", str(store))
    assert done.returncode == 0, done.stderr
    assert f"read 8 rows from {tmp_path / 'kernels-a.csv'}" in done.stdout
    done = modak("kernels", "export", "-o", str(tmp_path / "out"), "--store", str(store))
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        "kernels-m1.csv", "kernels-m2.csv", "reconcile-m1.csv", "reconcile-m2.csv"]
    assert read_kernel_csv(tmp_path / "out" / "kernels-m2.csv") == list(other_rows)
    assert read_reconcile_csv(tmp_path / "out" / "reconcile-m1.csv") == [reconciliation]
    # A damaged file: exit 2, one located line, no traceback.
    _damage(tmp_path / "kernels-a.csv", 3, "seconds", "-1")
    done = modak("kernels", "import", str(tmp_path / "kernels-a.csv"), "--store", str(tmp_path / "t.sqlite"))
    assert done.returncode == EXIT_BAD_INPUT
    assert done.stderr == (f"modak: error: {tmp_path / 'kernels-a.csv'}:3: seconds: a time cannot be negative, "
                           "got '-1'\n")
    done = modak("kernels", "export", "-o", str(tmp_path / "none"), "--store", str(tmp_path / "t.sqlite"))
    assert done.returncode == EXIT_BAD_INPUT and "no kernel rows" in done.stderr


def test_the_shipped_measurement_files_leave_kernel_files_out() -> None:
    from modak.predict.training import shipped_files

    assert shipped_files() and not any(is_label_csv(p) for p in shipped_files())


def test_the_shipped_kernel_files_read() -> None:
    for path in (ROOT / "perfmodels").glob("*.csv"):
        if is_label_csv(path):
            kernels, reconciled = read_labels_csv(path)
            assert kernels or reconciled, path


# --- modak bench --kernels -----------------------------------------------------------------------------------

def test_a_profiled_launch_is_stored_against_its_timed_row(tmp_path: Path) -> None:
    """The bench's side of a profiled launch, from the report a real Profile makes (what `measure --profile`
    prints), on the CNN example's plan and the analysis of its graph."""
    from modak.api import load
    from modak.bench.harness import measurement_row, store_profile
    from modak.plan import make_plan
    from modak.predict.roofline import RooflinePredictor
    from modak.workload.source import load_analysis

    loaded = load(CNN)
    plan = make_plan(loaded, *load_analysis(loaded), RooflinePredictor())  # the ranking does not matter here
    candidate = next(r.candidate for r in plan.ranked if r.candidate.runtime == "onnxruntime")
    row = dataclasses.replace(measurement_row(plan, candidate, {"status": "ok", "step_median_s": 0.002}),
                              session="s9")
    first, second = plan.workload.ops[:2]
    profile = Profile("onnxruntime-profiler", 10, 0.0025,
                      (KernelTime(Kernel("FusedConv", "conv", (first.name, second.name), ((1, 1, 28, 28),)), 0.001),),
                      unmapped_seconds=0.0002)
    report = {"status": "ok", "threads": row.threads, "profile": dataclasses.asdict(profile)}
    with PerfStore(tmp_path / "s.sqlite") as store:
        done = store_profile(store, plan, candidate, row, json.loads(json.dumps(report)))
        assert done == {"status": "ok", "kernels": 1, "kernel_s": 0.001, "unmapped_s": 0.0002,
                        "profiled_step_s": 0.0025, "step_s": 0.002}
        (stored,) = store.kernel_rows()
        assert stored.kernel.flops == first.flops + second.flops > 0 and stored.model == row.model
        assert store.reconciliations()[0].step_s == 0.002 and store.rows() == []  # the timed row is not touched
        failed = store_profile(store, plan, candidate, row, {"status": "error",
                                                             "error": "runtime pytorch reports no profile"})
        assert failed == {"status": "error", "error": "runtime pytorch reports no profile"}
        broken = store_profile(store, plan, candidate, row, {"status": "ok", "profile": {"source": "x"}})
        assert broken["status"] == "error" and "KeyError" in broken["error"]
        empty = dataclasses.replace(profile, kernels=())  # a graph the runtime folded away: nothing to learn from
        nothing = store_profile(store, plan, candidate, row, {"status": "ok", "profile": dataclasses.asdict(empty)})
        assert nothing == {"status": "error", "error": "its profile reports no kernel"}
        assert len(store.kernel_rows()) == 1 and len(store.reconciliations()) == 1


def test_an_inflated_profiled_launch_is_launched_again_and_the_least_inflated_kept(tmp_path: Path) -> None:
    """A profiled step well past the timed median ran beside other work: it is launched again (up to
    PROFILE_TRIES launches), and the fastest launch's kernels are stored; one within the allowance is not."""
    from modak.api import load
    from modak.bench.harness import (
        PROFILE_ALLOWANCE_S,
        PROFILE_INFLATION,
        PROFILE_TRIES,
        BenchSettings,
        Session,
        inflated,
        measurement_row,
    )
    from modak.plan import make_plan
    from modak.predict.roofline import RooflinePredictor
    from modak.workload.source import load_analysis

    loaded = load(CNN)
    plan = make_plan(loaded, *load_analysis(loaded), RooflinePredictor())
    quiet, busy, failing = [r.candidate for r in plan.ranked if r.candidate.runtime == "onnxruntime"][:3]
    op = plan.workload.ops[0].name

    def report(step: float, kernel: float) -> dict:
        timed = KernelTime(Kernel("FusedConv", "conv", (op,), ()), kernel)
        profile = Profile("onnxruntime-profiler", 10, step, (timed,))
        return {"status": "ok", "profile": dataclasses.asdict(profile)}

    step = 0.002
    edge = PROFILE_INFLATION * step + PROFILE_ALLOWANCE_S
    launches = {quiet.name: [report(edge * 0.99, 0.001)],
                busy.name: [report(3 * step, 0.003), report(2 * step, 0.002), report(5 * step, 0.005)],
                failing.name: [{"status": "error", "error": "boom"}]}
    seen: list[str] = []

    class Scripted:
        def run(self, tasks: list) -> list[dict]:
            seen.extend(t.name for t in tasks)
            return [launches[t.name].pop(0) for t in tasks]

    rows = {c.name: measurement_row(plan, c, {"status": "ok", "step_median_s": step}) for c in (quiet, busy, failing)}
    with PerfStore(tmp_path / "s.sqlite") as store, \
            Session(plan, store, BenchSettings(kernel_steps=10), Scripted(), tmp_path / "work") as session:
        done = session.profile([quiet, busy, failing], rows)
        assert sorted(seen) == sorted([quiet.name, failing.name, *[busy.name] * PROFILE_TRIES])
        assert done[busy.name]["profiled_step_s"] == 2 * step and done[busy.name]["kernel_s"] == 0.002
        assert done[quiet.name]["profiled_step_s"] == edge * 0.99 and done[failing.name]["status"] == "error"
        assert sorted(r.profiled_step_s for r in store.reconciliations()) == [edge * 0.99, 2 * step]
    assert inflated(report(edge * 1.01, 0.001), step) and not inflated(report(edge * 0.99, 0.001), step)
    assert not inflated({"status": "error"}, step) and not inflated(report(1.0, 0.001), None)


@pytest.mark.slow
def test_bench_kernels_profiles_after_the_timed_rounds(tmp_path: Path) -> None:
    store = tmp_path / "perf.sqlite"
    for _ in range(3):  # a launch this VM contended is stored so and not profiled: measured again, as bench advises
        store.unlink(missing_ok=True)
        done = subprocess.run([sys.executable, "-m", "modak", "bench", str(CNN), "--candidates", "top-1", "--launches",
                               "2", "--min-seconds", "0.2", "--budget", "0.5", "--store", str(store), "--kernels"],
                              capture_output=True, text=True, cwd=ROOT)
        assert done.returncode == 0, done.stderr
        with PerfStore(store) as perf:
            if any(row.status == "ok" for row in perf.rows()):
                break
    assert "kernel rows" in " ".join(done.stderr.split()), done.stderr  # rich wraps lines at the pipe's 80 columns
    with PerfStore(store) as perf:
        rows, kernels, reconciled = perf.rows(), perf.kernel_rows(), perf.reconciliations()
    assert rows and kernels and len(reconciled) == sum(r.status == "ok" for r in rows)
    for reconciliation in reconciled:
        key = (reconciliation.runtime, reconciliation.params, reconciliation.threads)
        (row,) = [r for r in rows if (r.runtime, r.params, r.threads) == key]
        assert reconciliation.step_s == row.step_median_s  # the profiled launch's step never enters the row
        assert row.launches == 2 and reconciliation.session == row.session
    assert any(k.kernel.flops > 0 for k in kernels)
