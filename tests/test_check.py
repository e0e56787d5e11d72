"""`modak check`: the CI regression gate against a stored baseline (predicted and measured step time)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from jsonschema import Draft202012Validator
from referencing import Registry, Resource

from modak import errors
from modak.cli import main
from modak.documents.check import BASELINE_KIND

ROOT = Path(__file__).resolve().parent.parent
JOB = ROOT / "examples" / "mnist-cnn-cpu" / "job.yaml"
SCHEMAS = ROOT / "modak" / "schemas"


def validator(name: str) -> Draft202012Validator:
    schemas = [json.loads(p.read_text()) for p in SCHEMAS.glob("*.schema.json")]
    registry = Registry().with_resources([(s["$id"], Resource.from_contents(s)) for s in schemas])
    return Draft202012Validator(json.loads((SCHEMAS / name).read_text()), registry=registry)


def assert_valid(name: str, document: object) -> None:
    problems = [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator(name).iter_errors(document)]
    assert not problems, f"{name}: " + "; ".join(problems[:5])


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.fixture(scope="module")
def plan() -> dict:
    """The real `modak plan --json` of the bundled CPU example."""
    done = subprocess.run([sys.executable, "-m", "modak", "plan", str(JOB), "--json"], capture_output=True, text=True,
                          check=True)
    return json.loads(done.stdout)


def chosen(plan: dict) -> dict:
    return next(c for c in plan["candidates"] if c["name"] == plan["choice"])


def test_exit_code_is_documented_and_distinct():
    codes = {name: value for name, value in vars(errors).items() if name.startswith("EXIT_")}
    assert errors.EXIT_REGRESSION == 9
    assert list(codes.values()).count(9) == 1, codes
    assert "| 9 |" in (ROOT / "docs" / "json-output.md").read_text()


def test_update_writes_a_baseline_then_the_same_plan_passes(tmp_path, capsys, plan):
    baseline = tmp_path / "ci" / "baseline.json"
    code, out, _ = run(capsys, "check", JOB, "--baseline", baseline, "--update")
    assert code == 0
    assert out.startswith(f"UPDATED mnist-cnn on local-cpu: new baseline {baseline} (predicted ")
    written = json.loads(baseline.read_text())
    assert_valid("check-baseline.schema.json", written)
    assert written["kind"] == BASELINE_KIND
    assert written["choice"] == plan["choice"]
    assert written["predicted_step_seconds"] == chosen(plan)["step_seconds"]
    assert written["runtime"] == chosen(plan)["runtime"]
    assert written["measured_step_seconds"] is None

    code, out, _ = run(capsys, "check", JOB, "--baseline", baseline)
    assert code == 0
    first, *rest = out.splitlines()
    assert first.startswith("PASS mnist-cnn on local-cpu: predicted step ")
    assert "(+0.0%) within threshold 10%" in first
    table = "\n".join(rest)
    assert "predicted step" in table and "ok" in table
    assert f"choice: {plan['choice']} (unchanged)" in out


def test_plan_json_is_a_baseline_and_a_slower_prediction_fails_with_exit_9(tmp_path, capsys, plan):
    # `modak plan --json` output as the baseline, as if the choice used to be predicted 20% faster.
    faster = json.loads(json.dumps(plan))
    step = chosen(plan)["step_seconds"]
    chosen(faster)["step_seconds"] = step / 1.2
    baseline = tmp_path / "plan.json"
    baseline.write_text(json.dumps(faster))

    code, out, err = run(capsys, "check", JOB, "--baseline", baseline, "--json")
    assert code == errors.EXIT_REGRESSION == 9
    result = json.loads(out)
    assert_valid("check.schema.json", result)
    assert result["verdict"] == "regression"
    predicted = result["comparisons"][0]
    assert predicted["metric"] == "predicted_step_seconds" and predicted["status"] == "regressed"
    assert predicted["current"] == step and predicted["change"] == pytest.approx(0.2, abs=1e-4)
    assert result["comparisons"][1]["status"] == "not compared"  # no measurements on either side
    assert err.startswith("REGRESSION mnist-cnn on local-cpu: predicted step") and "exceeds threshold 10%" in err
    assert result["message"] == err.strip()
    assert not result["updated"] and json.loads(baseline.read_text()) == faster  # nothing written

    # the same change within a looser threshold passes; --update accepts it and rewrites the baseline
    code, out, _ = run(capsys, "check", JOB, "--baseline", baseline, "--threshold", "0.25")
    assert code == 0 and out.startswith("PASS ")
    code, out, _ = run(capsys, "check", JOB, "--baseline", baseline, "--update", "--json")
    assert code == 0
    result = json.loads(out)
    assert result["verdict"] == "regression" and result["updated"]
    assert json.loads(baseline.read_text())["predicted_step_seconds"] == step


@pytest.mark.slow
def test_measured_times_from_bench_json(tmp_path, capsys, plan):
    """A real (short) `modak bench --json` of the chosen candidate is the measured side."""
    done = subprocess.run([sys.executable, "-m", "modak", "bench", str(JOB), "--candidates", plan["choice"],
                           "--launches", "1", "--min-seconds", "0.2", "--budget", "1",
                           "--store", str(tmp_path / "perf.sqlite"), "--json"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = json.loads(done.stdout)
    assert_valid("bench.schema.json", rows)
    assert len(rows) == 1 and rows[0]["status"] == "ok", rows
    measured = tmp_path / "bench.json"
    measured.write_text(done.stdout)

    baseline = tmp_path / "baseline.json"
    code, out, _ = run(capsys, "check", JOB, "--baseline", baseline, "--measured", measured, "--update", "--json")
    assert code == 0
    result = json.loads(out)
    assert_valid("check.schema.json", result)
    assert result["current"]["measured_step_seconds"] == rows[0]["step_median_s"]
    assert result["current"]["measured_candidate"] == plan["choice"]
    assert json.loads(baseline.read_text())["measured_step_seconds"] == rows[0]["step_median_s"]

    # 50% slower measurement, same prediction: the measured comparison fails the check
    slower = [dict(rows[0], step_median_s=rows[0]["step_median_s"] * 1.5)]
    (tmp_path / "slower.json").write_text(json.dumps(slower))
    code, out, err = run(capsys, "check", JOB, "--baseline", baseline, "--measured", tmp_path / "slower.json",
                         "--json")
    assert code == 9
    result = json.loads(out)
    status = {c["metric"]: c["status"] for c in result["comparisons"]}
    assert status == {"predicted_step_seconds": "ok", "measured_step_seconds": "regressed"}
    assert "measured step" in err and "+50.0%" in err

    # without --measured only the prediction is compared, and a note says so
    code, out, _ = run(capsys, "check", JOB, "--baseline", baseline)
    assert code == 0
    assert "no --measured FILE was given" in out


def test_update_replaces_the_baseline_of_another_job(tmp_path, capsys, plan):
    baseline = tmp_path / "baseline.json"
    baseline.write_text(json.dumps(dict(plan, job="resnet50")))
    code, out, _ = run(capsys, "check", JOB, "--baseline", baseline, "--update", "--json")
    assert code == 0
    result = json.loads(out)
    assert result["verdict"] == "updated" and result["baseline"] is None and result["comparisons"] == []
    assert result["notes"] == ["replaced the baseline of job 'resnet50' on target 'local-cpu'"]
    assert json.loads(baseline.read_text())["job"] == "mnist-cnn"


@pytest.mark.parametrize("case", ["missing", "other-job", "not-json", "threshold", "bad-measured"])
def test_bad_input_exits_2_with_one_line(tmp_path, capsys, plan, case):
    baseline = tmp_path / "baseline.json"
    argv = ["check", JOB, "--baseline", baseline]
    if case == "other-job":
        baseline.write_text(json.dumps(dict(plan, job="resnet50")))
        expected = f"{baseline}: is the baseline of job 'resnet50' on target 'local-cpu'"
    elif case == "not-json":
        baseline.write_text("{\n  nope")
        expected = f"{baseline}:2: not JSON"
    elif case == "threshold":
        baseline.write_text(json.dumps(plan))
        argv += ["--threshold", "-0.1"]
        expected = "--threshold must be 0 or more"
    elif case == "bad-measured":
        baseline.write_text(json.dumps(plan))
        (tmp_path / "m.json").write_text(json.dumps({"not": "rows"}))
        argv += ["--measured", tmp_path / "m.json"]
        expected = "expected the output of `modak bench --json`"
    else:
        expected = f"{baseline}: no such baseline file"
    code, out, err = run(capsys, *argv)
    assert code == 2
    assert out == ""
    assert err.startswith("modak: error: ") and expected in err and err.count("\n") == 1, err
