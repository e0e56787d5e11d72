"""The data scientist's own PyTorch model (model.pytorch, model.exported, loss): architectures outside the zoo,
written here; their code runs only in a child process, and every bad input is one located line, exit 2."""

from __future__ import annotations

import json
import os
import runpy
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
    return subprocess.run([sys.executable, "-m", "modak", *args], capture_output=True, text=True, cwd=cwd,
                          env={**os.environ, **(env or {})}, check=False)


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


# --- planning the user's model ----------------------------------------------------------------------------------

def plan_dict(path: Path) -> dict:
    """The plan's JSON, checked against its schema."""
    from jsonschema import Draft202012Validator

    from modak import api

    plan = api.plan_job(path, predictor_name="roofline").to_dict()
    schema = json.loads((Path(__file__).resolve().parents[1] / "modak" / "schemas" / "plan.schema.json").read_text())
    assert not [e.message for e in Draft202012Validator(schema).iter_errors(plan)]
    return plan


def runtimes(plan: dict) -> set[str]:
    return {c["runtime"] for c in plan["candidates"]}


def usermodels() -> list[str]:
    from modak.paths import cache_dir

    folder = cache_dir() / "usermodels"
    return sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []


@pytest.mark.slow
def test_a_module_file_plans_pytorch_compile_and_onnx_runtimes(tmp_path: Path) -> None:
    job = write(tmp_path, job_text(PYTORCH))
    plan = plan_dict(job)
    assert {"pytorch", "torch-compile", "onnxruntime"} <= runtimes(plan)
    assert not any("needs a PyTorch model" in p["reason"] for p in plan["pruned"])
    source = plan["model_source"]
    assert source["source"] == "model.py:build_model" and source["exporter"] == "dynamo"
    assert set(source["digests"]) == {"module", "kwargs"}
    assert plan["workload"]["parameters"] == 8 * 3 * 9 + 8 + 2 * 8 + 8 * 10 + 10  # conv, batchnorm, head
    assert not [m for m in sys.modules.values() if getattr(m, "__file__", None) == str(tmp_path / "model.py")]
    # The second plan reads the cached export: no new one.
    exports = usermodels()
    assert plan_dict(job)["model_source"] == source and usermodels() == exports


@pytest.mark.slow
def test_an_exported_program_needs_no_user_code(tmp_path: Path) -> None:
    import torch

    (tmp_path / "nets.py").write_text(MODULE)
    model = runpy.run_path(str(tmp_path / "nets.py"))["build_model"](width=4).eval()  # as the user would
    program = torch.export.export(model, (torch.randn(2, 3, 8, 8),),
                                  dynamic_shapes=({0: torch.export.Dim("batch")},))
    torch.export.save(program, tmp_path / "mixer.pt2")
    plan = plan_dict(write(tmp_path, job_text("  exported: mixer.pt2\n"), module=None))
    assert {"pytorch", "onnxruntime"} <= runtimes(plan)
    assert plan["model_source"]["source"] == "program mixer.pt2" and set(plan["model_source"]["digests"]) == {"program"}
    assert plan["workload"]["model"] == "mixer"


UNEXPORTABLE = MODULE + """

@torch.library.custom_op("own::twist", mutates_args=())
def twist(x: torch.Tensor) -> torch.Tensor:
    return x.flip(-1) * 2


@twist.register_fake
def _(x):
    return torch.empty_like(x)


class Twisted(nn.Module):
    def __init__(self):
        super().__init__()
        self.mixer = Mixer(8)

    def forward(self, x):
        return self.mixer(twist(x))


def build_twisted():
    return Twisted()
"""


@pytest.mark.slow
def test_a_model_no_exporter_can_export_still_plans_the_pytorch_runtimes(tmp_path: Path) -> None:
    job = write(tmp_path, job_text(PYTORCH.replace("build_model", "build_twisted").replace(", kwargs: {width: 8}", "")),
                UNEXPORTABLE)
    plan = plan_dict(job)
    assert "pytorch" in runtimes(plan) and not runtimes(plan) & {"onnxruntime", "openvino", "tvm"}
    onnx_pruned = [p["reason"] for p in plan["pruned"] if p["runtime"] == "onnxruntime"]
    assert onnx_pruned and "no ONNX exporter could export the model" in onnx_pruned[0]
    assert "dynamo:" in onnx_pruned[0] and "torchscript:" in onnx_pruned[0]
    assert plan["model_source"]["exporter"] is None
    assert any("torch.utils.flop_counter" in r for r in plan["reasons"])
    conv_macs = 4 * 8 * 3 * 9 * 16 * 16  # batch 4: the counter's FLOPs scaled from its batch of 2
    assert 2 * conv_macs < plan["workload"]["flops_per_step"] < 3 * conv_macs  # 2 FLOPs per MAC, and the rest
    assert plan["workload"]["parameters"] == 8 * 3 * 9 + 8 + 2 * 8 + 8 * 10 + 10


# --- the user's code fails: one located line, exit 2, nothing written --------------------------------------------

def fails(tmp_path: Path, job: str, module: str | None = MODULE, env: dict[str, str] | None = None) -> str:
    path = write(tmp_path, job, module)
    before, exports = sorted(tmp_path.rglob("*")), usermodels()
    result = modak("plan", str(path), cwd=tmp_path, env=env)
    assert result.returncode == 2, result.stderr
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr, result.stderr
    assert sorted(tmp_path.rglob("*")) == before and usermodels() == exports
    return result.stderr


def test_a_missing_module_file(tmp_path: Path) -> None:
    error = fails(tmp_path, job_text(PYTORCH.replace("model.py", "nets.py")))
    assert "job.yaml:7: model.pytorch.module: file not found" in error


def test_a_missing_factory_suggests_the_closest(tmp_path: Path) -> None:
    error = fails(tmp_path, job_text(PYTORCH.replace("build_model", "build_modle")))
    assert "model.pytorch.factory:" in error and "did you mean 'build_model'?" in error


def test_a_factory_that_raises_names_the_users_line(tmp_path: Path) -> None:
    module = MODULE.replace("    return Mixer(width)", "    width = width // 0\n    return Mixer(width)")
    error = fails(tmp_path, job_text(PYTORCH), module)
    line = module.splitlines().index("    width = width // 0") + 1
    assert f"model.pytorch.factory: {tmp_path / 'model.py'}:{line}: " in error
    assert "ZeroDivisionError" in error


def test_a_factory_that_returns_no_module(tmp_path: Path) -> None:
    error = fails(tmp_path, job_text(PYTORCH), MODULE.replace("return Mixer(width)", "return {'width': width}"))
    assert "model.pytorch.factory: build_model() returned dict, not a torch.nn.Module" in error


@pytest.mark.slow
def test_a_factory_that_never_returns_is_stopped(tmp_path: Path) -> None:
    module = MODULE.replace("    return Mixer(width)", "    import time\n    time.sleep(600)\n    return Mixer(width)")
    error = fails(tmp_path, job_text(PYTORCH), module, env={"MODAK_USERCODE_SECONDS": "8"})
    line = module.splitlines().index("    time.sleep(600)") + 1
    assert "model.pytorch.factory:" in error and "did not finish within 8 s (MODAK_USERCODE_SECONDS)" in error
    assert f"{tmp_path / 'model.py'}:{line}:" in error


def test_a_factory_that_allocates_past_its_memory_limit(tmp_path: Path) -> None:
    module = MODULE.replace("    return Mixer(width)", "    ballast = torch.empty(8 << 30, dtype=torch.uint8)\n"
                                                      "    return Mixer(width)")
    error = fails(tmp_path, job_text(PYTORCH), module, env={"MODAK_USERCODE_MEMORY_GB": "3"})
    line = module.splitlines().index("    ballast = torch.empty(8 << 30, dtype=torch.uint8)") + 1
    assert f"model.pytorch.factory: {tmp_path / 'model.py'}:{line}: " in error
    assert "MODAK_USERCODE_MEMORY_GB" in error


def test_weights_with_missing_keys(tmp_path: Path) -> None:
    import torch

    (tmp_path / "nets.py").write_text(MODULE)
    state = runpy.run_path(str(tmp_path / "nets.py"))["build_model"](width=8).state_dict()
    del state["head.bias"]
    torch.save(state, tmp_path / "weights.pt")
    error = fails(tmp_path, job_text(PYTORCH.replace("width: 8}", "width: 8}, weights: weights.pt")))
    assert "model.pytorch.weights:" in error and "missing 1 key(s): head.bias" in error


# --- the image carries the user's model ---------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("runtime", ["pytorch", "xla"])
def test_the_pytorch_image_carries_the_module_and_weights_and_matches_the_export(tmp_path: Path, runtime: str) -> None:
    import torch

    from modak import api
    from modak.image.deployment import Deployment
    from modak.image.runtimes.base import RunRequest
    from modak.runtime import measure as runner

    (tmp_path / "nets.py").write_text(MODULE)
    torch.save(runpy.run_path(str(tmp_path / "nets.py"))["build_model"](width=8).state_dict(), tmp_path / "w.pt")
    job = write(tmp_path, job_text(PYTORCH.replace("width: 8}", "width: 8}, weights: w.pt"), extra=(
        f"constraints: {{runtimes: [{runtime}]}}\n")))
    plan = api.plan_job(job, predictor_name="roofline")
    deployment = plan.to_dict()["deployment"]
    assert deployment["pytorch"] == {"module": "model.py", "factory": "build_model", "kwargs": {"width": 8},
                                     "weights": "w.pt"}
    api.render_plan(plan, tmp_path / "out")
    model_dir = tmp_path / "out" / "model"
    assert {"model.onnx", "model.py", "w.pt"} <= {p.name for p in model_dir.iterdir()}
    dockerfile = (tmp_path / "out" / "Dockerfile").read_text()
    assert "io.modak.model-source" in dockerfile and "model.py:build_model" in dockerfile
    # The image's runtime builds the module from the files beside the graph, and its outputs are the export's.
    request = RunRequest(runtime=runtime, device="cpu", precision="fp32", params={}, threads=None,
                         task="inference", onnx_path=str(model_dir / "model.onnx"), zoo=None, batch_size=4,
                         input_shapes={"input": [3, 16, 16]}, workdir=str(tmp_path / "work"),
                         pytorch=Deployment.from_dict(deployment).pytorch)
    result = runner.measure(request, min_seconds=0.1, budget_s=1)
    assert result["status"] == "ok" and result["max_abs_error"] <= 1e-3, result


@pytest.mark.slow
def test_the_pytorch_image_runs_an_exported_program(tmp_path: Path) -> None:
    import torch

    from modak import api
    from modak.image.runtimes.base import RunRequest
    from modak.runtime import measure as runner

    (tmp_path / "nets.py").write_text(MODULE)
    model = runpy.run_path(str(tmp_path / "nets.py"))["build_model"](width=4).eval()
    program = torch.export.export(model, (torch.randn(2, 3, 8, 8),), dynamic_shapes=({0: torch.export.Dim("batch")},))
    torch.export.save(program, tmp_path / "mixer.pt2")
    job = write(tmp_path, job_text("  exported: mixer.pt2\n", extra="constraints: {runtimes: [pytorch]}\n"), None)
    plan = api.plan_job(job, predictor_name="roofline")
    deployment = plan.to_dict()["deployment"]
    assert deployment["pytorch"] == {"program": "mixer.pt2"} and deployment["input_shapes"] == {"x": [3, 8, 8]}
    api.render_plan(plan, tmp_path / "out")
    model_dir = tmp_path / "out" / "model"
    assert {"model.onnx", "mixer.pt2"} <= {p.name for p in model_dir.iterdir()}
    request = RunRequest(runtime="pytorch", device="cpu", precision="fp32", params={}, threads=None,
                         task="inference", onnx_path=str(model_dir / "model.onnx"), zoo=None, batch_size=4,
                         input_shapes=deployment["input_shapes"], workdir=str(tmp_path / "work"),
                         pytorch=deployment["pytorch"])
    result = runner.measure(request, min_seconds=0.1, budget_s=1)
    assert result["status"] == "ok" and result["max_abs_error"] <= 1e-3, result


@pytest.mark.slow
def test_a_module_returning_a_mapping_runs_as_its_export(tmp_path: Path) -> None:
    """Like a Hugging Face ModelOutput: the values that are set, in order, are the export's outputs."""
    from modak import api
    from modak.image.runtimes.base import RunRequest
    from modak.runtime import measure as runner

    module = MODULE.replace("        return self.head((y + y.mean(dim=1, keepdim=True)).mean(dim=(2, 3)))",
                            "        pooled = (y + y.mean(dim=1, keepdim=True)).mean(dim=(2, 3))\n"
                            "        return {'logits': self.head(pooled), 'hidden': None, 'pooled': pooled}")
    job = write(tmp_path, job_text(PYTORCH, extra="constraints: {runtimes: [pytorch]}\n"), module)
    plan = api.plan_job(job, predictor_name="roofline")
    api.render_plan(plan, tmp_path / "out")
    deployment = plan.to_dict()["deployment"]
    request = RunRequest(runtime="pytorch", device="cpu", precision="fp32", params={}, threads=None,
                         task="inference", onnx_path=str(tmp_path / "out" / "model" / "model.onnx"), zoo=None,
                         batch_size=4, input_shapes=deployment["input_shapes"], workdir=str(tmp_path / "work"),
                         pytorch=deployment["pytorch"])
    result = runner.measure(request, min_seconds=0.1, budget_s=1)
    assert result["status"] == "ok" and result["max_abs_error"] <= 1e-3, result


@pytest.mark.parametrize(("runtime", "loss"), [("pytorch", "cross_entropy"), ("xla", "cross_entropy"),
                                               ("pytorch", "model.py:steady_loss")])
@pytest.mark.slow
def test_training_measures_the_jobs_loss(tmp_path: Path, runtime: str, loss: str) -> None:
    import math

    from modak import api
    from modak.image.runtimes.base import RunRequest, load_runtime, make_inputs
    from modak.runtime import measure as runner

    module = MODULE + ("\n\ndef steady_loss(outputs, batch):\n"
                       "    return outputs.float().mean() * 0 + 7 + 0 * batch['input'].sum()\n")
    job = write(tmp_path, job_text(PYTORCH, "training", f"loss: {loss}\nconstraints: {{runtimes: [{runtime}, xla]}}\n"),
                module)
    plan = api.plan_job(job, predictor_name="roofline")
    if ":" in loss:  # PyTorch code: XLA cannot run it
        assert any(p.runtime == "xla" and "is PyTorch code" in p.reason for p in plan.pruned)
    candidate = next(r.candidate for r in plan.ranked if r.candidate.runtime == runtime)
    api.render_plan(plan, tmp_path / "out")
    deployment = plan.deployment(candidate).to_dict()
    assert deployment["loss"] == ("model.py:steady_loss" if ":" in loss else loss)
    request = RunRequest(runtime=runtime, device="cpu", precision="fp32", params={}, threads=None, task="training",
                         onnx_path=str(tmp_path / "out" / "model" / "model.onnx"), zoo=None, batch_size=4,
                         input_shapes=deployment["input_shapes"], workdir=str(tmp_path / "work"),
                         pytorch=deployment["pytorch"], loss=deployment["loss"])
    inputs = make_inputs(request)
    first = float(load_runtime(runtime).prepare(request, inputs).run(inputs)[0])
    assert first == pytest.approx(7.0) if ":" in loss else abs(first - math.log(10)) < 0.5  # not a mean square
    result = runner.measure(request, min_seconds=0.1, budget_s=1)
    assert result["status"] == "ok", result  # checked against PyTorch eager's losses


@pytest.mark.slow
def test_the_own_model_example_plans_every_runtime_family() -> None:
    plan = plan_dict(Path(__file__).resolve().parents[1] / "examples" / "own-model-cpu" / "job.yaml")
    assert {"pytorch", "torch-compile", "xla", "onnxruntime", "openvino"} <= runtimes(plan)
    assert plan["model_source"]["source"] == "model.py:build_model" and plan["model_source"]["exporter"] == "dynamo"


@pytest.mark.slow
def test_the_pytorch_image_runs_a_model_no_exporter_could_export(tmp_path: Path) -> None:
    from modak import api
    from modak.image.runtimes.base import RunRequest
    from modak.runtime import measure as runner
    from modak.runtime import open_model

    job = write(tmp_path, job_text(PYTORCH.replace("build_model", "build_twisted").replace(", kwargs: {width: 8}", ""),
                                   extra="constraints: {runtimes: [pytorch, onnxruntime]}\n"), UNEXPORTABLE)
    plan = api.plan_job(job, predictor_name="roofline")
    api.render_plan(plan, tmp_path / "out")
    model_dir = tmp_path / "out" / "model"
    assert {p.name for p in model_dir.iterdir()} == {"model.py"}  # no graph: the runtime builds the module
    deployment = plan.to_dict()["deployment"]
    request = RunRequest(runtime="pytorch", device="cpu", precision="fp32", params={}, threads=None,
                         task="inference", onnx_path=str(model_dir / "model.onnx"), zoo=None, batch_size=4,
                         input_shapes=deployment["input_shapes"], workdir=str(tmp_path / "work"),
                         pytorch=deployment["pytorch"])
    model = open_model(request)
    assert [(s.name, s.shape) for s in model.inputs] == [("input", (3, 16, 16))]
    assert [(s.name, s.shape) for s in model.outputs] == [("output_0", (10,))]
    result = runner.measure(request, min_seconds=0.1, budget_s=1)
    assert result["status"] == "ok", result
