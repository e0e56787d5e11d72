"""Spec loading: every kind of bad input is one located line, exit code 2, no traceback, nothing written."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from modak.errors import InputError
from modak.spec.loader import load_job, load_spec
from modak.spec.target import Target
from tests.support.specs import CPU_TARGET

ROOT = Path(__file__).resolve().parents[1]
JOB = """\
apiVersion: modak/v1
kind: Job
name: tiny
target: target.yaml
task: inference
model:
  zoo: mlp
  batch_size: 4
"""


def write(tmp_path: Path, job: str = JOB, target: str = CPU_TARGET) -> Path:
    (tmp_path / "target.yaml").write_text(target)
    path = tmp_path / "job.yaml"
    path.write_text(job)
    return path


def modak(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "modak", *args], capture_output=True, text=True, cwd=cwd)


def error_of(path: Path) -> InputError:
    with pytest.raises(InputError) as info:
        load_job(path)
    return info.value


def test_valid_specs_load(tmp_path: Path) -> None:
    loaded = load_job(write(tmp_path))
    assert loaded.job.model.zoo == "mlp" and loaded.target.cpu.cores_per_socket == 4


def test_yaml_syntax_error_has_file_and_line(tmp_path: Path) -> None:
    path = write(tmp_path, JOB.replace("  batch_size: 4", "  batch_size: [4"))
    error = error_of(path)
    assert str(error).startswith(f"{path}:") and "YAML syntax error" in str(error)
    assert error.line is not None and error.line >= 8


def test_unknown_field_suggests_closest_name(tmp_path: Path) -> None:
    path = write(tmp_path, JOB.replace("  batch_size: 4", "  batch_sise: 4"))
    assert str(error_of(path)) == f"{path}:8: model.batch_sise: unknown field; did you mean 'batch_size'?"


def test_unknown_top_level_field_in_target(tmp_path: Path) -> None:
    path = write(tmp_path, target=CPU_TARGET + "schedular:\n  kind: slurm\n")
    error = error_of(path)
    assert error.file == str(tmp_path / "target.yaml") and error.line == 9
    assert error.field == "schedular" and "did you mean 'scheduler'" in error.message


def test_mistyped_field_names_line_and_field(tmp_path: Path) -> None:
    path = write(tmp_path, JOB.replace("batch_size: 4", "batch_size: four"))
    error = error_of(path)
    assert (error.line, error.field) == (8, "model.batch_size") and "integer" in error.message


def test_enum_value_lists_choices(tmp_path: Path) -> None:
    path = write(tmp_path, JOB.replace("task: inference", "task: serving"))
    error = error_of(path)
    assert (error.line, error.field) == (5, "task") and "'training'" in error.message and "'serving'" in error.message


def test_missing_required_field(tmp_path: Path) -> None:
    path = write(tmp_path, JOB.replace("task: inference\n", ""))
    error = error_of(path)
    assert error.field == "task" and "missing" in error.message


def test_duplicate_key_is_an_error(tmp_path: Path) -> None:
    path = write(tmp_path, JOB + "task: training\n")
    error = error_of(path)
    assert (error.line, error.field, error.message) == (9, "task", "duplicate key")


def test_missing_files(tmp_path: Path) -> None:
    assert error_of(tmp_path / "nope.yaml").message == "file not found"
    path = write(tmp_path, JOB.replace("target: target.yaml", "target: elsewhere.yaml"))
    error = error_of(path)
    assert (error.line, error.field) == (4, "target") and "target file not found" in error.message


def test_wrong_kind(tmp_path: Path) -> None:
    with pytest.raises(InputError) as info:
        load_spec(write(tmp_path), Target)
    assert info.value.field == "kind" and "expected kind 'Target'" in info.value.message


def test_objective_needs_steps_for_time_to_solution(tmp_path: Path) -> None:
    path = write(tmp_path, JOB + "objective:\n  metric: time_to_solution\n")
    error = error_of(path)
    assert error.field == "objective" and "steps" in error.message


@pytest.mark.parametrize("field,value", [("name", "x; rm -rf /"), ("name", "$(id)"), ("name", "a`b`"),
                                         ("name", "line\\nbreak")])
def test_constrained_fields_reject_hostile_strings(tmp_path: Path, field: str, value: str) -> None:
    path = write(tmp_path, JOB.replace("name: tiny", f"{field}: {json.dumps(value)}"))
    error = error_of(path)
    assert error.field == field and "only letters, digits" in error.message


def test_scheduler_fields_reject_directive_injection(tmp_path: Path) -> None:
    target = CPU_TARGET + 'scheduler:\n  kind: slurm\n  partition: "gpu\\n#SBATCH --uid=0"\n'
    path = write(tmp_path, target=target)
    error = error_of(path)
    assert error.field == "scheduler.partition"


def test_schema_command_prints_both_schemas() -> None:
    result = modak("schema")
    assert result.returncode == 0
    schemas = json.loads(result.stdout)
    assert schemas["job"]["title"] == "Job" and schemas["target"]["title"] == "Target"
    assert "batch_size" in json.dumps(schemas["job"])


@pytest.mark.parametrize("case", ["syntax", "unknown", "mistyped", "missing-target", "gpu-on-cpu", "bad-onnx"])
def test_cli_bad_input_is_one_line_exit_2_and_writes_nothing(tmp_path: Path, case: str) -> None:
    job = {
        "syntax": JOB + "model: [\n",
        "unknown": JOB.replace("task:", "tsak:"),
        "mistyped": JOB.replace("batch_size: 4", "batch_size: -1"),
        "missing-target": JOB.replace("target.yaml", "missing.yaml"),
        "gpu-on-cpu": JOB + "device: gpu\n",
        "bad-onnx": JOB.replace("zoo: mlp", "onnx: garbage.onnx"),
    }[case]
    (tmp_path / "garbage.onnx").write_bytes(b"this is not protobuf \x00\xff")
    path = write(tmp_path, job)
    out = tmp_path / "out"
    for command in (["plan", str(path)], ["render", str(path), "-o", str(out)]):
        result = modak(*command)
        assert result.returncode == 2, result.stderr
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
        assert lines[0].startswith(f"modak: error: {path}:")
        assert not out.exists()
    expected_field = {"syntax": None, "unknown": "tsak", "mistyped": "model.batch_size",
                      "missing-target": "target", "gpu-on-cpu": "device", "bad-onnx": "model.onnx"}[case]
    if expected_field:
        assert f": {expected_field}: " in lines[0]
