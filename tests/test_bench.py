"""modak bench writes measured rows to the store; the store round-trips through CSV; probe writes a Target."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from modak.measurements.store import PerfStore, read_csv
from modak.spec.loader import load_spec
from modak.spec.target import Target
from tests.support.signals import sigint_default

ROOT = Path(__file__).resolve().parents[1]
CNN = ROOT / "examples" / "mnist-cnn-cpu" / "job.yaml"


def modak(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "modak", *args], capture_output=True, text=True, env=env)


@pytest.mark.slow
def test_bench_on_the_cnn_example_writes_rows(tmp_path: Path) -> None:
    store = tmp_path / "perf.sqlite"
    result = modak("bench", str(CNN), "--candidates", "onnxruntime", "--launches", "2", "--min-seconds", "0.2",
                   "--budget", "0.5", "--store", str(store), "--json")
    assert result.returncode == 0, result.stderr
    printed = json.loads(result.stdout)
    with PerfStore(store) as perf:
        rows = perf.rows(model="mnist_cnn")
    assert len(rows) == len(printed) >= 2
    assert {r.runtime for r in rows} == {"onnxruntime"}
    # measured and checked; "contended": this VM drew steal time or moved the vCPUs apart (flagged, kept)
    assert all(r.status in ("ok", "contended") for r in rows), [(r.params, r.status, r.error, r.contention)
                                                                for r in rows]
    for row in rows:
        assert row.step_p10_s <= row.step_median_s <= row.step_p90_s and row.repeats >= 3
        assert row.flops > 0 and row.peak_fp32_gflops == 451.6 and row.max_abs_error < 1e-3
        assert json.loads(row.versions)["onnxruntime"] and row.compile_s >= 0 and row.peak_rss_mb > 0
        assert json.loads(row.op_class_flops)["conv"] > 0
    # A second run of the same configuration replaces its row instead of adding one.
    again = modak("bench", str(CNN), "--candidates", "top-1", "--launches", "1", "--min-seconds", "0.1",
                  "--budget", "0.2", "--store", str(store))
    assert again.returncode == 0, again.stderr
    with PerfStore(store) as perf:
        assert len(perf.rows()) <= len(rows) + 1


@pytest.mark.slow
def test_bench_rejects_unknown_candidate(tmp_path: Path) -> None:
    result = modak("bench", str(CNN), "--candidates", "nosuchruntime", "--store", str(tmp_path / "s.sqlite"))
    assert result.returncode == 2 and "no candidate named 'nosuchruntime'" in result.stderr


def test_store_csv_round_trip(tmp_path: Path) -> None:
    from modak.api import load as load_job
    from modak.bench.harness import measurement_row
    from modak.plan import make_plan
    from modak.workload.source import load_analysis

    loaded = load_job(CNN)
    plan = make_plan(loaded, *load_analysis(loaded))
    ok = measurement_row(plan, plan.choice.candidate, {"status": "ok", "step_median_s": 0.002, "repeats": 5})
    failed = replace(measurement_row(plan, plan.ranked[1].candidate, {"status": "error", "error": 'a "quoted",\nline'}))
    with PerfStore(tmp_path / "a.sqlite") as store:
        store.add([ok, failed])
        assert store.export_csv(tmp_path / "rows.csv") == 2
    assert list(read_csv(tmp_path / "rows.csv")) == [ok, failed]
    with PerfStore(tmp_path / "b.sqlite") as other:
        assert other.import_csv(tmp_path / "rows.csv") == 2
        assert other.rows(status="error")[0].error == 'a "quoted",\nline'


@pytest.mark.slow
def test_probe_writes_a_target_the_planner_accepts(tmp_path: Path) -> None:
    out = tmp_path / "target.yaml"
    env = {**os.environ, "MODAK_CACHE": str(tmp_path / "cache")}  # the probe also replaces the host's cached probe
    result = modak("probe", "-o", str(out), "--quick", "--name", "probe-test", env=env)
    assert result.returncode == 0, result.stderr
    target, _ = load_spec(out, Target)
    assert target.cpu.peaks.fp32_gflops > 1 and target.cpu.peaks.memory_bandwidth_gbs > 0.5
    assert "GEMM fp32 GFLOP/s by threads" in out.read_text()
    job = yaml.safe_load(CNN.read_text())
    job.pop("target")
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(job))
    plan = modak("plan", str(tmp_path / "job.yaml"), "--target", str(out), "--json", env=env)
    assert plan.returncode == 0, plan.stderr
    assert json.loads(plan.stdout)["target"] == "probe-test"


@pytest.mark.slow
def test_ctrl_c_keeps_what_was_measured(tmp_path: Path) -> None:
    """SIGINT during a bench run: exit 130, and every round measured before it stays in the store (rows are
    stored after each round, so the interrupt comes in the second)."""
    import signal
    import time

    store = tmp_path / "perf.sqlite"
    # The ONNX Runtime candidates only: a round of them takes seconds (all candidates include TVM tuning, minutes).
    process = subprocess.Popen([sys.executable, "-m", "modak", "bench", str(CNN), "--candidates", "onnxruntime",
                                "--launches", "3", "--min-seconds", "0.1", "--budget", "0.3", "--store", str(store)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=sigint_default)
    try:
        deadline = time.monotonic() + 240
        measured = 0
        while time.monotonic() < deadline and process.poll() is None:
            if store.exists():
                with PerfStore(store) as perf:
                    measured = len(perf.rows())
                if measured >= 1:
                    break
            time.sleep(0.5)
        assert measured >= 1 and process.poll() is None, "bench finished or measured nothing before the interrupt"
        process.send_signal(signal.SIGINT)
        _, stderr = process.communicate(timeout=120)
    finally:  # never leave a bench running into the next tests
        process.kill()
        process.wait()
    assert process.returncode == 130, stderr
    assert "interrupted" in stderr and "Traceback" not in stderr
    with PerfStore(store) as perf:
        kept = perf.rows()
    # Whole rows only; "contended": a launch of this VM drew steal time from the hypervisor (flagged, kept).
    assert len(kept) >= measured and all(r.status in ("ok", "error", "contended") for r in kept)


def test_a_store_of_schema_1_gains_the_protocol_columns(tmp_path: Path) -> None:
    """A perf store written before the measurement protocol opens with its rows intact and the new columns."""
    import sqlite3

    from modak.measurements.store import COLUMNS

    old_columns = COLUMNS[:COLUMNS.index("measured_at") + 1]
    path = tmp_path / "old.sqlite"
    db = sqlite3.connect(path)
    db.execute(f"CREATE TABLE measurements ({', '.join(old_columns)})")
    values = ["m", "x86_64", 2, 1.0, None, 1.0, None, "mlp", "inference", 1, "{}", 1.0, 1.0, 1.0, 1, 1, "{}", "{}",
              "onnxruntime", "cpu", "fp32", "{}", 2, "ok", 0.001, 0.001, 0.001, 10, 1000.0, 0.1, 100.0, 0.0, None,
              "{}", "2026-01-01T00:00:00+00:00"]
    db.execute(f"INSERT INTO measurements VALUES ({', '.join('?' for _ in old_columns)})", values)
    db.commit()
    db.close()
    with PerfStore(path) as perf:
        (row,) = perf.rows()
    assert row.protocol == 1 and row.launches == 1 and row.launch_medians is None and row.step_median_s == 0.001


def test_intervals_and_paired_ratios() -> None:
    from modak.measurements.stats import median_interval, ratio

    center, low, high = median_interval([1.0, 1.1, 0.9])
    assert center == 1.0 and low < 0.95 and high > 1.05
    assert median_interval([2.0]) == (2.0, 2.0, 2.0)
    # B is 20% slower than A in every round while the rounds drift by 2x: pairing cancels the drift.
    a = [1.0, 2.0, 1.5, 0.8]
    b = [x * 1.2 for x in a]
    paired = ratio(b, a)
    assert abs(paired.estimate - 1.2) < 1e-9 and paired.slower() and not paired.equivalent()
    unpaired = ratio(b, a, paired=False)
    assert unpaired.low < 1.0 < unpaired.high  # the drift hides the difference without pairing


def _running(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie waiting to be reaped does not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return False
    return state != "Z"


@pytest.mark.parametrize("ending", ["returns", "times out"])
def test_a_launch_ends_with_everything_it_started(tmp_path: Path, ending: str) -> None:
    """A launch's worker processes (a compiler's pool) do not outlive it to run beside the next launch."""
    import time

    from modak.bench.dispatch import LaunchTask, run_task

    pid_file = tmp_path / "worker.pid"
    code = ("import json, subprocess, sys, time\n"
            "worker = subprocess.Popen([sys.executable, '-c', 'while True: pass'], stdout=subprocess.DEVNULL,"
            " stderr=subprocess.DEVNULL)\n"
            f"open({str(pid_file)!r}, 'w').write(str(worker.pid))\n"
            + ("print(json.dumps({'status': 'ok'}))\n" if ending == "returns" else "time.sleep(60)\n"))
    result = run_task(LaunchTask("spawns", {}, (sys.executable, "-c", code), 3, tmp_path))
    assert result["status"] == ("ok" if ending == "returns" else "error"), result
    worker = int(pid_file.read_text())
    deadline = time.monotonic() + 5
    while _running(worker) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _running(worker), f"the launch's worker {worker} is still running"
