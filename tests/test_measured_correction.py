"""The kernel model's predictions of a job corrected by the job's own runs measured on its target (#40): the
arithmetic of the factors, and the plan that uses them and says so."""

from __future__ import annotations

import math
import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from modak import api
from modak.bench.harness import EACH_RUNTIME, measurement_row, select_candidates
from modak.candidates.enumerate import Candidate
from modak.measurements.store import PerfStore
from modak.predict.base import Prediction
from modak.predict.kernel_names import PREDICTOR
from modak.predict.measured import CORRECTION_TERM, corrected, corrections
from modak.spec.models import Precision

ROOT = Path(__file__).resolve().parents[1]
CNN = ROOT / "examples" / "mnist-cnn-cpu" / "job.yaml"


@pytest.fixture(scope="module")
def plan(tmp_path_factory):
    return api.plan_job(CNN, store=tmp_path_factory.mktemp("empty") / "perf.sqlite")


def prediction(step_s: float, predictor: str = PREDICTOR) -> Prediction:
    return Prediction(step_s, step_s * 0.8, step_s * 1.3, 0.0, (("compute_s", step_s),), "compute", predictor)


def test_factors_by_runtime_and_precision_else_by_runtime(plan) -> None:
    ort = Candidate("onnxruntime", "cpu", Precision.fp32, (("threads", "all"),), 4)
    ort_half = replace(ort, params=(("threads", "half"),), threads=2)
    ort_bf16 = replace(ort, precision=Precision.bf16)
    ov = Candidate("openvino", "cpu", Precision.fp32, (), 4)
    forest = Candidate("pytorch", "cpu", Precision.fp32, (), 4)
    candidates = [ort, ort_half, ort_bf16, ov, forest]
    predictions = [prediction(1.0), prediction(2.0), prediction(0.5), prediction(3.0), prediction(4.0, "learned")]
    measured = [measurement_row(plan, ort, {"status": "ok", "step_median_s": 1.5, "repeats": 5}),
                measurement_row(plan, ort_half, {"status": "ok", "step_median_s": 2.4, "repeats": 5}),
                measurement_row(plan, ov, {"status": "incorrect", "step_median_s": 9.0, "repeats": 5}),
                measurement_row(plan, forest, {"status": "ok", "step_median_s": 8.0, "repeats": 5})]
    factors = corrections(candidates, predictions, measured)
    both = math.sqrt(1.5 * 1.2)  # the geometric mean of 1.5 / 1.0 and 2.4 / 2.0
    assert factors == {("onnxruntime", "cpu", "fp32"): (pytest.approx(both), 2),
                       ("onnxruntime", "cpu"): (pytest.approx(both), 2)}
    ort_a, ort_b, bf16, ov_p, forest_p = corrected(candidates, predictions, factors)
    assert ort_a.step_seconds == pytest.approx(both) and ort_b.step_seconds == pytest.approx(2 * both)
    assert (ort_a.low_seconds, ort_a.high_seconds) == (pytest.approx(0.8 * both), pytest.approx(1.3 * both))
    assert dict(ort_a.terms)[CORRECTION_TERM] == pytest.approx(both) and ort_a.predictor == PREDICTOR
    assert bf16.step_seconds == pytest.approx(0.5 * both)  # no bf16 run: the runtime's factor
    assert ov_p == predictions[3]  # its only row failed the reference check
    assert forest_p == predictions[4]  # the forest learns the store's rows itself
    assert corrected(candidates, predictions, {}) == predictions


def test_a_step_corrected_by_its_own_precisions_runs_takes_the_interval_calibrated_for_it(plan) -> None:
    ort = Candidate("onnxruntime", "cpu", Precision.fp32, (("threads", "all"),), 4)
    ort_half = replace(ort, params=(("threads", "half"),), threads=2)
    ort_bf16 = replace(ort, precision=Precision.bf16)
    predictions = [replace(prediction(step), run_spread=(0.9, 1.1)) for step in (1.0, 2.0, 0.5)]
    measured = [measurement_row(plan, ort, {"status": "ok", "step_median_s": 1.5, "repeats": 5})]
    _, half, bf16 = corrected([ort, ort_half, ort_bf16], predictions,
                              corrections([ort, ort_half, ort_bf16], predictions, measured))
    assert (half.step_seconds, half.low_seconds, half.high_seconds) == pytest.approx((3.0, 2.7, 3.3))
    # bf16 has no run of its own: the runtime's factor, and its interval scaled (0.8x and 1.3x of 0.75 s)
    assert (bf16.step_seconds, bf16.low_seconds, bf16.high_seconds) == pytest.approx((0.75, 0.6, 0.975))


def test_the_plan_corrects_the_kernel_model_by_the_runs_measured_here_and_says_so(plan, tmp_path) -> None:
    kernel = [r for r in plan.ranked if r.prediction.predictor.startswith(PREDICTOR)]
    measured = kernel[0]
    same = [r for r in kernel[1:] if (r.candidate.runtime, r.candidate.precision)
            == (measured.candidate.runtime, measured.candidate.precision)]
    other = [r for r in kernel if r.candidate.runtime != measured.candidate.runtime]
    assert same and other
    store = tmp_path / "perf.sqlite"
    step = 3 * measured.prediction.step_seconds
    with PerfStore(store) as perf:
        perf.add([measurement_row(plan, measured.candidate, {"status": "ok", "step_median_s": step, "repeats": 5})])
        elsewhere = replace(measurement_row(plan, other[0].candidate, {"status": "ok", "step_median_s": 1.0,
                                                                       "repeats": 5}), machine="another-machine")
        perf.add([elsewhere])  # another target's run corrects nothing here
    replanned = api.plan_job(CNN, store=store)
    after = {r.candidate: r.prediction for r in replanned.ranked}
    assert after[measured.candidate].step_seconds == pytest.approx(step)
    for r in same:
        step = 3 * r.prediction.step_seconds
        assert after[r.candidate].step_seconds == pytest.approx(step)
        # The interval calibrated for steps corrected by a run of their own precision (PyTorch has none: scaled).
        low, high = r.prediction.run_spread or (r.prediction.low_seconds / r.prediction.step_seconds,
                                                r.prediction.high_seconds / r.prediction.step_seconds)
        assert (after[r.candidate].low_seconds, after[r.candidate].high_seconds) == pytest.approx(
            (step * low, step * high))
    assert any(r.prediction.run_spread for r in same) == (measured.candidate.runtime != "pytorch")
    for r in other:  # (the forest's predictions change: it learns the store's rows)
        assert after[r.candidate] == r.prediction
    line = next(r for r in replanned.reasons if r.startswith("the kernel model's predictions were corrected"))
    assert f"{measured.candidate.runtime}/{measured.candidate.precision.value} x3.00 (1 run)" in line
    assert f"target '{plan.loaded.target.name}'" in line
    # Before the run, the plan said which measurement would correct it; after, it no longer does.
    hint = f"no run of this workload on target '{plan.loaded.target.name}' corrects the kernel model yet"
    assert any(r.startswith(hint) and "--candidates each-runtime" in r for r in plan.reasons)
    assert not any(r.startswith("no run of this workload") for r in replanned.reasons)


def test_each_runtime_selects_the_predicted_best_of_each_runtime_and_precision(plan) -> None:
    chosen = select_candidates(plan, [EACH_RUNTIME])
    groups = {(r.candidate.runtime, r.candidate.device, r.candidate.precision) for r in plan.ranked}
    assert len(chosen) == len(groups) >= 3
    for candidate in chosen:
        assert candidate == next(r.candidate for r in plan.ranked if (r.candidate.runtime, r.candidate.device,
                                                                       r.candidate.precision)
                                 == (candidate.runtime, candidate.device, candidate.precision))


@pytest.mark.slow
def test_the_measured_runs_benchmark_measures_corrects_and_scores() -> None:
    """``python -m benchmarks.models.measured_runs``: a job's ONNX Runtime candidates measured for real, the plan
    redone with the run of its precision: the run's own prediction is then its measurement, the others are scored.
    (ONNX Runtime, whose kernels the kernel model predicts on AVX2 and AVX-512 hosts alike: OpenVINO picks other
    primitives on AVX2, which no shipped kernel row holds, so the learned model answers there and nothing is
    corrected.)"""
    done = subprocess.run([sys.executable, "-m", "benchmarks.models.measured_runs",
                           str(ROOT / "examples" / "own-model-cpu" / "job.yaml"), "--runtimes", "onnxruntime",
                           "--rounds", "1"], capture_output=True, text=True, cwd=ROOT, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    counted = re.search(r": (\d+) candidates measured, 1 of them the runs", lines[0])
    assert counted and int(counted[1]) > 1, done.stdout
    runs = [line for line in lines if line.startswith("run ")]
    assert len(runs) == 1 and runs[0].split()[-2] == "+0.0%", done.stdout  # after: its measurement
    others = int(counted[1]) - 1
    assert any(line.startswith(f"after   {others} candidates not runs: MAPE ") for line in lines), done.stdout
    assert sum(line.startswith("pick ") for line in lines) == 2, done.stdout
