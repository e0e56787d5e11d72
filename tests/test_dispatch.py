"""ArrayDispatcher on this machine's real Slurm: a round's launches as a job array, results collected in order,
failed and timed-out tasks submitted once more and then reported; and a bench session measuring through it."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from modak.bench.dispatch import ArrayDispatcher, LaunchTask
from modak.errors import InputError
from modak.schedulers import scheduler

pytestmark = [pytest.mark.slurm,
              pytest.mark.skipif(shutil.which("sbatch") is None, reason="sbatch not on PATH (needs a Slurm cluster)")]

ROOT = Path(__file__).resolve().parents[1]
CNN = ROOT / "examples" / "mnist-cnn-cpu" / "job.yaml"
SLURM = scheduler("slurm")
REPORT = 'import json, os; print("log line"); print(json.dumps({"status": "ok", "name": os.environ["MODAK_NAME"]}))'


def _task(tmp_path: Path, name: str, code: str, timeout_s: float = 60) -> LaunchTask:
    folder = tmp_path / name
    folder.mkdir()
    return LaunchTask(name, {"MODAK_NAME": name}, (sys.executable, "-c", code), timeout_s, folder)


def _arrays(tmp_path: Path) -> list[int]:
    """How many tasks each submitted array had, in submission order."""
    rounds = sorted(tmp_path.glob("slurm-round-*"), key=lambda p: p.stat().st_mtime)
    return [len([spec for spec in r.glob("*.json") if spec.stem.isdigit()]) for r in rounds]


def test_results_come_back_in_order(tmp_path: Path) -> None:
    tasks = [_task(tmp_path, name, REPORT) for name in ("first", "second")]
    results = ArrayDispatcher(SLURM, poll_s=0.2).run(tasks)
    assert [(r["status"], r["name"]) for r in results] == [("ok", "first"), ("ok", "second")]
    assert _arrays(tmp_path) == [2]


def test_a_failing_task_is_submitted_again_then_reported(tmp_path: Path) -> None:
    tasks = [_task(tmp_path, "fails", "import sys; sys.exit(1)"), _task(tmp_path, "works", REPORT)]
    failed, worked = ArrayDispatcher(SLURM, poll_s=0.2).run(tasks)
    assert worked == {"status": "ok", "name": "works"}
    assert failed["status"] == "error" and "failed twice" in failed["error"] and "exited with 1" in failed["error"]
    assert _arrays(tmp_path) == [2, 1]


def test_a_task_past_its_timeout_is_reported(tmp_path: Path) -> None:
    task = _task(tmp_path, "sleeps", "import time; time.sleep(30)", timeout_s=1)
    [result] = ArrayDispatcher(SLURM, poll_s=0.2).run([task])
    assert result["status"] == "error" and "timed out after 1 s" in result["error"]


def test_submission_errors_name_the_command(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tasks = [_task(tmp_path, "any", REPORT)]
    with pytest.raises(InputError, match=r"sbatch --parsable --partition=nosuchpartition .*: sbatch: error"):
        ArrayDispatcher(SLURM, extra=["--partition=nosuchpartition"]).run(tasks)
    monkeypatch.setenv("PATH", "")
    with pytest.raises(InputError, match="sbatch not found on PATH"):
        ArrayDispatcher(SLURM).run(tasks)


def test_bench_measures_through_slurm(tmp_path: Path) -> None:
    from modak.api import load as load_job
    from modak.bench.harness import BenchSettings, bench, select_candidates
    from modak.measurements.store import PerfStore
    from modak.plan import make_plan
    from modak.workload.source import load_analysis

    loaded = load_job(CNN)
    plan = make_plan(loaded, *load_analysis(loaded))
    candidates = select_candidates(plan, ["onnxruntime"])[:2]
    settings = BenchSettings(launches=1, min_seconds=0.2, budget_s=1, retries=0)
    with PerfStore(tmp_path / "perf.sqlite") as store:
        rows = bench(plan, candidates, store, settings, dispatcher=ArrayDispatcher(SLURM, poll_s=0.2))
        stored = store.rows(model="mnist_cnn")
    assert len(rows) == len(stored) == 2
    for row in rows:
        assert row.status in ("ok", "contended") and row.step_median_s > 0 and row.launches == 1


def test_an_array_past_its_deadline_is_cancelled(tmp_path: Path) -> None:
    dispatcher = ArrayDispatcher(SLURM, time_limit_s=2, poll_s=0.2, requeue=0)
    dispatcher.MARGIN_S = 0  # the deadline: the task's 2 s, not a scheduling margin
    [result] = dispatcher.run([_task(tmp_path, "hangs", "import time; time.sleep(60)", timeout_s=60)])
    assert result["status"] == "error" and "did not end within 2 s" in result["error"], result
    job = result["error"].split()[2].split("_")[0]
    assert subprocess.run(["squeue", "-h", "-j", job], capture_output=True, text=True).stdout.strip() == ""
