"""`modak build` measures before it chooses (#66 item 4): where the target is this machine, a race of the predicted
best of each runtime and precision within a budget; the plan, its JSON and the image's labels say whether the choice
was measured or predicted."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from modak import api
from modak.bench.tune import MEASURE_BUDGET_S, each_runtime, measure_budget
from modak.errors import InputError
from modak.render.ir import build_description

ROOT = Path(__file__).resolve().parents[1]
CNN = ROOT / "examples" / "mnist-cnn-cpu" / "job.yaml"  # its target: cpu: local


@pytest.fixture(scope="module")
def plan():
    return api.plan_job(CNN)


def test_the_shortlist_is_the_predicted_best_of_each_runtime_and_precision(plan) -> None:
    finalists = each_runtime(plan, 8, 600.0)
    groups = [(c.runtime, c.device, c.precision) for c in finalists]
    assert len(groups) == len(set(groups)) >= 3
    for candidate in finalists:
        if plan.stock is not None and candidate == plan.stock.candidate:
            continue
        same = [r for r in plan.ranked if (r.candidate.runtime, r.candidate.device, r.candidate.precision)
                == (candidate.runtime, candidate.device, candidate.precision)]
        assert candidate == min(same, key=lambda r: r.objective_seconds).candidate
    slow = [r for r in plan.ranked if r.prediction.compile_seconds > 2.0]
    assert slow, "the example has no candidate whose predicted compile time exceeds half of a 4 s budget"
    assert not {r.candidate for r in slow} & set(each_runtime(plan, 8, 4.0))
    assert len(each_runtime(plan, 2, 600.0)) == 2


def test_without_a_race_the_choice_is_predicted_and_says_why(plan, tmp_path: Path) -> None:
    assert plan.loaded.here and plan.tuned is None
    assert plan.chosen_by == plan.to_dict()["chosen_by"] == "predicted"
    labels = dict(build_description(plan).labels)
    assert labels["io.modak.chosen-by"] == "predicted"
    off = api.measure_choice(plan, 0.0, tmp_path / "perf.sqlite")
    assert off.race is None and "no measurement budget" in off.summary
    job = yaml.safe_load(CNN.read_text())
    target = yaml.safe_load((CNN.parent / "target.yaml").read_text())
    elsewhere = {**target, "name": "elsewhere", "cpu": {"microarchitecture": "zen4", "cores_per_socket": 2},
                 "memory": {"size_gb": 16}}
    (tmp_path / "target.yaml").write_text(yaml.safe_dump(elsewhere))
    (tmp_path / "job.yaml").write_text(yaml.safe_dump({**job, "target": "target.yaml"}))
    other = api.plan_job(tmp_path / "job.yaml")
    assert not other.loaded.here
    result = api.measure_choice(other, 60.0, tmp_path / "perf.sqlite")
    assert result.race is None and "target 'elsewhere' is not this machine" in result.summary
    assert not (tmp_path / "perf.sqlite").exists()


@pytest.mark.parametrize(("value", "expected"), [(None, MEASURE_BUDGET_S), ("", MEASURE_BUDGET_S), ("0", 0.0),
                                                 ("12.5", 12.5)])
def test_the_default_budget_comes_from_the_environment(value: str | None, expected: float) -> None:
    assert measure_budget({} if value is None else {"MODAK_MEASURE_BUDGET": value}) == expected


@pytest.mark.parametrize("value", ["a minute", "-1", "inf", "nan"])
def test_a_bad_budget_is_refused(value: str) -> None:
    with pytest.raises(InputError, match="MODAK_MEASURE_BUDGET"):
        measure_budget({"MODAK_MEASURE_BUDGET": value})


def test_a_negative_budget_flag_is_exit_2(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "modak", "build", str(CNN), "-o", str(tmp_path / "out"),
                           "--measure-budget", "-5"], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 2 and "--measure-budget takes seconds" in done.stderr, done.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_the_build_races_here_records_the_winner_and_the_plan_then_chooses_it(plan, tmp_path: Path) -> None:
    store = tmp_path / "perf.sqlite"
    launched: list[str] = []
    measured = api.measure_choice(plan, 20.0, store, on_launch=lambda c, r: launched.append(c.name))
    race = measured.race
    assert race is not None and race.recorded is not None, measured.summary
    assert list(race.shortlist) == [c.name for c in each_runtime(plan, 8, 20.0)]
    assert set(launched) == set(race.shortlist) and race.rounds >= 1
    assert measured.summary.startswith(f"chosen by measurement: {race.winner} of {len(race.shortlist)} ")
    again = api.plan_job(CNN, store=store)
    assert again.tuned is not None and again.choice.candidate.name == race.winner
    assert again.chosen_by == "measured" and again.to_dict()["chosen_by"] == "measured"
    assert "in `modak build`" in again.tuned.summary and any("modak build" in r for r in again.reasons)
    labels = dict(build_description(again).labels)
    assert labels["io.modak.chosen-by"] == "measured"
    assert json.loads(labels["io.modak.tuned"])["step-seconds"] == again.tuned.step_s
    repeat = api.measure_choice(again, 20.0, store)
    assert repeat.race is None and repeat.summary.startswith("chosen by measurement on ")
