"""`modak model eval`: its splits (model families named in one place, every zoo model in one), its predictors as
named fit/predict entries scored side by side, the accuracy metrics on a hand-computed table, and its --json
document against model-eval.schema.json."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import pytest

from modak import cli
from modak.candidates.catalog import load_catalog
from modak.image.kernels import Kernel
from modak.image.zoo import zoo_names
from modak.measurements.kernels import (
    CEILINGS,
    KernelRow,
    Reconciliation,
    probed_from,
    write_kernel_csv,
    write_reconcile_csv,
)
from modak.measurements.store import Measurement, as_json, write_csv
from modak.predict import evaluate as evaluation
from modak.predict import training
from modak.predict.evaluate import (
    FAMILIES,
    FAMILY_HELD_OUT,
    LEAVE_ONE_MODEL_OUT,
    LEAVE_ONE_TARGET_OUT,
    SPLITS,
    DerivedEntry,
    Prediction,
    PredictorEntry,
    Subset,
    answerers,
    default_predictors,
    evaluate,
    family,
    kernels_and_forest,
    score,
    subset,
    with_runs,
)
from modak.predict.kernel_model import KernelModel
from modak.predict.kernel_terms import MachineCeilings
from modak.predict.training import ok_rows, shipped_rows
from tests.test_ci_step import assert_valid
from tests.test_decision_metrics import row


def test_every_zoo_and_shipped_model_belongs_to_exactly_one_family() -> None:
    members = [model for models in FAMILIES.values() for model in models]
    assert len(members) == len(set(members)), "a model in two families"
    unmapped = ({r.model for r in shipped_rows()} | set(zoo_names())) - set(members)
    assert not unmapped, f"assign these zoo models a family in modak.predict.evaluate.FAMILIES: {sorted(unmapped)}"
    assert family("resnet18") == family("resnet50") == family("convnext_atto") == "resnet"
    assert family("mobilenet_v2") == family("squeezenet") and family("bert_base") == family("vit_tiny")
    assert family("dlrm_small") == family("ncf") == family("mlp") != family("lstm_lm")
    assert family("my_own_net") == "my_own_net"  # a user's model is a family of its own


def recording(name: str, fits: list[tuple[str, frozenset[str]]], factor: float, covers: str = "cpu",
              seed: int | None = None) -> PredictorEntry:
    """An entry that records the models each fit saw and predicts ``factor`` x the measured step on ``covers``."""

    def fit(rows: list[Measurement]) -> str:
        fits.append((name, frozenset(r.model for r in rows)))
        return covers

    def predict(device: str, rows: list[Measurement]) -> tuple[Prediction | None, ...]:
        return tuple(Prediction(r.step_s * factor, (r.step_s, r.step_s * factor)) if r.device == device else None
                     for r in rows)

    return PredictorEntry(name, fit, predict, seed)


def test_each_split_holds_out_its_groups_for_every_entry() -> None:
    """resnet18 and resnet50 are one family (held out together), mlp another; the two targets are held out one at
    a time. An entry that covers no row counts every held-out row as uncovered."""
    rows = [replace(row(t, model=m), machine=machine) for machine in ("m", "n")
            for m in ("resnet18", "resnet50", "mlp") for t in (1e-3, 2e-3, 3e-3)]
    fits: list[tuple[str, frozenset[str]]] = []
    entries = [recording("a", fits, 2.0, seed=0), recording("a", fits, 2.0, seed=1), recording("b", fits, 1.05),
               recording("none", fits, 1.0, covers="gpu")]
    scores = evaluate(rows, entries)
    splits = [LEAVE_ONE_MODEL_OUT, FAMILY_HELD_OUT, LEAVE_ONE_TARGET_OUT]
    assert [(s.split, s.predictor, s.seed) for s in scores] == [
        (split, name, seed) for split in splits for name, seed in (("a", 0), ("a", 1), ("b", None), ("none", None))]
    models = [f for name, f in fits if name == "b"]
    assert models == [frozenset({"resnet18", "resnet50"}), frozenset({"mlp", "resnet50"}),
                      frozenset({"mlp", "resnet18"}),  # leave one model out, models in name order
                      frozenset({"resnet18", "resnet50"}), frozenset({"mlp"}),  # families: mlp-recommender, resnet
                      frozenset({"mlp", "resnet18", "resnet50"}), frozenset({"mlp", "resnet18", "resnet50"})]
    for s in scores:
        if s.predictor == "none":
            assert (s.rows, s.uncovered) == (0, len(rows))
        else:
            assert (s.rows, s.uncovered) == (len(rows), 0)
            assert s.mape == pytest.approx(1.0 if s.predictor == "a" else 0.05)
            assert s.within_10 == (0.0 if s.predictor == "a" else 1.0) and s.interval_coverage == 1.0
    only_n = evaluate(rows, entries[2:3], machine="n")
    assert [(s.split, s.rows) for s in only_n] == [(split, len(rows) // 2) for split in splits]


def test_accuracy_metrics_on_a_fixed_table() -> None:
    """Workload A measured 1, 2, 4, 8 ms and predicted 1.05, 2.4, 2.8, 8.4 ms (errors 5%, 20%, 30%, 5%; same
    ranking: tau 1); workload B measured 1, 2, 3 ms and predicted 1.5, 3.3, 2.4 ms (errors 50%, 65%, 20%; one
    discordant pair of three: tau 1/3). Four rows have an interval, two of them hold the measured time."""
    measured = [1e-3, 2e-3, 4e-3, 8e-3, 1e-3, 2e-3, 3e-3]
    rows = [row(t, batch=1 if i < 4 else 8) for i, t in enumerate(measured)]
    predicted = dict(enumerate([1.05e-3, 2.4e-3, 2.8e-3, 8.4e-3, 1.5e-3, 3.3e-3, 2.4e-3]))
    intervals = {0: (0.9e-3, 1.1e-3), 1: (2.5e-3, 3e-3), 2: (3e-3, 5e-3), 4: (1.2e-3, 2e-3)}
    result = score("split", "test", rows, predicted, 0, intervals)
    assert result.mape == pytest.approx((0.05 + 0.2 + 0.3 + 0.05 + 0.5 + 0.65 + 0.2) / 7)
    assert result.within_10 == pytest.approx(2 / 7) and result.within_25 == pytest.approx(4 / 7)
    assert result.kendall_tau_median == pytest.approx((1 + 1 / 3) / 2)  # the median of the two workloads' tau
    assert result.interval_coverage == 0.5
    assert (result.workloads, result.hit_rate) == (2, 1.0)  # both picks are the measured best


def test_each_predictor_is_scored_on_the_rows_each_model_of_the_combined_entry_answered() -> None:
    """Rows measured 1, 2, 4, 8 ms. The combined entry answers rows 0 and 1 by kernels (errors 5%, 20%) and rows 2
    and 3 by the forest (errors 30%, 5%); a forest alone predicts rows 0, 1, 3 (errors 40%, 0%, 7.5%): on the
    kernels' rows it is scored on both, on the forest's rows on the one it predicted."""
    rows = [row(t) for t in (1e-3, 2e-3, 4e-3, 8e-3)]
    combined = {0: Prediction(1.05e-3, (1e-3, 1.1e-3), by="kernels"),
                1: Prediction(2.4e-3, (2.5e-3, 3e-3), by="kernels"),
                2: Prediction(2.8e-3, by="forest"), 3: Prediction(8.4e-3, by="forest")}
    alone = {0: Prediction(1.4e-3, (1e-3, 2e-3)), 1: Prediction(2e-3, (1e-3, 3e-3)), 3: Prediction(8.6e-3)}
    parts = answerers([alone, combined])
    assert parts == {"forest": {2, 3}, "kernels": {0, 1}} and answerers([alone]) == {}
    kernels = subset("kernels", rows, combined, parts["kernels"])
    assert (kernels.rows, kernels.within_10, kernels.within_25, kernels.interval_coverage) == (2, 0.5, 1.0, 0.5)
    assert kernels.mape == pytest.approx((0.05 + 0.2) / 2)
    assert subset("kernels", rows, alone, parts["kernels"]) == Subset("kernels", 2, pytest.approx(0.2), 0.5, 0.5, 1.0)
    forest = subset("forest", rows, alone, parts["forest"])
    assert (forest.rows, forest.mape, forest.within_10) == (1, pytest.approx(0.075), 1.0)
    assert math.isnan(forest.interval_coverage)  # no interval to be inside


def test_runs_are_left_out_of_the_accuracy_and_kept_in_the_decisions() -> None:
    """Workload A measured 1, 2, 4 ms, predicted 1.1, 2.4, 5 ms, of which row 0 is a run (taken as measured: its
    prediction 1 ms); workload B measured 1, 3 ms, predicted 2, 2.7 ms, row 3 a run."""
    rows = [row(t, batch=1 if i < 3 else 8) for i, t in enumerate([1e-3, 2e-3, 4e-3, 1e-3, 3e-3])]
    predicted = dict(enumerate([1e-3, 2.4e-3, 5e-3, 1e-3, 2.7e-3]))
    result = score("split", "test", rows, predicted, 0, {1: (2e-3, 3e-3), 2: (1e-3, 2e-3)}, runs=frozenset({0, 3}))
    assert (result.rows, result.runs) == (3, 2)
    assert result.mape == pytest.approx((0.2 + 0.25 + 0.1) / 3) and result.within_10 == pytest.approx(1 / 3)
    assert result.interval_coverage == 0.5
    assert (result.workloads, result.hit_rate) == (2, 1.0)  # both picks are the runs, the measured best


def test_with_runs_takes_the_predicted_best_of_each_runtime_and_precision_as_measured_and_corrects_the_kernels() \
        -> None:
    """One workload: onnxruntime fp32 at two settings (kernels predict 0.5 and 1.2 ms, measured 1 and 2 ms),
    onnxruntime bf16 (kernels, 0.9 ms predicted, 1.5 ms measured), openvino fp32 (the forest, 2.5 ms predicted, 3 ms
    measured) at two settings. The runs: onnxruntime fp32 at its first setting (factor 2), its bf16 row (1.67), the
    openvino row predicted faster. The other onnxruntime fp32 row is corrected by its group's factor, to 2.4 ms;
    the forest's other row is not corrected. A second workload (batch 8) keeps its own runs."""
    settings = [{"s": 1}, {"s": 2}, {"s": 1}, {"s": 1}, {"s": 2}]
    kinds = [("onnxruntime", "fp32"), ("onnxruntime", "fp32"), ("onnxruntime", "bf16"), ("openvino", "fp32"),
             ("openvino", "fp32")]
    measured = [1e-3, 2e-3, 1.5e-3, 3e-3, 3.2e-3]
    rows = [replace(row(t, runtime=r, precision=p, batch=b), params=as_json(q)) for b in (1, 8)
            for t, (r, p), q in zip(measured, kinds, settings)]  # params as the store writes them
    answers = [Prediction(0.5e-3, (0.4e-3, 0.6e-3), by="kernels"), Prediction(1.2e-3, (1e-3, 1.5e-3), by="kernels"),
               Prediction(0.9e-3, (0.8e-3, 1e-3), by="kernels"), Prediction(2.5e-3, (2e-3, 3e-3), (2.4e-3,), "forest"),
               Prediction(2.6e-3, (2e-3, 3e-3), (2.5e-3,), "forest")]
    base = PredictorEntry("kernels+forest", lambda rows: None, lambda _, rows: tuple(answers * 2), 0)
    entry = with_runs(base)
    assert isinstance(entry, DerivedEntry) and (entry.name, entry.seed) == ("kernels+forest+runs", 0)
    derived = entry.derive(rows, tuple(answers * 2))
    for workload in (derived[:5], derived[5:]):
        assert [p is not None and p.measured for p in workload] == [True, False, True, True, False]
        assert [p.step_s for p in workload if p is not None] == pytest.approx([1e-3, 2.4e-3, 1.5e-3, 3e-3, 2.6e-3])
        second = workload[1]
        assert second is not None and second.interval == pytest.approx((2e-3, 3e-3)) and second.by == "kernels"
        assert workload[4] == answers[4]
    two_models = rows + [replace(r, model="mlp") for r in rows]  # each held out in turn, the other trains
    scores = {s.predictor: s for s in evaluate(two_models, [base, entry]) if s.split == LEAVE_ONE_MODEL_OUT}
    assert (scores["kernels+forest"].rows, scores["kernels+forest"].runs) == (20, 0)
    runs = scores["kernels+forest+runs"]
    assert (runs.rows, runs.runs, runs.answered) == (8, 12, (("forest", 4), ("kernels", 4)))
    assert runs.mape == pytest.approx((0.2 + (3.2 - 2.6) / 3.2) / 2)
    assert (runs.workloads, runs.hit_rate) == (4, 1.0)  # the onnxruntime fp32 run, the best, is picked


def test_the_default_entries_add_the_kernel_model_with_runs_beside_it() -> None:
    names = [e.name for e in default_predictors(2, load_catalog(), ([], []))]
    assert names == ["forest", "forest", "kernels+forest", "kernels+forest", "kernels+forest+runs",
                     "kernels+forest+runs", "roofline/median-utilization"]
    assert [e.name for e in default_predictors(1, load_catalog())] == ["forest", "roofline/median-utilization"]


@pytest.fixture
def few_shipped_rows(tmp_path: Path, monkeypatch) -> Path:
    """The shipped data cut to three models' onnxruntime rows on two targets, and no kernel labels (fast to
    cross-validate; the kernel model's entry is tested below, through its seam)."""
    rows = [r for r in ok_rows(shipped_rows()) if r.model in ("mnist_cnn", "mlp", "ncf")
            and r.runtime == "onnxruntime" and r.machine in ("ci-zen3-2c", "ci-icelake-2c")]
    assert len({r.machine for r in rows}) == 2 and len({r.model for r in rows}) == 3
    write_csv(tmp_path / "few.csv", rows)
    monkeypatch.setattr(training, "shipped_files", lambda: [tmp_path / "few.csv"])
    monkeypatch.setattr(training, "shipped_kernel_files", lambda: [])
    return tmp_path / "no-store.sqlite"


def test_model_eval_json_matches_its_schema(few_shipped_rows: Path, capsys) -> None:
    assert cli.main(["model", "eval", "--json", "--seeds", "2", "--store", str(few_shipped_rows)]) == 0
    document = json.loads(capsys.readouterr().out)
    assert_valid("model-eval.schema.json", document)
    assert document["schema_version"] == 1 and document["families"] == {k: list(v) for k, v in FAMILIES.items()}
    assert [(e["split"], e["predictor"], e["seeds"]) for e in document["entries"]] == [
        (split, name, seeds) for split in (LEAVE_ONE_MODEL_OUT, FAMILY_HELD_OUT, LEAVE_ONE_TARGET_OUT)
        for name, seeds in (("forest", [0, 1]), ("roofline/median-utilization", []))]
    forest = document["entries"][0]
    assert forest["rows"] + forest["uncovered"] == document["scored"] == document["rows"]
    assert 0 <= forest["within_10"] <= forest["within_25"] <= 1 and forest["interval_coverage"] is not None
    low, high = forest["spread"]["mape"]
    assert low <= forest["mape"] <= high
    baseline = document["entries"][1]
    assert baseline["interval_coverage"] is None and baseline["spread"] == {}


def test_model_eval_table_shows_the_predictors_side_by_side(few_shipped_rows: Path, capsys, monkeypatch) -> None:
    monkeypatch.delenv("COLUMNS", raising=False)
    assert cli.main(["model", "eval", "--seeds", "1", "--store", str(few_shipped_rows), "--machine",
                     "ci-zen3-2c"]) == 0
    out = capsys.readouterr().out
    headers = [line for line in out.splitlines() if "forest" in line]
    assert len(headers) == 3 and all("roofline/median-utilization" in line for line in headers)
    assert [line.strip() for line in out.splitlines() if line.strip().endswith("out")] == [
        LEAVE_ONE_MODEL_OUT, FAMILY_HELD_OUT, LEAVE_ONE_TARGET_OUT]  # the tables' titles
    assert "within ±10%" in out and "Kendall tau, median of workloads" in out and "in the 80% interval" in out


def test_model_eval_scores_one_split_when_asked(few_shipped_rows: Path, capsys) -> None:
    assert cli.main(["model", "eval", "--json", "--seeds", "1", "--store", str(few_shipped_rows), "--split",
                     FAMILY_HELD_OUT]) == 0
    document = json.loads(capsys.readouterr().out)
    assert_valid("model-eval.schema.json", document)
    assert {e["split"] for e in document["entries"]} == {FAMILY_HELD_OUT} and FAMILY_HELD_OUT in SPLITS


@pytest.mark.parametrize("argv", [["model", "eval", "--seeds", "0"], ["model", "fit", "--json"],
                                  ["model", "eval", "--machine", "nowhere"], ["model", "eval", "--split", "family"],
                                  ["model", "fit", "--split", FAMILY_HELD_OUT]])
def test_bad_options_exit_2(few_shipped_rows: Path, argv: list[str], capsys) -> None:
    assert cli.main([*argv, "--store", str(few_shipped_rows)]) == 2
    assert capsys.readouterr().err.startswith("modak: error: ")


def test_an_unknown_option_exits_2() -> None:
    with pytest.raises(SystemExit) as exited:
        cli.main(["model", "eval", "--holdout", "family"])
    assert exited.value.code == 2


# --- the operator-level model beside the forest ----------------------------------------------------------------

def planned(row: Measurement) -> tuple[Kernel, ...]:
    """A row's planned kernels (the seam for the runtime's report of its graph): one matrix product of its FLOPs at
    20 FLOPs per byte and one elementwise kernel (every row's kernels of one mix of compute and memory, so no held-out
    model's kernel is past its kind's range of FLOPs per byte)."""
    return (Kernel("MatMul", "matmul", flops=row.flops, bytes=row.flops / 20),
            Kernel("Relu", "elementwise", flops=row.flops / 1e3, bytes=row.flops / 80))


def labels(rows: list[Measurement]) -> tuple[list[KernelRow], list[Reconciliation]]:
    """A profiled launch of each row: its planned kernels taking 60% and 30% of its step, on the row's ceilings."""
    kernels, reconciled = [], []
    for i, r in enumerate(rows):
        common = dict(machine=r.machine, runtime=r.runtime, device=r.device, threads=r.threads or 0,
                      precision=r.precision, params=r.params, model=r.model, batch_size=r.batch_size,
                      source="test", session=f"s{i}", measured_at=r.measured_at, task=r.task,
                      **{c: getattr(r, c) for c in CEILINGS})
        kernels += [KernelRow(kernel=k, seconds=share * r.step_s, calls=1, **common)
                    for k, share in zip(planned(r), (0.6, 0.3))]
        reconciled.append(Reconciliation(step_s=r.step_s, profiled_step_s=r.step_s * 1.1, kernel_s=0.9 * r.step_s,
                                         unmapped_s=0.0, kernels=2, **common))
    return kernels, reconciled


def test_the_kernel_entry_fits_on_the_training_folds_kernel_rows_and_falls_back_to_the_forest(
        few_shipped_rows: Path, monkeypatch) -> None:
    rows = ok_rows(training.training_data(few_shipped_rows)[0])
    kernels, reconciled = labels(rows)
    kernels += labels([replace(rows[0], machine="elsewhere")])[0]  # a machine of no measured row: never held out
    # Probe layers go with the model they were cut from: mlp's is held out with it, ncf's is trained on.
    mlp_matmul, ncf_matmul = (next(k for k in kernels[::2] if k.model == m) for m in ("mlp", "ncf"))
    kernels += [replace(mlp_matmul, model="probe-mlp-onnxruntime-0123456789ab"),
                replace(ncf_matmul, model="probe-ncf-onnxruntime-0123456789ab")]
    fits: list[KernelModel] = []

    def recorded_fit(*args, **kwargs) -> KernelModel:
        fits.append(fit(*args, **kwargs))
        return fits[-1]

    fit = KernelModel.fit
    monkeypatch.setattr(evaluation.KernelModel, "fit", recorded_fit)
    entry = kernels_and_forest(0, load_catalog(), kernels, reconciled, planned)
    assert entry.name == "kernels+forest" and entry.seed == 0
    train = [r for r in rows if r.model != "mlp"]
    fitted = entry.fit(train)
    assert fits == []  # fit lazily, for the rows asked
    held = [r for r in rows if r.model == "mlp"]
    answers = entry.predict(fitted, held)
    assert answers and all(a is not None and a.by == "kernels" and a.interval is not None for a in answers)
    pairs = {(r.machine, r.model) for r in train}
    assert [sum(m.kinds[("onnxruntime", "cpu", "MatMul")].rows for m in f.machines) for f in fits] == [
        sum((k.machine, k.model) in pairs for k in kernels[::2]) + 1]  # + ncf's probe layer
    assert probed_from("probe-mlp-onnxruntime-0123456789ab") == "mlp" and probed_from("mlp") == "mlp"
    assert any(k.model == "mlp" for k in kernels[::2])  # the held-out model's kernel rows exist, and were not fit
    # Rows of a machine with no kernel rows in the fold: the forest answers, and no kernel model is fit for them.
    elsewhere = [replace(r, machine="nowhere") for r in held]
    assert all(a is not None and a.by == "forest" for a in entry.predict(fitted, elsewhere)) and len(fits) == 1
    # An uncalibrated kernel model (one model to fit on): the forest answers every row.
    one = entry.fit([r for r in rows if r.model == "ncf"])
    assert all(a is not None and a.by == "forest" for a in entry.predict(one, held))
    assert all(m.calibration == {} for m in fits[-1].machines)
    # Held out by target, a machine's rows are asked of the other machine's kernel rows, transferred by ceilings.
    zen3 = entry.fit([r for r in rows if r.machine == "ci-zen3-2c"])
    icelake = entry.predict(zen3, [r for r in rows if r.machine == "ci-icelake-2c"])
    assert any(a is not None and a.by == "kernels" for a in icelake)
    assert [m.key for m in fits[-1].machines] == [MachineCeilings.of_row(next(
        r for r in rows if r.machine == "ci-zen3-2c")).key]


def test_model_eval_shows_the_kernel_model_beside_the_forest_on_the_same_rows(few_shipped_rows: Path, capsys,
                                                                             monkeypatch, tmp_path: Path) -> None:
    rows = ok_rows(training.training_data(few_shipped_rows)[0])
    kernels, reconciled = labels(rows)
    shipped = [tmp_path / "kernels-few.csv", tmp_path / "reconcile-few.csv"]
    write_kernel_csv(shipped[0], kernels)
    write_reconcile_csv(shipped[1], reconciled)
    monkeypatch.setattr(training, "shipped_kernel_files", lambda: shipped)
    monkeypatch.setattr(evaluation, "planned_for_row", planned)  # the runtime's report of a row's graph
    assert cli.main(["model", "eval", "--json", "--seeds", "1", "--store", str(few_shipped_rows)]) == 0
    document = json.loads(capsys.readouterr().out)
    assert_valid("model-eval.schema.json", document)
    entries = {(e["split"], e["predictor"]): e for e in document["entries"]}
    assert [p for s, p in entries if s == LEAVE_ONE_MODEL_OUT] == ["forest", "kernels+forest", "kernels+forest+runs",
                                                                  "roofline/median-utilization"]
    for split in (LEAVE_ONE_MODEL_OUT, FAMILY_HELD_OUT, LEAVE_ONE_TARGET_OUT):
        forest, both = entries[(split, "forest")], entries[(split, "kernels+forest")]
        assert (both["rows"], both["uncovered"]) == (forest["rows"], forest["uncovered"])  # like for like
        assert sum(both["answered"].values()) == both["rows"] and forest["answered"] == {}
        # Both are scored on the rows each model of the combined entry answered: the same rows, side by side.
        assert set(both["by_answerer"]) == set(forest["by_answerer"]) == set(both["answered"])
        for answerer, count in both["answered"].items():
            assert both["by_answerer"][answerer]["rows"] == forest["by_answerer"][answerer]["rows"] == count
        assert sum(part["mape"] * part["rows"] for part in both["by_answerer"].values()) == \
            pytest.approx(both["mape"] * both["rows"], rel=1e-3)  # the parts make up the whole
    assert entries[(LEAVE_ONE_MODEL_OUT, "kernels+forest")]["answered"]["kernels"] > 0
    # Holding out the family of mlp and ncf leaves one model's kernel rows: too few to calibrate, the forest answers.
    assert entries[(FAMILY_HELD_OUT, "kernels+forest")]["answered"].get("kernels", 0) < \
        entries[(LEAVE_ONE_MODEL_OUT, "kernels+forest")]["answered"]["kernels"]
    monkeypatch.delenv("COLUMNS", raising=False)
    assert cli.main(["model", "eval", "--seeds", "1", "--store", str(few_shipped_rows)]) == 0
    out = capsys.readouterr().out
    assert "answered by kernels" in out and "answered by forest" in out
    assert "on the rows kernels answered: MAPE" in out and "on the rows forest answered: within ±10%" in out


def test_a_rows_planned_kernels_come_from_its_zoo_models_graph() -> None:
    pytest.importorskip("modak.workload.kernels", reason="modak.workload.kernels.planned_kernels (kgraph)")
    row = next(r for r in ok_rows(shipped_rows()) if r.model == "mnist_cnn" and r.runtime == "onnxruntime")
    kernels = evaluation.planned_for_row(row)
    assert kernels and sum(k.flops for k in kernels) > 0
    assert evaluation.planned_for_row(replace(row, model="my_own_net")) == ()  # not in the zoo: no graph
