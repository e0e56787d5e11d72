"""`modak tune`: racing on a fixed synthetic timing source, the recorded winner reaching `modak plan` and the
build's labels, and a real (short) race through the command line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from modak.api import load as load_job
from modak.bench.dispatch import LaunchTask
from modak.bench.harness import BenchSettings
from modak.bench.tune import TuneSettings, shortlist, tune
from modak.measurements.store import PerfStore
from modak.plan import make_plan, workload_identity, worth_tuning
from modak.workload.source import load_analysis

ROOT = Path(__file__).resolve().parents[1]
CNN = ROOT / "examples" / "mnist-cnn-cpu" / "job.yaml"
SEEDED = BenchSettings(seed=1)  # the rounds' order, hence which synthetic draw each candidate gets, is fixed


class SyntheticDispatcher:
    """Launch results from fixed true step times with seeded multiplicative noise per launch (one level, or one per
    candidate) and a drift shared by every launch of a round (what interleaving cancels)."""

    def __init__(self, true_seconds: dict[str, float], noise: float | dict[str, float], drift: float = 0.0,
                 seed: int = 0) -> None:
        self.true_seconds, self.noise, self.drift = true_seconds, noise, drift
        self.rng = np.random.default_rng(seed)
        self.launched: list[str] = []

    def run(self, tasks: list[LaunchTask]) -> list[dict]:
        shared = float(np.exp(self.rng.normal(0, self.drift)))
        results = []
        for task in tasks:
            self.launched.append(task.name)
            noise = self.noise[task.name] if isinstance(self.noise, dict) else self.noise
            step = self.true_seconds[task.name] * shared * float(np.exp(self.rng.normal(0, noise)))
            results.append({"status": "ok", "step_median_s": step, "step_p10_s": step * 0.98,
                            "step_p90_s": step * 1.02, "repeats": 100, "threads": 2, "compile_s": 0.1,
                            "contention": {"cpus": 2, "other_cores": 0.0, "steal_cores": 0.0}})
        return results


@pytest.fixture(scope="module")
def plan():
    loaded = load_job(CNN)
    return make_plan(loaded, *load_analysis(loaded))


def finalists(plan, count: int = 4) -> list[str]:
    return [c.name for c in shortlist(plan, count)]


def test_shortlist_is_top_overlapping_and_stock(plan):
    worth = worth_tuning(plan)
    ranked = sorted(plan.ranked, key=lambda r: r.objective_seconds)
    assert worth[:3] == ranked[:3] and plan.stock in worth
    leader = ranked[0].prediction
    assert all(r in worth for r in ranked if r.prediction.low_seconds < leader.high_seconds)
    assert len(shortlist(plan, 2)) == 2 and shortlist(plan, 2)[-1] == plan.stock.candidate
    assert json.loads(json.dumps(plan.to_dict()))["worth_tuning"] == [r.candidate.name for r in worth]


def test_race_drops_the_confidently_slower_and_declares_a_confident_winner(plan, tmp_path):
    names = finalists(plan)
    true = dict(zip(names, (2e-3, 2.5e-3, 3e-3, 10e-3)))
    dispatcher = SyntheticDispatcher(true, noise=0.02, drift=0.2)
    with PerfStore(tmp_path / "perf.sqlite") as store:
        result = tune(plan, store, TuneSettings(budget_s=600, trials=4, min_rounds=3, max_rounds=8,
                                                protocol=BenchSettings(seed=1)), dispatcher)
        rows = store.rows()
        recorded = store.tuned(plan.loaded.target.name, workload_identity(plan.loaded, plan.workload))
    assert result.winner == names[0] and result.confident and result.rounds == 3
    assert "confidently slower" in result.stopped
    assert [s.status for s in result.standings] == ["winner"] + ["dropped after 3 rounds"] * 3
    assert dispatcher.launched.count(names[0]) == 3 and len(dispatcher.launched) == 12
    assert len(rows) == 4 and all(r.launches == 3 and r.protocol == 2 and r.status == "ok" for r in rows)
    assert len({r.session for r in rows}) == 1
    assert recorded is not None and recorded.candidate == names[0] and recorded.confident
    assert recorded.ci_low_s <= recorded.step_s <= recorded.ci_high_s


def test_race_between_equals_ends_on_the_budget_without_confidence(plan, tmp_path):
    names = finalists(plan, 2)
    dispatcher = SyntheticDispatcher({names[0]: 2e-3, names[1]: 2.01e-3}, noise=0.05, drift=0.1, seed=3)
    with PerfStore(tmp_path / "perf.sqlite") as store:
        result = tune(plan, store, TuneSettings(trials=2, min_rounds=3, max_rounds=5, protocol=SEEDED), dispatcher)
    assert result.rounds == 5 and not result.confident and result.winner in names
    loser = next(s for s in result.standings if s.name != result.winner)
    assert loser.status == "tied with the winner" and loser.versus_winner.low < 1 < loser.versus_winner.high


def test_budget_stops_before_a_round_that_would_not_fit(plan, tmp_path):
    import time

    class Slow(SyntheticDispatcher):
        def run(self, tasks):
            time.sleep(0.3)
            return super().run(tasks)

    names = finalists(plan, 2)
    with PerfStore(tmp_path / "perf.sqlite") as store:
        result = tune(plan, store, TuneSettings(budget_s=0.5, trials=2, protocol=SEEDED),
                      Slow({n: 1e-3 for n in names}, 0.01))
    assert result.rounds == 1 and "budget" in result.stopped and not result.confident


def test_failed_candidate_leaves_the_race_and_is_reported(plan, tmp_path):
    names = finalists(plan, 3)

    class Failing(SyntheticDispatcher):
        def run(self, tasks):
            results = super().run(tasks)
            return [{"status": "error", "error": "boom"} if t.name == names[1] else r for t, r in zip(tasks, results)]

    with PerfStore(tmp_path / "perf.sqlite") as store:
        result = tune(plan, store, TuneSettings(trials=3, max_rounds=3, protocol=SEEDED),
                      Failing({n: t for n, t in zip(names, (1e-3, 1e-3, 5e-3))}, 0.01))
        failed = store.rows(status="error")
    assert next(s for s in result.standings if s.name == names[1]).status == "failed: boom"
    assert len(failed) == 1 and failed[0].launches == 1 and result.winner == names[0]


def test_tuned_winner_reaches_the_plan_and_the_image_labels(plan, tmp_path):
    """The recorded winner becomes the plan's choice, with the reason, and the build's labels say so."""
    from modak import api
    from modak.render.ir import build_description

    names = finalists(plan)
    slow_pick = names[2]  # not the model's choice: the measurement decides
    true = {n: (1e-3 if n == slow_pick else 4e-3) for n in names}
    store_path = tmp_path / "perf.sqlite"
    with PerfStore(store_path) as store:
        tune(plan, store, TuneSettings(trials=4, protocol=SEEDED), SyntheticDispatcher(true, 0.01))
    tuned = api.plan_job(CNN, store=store_path)
    assert tuned.choice.candidate.name == slow_pick and tuned.tuned.candidate == slow_pick
    assert (tuned.reasons[0].startswith(f"chose {slow_pick}: tuned on ")
            and "confidently the fastest" in tuned.reasons[0])
    assert tuned.reasons[1].startswith(f"the model predicted for it: {slow_pick}: predicted ")
    assert tuned.to_dict()["tuned"]["candidate"] == slow_pick
    labels = dict(build_description(tuned).labels)
    assert labels["io.modak.runtime"] == tuned.choice.candidate.runtime
    assert json.loads(labels["io.modak.tuned"])["confident"] is True
    untuned = api.plan_job(CNN, store=tmp_path / "empty.sqlite")
    assert untuned.tuned is None and "io.modak.tuned" not in dict(build_description(untuned).labels)


@pytest.mark.slow
def test_a_candidate_whose_output_failed_the_check_here_is_never_chosen(plan, tmp_path):
    """An ``incorrect`` row of this workload on this target keeps its candidate ranked (last) but out of the choice and
    of ``modak tune``'s shortlist; a later row of the same configuration that passes lifts the bar; every candidate
    failing is an input error."""
    from modak import api
    from modak.bench.harness import measurement_row
    from modak.plan import NoCandidate

    store_path = tmp_path / "perf.sqlite"
    before = api.plan_job(CNN, store=store_path)
    wrong = before.choice.candidate
    failed = {"status": "incorrect", "max_abs_error": 0.0113,
              "error": "output differs from the fp32 reference by 0.0113 (relative), tolerance 0.001"}
    with PerfStore(store_path) as store:
        store.add([measurement_row(before, wrong, failed)])
    after = api.plan_job(CNN, store=store_path)
    barred = next(r for r in after.ranked if r.candidate == wrong)
    assert after.choice.candidate != wrong and after.ranked[-1] is barred and "0.0113" in barred.failed_check
    assert wrong not in [r.candidate for r in worth_tuning(after)] and wrong not in shortlist(after, 10)
    assert any(r.startswith("never chosen: 1 candidate(s)") and wrong.name in r for r in after.reasons)
    assert next(c for c in after.to_dict()["candidates"] if c["name"] == wrong.name)["failed_check"]
    with PerfStore(store_path) as store:  # measured again, and right: the same configuration's row is replaced
        store.add([measurement_row(before, wrong, {"status": "ok", "step_median_s": 0.002, "repeats": 5})])
    assert next(r for r in api.plan_job(CNN, store=store_path).ranked if r.candidate == wrong).failed_check is None
    with PerfStore(store_path) as store:
        store.add([measurement_row(before, r.candidate, failed) for r in before.ranked])
    with pytest.raises(NoCandidate, match="every candidate's output failed the reference check"):
        api.plan_job(CNN, store=store_path)


def tune_for_real(store: Path, *options: str) -> tuple[dict, list]:
    """`modak tune --json` of two candidates of the CNN example: its result and the rows it stored."""
    done = subprocess.run([sys.executable, "-m", "modak", "tune", str(CNN), "--trials", "2", "--min-seconds", "0.2",
                           "--store", str(store), "--json", *options], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    with PerfStore(store) as perf:
        return json.loads(done.stdout), perf.rows()


@pytest.mark.slow
def test_tune_command_races_for_real(tmp_path):
    """A short real race of two candidates through the command line: rows stored, winner recorded."""
    result, rows = tune_for_real(tmp_path / "perf.sqlite", "--race-budget", "120", "--max-rounds", "3", "--seed", "0")
    assert result["winner"] in result["shortlist"] and len(result["shortlist"]) == 2 and 1 <= result["rounds"] <= 3
    assert len(rows) == 2 and all(r.session == rows[0].session for r in rows)
    assert all(1 <= r.launches <= result["rounds"] for r in rows if r.status in ("ok", "contended"))


def test_max_rounds_below_the_rounds_before_a_drop_is_exit_2(tmp_path):
    """`--max-rounds` fewer than the rounds a candidate must run before it can be dropped is refused before any
    launch; the parser's documented default is the race's."""
    from modak.cli import _parser

    done = subprocess.run([sys.executable, "-m", "modak", "tune", str(CNN), "--max-rounds", "2", "--store",
                           str(tmp_path / "perf.sqlite")], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "--max-rounds must be at least 3" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr and not (tmp_path / "perf.sqlite").exists()
    settings = TuneSettings()
    help_text = next(a.help for a in _parser()._subparsers._group_actions[0].choices["tune"]._actions
                     if "--max-rounds" in a.option_strings)
    assert f"default {settings.max_rounds}; at least {settings.min_rounds}," in help_text


def test_tune_budget_is_a_deprecated_alias_of_race_budget(capsys):
    """`tune --budget` still sets the race's wall clock for one release, with a warning on stderr; `--race-budget`
    does without one, and `bench --budget` (seconds per launch) is unchanged."""
    from modak.cli import _parser

    assert _parser().parse_args(["tune", str(CNN), "--budget", "42"]).race_budget == 42.0
    warning = capsys.readouterr().err
    assert "--budget is deprecated" in warning and "use --race-budget" in warning
    assert _parser().parse_args(["tune", str(CNN), "--race-budget", "42"]).race_budget == 42.0
    assert _parser().parse_args(["tune", str(CNN)]).race_budget == 600.0
    assert _parser().parse_args(["tune", str(CNN), "--max-rounds", "3"]).max_rounds == 3
    assert _parser().parse_args(["bench", str(CNN), "--budget", "3"]).budget == 3.0
    assert capsys.readouterr().err == ""


@pytest.mark.slurm
@pytest.mark.skipif(not __import__("shutil").which("sbatch"), reason="Slurm's sbatch is not installed")
def test_tune_dispatches_rounds_as_slurm_job_arrays(tmp_path):
    """`--dispatch slurm`: every round runs as a job array on the real Slurm; rows and winner as locally."""
    result, rows = tune_for_real(tmp_path / "perf.sqlite", "--race-budget", "90", "--max-rounds", "3", "--dispatch",
                                 "slurm")
    assert result["winner"] in result["shortlist"] and 1 <= result["rounds"] <= 3
    assert len(rows) == 2 and all(r.launches >= 1 and r.step_median_s > 0 for r in rows)


def test_a_leader_not_confidently_faster_than_stock_does_not_replace_it(plan, tmp_path):
    """The stock guard, measured: 2% faster within 6% noise is not confidently faster, so stock is recorded."""
    names = finalists(plan, 2)
    stock = plan.stock.candidate.name
    other = next(n for n in names if n != stock)
    dispatcher = SyntheticDispatcher({other: 0.98e-3, stock: 1e-3}, noise=0.06, seed=5)
    with PerfStore(tmp_path / "perf.sqlite") as store:
        result = tune(plan, store, TuneSettings(trials=2, min_rounds=3, max_rounds=4, protocol=SEEDED), dispatcher)
    assert result.winner == stock and not result.confident
    assert result.recorded.candidate == stock and result.recorded.summary.startswith("kept the stock deployment")
    assert next(s for s in result.standings if s.name == other).status == "fastest, not confidently faster than stock"


def test_an_erratic_leader_gives_way_to_a_steady_candidate_confidently_faster_than_stock(plan, tmp_path):
    """The fastest by its center swings too much to be confidently faster than stock, but a candidate tied with it
    is: that one wins, not stock (a race of ResNet-34 on the CI VM kept stock at 1.65x of the best this way)."""
    names = finalists(plan, 3)
    stock = plan.stock.candidate.name
    erratic, steady = [n for n in names if n != stock][:2]
    true = {erratic: 0.6e-3, steady: 0.7e-3, stock: 1e-3}
    dispatcher = SyntheticDispatcher(true, noise={erratic: 0.6, steady: 0.02, stock: 0.02}, seed=0)
    with PerfStore(tmp_path / "perf.sqlite") as store:
        result = tune(plan, store, TuneSettings(trials=3, min_rounds=3, max_rounds=4, protocol=SEEDED), dispatcher)
    status = {s.name: s.status for s in result.standings}
    assert status[erratic] == "fastest, not confidently faster than stock"
    assert result.winner == steady and status[steady] == "winner (confidently faster than stock)"
    assert result.recorded.candidate == steady and "this one is" in result.recorded.summary
