"""The data scientist's own PyTorch model (model.pytorch, model.exported, loss): architectures outside the zoo,
written here; their code runs only in a child process, and every bad input is one located line, exit 2."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from modak.errors import InputError
from modak.spec.loader import load_job

TARGET = """\
apiVersion: modak/v1
kind: Target
name: cpu-box
cpu:
  microarchitecture: icelake
  cores_per_socket: 4
memory:
  size_gb: 16
"""
# A small residual MLP-mixer-like network: not a zoo architecture.
MODULE = """\
import torch
from torch import nn


class Mixer(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.conv = nn.Conv2d(3, width, 3, padding=1)
        self.norm = nn.BatchNorm2d(width)
        self.head = nn.Linear(width, 10)

    def forward(self, x):
        y = torch.relu(self.norm(self.conv(x)))
        return self.head((y + y.mean(dim=1, keepdim=True)).mean(dim=(2, 3)))


def build_model(width=8):
    return Mixer(width)
"""


def job_text(model: str, task: str = "inference", extra: str = "") -> str:
    return (f"apiVersion: modak/v1\nkind: Job\nname: own\ntarget: target.yaml\ntask: {task}\nmodel:\n{model}"
            f"  batch_size: 4\n{extra}")


PYTORCH = "  pytorch: {module: model.py, factory: build_model, kwargs: {width: 8}}\n  input_shape: [3, 16, 16]\n"


def write(tmp_path: Path, job: str, module: str | None = MODULE) -> Path:
    (tmp_path / "target.yaml").write_text(TARGET)
    if module is not None:
        (tmp_path / "model.py").write_text(module)
    path = tmp_path / "job.yaml"
    path.write_text(job)
    return path


def modak(*args: str, cwd: Path | None = None, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    import os

    return subprocess.run([sys.executable, "-m", "modak", *args], capture_output=True, text=True, cwd=cwd,
                          env={**os.environ, **(env or {})})


def error_of(path: Path) -> InputError:
    with pytest.raises(InputError) as info:
        load_job(path)
    return info.value


# --- the spec ---------------------------------------------------------------------------------------------------

def test_a_pytorch_model_loads_with_its_files(tmp_path: Path) -> None:
    (tmp_path / "weights.pt").write_bytes(b"")
    loaded = load_job(write(tmp_path, job_text(PYTORCH.replace("width: 8}", "width: 8}, weights: weights.pt"),
                                               "training", "loss: model.py:build_model\n")))
    assert loaded.job.model.pytorch.kwargs == {"width": 8} and loaded.job.loss == "model.py:build_model"
    assert loaded.files.model_module == tmp_path / "model.py" and loaded.files.weights == tmp_path / "weights.pt"
    assert loaded.files.loss_module == tmp_path / "model.py"


def test_an_importable_module_is_found_without_importing_it(tmp_path: Path) -> None:
    package = tmp_path / "mypkg"
    package.mkdir()
    (package / "__init__.py").write_text("raise SystemExit('imported in the planner')\n")
    (package / "models.py").write_text(MODULE)
    loaded = load_job(write(tmp_path, job_text(PYTORCH.replace("model.py", "mypkg.models"))))
    assert loaded.files.model_module == package / "models.py"


@pytest.mark.parametrize(("model", "task", "extra", "field", "message"), [
    ("  pytorch: {module: missing.py, factory: f}\n  input_shape: [3]\n", "inference", "",
     "model.pytorch.module", "file not found"),
    ("  pytorch: {module: nopkg.models, factory: f}\n  input_shape: [3]\n", "inference", "",
     "model.pytorch.module", "module 'nopkg.models' not found"),
    ("  pytorch: {module: model.py, factory: f, weights: w.pt}\n  input_shape: [3]\n", "inference", "",
     "model.pytorch.weights", "file not found"),
    ("  pytorch: {module: model.py, factory: f}\n", "inference", "", "model", "needs input_shape"),
    ("  pytorch: {module: model.py, factory: 'f()'}\n  input_shape: [3]\n", "inference", "",
     "model.pytorch.factory", "invalid value"),
    ("  exported: model.pt2\n", "inference", "", "model.exported", "file not found"),
    ("  zoo: mlp\n  exported: model.pt2\n", "inference", "", "model", "give exactly one of"),
    ("  zoo: mlp\n", "training", "loss: hinge\n", "loss", "expected a built-in loss"),
    ("  zoo: mlp\n", "training", "loss: losses.py:mine\n", "loss", "file not found"),
    ("  zoo: mlp\n", "inference", "loss: cross_entropy\n", "loss", "an inference job has none"),
])
def test_bad_model_sections_are_located(tmp_path: Path, model: str, task: str, extra: str, field: str,
                                        message: str) -> None:
    error = error_of(write(tmp_path, job_text(model, task, extra)))
    assert error.field == field and message in error.message and error.line


def test_the_job_schema_describes_the_new_sources() -> None:
    result = modak("schema", "job")
    schema = json.loads(result.stdout)
    model = schema["$defs"]["ModelSpec"]["properties"]
    assert {"pytorch", "exported"} <= set(model) and "loss" in schema["properties"]
    assert set(schema["$defs"]["PyTorchModel"]["properties"]) == {"module", "factory", "kwargs", "weights"}
