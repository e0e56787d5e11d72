"""The GPU levers of #68 on the CPU: which candidates carry them (GPU only: a CPU space is what it was), how the
runtime selects them per device (no-ops said once on a CPU), the per-shape graph cache a server relies on, and
torch.compile's mode for cuda_graphs. What needs CUDA (the capture, the pinned copies) is exercised by the GPU
session (benchmarks/data/gpu_session.py), not here."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml

from modak import api
from modak.candidates.catalog import load_catalog
from modak.candidates.enumerate import enumerate_candidates
from modak.hardware.ceilings import target_ceilings
from modak.image.runtimes.base import RunRequest
from modak.image.runtimes.pytorch import MAX_GRAPHS, GpuLevers, PerShape, gpu_levers, prepare
from modak.image.runtimes.torch_compile import CUDA_GRAPH_MODES, compile_mode

LEVERS = {"cuda_graphs", "io"}


def _space(tmp_path: Path, task: str, gpu: bool) -> list:
    target = {"apiVersion": "modak/v1", "kind": "Target", "name": "t",
              "cpu": {"microarchitecture": "sapphirerapids", "sockets": 1, "cores_per_socket": 16,
                      "threads_per_core": 1}, "memory": {"size_gb": 128}}
    if gpu:
        target["gpus"] = {"model": "H100-SXM", "count": 1}
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "target.yaml").write_text(yaml.safe_dump(target))
    (tmp_path / "job.yaml").write_text(yaml.safe_dump({
        "apiVersion": "modak/v1", "kind": "Job", "name": "j", "target": "target.yaml", "task": task,
        "model": {"zoo": "resnet18", "batch_size": 8}, "precision": ["fp32", "tf32", "bf16", "fp16"],
        "constraints": {"runtimes": ["pytorch", "torch-compile"]}}))
    loaded = api.load(tmp_path / "job.yaml")
    return list(enumerate_candidates(loaded, target_ceilings(loaded.target, loaded.target_doc), load_catalog(),
                                     frozenset({"conv", "matmul"})).candidates)


def test_the_levers_are_parameters_of_the_gpu_candidates_only(tmp_path: Path) -> None:
    candidates = _space(tmp_path / "gpu", "inference", gpu=True)
    gpu = [c for c in candidates if c.device == "gpu"]
    assert all(LEVERS <= {k for k, _ in c.params} for c in gpu)
    assert not any(LEVERS & {k for k, _ in c.params} for c in candidates if c.device == "cpu")
    eager = [c for c in gpu if c.runtime == "pytorch"]
    compiled = [c for c in gpu if c.runtime == "torch-compile"]
    # 4 precisions x channels_last x cuda_graphs x io; compile also x its 2 modes
    assert len(eager) == 4 * 2 * 2 * 2 and len(compiled) == 4 * 2 * 2 * 2 * 2
    assert {c.precision.value for c in gpu} == {"fp32", "tf32", "bf16", "fp16"}
    assert any(c.param("mode") == "max-autotune-no-cudagraphs" and c.param("cuda_graphs") is True for c in compiled)
    cpu_only = _space(tmp_path / "cpu", "inference", gpu=False)
    assert cpu_only and not any(LEVERS & {k for k, _ in c.params} for c in cpu_only)


def test_eager_graphs_are_an_inference_lever_and_compile_graphs_also_train(tmp_path: Path) -> None:
    gpu = [c for c in _space(tmp_path, "training", gpu=True) if c.device == "gpu"]
    assert not any(c.param("cuda_graphs") is not None for c in gpu if c.runtime == "pytorch")
    assert {c.param("cuda_graphs") for c in gpu if c.runtime == "torch-compile"} == {False, True}
    assert {c.param("io") for c in gpu} == {"pageable", "pinned"}


def _request(device: str, task: str = "inference", **params: object) -> RunRequest:
    return RunRequest(runtime="pytorch", device=device, precision="fp32", params=dict(params), threads=1, task=task,
                      onnx_path="", zoo="mlp", batch_size=2, input_shapes={"input": [784]}, workdir="")


def test_the_runtime_selects_the_levers_per_device() -> None:
    assert gpu_levers(_request("gpu", cuda_graphs=True, io="pinned")) == GpuLevers(True, True, ())
    on_gpu = gpu_levers(_request("gpu", cuda_graphs=True, io="pageable"))
    assert (on_gpu.cuda_graphs, on_gpu.pinned) == (True, False)
    compiled = gpu_levers(_request("gpu", cuda_graphs=True, io="pinned"), compiled=True)
    assert (compiled.cuda_graphs, compiled.pinned) == (False, True)  # the compile mode captures
    training = gpu_levers(_request("gpu", task="training", cuda_graphs=True))
    assert not training.cuda_graphs
    cpu = gpu_levers(_request("cpu", cuda_graphs=True, io="pinned"))
    assert (cpu.cuda_graphs, cpu.pinned) == (False, False) and cpu.ignored == ("cuda_graphs=true", "io=pinned")
    assert gpu_levers(_request("cpu", cuda_graphs=False, io="pageable")).ignored == ()


def test_a_cpu_session_with_the_levers_runs_them_as_no_ops(capfd: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("torch")
    feeds = {"input": np.random.default_rng(0).standard_normal((2, 784)).astype(np.float32)}
    plain = prepare(_request("cpu"), feeds).run(feeds)
    levered = prepare(_request("cpu", cuda_graphs=True, io="pinned"), feeds).run(feeds)
    assert [o.shape for o in levered] == [(2, 10)] and np.allclose(levered[0], plain[0])
    assert "cuda_graphs=true, io=pinned are GPU levers: not applied on the cpu" in capfd.readouterr().err


def test_graphs_are_kept_per_served_shape_up_to_the_limit() -> None:
    built: list[int] = []
    graphs = PerShape(2)
    for batch in (1, 4, 1, 4, 8, 1):
        graphs.get(batch, lambda batch=batch: built.append(batch) or f"graph{batch}")
    assert built == [1, 4]  # each served batch size captured once; the third size runs without a graph
    assert graphs.get(8, lambda: "never") is None and graphs.get(4, lambda: "never") == "graph4"
    assert PerShape(0).get(1, lambda: "never") is None  # cuda_graphs off: every shape eager
    assert MAX_GRAPHS >= 8  # the session's batch sizes (1 and 32) and a server's few


def test_compile_mode_of_cuda_graphs() -> None:
    assert compile_mode({"mode": "default", "cuda_graphs": True}, "gpu") == "reduce-overhead"
    assert compile_mode({"mode": "max-autotune-no-cudagraphs", "cuda_graphs": True}, "gpu") == "max-autotune"
    assert compile_mode({"mode": "default", "cuda_graphs": False}, "gpu") == "default"
    assert compile_mode({"mode": "default", "cuda_graphs": True}, "cpu") == "default"
    recipe = load_catalog()["torch-compile"]
    modes = next(p for p in recipe.parameters if p.name == "mode").values
    assert set(CUDA_GRAPH_MODES) == set(modes)  # every recipe mode has its CUDA-graph twin
