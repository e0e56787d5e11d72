"""What a warm plan reads instead of making again: the predictions it remembers (:mod:`modak.predict.memo`), read
without loading a fitted model and found again only for the same predictor, model, workload, target and
candidates; and the runtime catalog, parsed once per content."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from modak import paths
from modak.api import load as load_job
from modak.candidates import catalog as catalog_module
from modak.candidates.catalog import load_catalog
from modak.errors import InputError
from modak.hardware.local import store_probe
from modak.plan import Plan, make_plan
from modak.predict import memo
from modak.predict.base import Prediction
from modak.predict.kernel_model import KernelModel
from modak.predict.learned import LearnedPredictor
from modak.predict.memo import MemoPredictor, identity
from modak.workload.source import load_analysis
from tests.support.host import TEST_HOST_PROBE

ROOT = Path(__file__).resolve().parents[1]
CNN = ROOT / "examples" / "mnist-cnn-cpu" / "job.yaml"


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty cache of its own (with the test host's probe)."""
    monkeypatch.setenv("MODAK_CACHE", str(tmp_path / "cache"))
    store_probe(TEST_HOST_PROBE)
    return tmp_path / "cache"


def plan_cnn() -> Plan:
    loaded = load_job(CNN)
    return make_plan(loaded, *load_analysis(loaded))


def test_a_warm_plan_reads_its_predictions_without_loading_a_fit(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first = plan_cnn()
    assert list((cache / memo.FOLDER).glob("*.json"))

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("a fitted model was loaded")

    monkeypatch.setattr(KernelModel, "cached", refuse)
    monkeypatch.setattr(LearnedPredictor, "cached", refuse)
    assert plan_cnn().digest() == first.digest()


class Counting:
    """A predictor that answers every request with the same prediction and counts the calls."""

    name = "counting"

    def __init__(self) -> None:
        self.calls = 0

    def predict(self, workload, ceilings, candidate, recipe) -> Prediction:
        self.calls += 1
        return Prediction(0.1 / 3, 0.02, 0.2, 1.5, (("compute_s", 0.01),), "compute", self.name, members=(0.1, 0.2))


def test_an_entry_is_found_only_for_the_same_requests_and_predictor(cache: Path) -> None:
    plan = plan_cnn()
    workload, ceilings = plan.workload, plan.ceilings
    requests = [(r.candidate, plan.recipes[r.candidate.runtime]) for r in plan.ranked[:3]]
    made = Counting()
    key = identity("data", catalog=load_catalog())

    def ask(key: str = key, **changed: object) -> list[Prediction | None]:
        asked = {"workload": workload, "ceilings": ceilings, "requests": requests} | changed
        return MemoPredictor(key, lambda: made).predict_many(asked["workload"], asked["ceilings"],
                                                             asked["requests"])

    first = ask()
    assert made.calls == 3 and first[0] == Counting().predict(None, None, None, None)  # read back, the same values
    assert ask() == first and made.calls == 3  # a new process's predictor: read, not made
    ask(requests=requests[:2])
    assert made.calls == 5
    ask(ceilings=replace(ceilings, cores=ceilings.cores + 1))
    ask(workload=replace(workload, batch_size=workload.batch_size + 1))
    assert made.calls == 11
    ask(identity("other data", catalog=load_catalog()))
    assert made.calls == 14
    for entry in (cache / memo.FOLDER).glob("*.json"):
        entry.write_text("{not json")
    assert ask() == first and made.calls == 17  # a damaged entry is made again


@pytest.fixture
def source(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A package of one source file standing for modak's own (:func:`modak.paths.source_identity`)."""
    package = tmp_path / "modak"
    (package / "predict").mkdir(parents=True)
    (package / "predict" / "rule.py").write_text("STEP = 1\n")
    monkeypatch.setattr(paths, "_PACKAGE", package)
    paths.source_identity.cache_clear()
    yield package
    monkeypatch.undo()
    paths.source_identity.cache_clear()


def test_the_identity_changes_with_the_data_the_catalog_and_modaks_source(source: Path) -> None:
    catalog = load_catalog()
    first = identity("a", None, catalog=catalog)
    assert identity("a", None, catalog=catalog) == first
    assert identity("b", None, catalog=catalog) != first
    assert identity("a", "b", catalog=catalog) != first
    assert identity("a", None, catalog=dict(list(catalog.items())[1:])) != first
    (source / "predict" / "rule.py").write_text("STEP = 22\n")
    assert identity("a", None, catalog=catalog) == first  # read once per process
    paths.source_identity.cache_clear()
    assert identity("a", None, catalog=catalog) != first


def test_predictions_are_made_where_the_cache_cannot_be_written(cache: Path) -> None:
    plan = plan_cnn()
    requests = [(r.candidate, plan.recipes[r.candidate.runtime]) for r in plan.ranked[:2]]
    (cache / memo.FOLDER).rename(cache / "kept")
    (cache / memo.FOLDER).write_text("a file where the folder would be")
    made = Counting()
    answers = MemoPredictor("key", lambda: made).predict_many(plan.workload, plan.ceilings, requests)
    assert [a is not None for a in answers] == [True, True] and made.calls == 2


def test_the_catalog_is_parsed_once_per_content(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MODAK_CACHE", str(tmp_path / "cache"))
    folder = tmp_path / "runtimes"
    shutil.copytree(ROOT / "recipes" / "runtimes", folder)
    parsed = catalog_module.load_catalog.__wrapped__(folder)

    def refuse(*args: object) -> None:
        raise AssertionError("a recipe was parsed")

    with monkeypatch.context() as patch:
        patch.setattr(catalog_module, "load_spec", refuse)
        assert catalog_module.load_catalog.__wrapped__(folder) == parsed  # read back, the same recipes
        recipe = folder / "onnxruntime.yaml"
        recipe.write_text(recipe.read_text().replace("title: ONNX Runtime", "title: ONNX Runtime, edited"))
        with pytest.raises(AssertionError, match="a recipe was parsed"):
            catalog_module.load_catalog.__wrapped__(folder)
    assert catalog_module.load_catalog.__wrapped__(folder)["onnxruntime"].title == "ONNX Runtime, edited"
    recipe.write_text(recipe.read_text().replace("title: ONNX Runtime, edited", "title: [not, a, string]"))
    with pytest.raises(InputError, match="title"):  # a changed recipe is checked again
        catalog_module.load_catalog.__wrapped__(folder)


def test_a_cache_keeps_its_newest_files(tmp_path: Path) -> None:
    import os

    for age, name in enumerate(["e.json", "d.json", "c.json", "b.json", "a.json"]):
        (tmp_path / name).write_text(name)
        os.utime(tmp_path / name, ns=(0, (10 - age) * 10**9))  # e is the newest
    (tmp_path / "other.txt").write_text("not matched")
    paths.keep_newest(tmp_path, "*.json", 2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d.json", "e.json", "other.txt"]


def test_the_fits_load_once_for_every_model_the_predictor_is_bound_to(cache: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    from modak.predict.default import default_predictor

    loads = []
    real = LearnedPredictor.cached
    monkeypatch.setattr(LearnedPredictor, "cached", lambda *args, **kwargs: loads.append(1) or real(*args, **kwargs))
    predictor = default_predictor()
    assert isinstance(predictor, MemoPredictor) and not loads  # nothing loaded until a prediction is not remembered
    first, second = predictor.for_model(Path("a.onnx")).made, predictor.for_model(Path("b.onnx")).made
    assert loads == [1] and first is not second  # each bound to its model, one load between them


def local_store(path: Path, rows: int) -> Path:
    """A perf store with the first ``rows`` of a shipped machine's measurements, kernel rows and reconciliations,
    as `modak bench --kernels` leaves one."""
    from modak.measurements.kernels import read_kernel_csv, read_reconcile_csv
    from modak.measurements.store import PerfStore, read_csv

    perfmodels = ROOT / "perfmodels"
    with PerfStore(path) as store:
        store.add(list(read_csv(perfmodels / "cpu-ci-zen4-2c.csv"))[:rows])
        store.add_kernels(read_kernel_csv(perfmodels / "kernels-ci-zen4-2c.csv")[:rows],
                          read_reconcile_csv(perfmodels / "reconcile-ci-zen4-2c.csv")[:rows])
    return path


def test_a_warm_plan_takes_the_local_stores_keys_without_reading_its_rows(
        cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The models' data keys of an unchanged local store come from the cache, not from its rows; a write to the
    store (another `modak bench`) makes them be read again, and changes the keys."""
    from modak.measurements.store import PerfStore
    from modak.predict.training import kernel_set, training_set

    store = local_store(tmp_path / "perf.sqlite", 20)
    keys = kernel_set(store).key, training_set(store).key  # type: ignore[union-attr]

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("the local store's rows were read")

    with monkeypatch.context() as patched:
        for method in ("rows", "kernel_rows", "reconciliations"):
            patched.setattr(PerfStore, method, refuse)
        assert (kernel_set(store).key, training_set(store).key) == keys  # type: ignore[union-attr]
    local_store(tmp_path / "more.sqlite", 30)
    shutil.copy(tmp_path / "more.sqlite", store)
    changed = kernel_set(store).key, training_set(store).key  # type: ignore[union-attr]
    assert changed[0] != keys[0] and changed[1] != keys[1]
    shutil.copy(tmp_path / "more.sqlite", tmp_path / "same.sqlite")  # the same rows in another file: the same keys
    assert (kernel_set(tmp_path / "same.sqlite").key, training_set(tmp_path / "same.sqlite").key) == changed


def test_rows_written_after_their_key_was_taken_are_refused(cache: Path, tmp_path: Path) -> None:
    """A fit needs the rows whose key it is kept under: where the store was written to between the plan's key
    and the fit's read, the plan stops (exit 2) instead of keeping a fit under the wrong key."""
    from modak.measurements.kernels import read_kernel_csv
    from modak.measurements.store import PerfStore
    from modak.predict.training import kernel_set

    store = local_store(tmp_path / "perf.sqlite", 20)
    kernel_set(store)  # the key kept
    data = kernel_set(store)  # the key from the cache, the rows not read
    assert data is not None
    with PerfStore(store) as perf:
        perf.add_kernels(read_kernel_csv(ROOT / "perfmodels" / "kernels-ci-zen4-2c.csv")[20:25])
    with pytest.raises(InputError, match="written to while this plan read it"):
        data.load()
