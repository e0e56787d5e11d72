"""modak.runtime.torch.prepare applies a plan to a user's own PyTorch loop, and the bundled training example
(examples/cnn-train-cpu/train.py) runs with the plan applied through the image's launcher."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="PyTorch (pip install torch==2.13.0) runs the training API")

import modak.runtime.torch as modak_torch  # noqa: E402
from modak.image.deployment import Deployment  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "cnn-train-cpu"


def _plan(folder: Path, runtime: str = "pytorch", precision: str = "fp32", **params: object) -> Path:
    deployment = Deployment(runtime=runtime, device="cpu", precision=precision, task="training",
                            params={"threads": 1, **params}, env={}, batch_size=16,
                            input_shapes={"input": [1, 12, 12]}, zoo="mnist_cnn")
    path = folder / f"plan-{runtime}-{precision}.json"
    path.write_text(json.dumps({"deployment": deployment.to_dict()}))
    return path


def _net() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Conv2d(1, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.Flatten(),
                               torch.nn.Linear(8 * 12 * 12, 4))


def _train(model, optimizer, step, steps: int = 25) -> list[float]:
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(32, 1, 12, 12, generator=generator)
    y = (x.flatten(1) @ torch.randn(144, 4, generator=generator)).argmax(1)
    losses = []
    for _ in range(steps):
        with step:
            loss = torch.nn.functional.cross_entropy(model(step.inputs(x)), step.inputs(y))
            dtype = torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else None
        step.update(loss)
        losses.append(loss.detach().item())
    return losses, dtype


@pytest.fixture(autouse=True)
def _restore_threads():
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def test_fp32_plan_threads_and_a_falling_loss(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MODAK_THREADS", "1")
    net = _net()
    model, optimizer, step = modak_torch.prepare(net, torch.optim.SGD(net.parameters(), lr=0.1),
                                                 plan=_plan(tmp_path))
    assert torch.get_num_threads() == 1 and step.threads == 1
    losses, dtype = _train(model, optimizer, step)
    assert dtype is None  # fp32: no autocast
    assert sum(losses[-5:]) / 5 < 0.7 * sum(losses[:5]) / 5
    assert len(step.times) == 25 and step.median_seconds() > 0
    assert "runtime pytorch on cpu, precision fp32" in step.describe() and "1 threads" in step.describe()


def test_processes_of_torchrun_share_the_threads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A job with scaling starts LOCAL_WORLD_SIZE processes per node: each takes its share of the threads."""
    monkeypatch.setenv("MODAK_THREADS", "4")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "1")  # a CPU plan: no GPU to pick
    net = _net()
    _, _, step = modak_torch.prepare(net, torch.optim.SGD(net.parameters(), lr=0.1), plan=_plan(tmp_path))
    assert step.threads == 2 and torch.get_num_threads() == 2 and step.device.type == "cpu"
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")
    _, _, step = modak_torch.prepare(net, torch.optim.SGD(net.parameters(), lr=0.1), plan=_plan(tmp_path))
    assert step.threads == 1


@pytest.mark.slow
def test_bf16_channels_last_plan(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MODAK_THREADS", "2")
    net = _net()
    model, optimizer, step = modak_torch.prepare(net, torch.optim.SGD(net.parameters(), lr=0.1),
                                                 plan=_plan(tmp_path, precision="bf16", channels_last=True))
    assert torch.get_num_threads() == 2
    assert net[0].weight.is_contiguous(memory_format=torch.channels_last)
    assert step.inputs(torch.zeros(2, 1, 12, 12)).is_contiguous(memory_format=torch.channels_last)
    losses, dtype = _train(model, optimizer, step)
    assert dtype == torch.bfloat16
    assert sum(losses[-5:]) / 5 < 0.8 * sum(losses[:5]) / 5
    assert "channels_last=True" in step.describe()


@pytest.mark.slow
def test_torch_compile_plan_compiles_the_model(tmp_path: Path) -> None:
    net = _net()
    model, optimizer, step = modak_torch.prepare(net, torch.optim.SGD(net.parameters(), lr=0.1),
                                                 plan=_plan(tmp_path, runtime="torch-compile", mode="default"))
    assert isinstance(model, torch._dynamo.eval_frame.OptimizedModule)
    losses, _ = _train(model, optimizer, step, steps=3)
    assert all(loss == loss for loss in losses)  # compiled and ran


def test_a_plan_for_another_runtime_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="'onnxruntime'.*PyTorch runtimes"):
        modak_torch.prepare(_net(), None, plan=_plan(tmp_path, runtime="onnxruntime"))


@pytest.mark.slow
def test_example_trains_with_the_plan_applied(tmp_path: Path) -> None:
    """The example's own plan (``modak plan --json``: its ``deployment``), applied through the image's launcher."""
    planned = subprocess.run([sys.executable, "-m", "modak", "plan", str(EXAMPLE / "job.yaml"), "--json"],
                             capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert planned.returncode == 0, planned.stderr
    plan = json.loads(planned.stdout)
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    env = {**os.environ, "MODAK_PLAN": str(tmp_path / "plan.json"), "MODAK_WORKDIR": str(tmp_path)}
    done = subprocess.run([sys.executable, "-m", "modak.image.launch", "--", sys.executable,
                           str(EXAMPLE / "train.py"), "30"], capture_output=True, text=True, timeout=600, env=env,
                          cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    deployment = plan["deployment"]
    first_line = done.stdout.splitlines()[0]
    assert f"runtime {deployment['runtime']} on cpu, precision {deployment['precision']}" in first_line
    for name, value in deployment["params"].items():
        assert f"{name}={value}" in first_line
    losses = re.search(r"loss ([0-9.]+) -> ([0-9.]+), median step ([0-9.]+) ms", done.stdout)
    assert losses, done.stdout
    assert float(losses[2]) < 0.9 * float(losses[1]) and float(losses[3]) > 0
