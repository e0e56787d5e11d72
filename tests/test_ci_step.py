"""modak as a CI pipeline step: the JSON machine interface against its schemas, and the step script run the way
the GitHub Action (action.yml) and the GitLab template (integrations/gitlab/modak.gitlab-ci.yml) run it."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from jsonschema import Draft202012Validator
from referencing import Registry, Resource

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "mnist-cnn-cpu"
JOB = EXAMPLE / "job.yaml"
STEP = ROOT / "integrations" / "github" / "modak-step.sh"
GITLAB = ROOT / "integrations" / "gitlab" / "modak.gitlab-ci.yml"
SCHEMAS = ROOT / "modak" / "schemas"
_EXPR = re.compile(r"\$\{\{\s*(.*?)\s*\}\}")


def assert_valid(name: str, document: object) -> None:
    schemas = [json.loads(p.read_text()) for p in SCHEMAS.glob("*.schema.json")]
    registry = Registry().with_resources([(s["$id"], Resource.from_contents(s)) for s in schemas])
    validator = Draft202012Validator(json.loads((SCHEMAS / name).read_text()), registry=registry)
    problems = [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(document)]
    assert not problems, f"{name}: " + "; ".join(problems[:5])


def base_env(tmp_path: Path) -> dict[str, str]:
    """This environment without CI variables, with this Python's `modak` and `python3` first on PATH."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GITHUB_", "MODAK_", "CI_"))}
    env.update({k: os.environ[k] for k in ("MODAK_CACHE", "MODAK_STORE", "MODAK_MEASURE_BUDGET") if k in os.environ})
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env["HOME"] = os.environ.get("HOME", str(tmp_path))
    return env


def read_outputs(path: Path) -> dict[str, str]:
    """A GITHUB_OUTPUT file (key=value lines)."""
    lines = [line for line in path.read_text().splitlines() if line]
    assert all("=" in line for line in lines), lines
    return dict(line.split("=", 1) for line in lines)


def run_step(tmp_path: Path, **variables: str) -> tuple[subprocess.CompletedProcess[str], dict[str, str]]:
    output = tmp_path / "github-output"
    output.write_text("")
    env = base_env(tmp_path) | {"GITHUB_OUTPUT": str(output), "GITHUB_STEP_SUMMARY": str(tmp_path / "summary.md")}
    env |= variables
    done = subprocess.run(["bash", str(STEP)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    return done, read_outputs(output)


@pytest.fixture(scope="module")
def plan() -> dict:
    done = subprocess.run([sys.executable, "-m", "modak", "plan", str(JOB), "--json"], capture_output=True,
                          text=True, check=True)
    return json.loads(done.stdout)


def chosen(plan: dict) -> dict:
    return next(c for c in plan["candidates"] if c["name"] == plan["choice"])


def test_plan_and_render_json_match_their_schemas(tmp_path, plan):
    assert_valid("plan.schema.json", plan)
    assert plan["schema_version"] == 1 and plan["candidates"][0]["name"] == plan["choice"]
    done = subprocess.run([sys.executable, "-m", "modak", "render", str(JOB), "-o", str(tmp_path / "out"), "--json"],
                          capture_output=True, text=True, check=True)
    rendered = json.loads(done.stdout)
    assert_valid("render.schema.json", rendered)
    assert rendered["choice"] == plan["choice"]
    assert [Path(f).name for f in rendered["files"]] == sorted(
        ["Dockerfile", "Singularity.def", "entrypoint.sh", "job.sh", "plan.json"])
    assert all(Path(f).is_file() for f in rendered["files"])
    written = json.loads((tmp_path / "out" / "plan.json").read_text())
    assert_valid("plan.schema.json", written)
    assert written == plan  # plan.json is the `modak plan --json` document


def test_analyze_json_carries_the_envelope_and_matches_its_schema():
    done = subprocess.run([sys.executable, "-m", "modak", "analyze", str(JOB), "--json"], capture_output=True,
                          text=True, check=True)
    analysis = json.loads(done.stdout)
    assert_valid("analyze.schema.json", analysis)
    assert list(analysis)[0] == "schema_version" and analysis["model"] == "mnist_cnn"
    assert analysis["forward_flops"] == pytest.approx(sum(t["flops"] for t in analysis["op_types"].values()))


def test_step_script_plan(tmp_path, plan):
    done, out = run_step(tmp_path, MODAK_JOB=str(JOB), MODAK_COMMAND="plan")
    assert done.returncode == 0, done.stderr[-3000:]
    best = chosen(plan)
    assert out["choice"] == plan["choice"]
    assert out["runtime"] == best["runtime"]
    assert json.loads(out["parameters"]) == best["parameters"]
    assert float(out["predicted-step-seconds"]) == best["step_seconds"]
    assert out["exit-code"] == "0" and "error" not in out and "image" not in out
    assert json.loads((tmp_path / out["json-file"]).read_text()) == plan  # modak's JSON, kept for later steps
    summary = (tmp_path / "summary.md").read_text()
    assert f"### modak plan {JOB} (exit 0)" in summary and f"**choice**: `{plan['choice']}`" in summary


def _expression(text: str, inputs: dict[str, str], steps: dict[str, dict[str, str]]) -> str:
    """The few GitHub expressions action.yml may use: inputs.X, steps.ID.outputs.X, github.action_path."""

    def value(match: re.Match[str]) -> str:
        parts = match[1].split(".")
        if parts[0] == "inputs" and len(parts) == 2:
            return inputs[parts[1]]
        if parts[0] == "steps" and len(parts) == 4 and parts[2] == "outputs":
            return steps.get(parts[1], {}).get(parts[3], "")
        if parts == ["github", "action_path"]:
            return str(ROOT)
        raise AssertionError(f"action.yml uses an expression this test cannot evaluate: {match[0]}")

    return _EXPR.sub(value, text)


def run_action(tmp_path: Path, inputs: dict[str, str]) -> tuple[int, dict[str, str]]:
    """Run action.yml's composite steps as GitHub's runner does (bash -eo pipefail, GITHUB_OUTPUT per step)."""
    action = yaml.safe_load((ROOT / "action.yml").read_text())
    assert action["runs"]["using"] == "composite"
    missing = [k for k, v in action["inputs"].items() if v.get("required") and k not in inputs]
    assert not missing, f"required inputs not given: {missing}"
    values = {k: str(v.get("default", "")) for k, v in action["inputs"].items()} | inputs
    steps: dict[str, dict[str, str]] = {}
    for number, step in enumerate(action["runs"]["steps"]):
        assert step["shell"] == "bash"
        output = tmp_path / f"github-output-{number}"
        output.write_text("")
        script = tmp_path / f"step-{number}.sh"
        script.write_text(_expression(step["run"], values, steps))
        env = base_env(tmp_path) | {"GITHUB_ACTION_PATH": str(ROOT), "GITHUB_OUTPUT": str(output),
                                    "GITHUB_WORKSPACE": str(tmp_path)}
        env |= {k: _expression(str(v), values, steps) for k, v in step.get("env", {}).items()}
        done = subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", str(script)], cwd=tmp_path,
                              env=env, capture_output=True, text=True, timeout=900)
        assert done.returncode == 0, f"step {step.get('name')}: {done.stderr[-3000:]}"
        if "id" in step:
            steps[step["id"]] = read_outputs(output)
    outputs = {k: _expression(v["value"], values, steps) for k, v in action["outputs"].items()}
    return 0, outputs


def test_github_action_render(tmp_path, plan):
    _, out = run_action(tmp_path, {"job": str(JOB), "command": "render", "output-dir": "rendered"})
    assert {"choice", "image", "predicted-step-seconds"} <= set(out)
    assert out["choice"] == plan["choice"]
    assert out["runtime"] == chosen(plan)["runtime"]
    assert float(out["predicted-step-seconds"]) == chosen(plan)["step_seconds"]
    assert json.loads(out["parameters"]) == chosen(plan)["parameters"]
    assert out["output-dir"] == str(tmp_path / "rendered")
    files = json.loads(out["files"])
    assert sorted(Path(f).name for f in files) == ["Dockerfile", "Singularity.def", "entrypoint.sh", "job.sh",
                                                   "plan.json"]
    assert all(Path(f).is_file() for f in files)
    assert json.loads((tmp_path / "rendered" / "plan.json").read_text()) == plan
    rendered = json.loads((tmp_path / out["json-file"]).read_text())
    assert_valid("render.schema.json", rendered)
    # The reference a build would tag: written into the rendered job script too.
    assert out["image"] == rendered["image"] and out["image"] in (tmp_path / "rendered" / "job.sh").read_text()
    assert out["verdict"] == ""  # verdict is check's


def test_gitlab_template_render(tmp_path, plan):
    template = yaml.safe_load(GITLAB.read_text())
    job = template[".modak"]
    variables = {k: str(v) for k, v in job["variables"].items()} | {"MODAK_JOB": str(JOB), "MODAK_COMMAND": "render"}
    # GitLab's shell runner: one bash session, `set -eo pipefail`, before_script then script lines
    lines = [*job.get("before_script", []), *job["script"]]
    script = tmp_path / "gitlab-job.sh"
    script.write_text("set -eo pipefail\n" + "\n".join(lines) + "\n")
    env = base_env(tmp_path) | variables
    done = subprocess.run(["bash", str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"modak-step: modak render {JOB} --json -o modak-out" in done.stderr

    dotenv = job["artifacts"]["reports"]["dotenv"]
    assert dotenv == variables["MODAK_DOTENV"]
    lines = (tmp_path / dotenv).read_text().splitlines()
    assert all(re.fullmatch(r"MODAK_[A-Z0-9_]+=[^\n]*", line) for line in lines), lines
    report = dict(line.split("=", 1) for line in lines)
    assert report["MODAK_CHOICE"] == plan["choice"]
    assert report["MODAK_RUNTIME"] == chosen(plan)["runtime"]
    assert float(report["MODAK_PREDICTED_STEP_SECONDS"]) == chosen(plan)["step_seconds"]
    assert report["MODAK_RESULT_DIR"] == str(tmp_path / "modak-out")
    assert report["MODAK_EXIT_CODE"] == "0"
    assert "MODAK_OUTPUT_DIR" not in report and "MODAK_JSON_FILE" not in report  # the template's own inputs
    for pattern in job["artifacts"]["paths"]:  # what GitLab would upload exists
        expanded = pattern.replace("${MODAK_OUTPUT_DIR}", variables["MODAK_OUTPUT_DIR"])
        assert list(tmp_path.glob(expanded.rstrip("/"))), expanded
    assert json.loads((tmp_path / "modak-out" / "plan.json").read_text()) == plan


def test_step_script_reports_modaks_error_and_exit_code(tmp_path):
    bad = tmp_path / "job.yaml"
    bad.write_text(JOB.read_text().replace("batch_size: 64", "batch_sise: 64"))
    shutil.copy(EXAMPLE / "target.yaml", tmp_path / "target.yaml")
    done, out = run_step(tmp_path, MODAK_JOB=str(bad), MODAK_COMMAND="render")
    assert done.returncode == 2
    assert out["exit-code"] == "2"
    line = bad.read_text().splitlines().index("  batch_sise: 64") + 1
    assert out["error"] == f"modak: error: {bad}:{line}: model.batch_sise: unknown field; did you mean 'batch_size'?"
    assert "choice" not in out
    assert not (tmp_path / "modak-out").exists()  # nothing written on bad input


def test_step_script_check_regression(tmp_path, plan):
    faster = json.loads(json.dumps(plan))
    chosen(faster)["step_seconds"] = chosen(plan)["step_seconds"] / 1.25
    (tmp_path / "base line.json").write_text(json.dumps(faster))
    done, out = run_step(tmp_path, MODAK_JOB=str(JOB), MODAK_COMMAND="check",
                         MODAK_EXTRA_ARGS="--baseline 'base line.json' --threshold 0.1")
    assert done.returncode == 9, done.stderr[-3000:]
    assert out["exit-code"] == "9" and out["verdict"] == "regression"
    assert out["choice"] == plan["choice"]
    assert out["message"].startswith("REGRESSION mnist-cnn on local-cpu: predicted step") and "+25.0%" in out["message"]
    assert_valid("check.schema.json", json.loads((tmp_path / "modak-check.json").read_text()))


@pytest.mark.engine
def test_step_script_build_with_podman(tmp_path, plan):
    """`command=build`: a real Podman build of the CPU example (under its own name, removed afterwards)."""
    job = tmp_path / "job.yaml"
    job.write_text(JOB.read_text().replace("name: mnist-cnn", "name: modak-ci-step"))
    shutil.copy(EXAMPLE / "target.yaml", tmp_path / "target.yaml")
    done, out = run_step(tmp_path, MODAK_JOB=str(job), MODAK_COMMAND="build", MODAK_ENGINE="podman",
                         MODAK_OUTPUT_DIR="image")
    built = json.loads((tmp_path / "modak-build.json").read_text()) if (tmp_path / "modak-build.json").stat().st_size \
        else {}
    try:
        assert done.returncode == 0, done.stderr[-3000:]
        assert_valid("build.schema.json", built)
        runtime = chosen(plan)["runtime"]
        assert out["image"] == built["image"]["ref"]
        assert out["image"].startswith(f"localhost/modak/modak-ci-step:{runtime}-")
        assert out["image-digest"] == built["image"]["id"] and out["image-digest"].startswith("sha256:")
        assert out["choice"] == plan["choice"] and out["runtime"] == runtime  # same plan under another name
        assert float(out["predicted-step-seconds"]) == pytest.approx(chosen(plan)["step_seconds"], rel=1e-5)
        assert built["smoke_test"]["status"] == "ok" and built["smoke_test"]["runtime"] == runtime
        assert str(tmp_path / "image" / "job.sh") in json.loads(out["files"])
        assert subprocess.run(["podman", "image", "exists", out["image"]]).returncode == 0
    finally:
        if built.get("image", {}).get("ref"):
            subprocess.run(["podman", "rmi", "--force", built["image"]["ref"]], capture_output=True)
