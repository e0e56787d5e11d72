"""int8 post-training quantization: candidates, calibration samples, the accuracy gate, the cache, bench and render."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pytest
import yaml

from modak import api
from modak.bench.harness import BenchSettings, bench
from modak.errors import InputError
from modak.hardware.ceilings import target_ceilings
from modak.measurements.store import PerfStore
from modak.quantize import gate
from modak.spec.document import SpecDocument
from modak.spec.loader import validate
from modak.spec.models import Precision
from modak.spec.target import CpuPeaks, Target
from tests.test_ci_step import assert_valid

ROOT = Path(__file__).resolve().parents[1]
TARGET = ROOT / "examples" / "mnist-cnn-cpu" / "target.yaml"


def write_job(folder: Path, **fields: Any) -> Path:
    """An MNIST-CNN inference job (batch 16) with ``fields`` over the defaults."""
    job = {"apiVersion": "modak/v1", "kind": "Job", "name": "mnist-int8", "target": str(TARGET),
           "task": "inference", "model": {"zoo": "mnist_cnn", "input_shape": [1, 28, 28], "batch_size": 16},
           "precision": ["int8"], "constraints": {"runtimes": ["onnxruntime"]},
           "accuracy": {"metric": "relative_error", "max_drop": 1.0}, **fields}
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "job.yaml"
    path.write_text(yaml.safe_dump(job, sort_keys=False))
    return path


def methods(plan: Any) -> set[str]:
    return {str(r.candidate.param("quantization")) for r in plan.ranked if r.candidate.precision is Precision.int8}


def test_quantized_candidates_pass_the_gate_and_carry_their_figure(tmp_path: Path) -> None:
    plan = api.plan_job(write_job(tmp_path, constraints={"runtimes": ["onnxruntime", "openvino"]}))
    assert methods(plan) == {"static", "dynamic", "nncf"}
    for ranked in plan.ranked:
        check = ranked.accuracy
        assert check is not None and check.passed and check.samples == "64 random samples"
        assert 0 < check.value < 1.0 and check.model.is_file() and check.model != plan.source.onnx_path
        assert plan.model_file(ranked.candidate) == check.model
        assert ranked.prediction.predictor == "roofline"  # no measured int8 rows: the learned model does not answer
    data = plan.to_dict()
    assert_valid("plan.schema.json", data)
    assert data["candidates"][0]["accuracy"]["metric"] == "relative_error"
    assert any("passed the accuracy gate: relative error" in r for r in plan.reasons)
    assert any("64 random inputs" in r and "calibration.data" in r for r in plan.reasons)
    # the quantized graphs hold int8 weights
    import onnx

    types = {i.data_type for i in onnx.load(str(plan.choice.accuracy.model)).graph.initializer}
    assert onnx.TensorProto.INT8 in types


def test_a_candidate_failing_the_gate_is_pruned_with_its_figure(tmp_path: Path) -> None:
    job = write_job(tmp_path, precision=["fp32", "int8"], accuracy={"metric": "relative_error", "max_drop": 0.0})
    plan = api.plan_job(job, predictor_name="roofline")
    assert {r.candidate.precision for r in plan.ranked} == {Precision.fp32}
    failed = [p for p in plan.pruned if "failed the accuracy gate" in p.reason]
    assert failed and all("/int8 " in p.runtime for p in failed)
    assert any("quantization=static: failed the accuracy gate: relative error" in r and "above 0 (accuracy.max_drop 0)"
               in r for r in plan.reasons)


def test_the_default_gate_is_top1_agreement_for_a_classifier(tmp_path: Path) -> None:
    plan = api.plan_job(write_job(tmp_path, accuracy={}, constraints={"runtimes": ["onnxruntime"]}),
                        predictor_name="roofline")
    checked = [r.accuracy for r in plan.ranked] + [None]
    figures = [r for r in plan.reasons if "accuracy gate" in r]
    assert figures and all("top-1 agreement" in r and "(accuracy.max_drop 0.01)" in r for r in figures)
    assert all(c is None or c.metric.value == "top1_agreement" for c in checked)


def test_a_second_plan_reuses_the_quantized_model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    job = write_job(tmp_path)
    first = api.plan_job(job)
    stamps = {r.accuracy.model: r.accuracy.model.stat().st_mtime_ns for r in first.ranked}

    def refuse(*args: object) -> None:
        raise AssertionError("quantized again")

    monkeypatch.setattr(gate, "_QUANTIZERS", {name: refuse for name in gate._QUANTIZERS})
    second = api.plan_job(job)
    assert second.to_dict() == first.to_dict()
    assert {m: m.stat().st_mtime_ns for m in stamps} == stamps


def test_calibration_folder_replaces_random_inputs(tmp_path: Path) -> None:
    samples = tmp_path / "samples"
    samples.mkdir()
    rng = np.random.default_rng(1)
    np.savez(samples / "a.npz", input=rng.random((5, 1, 28, 28)))  # float64 stack: cast to float32
    np.save(samples / "b.npy", rng.random((1, 28, 28), dtype=np.float32))  # one sample
    np.savez(samples / "c.npz", input=rng.random((30, 1, 28, 28), dtype=np.float32))
    (samples / "README").write_text("other files are ignored")
    job = write_job(tmp_path, calibration={"data": "samples", "samples": 20})
    plan = api.plan_job(job)
    random_plan = api.plan_job(write_job(tmp_path / "random"))
    check = plan.choice.accuracy
    assert check is not None and check.samples == "20 samples from calibration.data" and not check.random_samples
    assert not any("random inputs" in r for r in plan.reasons)
    assert check.key != random_plan.choice.accuracy.key


@pytest.mark.parametrize("files, message", [
    ({"bad.npz": {"input": np.zeros((2, 28, 28), np.float32)}}, "bad.npz: input input: shape [2, 28, 28] is neither"),
    ({"bad.npz": {"image": np.zeros((1, 28, 28), np.float32)}}, "bad.npz: the model's inputs are input; missing input; "
                                                                "unknown image"),
    ({"bad.npz": {"input": np.zeros((1, 28, 28), np.complex64)}}, "dtype complex64 cannot be converted"),
    ({"bad.npy": b"not numpy"}, "bad.npy: not a NumPy file modak can read"),
    ({"bad.npz": {"input": np.array([None] * 784, dtype=object).reshape(1, 28, 28)}}, "bad.npz: not a NumPy file"),
    ({"notes.txt": b"x"}, "no .npz or .npy files in"),
])
def test_bad_calibration_data_is_a_located_input_error(tmp_path: Path, files: dict, message: str) -> None:
    folder = tmp_path / "samples"
    folder.mkdir()
    for name, content in files.items():
        if isinstance(content, bytes):
            (folder / name).write_bytes(content)
        else:
            np.savez(folder / name, **content)
    job = write_job(tmp_path, calibration={"data": "samples"})
    with pytest.raises(InputError) as error:
        api.plan_job(job)
    assert error.value.field == "calibration.data" and error.value.line and message in error.value.message


def test_bad_calibration_data_exits_2(tmp_path: Path) -> None:
    (tmp_path / "samples").mkdir()
    np.savez(tmp_path / "samples" / "bad.npz", input=np.zeros((3, 2, 28, 28), np.float32))
    job = write_job(tmp_path, calibration={"data": "samples"})
    result = subprocess.run([sys.executable, "-m", "modak", "plan", str(job)], capture_output=True, text=True)
    line = job.read_text().splitlines().index("calibration:") + 2
    assert result.returncode == 2
    assert f"job.yaml:{line}: calibration.data: bad.npz: input input: shape [3, 2, 28, 28]" in result.stderr
    missing = write_job(tmp_path / "missing", calibration={"data": "nowhere"})
    result = subprocess.run([sys.executable, "-m", "modak", "plan", str(missing)], capture_output=True, text=True)
    assert result.returncode == 2 and "calibration.data: folder not found" in result.stderr


def test_render_bakes_the_quantized_model_into_the_context(tmp_path: Path) -> None:
    plan = api.plan_job(write_job(tmp_path / "job"))
    out = tmp_path / "out"
    api.render_plan(plan, out)
    model = out / "model"
    assert sorted(p.name for p in model.iterdir()) == ["model.onnx"]  # no external data of the fp32 export
    assert (model / "model.onnx").read_bytes() == plan.choice.accuracy.model.read_bytes()
    written = json.loads((out / "plan.json").read_text())
    assert written["candidates"][0]["accuracy"]["passed"] and written["deployment"]["precision"] == "int8"
    dockerfile = (out / "Dockerfile").read_text()
    assert "io.modak.quantized-model" in dockerfile and "relative_error" in dockerfile


def test_bench_measures_int8_on_the_quantized_model(tmp_path: Path) -> None:
    plan = api.plan_job(write_job(tmp_path, constraints={"runtimes": ["onnxruntime", "openvino"]}))
    chosen = {str(r.candidate.param("quantization")): r.candidate for r in reversed(plan.ranked)}
    with PerfStore(tmp_path / "perf.sqlite") as store:
        rows = bench(plan, list(chosen.values()), store,
                     BenchSettings(launches=1, min_seconds=0.05, budget_s=0.2, retries=0))
    assert {r.precision for r in rows} == {"int8"} and len(rows) == 3
    assert all(r.status in ("ok", "contended") for r in rows), [r.error for r in rows]
    assert all(r.max_abs_error <= 0.1 for r in rows)  # against ONNX Runtime on the same quantized graph


@pytest.mark.parametrize("microarchitecture, factor", [("zen3", 2), ("haswell", 2), ("cascadelake", 4),
                                                       ("x86_64", None)])
def test_int8_peak_on_cpus_with_and_without_dot_product_instructions(microarchitecture: str,
                                                                     factor: int | None) -> None:
    target = validate({"apiVersion": "modak/v1", "kind": "Target", "name": "t", "memory": {"size_gb": 8},
                                    "cpu": {"microarchitecture": microarchitecture, "cores_per_socket": 4}}, Target)
    cpu = target_ceilings(target, SpecDocument(Path("t.yaml"))).cpu
    if factor is None:
        assert not cpu.supports(Precision.int8)
    else:
        assert cpu.peak_gflops[Precision.int8] == pytest.approx(factor * cpu.peak_gflops[Precision.fp32])
    measured = msgspec.structs.replace(target, cpu=msgspec.structs.replace(target.cpu, peaks=CpuPeaks(int8_gops=123.0)))
    assert target_ceilings(measured, SpecDocument(Path("t.yaml"))).cpu.peak_gflops[Precision.int8] == 123.0


def test_the_quantization_parameter_is_enumerated_for_int8_only(tmp_path: Path) -> None:
    plan = api.plan_job(write_job(tmp_path, precision=["fp32", "int8"]), predictor_name="roofline")
    for ranked in plan.ranked:
        has = ranked.candidate.param("quantization") is not None
        assert has == (ranked.candidate.precision is Precision.int8)
