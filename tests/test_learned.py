"""The learned model: it recovers a known utilization, answers only where data covers it, the plan falls back
to the roofline elsewhere and says so, and local rows outweigh shipped ones."""

from __future__ import annotations

import math
import statistics
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import msgspec
import pytest

from modak.api import load as load_job
from modak.batching import with_batch
from modak.bench.harness import measurement_row
from modak.candidates.catalog import Parameter, load_catalog
from modak.measurements.store import Measurement, PerfStore
from modak.plan import make_plan
from modak.predict.base import FallbackPredictor
from modak.predict.data import TrainingData
from modak.predict.evaluate import evaluate, score
from modak.predict.learned import (
    NEW_MACHINE_SPREAD,
    NEW_MODEL_SPREAD,
    SAME_KIND_SPREAD,
    TREES,
    Features,
    LearnedPredictor,
    ParameterFeature,
    example_from,
    example_from_row,
    fit_key,
    machine_kind,
    shrunk_offset,
)
from modak.predict.roofline import RooflinePredictor
from modak.predict.training import training_data
from modak.workload.source import load_analysis

ROOT = Path(__file__).resolve().parents[1]
CNN = ROOT / "examples" / "mnist-cnn-cpu" / "job.yaml"
# The "truth" of the synthetic data: each runtime reaches a fixed fraction of the roofline bound.
UTILIZATION = {"onnxruntime": 0.5, "openvino": 0.6, "pytorch": 0.1, "torch-compile": 0.3}
CATALOG = load_catalog()


@pytest.fixture(scope="module")
def plans():
    """Roofline plans of the CNN at three batch sizes (the candidates synthetic rows are made for)."""
    loaded = load_job(CNN)
    result = []
    for batch in (1, 8, 64):
        batch_loaded = with_batch(loaded, batch)
        result.append(make_plan(batch_loaded, *load_analysis(batch_loaded), RooflinePredictor()))
    return result


def synthetic_rows(plans, runtimes=tuple(UTILIZATION), model="mnist_cnn") -> list[Measurement]:
    rows = []
    for plan in plans:
        for ranked in plan.ranked:
            candidate = ranked.candidate
            if candidate.runtime not in runtimes:
                continue
            row = measurement_row(plan, candidate, {"status": "ok", "repeats": 5, "compile_s": 1.0})
            step = example_from_row(row, CATALOG).anchor_seconds / UTILIZATION[candidate.runtime]
            rows.append(replace(row, model=model, step_median_s=step, step_p10_s=step, step_p90_s=step))
    return rows


def test_learned_model_recovers_a_known_utilization(plans) -> None:
    model = LearnedPredictor.fit(synthetic_rows(plans))
    plan = plans[1]
    for ranked in plan.ranked[:12]:
        candidate = ranked.candidate
        if candidate.runtime not in UTILIZATION:
            continue
        example = example_from(plan.workload, plan.ceilings, candidate, CATALOG[candidate.runtime])
        step, low, high, compile_s, members = model.predict_examples([example])[0]
        assert step == pytest.approx(example.anchor_seconds / UTILIZATION[candidate.runtime], rel=0.15)
        assert low <= step <= high and compile_s == pytest.approx(1.0, rel=0.2)
        assert len(members) == TREES and min(members) <= low <= high <= max(members)


def test_plan_uses_learned_where_covered_and_roofline_elsewhere(plans) -> None:
    covered = ("onnxruntime", "pytorch")
    model = LearnedPredictor.fit(synthetic_rows(plans, covered))
    assert {(runtime, device) for runtime, device, _ in model.coverage} == {("onnxruntime", "cpu"), ("pytorch", "cpu")}
    plan = plans[2]
    replanned = make_plan(plan.loaded, plan.source, plan.workload, FallbackPredictor((model, RooflinePredictor())))
    used = {r.candidate.runtime: r.prediction.predictor for r in replanned.ranked}
    assert used["onnxruntime"] == used["pytorch"] == "learned"
    assert used["openvino"] == used["torch-compile"] == "roofline"
    learned_row = next(r for r in replanned.to_dict()["candidates"] if r["predictor"] == "learned")
    assert {"roofline_bound_s", "utilization", "compute_s"} <= set(learned_row["roofline"])
    assert any(reason.startswith("predictors: learned for onnxruntime, pytorch; roofline for")
               for reason in replanned.reasons)
    # The learned ranking follows the synthetic truth: onnxruntime (0.5) before pytorch (0.1).
    order = [r.candidate.runtime for r in replanned.ranked if r.candidate.runtime in covered]
    assert order.index("onnxruntime") < order.index("pytorch")


def test_uncovered_runtime_gets_no_learned_prediction(plans) -> None:
    model = LearnedPredictor.fit(synthetic_rows(plans, ("onnxruntime",)))
    tvm = next(r for r in plans[0].ranked if r.candidate.runtime == "tvm")
    assert model.predict(plans[0].workload, plans[0].ceilings, tvm.candidate, None) is None


def test_no_rows_is_an_error() -> None:
    with pytest.raises(ValueError):
        LearnedPredictor.fit([])


def test_local_rows_replace_and_outweigh_shipped(plans, tmp_path: Path, monkeypatch) -> None:
    shipped = synthetic_rows(plans[:1], ("onnxruntime",))
    local = [replace(r, step_median_s=r.step_median_s * 2) for r in shipped[:2]]
    monkeypatch.setattr("modak.predict.training.shipped_rows", lambda: shipped)
    store = tmp_path / "local.sqlite"
    with PerfStore(store) as perf:
        perf.add(local)
    rows, weights = training_data(store)
    assert len(rows) == len(shipped)  # the two local rows replaced their shipped twins
    assert sorted(weights)[-2:] == [3.0, 3.0] and rows[-1].step_median_s == local[-1].step_median_s


def test_leave_one_model_out_scores_held_out_rows(plans) -> None:
    rows = synthetic_rows(plans, model="mnist_cnn") + synthetic_rows(plans, model="cnn_twin")
    scores = {s.predictor: s for s in evaluate(rows) if s.split == "leave-one-model-out"}
    learned = scores["forest"]
    assert learned.split == "leave-one-model-out" and learned.rows == len(rows) and learned.uncovered == 0
    assert learned.mape < 0.15 and learned.kendall_tau_median > 0.5
    assert learned.hit_rate == 1.0 and learned.captured_median == 1.0 and learned.no_stock == 0


def test_scores_count_a_miss_and_interval_coverage(plans) -> None:
    """Four configurations of one workload measured at 1-4 ms (one launch each); the prediction takes the 4 ms
    one for the fastest, a miss; two of the four measured times lie in their interval."""
    measured = [1e-3, 2e-3, 3e-3, 4e-3]
    rows = [replace(row, step_median_s=t) for row, t in zip(synthetic_rows(plans[:1]), measured)]
    predicted = {0: 1e-3, 1: 2e-3, 2: 3e-3, 3: 0.5e-3}
    intervals = {0: (0.0, math.inf), 1: (4e-3, 6e-3), 2: (3e-3, 3e-3), 3: (0.0, 1e-3)}
    result = score("split", "test", rows, predicted, 1, intervals)
    assert result.interval_coverage == 0.5 and result.uncovered == 1 and result.workloads == 1
    assert (result.hit_rate, result.undecided, result.miss_rate, result.one_launch) == (0.0, 0.0, 1.0, 1)
    assert result.mape == pytest.approx(0.875 / 4)
    assert result.kendall_tau_median == pytest.approx(0.0)  # ranks 2,3,4,1 vs 1,2,3,4: 3 concordant, 3 not


@pytest.mark.slow
def test_model_eval_cli_reports_the_metrics(plans, tmp_path: Path) -> None:
    store = tmp_path / "perf.sqlite"
    with PerfStore(store) as perf:
        perf.add(synthetic_rows(plans, model="mnist_cnn") + synthetic_rows(plans, model="cnn_twin"))
    # Only the synthetic rows' machine scored (every shipped row still trains): a machine without kernel rows, so the
    # kernel model is not fit per fold (that evaluation has its own tests, tests/test_model_eval.py).
    machine = plans[0].loaded.target.name
    result = subprocess.run([sys.executable, "-m", "modak", "model", "eval", "--store", str(store), "--seeds", "2",
                             "--machine", machine], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert "leave-one-model-out" in result.stdout and "MAPE" in result.stdout and "hit rate" in result.stdout
    assert "forest over 2 seeds" in result.stdout and "family-held-out" in result.stdout


@pytest.mark.slow
def test_eval_of_one_machine_scores_only_its_rows(plans) -> None:
    """With ``machine``, only that target's rows are held out and scored; the other target's rows still train."""
    machine_a = synthetic_rows(plans, model="mnist_cnn") + synthetic_rows(plans, model="cnn_twin")
    machine_b = [replace(r, machine="b", bandwidth_gbs=r.bandwidth_gbs + 0.5) for r in machine_a]
    everything = {s.split: s for s in evaluate(machine_a + machine_b) if s.predictor == "forest"}
    only_b = {s.split: s for s in evaluate(machine_a + machine_b, machine="b") if s.predictor == "forest"}
    assert only_b["leave-one-model-out"].rows == len(machine_b) == everything["leave-one-model-out"].rows / 2
    assert only_b["leave-one-target-out"].rows == len(machine_b)
    assert only_b["leave-one-model-out"].workloads == everything["leave-one-model-out"].workloads / 2


def test_calibration_rows_from_a_new_machine_correct_its_predictions(plans) -> None:
    """Machine B is uniformly 2x slower than what machine A's data predicts; its rows at batch 1 and 8
    (a calibration run) must correct predictions for its held-out batch-64 rows, and leave A's alone."""
    machine_a = synthetic_rows(plans)
    machine_b = [replace(r, machine="b", bandwidth_gbs=r.bandwidth_gbs + 0.5, step_median_s=r.step_median_s * 2)
                 for r in synthetic_rows(plans)]
    calibration = [r for r in machine_b if r.batch_size in (1, 8)]
    held_out = [r for r in machine_b if r.batch_size == 64]

    def error(model: LearnedPredictor, rows: list[Measurement]) -> float:
        predicted = model.predict_examples([example_from_row(r, CATALOG) for r in rows])
        return sum(abs(p[0] - r.step_median_s) / r.step_median_s for p, r in zip(predicted, rows)) / len(rows)

    before = LearnedPredictor.fit(machine_a)
    after = LearnedPredictor.fit(machine_a + calibration)
    assert before.machine_offsets == {} and len(after.machine_offsets) == 1
    assert error(before, held_out) > 0.4 and error(after, held_out) < 0.15
    assert error(after, machine_a) < 0.1  # the reference machine's predictions do not move


def test_machine_offset_needs_workloads_that_agree() -> None:
    """One workload cannot tell a machine's offset from its own error; agreeing workloads give (nearly) their
    mean; workloads whose errors scatter around a small mean give nothing."""
    assert shrunk_offset([0.7]) == 0.0
    assert shrunk_offset([0.69, 0.70, 0.68, 0.69]) == pytest.approx(0.69, abs=0.02)
    assert shrunk_offset([0.3, -0.2, 0.25, -0.15]) == 0.0
    spread2 = (2 * 0.24 ** 2 + 1 * 0.02) / 3  # two workloads at 0.2 and 0.4: prior spread pooled with theirs
    assert shrunk_offset([0.2, 0.4]) == pytest.approx(0.3 * (1 - spread2 / (2 * 0.09)))


def test_one_calibration_workload_moves_no_offset(plans) -> None:
    machine_a = synthetic_rows(plans)
    one_workload = [replace(r, machine="b", bandwidth_gbs=r.bandwidth_gbs + 0.5, step_median_s=r.step_median_s * 2)
                    for r in synthetic_rows(plans[:1])]
    assert len({example_from_row(r, CATALOG).workload for r in one_workload}) == 1
    assert list(LearnedPredictor.fit(machine_a + one_workload).machine_offsets.values()) == [0.0]


def test_an_unseen_machine_or_model_widens_the_interval_not_the_prediction(plans) -> None:
    """On a machine the model has rows of two workloads or more, the interval is the trees' spread; on one it has
    none (or one workload: no offset), the same step time with NEW_MACHINE_SPREAD added in log, in quadrature; on
    another probe of a known machine kind, SAME_KIND_SPREAD; for a model graph it has no rows of, on a machine it
    knows, NEW_MODEL_SPREAD; a new model on another probe of a known kind, both."""
    machine_a = [replace(r, microarchitecture="zen3") for r in synthetic_rows(plans)]  # a kind (x86_64_v4 is none)
    one_workload = [replace(r, machine="b", bandwidth_gbs=r.bandwidth_gbs + 0.5) for r in synthetic_rows(plans[:1])]
    model = LearnedPredictor.fit(machine_a + one_workload)
    row = machine_a[-1]
    seen = example_from_row(row, CATALOG)
    reprobed = replace(seen, machine=("cpu", seen.cores, 1.0, 1.0))
    unseen = replace(reprobed, kind=("cpu", "zen2", seen.cores, True))
    assert seen.kind == ("cpu", "zen3", row.cores, True) and model.knows_kind(reprobed)
    assert list(model.known_machines) == [seen.machine] and not model.knows_kind(unseen)
    new_graph = replace(seen, parameters=seen.parameters + 1)
    assert new_graph.graph not in model.known_models and seen.graph in model.known_models
    cases = (unseen, reprobed, new_graph, replace(reprobed, parameters=seen.parameters + 1))
    spreads = [(NEW_MACHINE_SPREAD, 0.0, 0.0), (0.0, SAME_KIND_SPREAD, 0.0), (0.0, 0.0, NEW_MODEL_SPREAD),
               (0.0, SAME_KIND_SPREAD, NEW_MODEL_SPREAD)]
    assert [model.unseen_spread(e) for e in (seen, *cases)] == [(0.0, 0.0, 0.0), *spreads]
    (step, low, high, _, members), *others = model.predict_examples([seen, *cases])
    for (step_u, low_u, high_u, _, members_u), spread in zip(others, spreads):
        assert members_u == members and step_u == pytest.approx(step, rel=1e-9)
        z = statistics.NormalDist().inv_cdf(0.9) * math.hypot(*spread)
        assert math.log(high_u / step) == pytest.approx(math.hypot(math.log(high / step), z))
        assert math.log(step / low_u) == pytest.approx(math.hypot(math.log(step / low), z))


def test_another_probe_of_a_known_machine_takes_no_offset(plans) -> None:
    """Machine B (2x slower than A's data says: an offset learned from its rows) probed again with other ceilings:
    of B's kind, but the offset corrected B's old ceilings, so the prediction is that of a new machine with the new
    ceilings (no offset), with the narrower same-kind interval; a machine of a generic architecture level (archspec's
    x86_64_v4, which many CPUs share) is of no kind."""
    machine_a = synthetic_rows(plans)
    machine_b = [replace(r, machine="b", microarchitecture="icelake", bandwidth_gbs=r.bandwidth_gbs * 2,
                         step_median_s=r.step_median_s * 2) for r in synthetic_rows(plans)]
    model = LearnedPredictor.fit(machine_a + machine_b)
    b = example_from_row(machine_b[0], CATALOG)
    reprobe = replace(b, machine=(*b.machine[:3], b.machine[3] * 1.1))
    stranger = replace(reprobe, kind=None)
    assert model.machine_offsets[b.machine] < -0.3  # log utilization: B is slower
    assert model.knows_kind(reprobe) and not model.knows_kind(stranger)
    (own, *_), (again, low, high, *_), (new, new_low, new_high, *_) = model.predict_examples([b, reprobe, stranger])
    assert again == pytest.approx(new, rel=1e-9) and again == pytest.approx(own * math.exp(
        model.machine_offsets[b.machine]), rel=1e-9)
    assert new_low < low < again < high < new_high
    assert machine_kind("cpu", "x86_64_v4", 2, False) is None
    assert machine_kind("cpu", "icelake", 2, False) == ("cpu", "icelake", 2, False)


def test_a_cpu_archspec_names_like_a_known_one_but_with_native_bf16_is_another_kind(plans) -> None:
    """An Emerald Rapids VM without AMX is archspec's ``icelake``: with native bf16 it is not of the kind of an Ice
    Lake without it (its predictions widen as on a machine never measured, not by the same kind's spread)."""
    rows = [replace(r, machine="b", microarchitecture="icelake", peak_bf16_gflops=None) for r in synthetic_rows(plans)]
    model = LearnedPredictor.fit(rows)
    ice_lake = example_from_row(rows[0], CATALOG)
    reprobe = replace(ice_lake, machine=(*ice_lake.machine[:3], ice_lake.machine[3] * 1.1))
    with_bf16 = replace(reprobe, kind=machine_kind("cpu", "icelake", ice_lake.cores, True))
    assert model.knows_kind(reprobe) and not model.knows_kind(with_bf16)
    assert model.unseen_spread(with_bf16) == (NEW_MACHINE_SPREAD, 0.0, 0.0)


def test_a_new_recipe_parameter_gets_feature_columns_from_the_recipe(plans) -> None:
    """ONNX Runtime's recipe with an extra categorical parameter: the model gets a column per value of it from
    the catalog alone and learns its effect (synthetic rows run at 0.5 utilization with it on, 0.25 off)."""
    catalog = dict(load_catalog())
    ort = catalog["onnxruntime"]
    catalog["onnxruntime"] = msgspec.structs.replace(
        ort, parameters=ort.parameters + (Parameter(name="arena", values=("on", "off")),))
    replanned = [make_plan(plan.loaded, plan.source, plan.workload, RooflinePredictor(), catalog) for plan in plans]
    rows = []
    for plan in replanned:
        for candidate in (r.candidate for r in plan.ranked if r.candidate.runtime == "onnxruntime"):
            row = measurement_row(plan, candidate, {"status": "ok", "repeats": 5, "compile_s": 1.0})
            step = example_from_row(row, catalog).anchor_seconds / (0.5 if candidate.param("arena") == "on" else 0.25)
            rows.append(replace(row, step_median_s=step, step_p10_s=step, step_p90_s=step))
    model = LearnedPredictor.fit(rows, catalog=catalog)
    assert ParameterFeature("arena", "categorical", ("on", "off")) in model.features.parameters
    plan = replanned[1]
    on = next(r.candidate for r in plan.ranked if r.candidate.param("arena") == "on")
    off = replace(on, params=tuple((k, "off" if k == "arena" else v) for k, v in on.params))
    steps = [step for step, *_ in model.predict_examples([example_from(plan.workload, plan.ceilings, c,
                                                                       catalog[c.runtime])
                                                          for c in (on, off)])]
    assert steps[1] / steps[0] == pytest.approx(2.0, rel=0.15)


def test_parameter_features_follow_the_recipes() -> None:
    """The default follows the value types; threads is the threads parameter's; recipes sharing a parameter
    must agree on its feature."""
    assert Parameter(name="trials", values=(0, 64)).feature == "numeric"
    assert Parameter(name="fast", values=(False, True)).feature == "categorical"
    with pytest.raises(ValueError, match="threads"):
        Parameter(name="workers", values=(1, 2), given_feature="threads")
    catalog = dict(load_catalog())
    xla = catalog["xla"]
    catalog["xla"] = msgspec.structs.replace(xla, parameters=(Parameter(name="allocator", values=(1,)),))
    with pytest.raises(ValueError, match="allocator"):
        Features.from_catalog(catalog)


def test_tree_arrays_predict_what_scikit_learn_predicts_and_round_trip_without_pickle(tmp_path) -> None:
    import numpy as np
    from sklearn.ensemble import RandomForestRegressor

    from modak.predict.forest import TreeEnsemble, encode_arrays, load_arrays

    rng = np.random.default_rng(0)
    X = rng.normal(size=(300, 6))
    y = X[:, 0] * 2 + np.sin(X[:, 1]) + rng.normal(scale=0.1, size=300)
    forest = RandomForestRegressor(n_estimators=20, min_samples_leaf=2, max_features=0.5, random_state=0).fit(X, y)
    ensemble = TreeEnsemble.from_sklearn(forest)
    probe = rng.normal(size=(50, 6))
    expected = np.stack([tree.predict(probe) for tree in forest.estimators_])
    np.testing.assert_array_equal(ensemble.predict_trees(probe), expected)
    np.testing.assert_allclose(ensemble.predict(probe), forest.predict(probe))
    path = tmp_path / "trees.forest"
    path.write_bytes(encode_arrays({"note": "header"}, ensemble.arrays("t")))
    header, arrays = load_arrays(path)
    assert header == {"note": "header"}
    np.testing.assert_array_equal(TreeEnsemble.from_arrays(arrays, "t").predict_trees(probe), expected)


def test_a_damaged_forest_file_is_refused_not_followed(tmp_path) -> None:
    from array import array

    from modak.paths import content_entry
    from modak.predict.forest import TreeEnsemble, encode_arrays, load_arrays

    # one tree: node 0 splits on feature 0 into leaves 1 and 2
    good = {"t.roots": array("q", [0]), "t.left": array("q", [1, -1, -1]), "t.right": array("q", [2, -1, -1]),
            "t.feature": array("q", [0, 0, 0]), "t.threshold": array("d", [0.5, 0, 0]),
            "t.value": array("d", [0, 1.0, 2.0]), "t.depth": array("q", [1])}
    assert TreeEnsemble.from_arrays(good, "t").predict_trees([[0.0], [1.0]]) == [[1.0, 2.0]]
    looped = good | {"t.left": array("q", [1, 0, -1]), "t.right": array("q", [2, 0, -1])}  # node 1 back to 0
    assert TreeEnsemble.from_arrays(looped, "t").predict_trees([[0.0]]) == [[1.0]]  # a walk stops at depth
    with pytest.raises(ValueError, match="point outside"):
        TreeEnsemble.from_arrays(good | {"t.roots": array("q", [3])}, "t")
    with pytest.raises(ValueError, match="point outside"):
        TreeEnsemble.from_arrays(good | {"t.right": array("q", [3, -1, -1])}, "t").predict_trees([[1.0]])
    with pytest.raises(ValueError, match="inconsistent"):
        TreeEnsemble.from_arrays(good | {"t.value": array("d", [0, 1.0])}, "t")
    with pytest.raises(ValueError, match="wrong array types"):
        TreeEnsemble.from_arrays(good | {"t.left": array("d", [1, -1, -1])}, "t")
    with pytest.raises(ValueError, match="a row has fewer"):
        TreeEnsemble.from_arrays(good | {"t.feature": array("q", [2, 0, 0])}, "t").predict_trees([[0.0]])
    data = encode_arrays({}, good)
    flipped = data[:-1] + bytes([data[-1] ^ 1])  # a bit of a leaf's value: every index still in range
    for damaged, message in ((data[:-3], "truncated"), (data + b"x", "trailing"), (b"PK" + data, "not a modak"),
                             (flipped, "damaged")):
        (tmp_path / "f").write_bytes(damaged)
        with pytest.raises(ValueError, match=message):
            load_arrays(tmp_path / "f")
    (tmp_path / "g").write_bytes(data)  # mapped, checked once per content, and the same values as written
    assert not content_entry(tmp_path / "g", "verified").exists()
    header, arrays = load_arrays(tmp_path / "g")
    assert content_entry(tmp_path / "g", "verified").exists()
    assert header == {} and {name: list(values) for name, values in arrays.items()} == {
        name: list(values) for name, values in good.items()}


def test_the_cached_fit_predicts_as_the_fresh_one_and_new_data_refits(plans, tmp_path) -> None:
    rows = synthetic_rows(plans)
    weights = [1.0] * len(rows)
    fresh = LearnedPredictor.fit(rows, weights)
    first = LearnedPredictor.cached(TrainingData.of(rows, weights), folder=tmp_path)
    saved = list(tmp_path.glob("*.forest"))
    assert len(saved) == 1
    again = LearnedPredictor.cached(TrainingData.of(rows, weights), folder=tmp_path)  # loaded, not refit
    examples = [example_from_row(r, CATALOG) for r in rows[:20]]
    assert fresh.predict_examples(examples) == first.predict_examples(examples) == again.predict_examples(examples)
    assert again.coverage == fresh.coverage and again.rows == fresh.rows
    changed = rows[:-1]
    LearnedPredictor.cached(TrainingData.of(changed, weights[:-1]), folder=tmp_path)
    assert len(list(tmp_path.glob("*.forest"))) == 2  # other data, another fit
    saved[0].write_bytes(b"not a model")  # a damaged cache file is refit, not trusted
    cached = LearnedPredictor.cached(TrainingData.of(rows, weights), folder=tmp_path)
    assert cached.predict_examples(examples) == fresh.predict_examples(examples)


def test_a_changed_overhead_prior_is_another_fit() -> None:
    """The anchor adds the recipes' dispatch overheads, so a cached fit is keyed by them, not only by the columns."""
    catalog = dict(load_catalog())
    ort = catalog["onnxruntime"]
    cpu = ort.performance["cpu"]
    changed = dict(catalog, onnxruntime=msgspec.structs.replace(ort, performance={
        **ort.performance, "cpu": msgspec.structs.replace(cpu, node_overhead_us=cpu.node_overhead_us * 2)}))
    assert Features.from_catalog(changed) == Features.from_catalog(catalog)
    assert fit_key("rows", changed) != fit_key("rows", catalog) == fit_key("rows", dict(load_catalog()))


def test_a_fit_on_several_machines_is_the_same_every_time(tmp_path: Path) -> None:
    """The shipped rows (six machines: per-machine offsets, each from a forest fit without that machine) fit three
    times in one process give the same bytes. Their forests run in threads: a prediction summed in the order the
    threads finish moved the offsets' last bits and then the splits (about half the fits differed)."""
    from modak.predict.training import training_set

    rows, weights = training_set(tmp_path / "no-store.sqlite").load()
    saved = []
    for attempt in range(3):
        fitted = LearnedPredictor.fit(rows, weights)
        assert len(fitted.machine_offsets) >= 2
        fitted.save(tmp_path / f"fit-{attempt}")
        saved.append((tmp_path / f"fit-{attempt}").read_bytes())
    assert saved[1] == saved[0] and saved[2] == saved[0]
