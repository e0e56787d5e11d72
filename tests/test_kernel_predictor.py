"""The operator-level predictor (#40 item 3): per-kind roofline priors and their learned corrections, composition
of a step from its kernels, calibration on reconciled steps, transfer by ceilings, refusal of a damaged table, and
its place before the forest in the plan."""

from __future__ import annotations

import concurrent.futures
import functools
import json
import math
import random
import statistics
from dataclasses import replace
from pathlib import Path

import pytest

from modak.api import load as load_job
from modak.candidates.catalog import load_catalog
from modak.candidates.enumerate import Candidate
from modak.errors import EXIT_BAD_INPUT, InputError
from modak.hardware.ceilings import Ceilings, TargetCeilings, target_ceilings
from modak.image.kernels import OP_CLASSES, Kernel
from modak.measurements.kernels import (
    PROBE_MODEL_PREFIX,
    KernelRow,
    Reconciliation,
    write_kernel_csv,
    write_reconcile_csv,
)
from modak.measurements.store import PerfStore
from modak.plan import make_plan
from modak.predict.base import FallbackPredictor, for_model
from modak.predict.data import KernelData
from modak.predict.default import default_predictor
from modak.predict.gpu import PREDICTOR as GPU_TERMS
from modak.predict.kernel_fit import (
    KernelEstimate,
    attributable,
    calibrate,
    calibrate_runs,
    class_kind,
    fit_kind,
    fit_kinds,
    kernel_seconds,
)
from modak.predict.kernel_model import KernelModel
from modak.predict.kernel_names import PREDICTOR, TRANSFER_PREDICTOR
from modak.predict.kernel_terms import MachineCeilings, Recurrence, features, recurrence, roofline_seconds, sized
from modak.predict.kernels import KernelPredictor
from modak.predict.learned import NEW_MACHINE_SPREAD, Z80
from modak.predict.roofline import RooflinePredictor
from modak.predict.training import kernel_set
from modak.spec.models import Precision
from modak.workload.source import load_analysis
from tests.support.kernel_models import only

ROOT = Path(__file__).resolve().parents[1]
CNN = ROOT / "examples" / "mnist-cnn-cpu" / "job.yaml"
MS = 1e-3
PROFILER_S = 10e-6  # what profiling adds to a step per kernel, in the reconciliations made here

# The fixed table's machine: 4 cores, 100 GFLOP/s, 10 GB/s; all 4 threads get all of both.
BOX = MachineCeilings("cpu", "box", 4, 100.0, None, 10.0)
CONV = Kernel("Conv", "conv", ("conv",), ((1, 8, 16, 16),), '{"kernel_shape": [3, 3]}', flops=2e8, bytes=1e6)
RELU = Kernel("Relu", "elementwise", ("relu",), ((1, 8, 16, 16),), "{}", flops=1e5, bytes=4e6)
# Their rooflines there: Conv 2e8 / 1e11 = 2 ms (compute-bound), Relu 4e6 / 1e10 = 0.4 ms (memory-bound); profiled at
# efficiencies 0.5 and 0.8: 4 ms and 0.5 ms per call.
STEPS_MS = (4.7, 4.9, 5.1, 5.3, 5.5)  # five models' unprofiled steps: dispatch (step - 4.5 ms) / 2 = 0.1 ... 0.5 ms


def ceilings_of(machine: MachineCeilings) -> dict:
    """The ceiling columns of a row measured on ``machine``."""
    return dict(microarchitecture=machine.name or "unknown", cores=machine.cores,
                peak_fp32_gflops=machine.fp32_gflops, peak_bf16_gflops=machine.bf16_gflops,
                bandwidth_gbs=machine.bandwidth_gbs, gpu=None)


def kernel_row(kernel: Kernel, seconds: float, model: str, machine: str = "box", runtime: str = "onnxruntime",
               calls: int = 1, threads: int = 4, ceilings: MachineCeilings = BOX) -> KernelRow:
    return KernelRow(machine=machine, runtime=runtime, device="cpu", threads=threads, precision="fp32", params="{}",
                     model=model, batch_size=1, kernel=kernel, seconds=seconds, calls=calls, source="test",
                     session=f"s-{model}", measured_at="2026-11-26T00:00:00Z", **ceilings_of(ceilings))


def reconciliation(model: str, step_s: float, kernel_s: float, kernels: int, machine: str = "box",
                   runtime: str = "onnxruntime", threads: int = 4, ceilings: MachineCeilings = BOX) -> Reconciliation:
    return Reconciliation(machine=machine, runtime=runtime, device="cpu", threads=threads, precision="fp32",
                          params="{}", model=model, batch_size=1, step_s=step_s,
                          profiled_step_s=step_s + PROFILER_S * kernels,
                          kernel_s=kernel_s, unmapped_s=0.0, kernels=kernels, source="test", session=f"s-{model}",
                          measured_at="2026-11-26T00:00:00Z", **ceilings_of(ceilings))


def fixed_table() -> tuple[list[KernelRow], list[Reconciliation]]:
    rows, recs = [], []
    for i, step in enumerate(STEPS_MS):
        model = f"m{i}"
        rows += [kernel_row(CONV, 4 * MS, model), kernel_row(RELU, 0.5 * MS, model)]
        recs.append(reconciliation(model, step * MS, 4.5 * MS, 2))
    return rows, recs


def target(name: str, scale: float) -> TargetCeilings:
    cpu = Ceilings("cpu", name, {Precision.fp32: 100.0 * scale}, 10.0 * scale, 16.0, measured=True)
    return TargetCeilings(name, frozenset(), 4, 4, cpu, None, 0, None)


@functools.cache
def cnn():
    loaded = load_job(CNN)
    source, workload = load_analysis(loaded)
    return loaded, source, workload


@pytest.fixture(scope="module")
def fixed() -> KernelModel:
    return KernelModel.fit(*fixed_table())


def predict_fixed(model: KernelModel, ceilings: TargetCeilings, kernels: tuple[Kernel, ...]):
    _, _, workload = cnn()
    predictor = KernelPredictor(model, kernels_of=lambda workload, candidate, threads: kernels)
    candidate = Candidate("onnxruntime", "cpu", Precision.fp32, (), 4)
    return predictor.predict(workload, ceilings, candidate, load_catalog()["onnxruntime"])


def test_composition_arithmetic_on_a_fixed_kernel_table(fixed: KernelModel) -> None:
    assert only(fixed).dispatch[("onnxruntime", "cpu")] == pytest.approx(0.3 * MS)  # median of 0.1 ... 0.5 ms
    # Out of fold every step composes to 4 + 0.5 + 2 x 0.3 = 5.1 ms; the residuals log(step / 5.1 ms), sorted:
    r = [math.log(s / 5.1) for s in STEPS_MS]
    q10, q90 = r[0] + 0.4 * (r[1] - r[0]), r[3] + 0.6 * (r[4] - r[3])  # deciles, linear between order statistics
    assert only(fixed).calibration[("onnxruntime", "cpu", "")] == pytest.approx((q10, 0.0, q90), abs=1e-9)
    # Every launch had the same (no) parameters: their own calibration is the runtime's.
    assert only(fixed).calibration[("onnxruntime", "cpu", "{}")] == only(fixed).calibration[("onnxruntime", "cpu", "")]
    # A step of 3 Conv and 2 Relu: 3 x 4 + 2 x 0.5 + 5 x 0.3 = 14.5 ms, times exp(median residual 0).
    p = predict_fixed(fixed, target("box", 1.0), (CONV, CONV, RELU, CONV, RELU))
    assert p is not None and p.predictor == PREDICTOR
    assert p.step_seconds == pytest.approx(14.5 * MS)
    assert (p.low_seconds, p.high_seconds) == pytest.approx((14.5 * MS * math.exp(q10), 14.5 * MS * math.exp(q90)))
    assert (p.term("compute_s"), p.term("memory_s"), p.term("overhead_s")) == pytest.approx((12 * MS, MS, 1.5 * MS))
    assert p.bound == "compute" and p.term("kernels") == 5 and p.widening and p.widening.new_machine == 0.0
    # The same from the model alone (what an evaluation composes from a launch's kernels, without a workload).
    candidate = Candidate("onnxruntime", "cpu", Precision.fp32, (), 4)
    composed = fixed.compose((CONV, CONV, RELU, CONV, RELU), BOX, candidate)
    assert composed is not None and (composed.step_s, composed.low_s, composed.high_s) == pytest.approx(
        (p.step_seconds, p.low_seconds, p.high_seconds))
    assert p.run_spread is None and only(fixed).run_calibration == {}  # each workload launched once: no pair
    # From measured kernel times instead (the benchmark's floor): 3 x 5 + 2 x 1 + 5 x 0.3 = 18.5 ms.
    measured = [KernelEstimate(t * MS, False, False) for t in (5, 5, 1, 5, 1)]
    floor = only(fixed).composition(measured, candidate, known=True)
    assert (floor.step_s, floor.dispatch_s, floor.kernels) == pytest.approx((18.5 * MS, 1.5 * MS, 5))


def test_parameters_that_run_the_same_kernels_in_other_steps_are_calibrated_apart() -> None:
    # Ten models' launches under two hints: the same kernels, the THROUGHPUT steps 20% shorter.
    rows, recs = [], []
    for i, step in enumerate((*STEPS_MS, *STEPS_MS)):
        model = f"m{i}"
        for hint, factor in (("LATENCY", 1.0), ("THROUGHPUT", 0.8)):
            params = json.dumps({"performance_hint": hint})
            rows += [replace(kernel_row(CONV, 4 * MS, model), params=params),
                     replace(kernel_row(RELU, 0.5 * MS, model), params=params)]
            recs.append(replace(reconciliation(model, step * factor * MS, 4.5 * MS, 2), params=params))
    model = KernelModel.fit(rows, recs)
    steps = {}
    for hint in ("LATENCY", "THROUGHPUT", "CUMULATIVE_THROUGHPUT"):  # the last: no launch, the runtime's calibration
        candidate = Candidate("onnxruntime", "cpu", Precision.fp32, (("performance_hint", hint),), 4)
        composed = model.compose((CONV, RELU), BOX, candidate)
        assert composed is not None
        steps[hint] = composed.step_s
    assert steps["THROUGHPUT"] / steps["LATENCY"] == pytest.approx(0.8, rel=0.01)
    assert steps["THROUGHPUT"] < steps["CUMULATIVE_THROUGHPUT"] < steps["LATENCY"]


def test_a_step_corrected_by_a_run_is_calibrated_by_such_corrected_steps() -> None:
    # Each model's launches under two hints, composed out of fold at 5 ms; the THROUGHPUT step 0.8x the LATENCY one,
    # off by the model's own error e: the part of it a LATENCY run does not correct.
    errors = (-0.06, -0.02, 0.0, 0.03, 0.05)
    steps = []
    for i, e in enumerate(errors):
        for hint, factor in (("LATENCY", 1.0), ("THROUGHPUT", 0.8 * math.exp(e))):
            rec = reconciliation(f"m{i}", 5 * factor * MS, 4.5 * MS, 2)
            steps.append((replace(rec, params=json.dumps({"performance_hint": hint})), 5 * MS))
    alone = reconciliation("m0", 9 * MS, 4.5 * MS, 2)
    steps += [(replace(alone, batch_size=8), 5 * MS), (replace(alone, precision="bf16"), 5 * MS)]  # no pair
    calibration = calibrate(steps)
    # Calibrated, LATENCY steps are off by 0 and THROUGHPUT ones by e - median(e) = e: one corrected by the other is
    # off by +-e, the ten ordered pairs' deciles linear between order statistics.
    paired = sorted([*errors, *(-e for e in errors)])
    q10, q90 = paired[0] + 0.9 * (paired[1] - paired[0]), paired[8] + 0.1 * (paired[9] - paired[8])
    assert calibrate_runs(steps, calibration) == {("onnxruntime", "cpu"): (pytest.approx(q10), pytest.approx(q90))}
    assert calibrate_runs(steps[:4], calibrate(steps[:4])) == {}  # under MIN_CALIBRATION steps: not calibrated


def test_kinds_fit_in_processes_are_the_model_fit_in_one(tmp_path: Path, monkeypatch) -> None:
    # Two machine kinds, each with its five models' own sizes and times: every calibration fold fits other kinds.
    twin = MachineCeilings("cpu", "twin", 4, 200.0, None, 10.0)
    rows, recs = [], []
    for machine, ceilings in (("box", BOX), ("twin", twin)):
        for i, step in enumerate(STEPS_MS):
            sizes = [replace(CONV, flops=CONV.flops * (1 + i + j), shapes=((1 + i + j, 8, 16, 16),)) for j in range(6)]
            rows += [kernel_row(k, (4 + i + j) * MS, f"m{i}", machine, ceilings=ceilings)
                     for j, k in enumerate(sizes)]
            rows.append(kernel_row(RELU, (0.5 + 0.1 * i) * MS, f"m{i}", machine, ceilings=ceilings))
            recs.append(reconciliation(f"m{i}", (step + 30 + 7 * i) * MS, (27.5 + 6.1 * i) * MS, 7, machine,
                                       ceilings=ceilings))
    KernelModel.fit(rows, recs).save(tmp_path / "one.forest")
    KernelModel.fit(rows, recs, jobs=3).save(tmp_path / "three.forest")
    assert (tmp_path / "one.forest").read_bytes() == (tmp_path / "three.forest").read_bytes()
    # Where the system cannot start a pool (no shared memory for its semaphores), the fit runs in this process.
    def no_pool(*args, **kwargs):
        raise PermissionError(13, "Permission denied", "/dev/shm")

    monkeypatch.setattr(concurrent.futures, "ProcessPoolExecutor", no_pool)
    KernelModel.fit(rows, recs, jobs=3).save(tmp_path / "here.forest")
    assert (tmp_path / "here.forest").read_bytes() == (tmp_path / "one.forest").read_bytes()


def test_a_machine_without_kernel_rows_transfers_by_ceilings_and_widens(fixed: KernelModel) -> None:
    # Twice the peak and bandwidth: the same efficiencies on half the rooflines, 3 x 2 + 2 x 0.25 + 5 x 0.3 = 8 ms.
    p = predict_fixed(fixed, target("other", 2.0), (CONV, CONV, RELU, CONV, RELU))
    assert p is not None and p.predictor == TRANSFER_PREDICTOR
    assert p.step_seconds == pytest.approx(8 * MS)
    q10, _, q90 = only(fixed).calibration[("onnxruntime", "cpu", "")]
    widen = (Z80 * NEW_MACHINE_SPREAD) ** 2
    assert p.low_seconds == pytest.approx(8 * MS / math.exp(math.sqrt(q10 ** 2 + widen)))
    assert p.high_seconds == pytest.approx(8 * MS * math.exp(math.sqrt(q90 ** 2 + widen)))
    assert p.widening and p.widening.new_machine == NEW_MACHINE_SPREAD


def test_each_machine_kind_is_fit_apart_and_a_machine_of_neither_is_composed_by_the_nearest() -> None:
    # A second kind beside the fixed table's: twice BOX's peak, its Conv at a quarter of BOX's efficiency (8 ms).
    twin = MachineCeilings("cpu", "twin", 4, 200.0, None, 10.0)
    rows, recs = fixed_table()
    twin_rows = [kernel_row(CONV, 8 * MS, f"m{i}", "twin", ceilings=twin) for i in range(len(STEPS_MS))]
    twin_rows += [kernel_row(RELU, 0.5 * MS, f"m{i}", "twin", ceilings=twin) for i in range(len(STEPS_MS))]
    twin_recs = [reconciliation(f"m{i}", (step + 4) * MS, 8.5 * MS, 2, "twin", ceilings=twin)
                 for i, step in enumerate(STEPS_MS)]
    both = KernelModel.fit([*rows, *twin_rows], [*recs, *twin_recs])
    alone = {"box": KernelModel.fit(rows, recs), "twin": KernelModel.fit(twin_rows, twin_recs)}
    assert [m.key for m in both.machines] == [only(alone["box"]).key, only(alone["twin"]).key]
    candidate = Candidate("onnxruntime", "cpu", Precision.fp32, (), 4)

    def composed(model: KernelModel, machine: MachineCeilings) -> tuple[float, float, float, bool]:
        c = model.compose((CONV, RELU), machine, candidate)
        assert c is not None
        return c.step_s, c.low_s, c.high_s, c.known_machine

    # Each machine's steps by its own kind's model: the other's rows change nothing.
    assert composed(both, BOX) == pytest.approx(composed(alone["box"], BOX))
    assert composed(both, twin) == pytest.approx(composed(alone["twin"], twin))
    assert composed(both, twin)[0] > 1.5 * composed(both, BOX)[0] and composed(both, twin)[3]
    # Another probe of BOX (other ceilings, the same kind) is known; a machine of neither kind is composed by the
    # nearest known machine's model, transferred: by name first, then by ceilings.
    reprobed = replace(BOX, fp32_gflops=110.0)
    assert composed(both, reprobed) == pytest.approx(composed(alone["box"], reprobed)) and composed(both, reprobed)[3]
    near_twin = MachineCeilings("cpu", "other", 4, 190.0, None, 10.0)
    assert composed(both, near_twin) == pytest.approx(composed(alone["twin"], near_twin))
    assert not composed(both, near_twin)[3]
    named_box = MachineCeilings("cpu", "box", 8, 190.0, None, 10.0)  # another kind (8 cores) of BOX's name
    assert composed(both, named_box) == pytest.approx(composed(alone["box"], named_box))
    assert not composed(both, named_box)[3]


def test_a_plans_candidates_walk_each_distinct_kernel_row_once(fixed: KernelModel, monkeypatch) -> None:
    from modak.predict.forest import TreeEnsemble

    walked: list[int] = []
    walk = TreeEnsemble.predict_trees
    monkeypatch.setattr(TreeEnsemble, "predict_trees", lambda self, X: walked.append(len(X)) or walk(self, X))
    _, _, workload = cnn()
    predictor = KernelPredictor(fixed, kernels_of=lambda workload, candidate, threads: (CONV, RELU, CONV))
    recipe = load_catalog()["onnxruntime"]
    four, two = (Candidate("onnxruntime", "cpu", Precision.fp32, (), threads) for threads in (4, 2))
    alone = [predictor.predict(workload, target("box", 1.0), c, recipe) for c in (four, two, four)]
    assert walked == [1, 1] * 3  # per candidate: Conv (its two calls one row), then Relu
    walked.clear()
    batched = predictor.predict_many(workload, target("box", 1.0), [(four, recipe), (two, recipe), (four, recipe)])
    assert walked == [1, 1, 1, 1]  # the third candidate's rows were the first's: not walked again
    assert batched == alone and alone[0] != alone[1]


def test_a_kind_whose_trees_disagree_widens_the_interval_by_its_share_of_the_step(fixed: KernelModel) -> None:
    from array import array

    from modak.predict.forest import TreeEnsemble

    step, candidate = (CONV, RELU), Candidate("onnxruntime", "cpu", Precision.fp32, (), 4)
    times = kernel_seconds(only(fixed).kinds, "onnxruntime", "cpu", step, BOX, candidate)
    assert times is not None and [t.spread for t in times] == [0.0, 0.0]  # the fixed table's trees agree
    # Relu's forest replaced by two one-leaf trees 0.1 either side of its correction: the same step, a spread of 0.1.
    key = ("onnxruntime", "cpu", "Relu")
    relu = only(fixed).kinds[key]
    correction = relu.forest.predict([features(sized(RELU), BOX, candidate, relu.attribute_keys)[0]])[0]
    split = TreeEnsemble(array("q", [0, 1]), array("q", [-1, -1]), array("q", [-1, -1]), array("q", [0, 0]),
                         array("d", [0.0, 0.0]), array("d", [correction - 0.1, correction + 0.1]), array("q", [0]))
    box = only(fixed)
    spread = replace(fixed, machines=(replace(box, kinds={**box.kinds, key: replace(relu, forest=split)}),))
    base, wide = (predict_fixed(m, target("box", 1.0), step) for m in (fixed, spread))
    assert base is not None and wide is not None and wide.step_seconds == pytest.approx(base.step_seconds)
    share = 0.1 * times[1].seconds / (times[0].seconds + times[1].seconds)  # weighted by Relu's share of the time
    q10, _, q90 = only(fixed).calibration[("onnxruntime", "cpu", "")]
    assert base.high_seconds / base.step_seconds == pytest.approx(math.exp(q90))
    assert wide.high_seconds / wide.step_seconds == pytest.approx(math.exp(math.sqrt(q90 ** 2 + (Z80 * share) ** 2)))
    assert base.step_seconds / base.low_seconds == pytest.approx(math.exp(-q10))
    assert wide.step_seconds / wide.low_seconds == pytest.approx(math.exp(math.sqrt(q10 ** 2 + (Z80 * share) ** 2)))


def test_no_answer_for_an_unmodelled_kind_an_uncalibrated_runtime_or_training(fixed: KernelModel) -> None:
    pool = Kernel("MaxPool", "pooling", flops=1e5, bytes=1e6)
    assert predict_fixed(fixed, target("box", 1.0), (CONV, pool)) is None  # coverage: every kernel's kind
    assert predict_fixed(fixed, target("box", 1.0), ()) is None
    assert only(fixed).precisions == {("onnxruntime", "cpu"): frozenset({"fp32"})}  # none profiled at int8: no answer
    assert fixed.compose((CONV,), BOX, Candidate("onnxruntime", "cpu", Precision.int8, (), 4)) is None
    rows, recs = fixed_table()
    one = KernelModel.fit(rows[:2], recs[:1])  # one model: nothing out of fold
    assert only(one).calibration == {} and predict_fixed(one, target("box", 1.0), (CONV,)) is None
    loaded, source, workload = cnn()
    candidate = Candidate("onnxruntime", "cpu", Precision.fp32, (), 4)
    predictor = KernelPredictor(fixed, kernels_of=lambda *_: (CONV,))
    training = replace(workload, task=type(workload.task)("training"))
    assert predictor.predict(training, target("box", 1.0), candidate, load_catalog()["onnxruntime"]) is None
    assert predictor.predict(workload, target("box", 1.0), candidate, load_catalog()["onnxruntime"]) is not None


def test_kernels_too_short_to_stand_out_of_the_profiler_are_not_composed(fixed: KernelModel) -> None:
    assert only(fixed).profiling[("onnxruntime", "cpu")] == pytest.approx(PROFILER_S)
    tiny = replace(RELU, flops=1.0, bytes=1e4)  # 1 us of memory time: 1.25 us per call, under 2 x 10 us
    assert predict_fixed(fixed, target("box", 1.0), (tiny, tiny)) is None
    # Beside a Conv the average kernel stands out, and the step is composed.
    assert predict_fixed(fixed, target("box", 1.0), (tiny, tiny, CONV)) is not None


def noisy_launch(draw: random.Random, model: str) -> tuple[list[KernelRow], Reconciliation, tuple[Kernel, ...]]:
    """One profiled launch of Conv and Relu kernels of random sizes (efficiencies 0.5 and 0.8), 0.2 ms dispatch per
    kernel, and a step off that composition by a log-normal factor (SD 0.1)."""
    kernels = tuple(replace(k, flops=k.flops * f, bytes=k.bytes * f)
                    for k in (CONV, RELU) for f in [draw.uniform(0.2, 4) for _ in range(draw.randint(1, 4))])
    times = [max(roofline_seconds(k, BOX, Candidate("onnxruntime", "cpu", Precision.fp32, (), 4)))
             / (0.5 if k.kind == "Conv" else 0.8) for k in kernels]
    step = (sum(times) + 0.2 * MS * len(kernels)) * math.exp(draw.gauss(0, 0.1))
    rows = [kernel_row(k, t, model) for k, t in zip(kernels, times)]
    return rows, reconciliation(model, step, sum(times), len(kernels)), kernels


def test_the_interval_holds_80_percent_of_new_steps() -> None:
    draw = random.Random(1)
    launches = [noisy_launch(draw, f"m{i}") for i in range(100)]
    model = KernelModel.fit([r for rows, _, _ in launches for r in rows], [rec for _, rec, _ in launches])
    inside = []
    for i in range(300):
        _, rec, kernels = noisy_launch(draw, f"new{i}")
        p = predict_fixed(model, target("box", 1.0), kernels)
        assert p is not None
        inside.append(p.low_seconds <= rec.step_s <= p.high_seconds)
    assert 0.7 <= sum(inside) / len(inside) <= 0.9  # 80%, give or take the deciles' error on 100 steps


@pytest.mark.parametrize(("index", "change", "field"), [
    (1, lambda r: replace(r, seconds=-0.001), "kernel_rows[2].seconds"),
    (0, lambda r: replace(r, kernel=replace(r.kernel, op="convolution")), "kernel_rows[1].kernel.op"),
    (0, lambda r: replace(r, kernel=replace(r.kernel, kind=" ")), "kernel_rows[1].kernel.kind"),
    (0, lambda r: replace(r, kernel=replace(r.kernel, flops=float("nan"))), "kernel_rows[1].kernel.flops"),
    (3, lambda r: replace(r, cores=0), "kernel_rows[4].cores"),
    (3, lambda r: replace(r, bandwidth_gbs=float("inf")), "kernel_rows[4].bandwidth_gbs"),
    (2, lambda r: replace(r, peak_bf16_gflops=0.0), "kernel_rows[3].peak_bf16_gflops"),
    (2, lambda r: replace(r, kernel=replace(r.kernel, attributes="{kernel_shape")), "kernel_rows[3].kernel.attributes"),
    (1, lambda r: replace(r, params="[]"), "kernel_rows[2].params"),
    (1, lambda r: replace(r, precision="fp64"), "kernel_rows[2].precision"),
])
def test_a_damaged_kernel_row_is_refused_with_its_location(index, change, field) -> None:
    rows, recs = fixed_table()
    rows[index] = change(rows[index])
    with pytest.raises(InputError) as error:
        KernelModel.fit(rows, recs)
    assert error.value.field == field and error.value.exit_code == EXIT_BAD_INPUT
    assert str(error.value).startswith(f"{field}: ")


def test_a_damaged_reconciliation_is_refused_with_its_location() -> None:
    rows, recs = fixed_table()
    recs[4] = replace(recs[4], step_s=0.0)
    with pytest.raises(InputError, match=r"^reconciliations\[5\]\.step_s: 0\.0 is not a positive time"):
        KernelModel.fit(rows, recs)
    recs[4] = replace(recs[4], step_s=0.005, kernels=0)
    with pytest.raises(InputError, match=r"^reconciliations\[5\]\.kernels: "):
        KernelModel.fit(rows, recs)


def efficiency(flops: float) -> float:
    """The synthetic runtime's efficiency: small matrix products reach less of the roofline."""
    return 0.15 + 0.6 / (1 + math.exp(-(math.log10(flops) - 7.5) * 1.5))


def matmul(m: int, n: int, k: int) -> Kernel:
    return Kernel("MatMul", "matmul", shapes=((m, k), (k, n)), flops=2.0 * m * n * k,
                  bytes=4.0 * (m * k + k * n + m * n))


def test_fit_recovers_a_known_roofline_efficiency_and_transfers_it_by_ceilings() -> None:
    machines = {("a", "cpu"): MachineCeilings("cpu", "a", 4, 100.0, None, 10.0),
                ("b", "cpu"): MachineCeilings("cpu", "b", 8, 400.0, None, 30.0)}
    draw = random.Random(0)
    sizes = [2 ** e for e in range(4, 11)]
    rows = []
    for i in range(480):  # 240 per machine
        name = "a" if i % 2 else "b"
        kernel = matmul(draw.choice(sizes), draw.choice(sizes), draw.choice(sizes))
        machine = machines[(name, "cpu")]
        threads = draw.choice((1, machine.cores))
        candidate = Candidate("onnxruntime", "cpu", Precision.fp32, (), threads)
        bound = max(roofline_seconds(kernel, machine, candidate))
        rows.append(kernel_row(kernel, bound / efficiency(kernel.flops), f"m{i % 12}", machine=name,
                               threads=threads, ceilings=machine))
    model = KernelModel.fit(rows, [])
    assert [m.key for m in model.machines] == [("cpu", "a", 4, False), ("cpu", "b", 8, False)]
    # New shapes on a machine of other ceilings, at threads it was never profiled with, by each machine's model.
    unseen = MachineCeilings("cpu", "c", 6, 250.0, None, 20.0)
    for fitted in model.machines:
        assert fitted.calibration == {} and fitted.dispatch == {}
        errors = []
        for _ in range(60):
            kernel = matmul(draw.randint(24, 900), draw.randint(24, 900), draw.randint(24, 900))
            candidate = Candidate("onnxruntime", "cpu", Precision.fp32, (), 3)
            predicted = kernel_seconds(fitted.kinds, "onnxruntime", "cpu", [kernel], unseen, candidate)
            assert predicted is not None
            truth = max(roofline_seconds(kernel, unseen, candidate)) / efficiency(kernel.flops)
            errors.append(abs(predicted[0].seconds / truth - 1))
        assert statistics.median(errors) < 0.05 and max(errors) < 0.15


def test_a_kernel_row_faster_than_the_flops_named_for_it_is_not_learned_from() -> None:
    """A whole decoder layer (82 MFLOPs, computed when OpenVINO compiled detr_r18) mapped to one Add that ran in
    4 us: the row's FLOPs would take 0.8 ms at BOX's peak. Learned from, it throws its kind's compute cost off."""
    candidate = Candidate("onnxruntime", "cpu", Precision.fp32, (), 4)
    honest = []
    for i, n in enumerate((64, 128, 256, 384)):
        kernel = matmul(n, n, n)
        honest.append(kernel_row(kernel, 2 * max(roofline_seconds(kernel, BOX, candidate)), f"m{i}"))
    misnamed = [kernel_row(replace(matmul(50, 256, 1), flops=8.2e7), 4e-6, f"detr{i}") for i in range(2)]
    assert all(map(attributable, honest)) and not any(map(attributable, misnamed))
    unseen = matmul(160, 160, 160)
    truth = 2 * max(roofline_seconds(unseen, BOX, candidate))
    fitted = KernelModel.fit([*honest, *misnamed], []).machines[0].kinds["onnxruntime", "cpu", "MatMul"]
    assert fitted.rows == len(honest)
    predicted = kernel_seconds({("onnxruntime", "cpu", "MatMul"): fitted}, "onnxruntime", "cpu", [unseen], BOX,
                               candidate)
    assert predicted is not None and predicted[0].seconds == pytest.approx(truth, rel=0.05)
    assert fitted.prior == pytest.approx((0.0, 2.0, 0.0), abs=1e-9)  # the honest rows' efficiency, 0.5
    learned_from_all = fit_kind([*honest, *misnamed])  # the kind with the rows: its prior no longer sees FLOPs
    assert learned_from_all.prior[1] == pytest.approx(0.0, abs=1e-9)


def test_a_kinds_correction_is_applied_as_far_as_it_predicts_the_kinds_other_models() -> None:
    candidate = Candidate("onnxruntime", "cpu", Precision.fp32, (), 4)
    draw = random.Random(1)
    sizes = [2 ** e for e in range(4, 11)]
    rows = []
    for i in range(120):  # MatMul: one efficiency curve in every model, so the correction transfers across them
        kernel = matmul(draw.choice(sizes), draw.choice(sizes), draw.choice(sizes))
        rows.append(kernel_row(kernel, max(roofline_seconds(kernel, BOX, candidate)) / efficiency(kernel.flops),
                               f"m{i % 6}"))
    for i in range(6):  # Gemm: each model of sizes of its own, at 0.3 or 0.9 of the roofline by model
        for j in range(10):
            kernel = replace(matmul(64, 64, 2 ** (4 + i) + 2 * j), kind="Gemm")
            rows.append(kernel_row(kernel, max(roofline_seconds(kernel, BOX, candidate)) / (0.3, 0.9)[i % 2],
                                   f"m{i}"))
    rows += [kernel_row(replace(RELU, flops=1e5 * n), 0.5 * MS * n, f"m{n % 2}") for n in range(1, 9)]  # 2 models
    kinds = only(KernelModel.fit(rows, [])).kinds
    matmul_kind, gemm, relu = (kinds[("onnxruntime", "cpu", kind)] for kind in ("MatMul", "Gemm", "Relu"))
    assert matmul_kind.share >= 0.75
    # Held out, a Gemm model's neighbours in size run at the other efficiency: the trees' correction would carry it
    # the wrong way, so the kind keeps its prior; so does a kind of fewer models than folds.
    assert gemm.share == 0.0 and relu.share == 0.0
    unseen = replace(matmul(64, 64, 100), kind="Gemm")
    compute_s, memory_s = roofline_seconds(unseen, BOX, candidate)
    times = kernel_seconds(kinds, "onnxruntime", "cpu", [unseen], BOX, candidate)
    assert times is not None and times[0].seconds == pytest.approx(gemm.prior_seconds(compute_s, memory_s))


def reorder(elements: int) -> Kernel:
    return Kernel("Reorder", "data_movement", shapes=((elements,),), flops=0.0, bytes=8.0 * elements)


def reorder_seconds(kernel: Kernel) -> float:
    """The synthetic runtime's data movement: 20 us per call, then half the bandwidth."""
    candidate = Candidate("openvino", "cpu", Precision.fp32, (), 4)
    return 20e-6 + roofline_seconds(kernel, BOX, candidate)[1] / 0.5


def test_a_fixed_cost_per_call_extrapolates_along_the_roofline_and_little_of_a_step_may_be_past_the_limit() -> None:
    # Profiled sizes 1e3 ... 1e5 elements: 20 us fixed, then up to 160 us of memory time per call. A forest of the
    # roofline's ratio to the time would carry the largest profile's ratio to a larger kernel (4e5 elements:
    # 680 us / 0.2 = 3.2 ms); the prior goes along the roofline to 20 + 640 us.
    sizes = [int(10 ** (3 + 2 * i / 39)) for i in range(40)]
    rows = [kernel_row(reorder(n), reorder_seconds(reorder(n)), f"m{i % 5}", runtime="openvino")
            for i, n in enumerate(sizes)]
    model = KernelModel.fit(rows, [])
    kind = only(model).kinds[("openvino", "cpu", "Reorder")]
    assert kind.prior == pytest.approx((20e-6, 0.0, 2.0), rel=0.01)  # the penalty on c costs it 0.3%
    assert (kind.max_flops, kind.max_bytes) == (0.0, 8e5)
    candidate = Candidate("openvino", "cpu", Precision.fp32, (), 4)
    larger = reorder(400_000)  # 4x the largest profiled: within
    times = kernel_seconds(only(model).kinds, "openvino", "cpu", [larger, reorder(400_001)], BOX, candidate)
    assert times is not None and times[0].seconds == pytest.approx(reorder_seconds(larger), rel=0.02)
    assert [e.extrapolated for e in times] == [False, True]
    # A kernel with FLOPs where the kind's profiles had none is past the limit too.
    busy = replace(reorder(1000), flops=1.0)
    assert kernel_seconds(only(model).kinds, "openvino", "cpu", [busy], BOX, candidate)[0].extrapolated
    # A step is composed where its extrapolated kernels hold at most a tenth of its kernel time.
    recs = [reconciliation(f"m{i}", 30e-6 * (1 + 0.1 * i), 25e-6, 1, runtime="openvino") for i in range(5)]
    model = KernelModel.fit(rows, recs)
    small, past = reorder(10_000), reorder(1_000_000)  # 36 us, and 1.62 ms past the limit
    assert model.compose((past, *[small] * 500), BOX, candidate) is not None  # 1.62 of 19.6 ms
    assert model.compose((past, *[small] * 300), BOX, candidate) is None  # 1.62 of 12.4 ms


def test_a_kind_no_profile_has_shown_is_not_priced_from_its_op_class(fixed: KernelModel) -> None:
    candidate = Candidate("onnxruntime", "cpu", Precision.fp32, (), 4)
    kinds = only(fixed).kinds
    assert {kind for _, _, kind in kinds} == {"Conv", "Relu", class_kind("conv"), class_kind("elementwise")}
    deconv = replace(CONV, kind="ConvTranspose")  # of the conv class, whose pooled model has Conv's rows
    assert kernel_seconds(kinds, "onnxruntime", "cpu", [CONV, deconv], BOX, candidate) is None
    assert fixed.compose((CONV, CONV, CONV, deconv), BOX, candidate) is None


def test_a_kernel_its_kind_would_extrapolate_is_answered_by_its_op_class() -> None:
    # "Depthwise" is profiled only at the machine's ridge point (10 FLOPs per byte), where its calls cannot tell a
    # compute-bound kernel from a memory-bound one, and only up to 16 MFLOPs; Conv's calls span 0.5 to 50 FLOPs per
    # byte and up to 160 MFLOPs. Both take 4x their compute roofline.
    candidate = Candidate("onnxruntime", "cpu", Precision.fp32, (), 4)

    def timed(kernel: Kernel) -> float:
        return roofline_seconds(kernel, BOX, candidate)[0] / 0.25

    rows = []
    for i in range(20):
        flops = 1e6 * 2 ** (i % 5)
        depthwise = Kernel("Depthwise", "conv", flops=flops, bytes=flops / 10)
        conv = Kernel("Conv", "conv", flops=10 * flops, bytes=10 * flops / (0.5 * 100 ** (i / 19)))
        rows += [kernel_row(depthwise, timed(depthwise), f"m{i % 5}"), kernel_row(conv, timed(conv), f"m{i % 5}")]
    kinds = only(KernelModel.fit(rows, [])).kinds
    own = kinds[("onnxruntime", "cpu", "Depthwise")]
    assert own.intensities == pytest.approx((10.0, 10.0), rel=1e-3)
    at_ridge, memory_heavy, larger, apart = (Kernel("Depthwise", "conv", flops=f, bytes=b)
                                             for f, b in ((4e6, 4e5), (4e6, 4e6), (1e8, 1e7), (4e6, 4e9)))
    assert own.within(at_ridge) and not any(map(own.within, (memory_heavy, larger, apart)))
    times = kernel_seconds(kinds, "onnxruntime", "cpu", [at_ridge, memory_heavy, larger, apart], BOX, candidate)
    assert times is not None
    # The pooled model answers the two outside the kind's range, from Conv's calls too: the time follows the FLOPs.
    assert [e.extrapolated for e in times] == [False, False, False, True]
    for estimate, kernel in zip(times[:3], (at_ridge, memory_heavy, larger)):
        assert estimate.seconds == pytest.approx(timed(kernel), rel=0.1)
    # Without the pool (as the probe's sampling fits a kind alone), the kind's own model answers, extrapolated.
    alone = kernel_seconds(fit_kinds(rows, pooled=False), "onnxruntime", "cpu", [memory_heavy], BOX, candidate)
    assert alone is not None and alone[0].extrapolated


def test_a_kernel_the_analysis_did_not_cost_is_sized_by_its_tensors() -> None:
    rnn = Kernel("RNNSeq:ref_any_f32", "other", shapes=((1, 64, 256), (1, 2048, 256)))
    assert sized(rnn).bytes == 4.0 * (64 * 256 + 2048 * 256 + 64 * 256)
    assert sized(CONV) == CONV and sized(Kernel("Reorder", "data_movement")) == Kernel("Reorder", "data_movement")
    # So an uncosted kind's time grows with its tensors (here 1 us + 1 ns per byte) instead of staying its median.
    rows = [kernel_row(Kernel("RNNSeq", "other", shapes=((1, n, 256),)), 1e-6 + 8e-9 * n * 256, f"m{n % 5}",
                       runtime="openvino") for n in range(8, 400, 8)]
    model = KernelModel.fit(rows, [])
    candidate = Candidate("openvino", "cpu", Precision.fp32, (), 4)
    times = kernel_seconds(only(model).kinds, "openvino", "cpu", [Kernel("RNNSeq", "other", shapes=((1, 1000, 256),))],
                           BOX, candidate)
    assert times is not None and times[0].seconds == pytest.approx(1e-6 + 8e-9 * 1000 * 256, rel=0.02)


def test_a_recurrent_kernel_is_read_from_each_runtimes_shapes_and_sized_by_its_weights_per_step() -> None:
    # The same 64-step LSTM layer (256 inputs, 512 hidden) as ONNX Runtime, OpenVINO and PyTorch report it.
    lstm = Recurrence(steps=64, directions=1, gates=4, hidden=512, inputs=256)
    ort = Kernel("LSTM", "recurrent", ("lstm",), ((64, 1, 256), (1, 2048, 256), (1, 2048, 512), (1, 4096)),
                 flops=lstm.flops, bytes=6.5e6)
    openvino = Kernel("RNNSeq:ref_any_f32", "other", (), ((1, 64, 256), (1, 1, 512), (1, 1, 512), (1,),
                                                         (1, 2048, 256), (1, 2048, 512), (1, 2048)))
    pytorch = Kernel("aten::mkldnn_rnn_layer", "other", (), ((64, 1, 256), (2048, 256), (2048, 512), (2048,)))
    assert recurrence(ort) == recurrence(openvino) == recurrence(pytorch) == lstm
    # A bidirectional GRU whose input shape the runtime did not report: its steps from the analysis' FLOPs.
    gru = Recurrence(steps=256, directions=2, gates=3, hidden=128, inputs=256)
    assert recurrence(Kernel("GRU", "recurrent", ("gru",), ((), (2, 384, 256), (2, 384, 128)), flops=gru.flops)) == gru
    assert recurrence(Kernel("GRU", "recurrent", ("gru",), ((), (2, 384, 256), (2, 384, 128)))) is None
    # Attention's square weights and a convolution are not recurrences.
    assert recurrence(Kernel("Subgraph", "other", (), ((1, 128, 64), (351, 128, 64), (351, 128, 128)))) is None
    assert recurrence(CONV) is None
    # Each runtime's layer is priced by the recurrent weights it reads every step, not once.
    for kernel in (ort, openvino, pytorch):
        assert sized(kernel).flops == lstm.flops == 2.0 * 64 * 2048 * (256 + 512)
        assert sized(kernel).bytes == 4.0 * (64 * 2048 * 512 + 2048 * 256 + 64 * (256 + 512))


def test_one_recurrent_model_teaches_another_of_other_steps_and_width() -> None:
    # Layers whose time is 20 us plus their recurrent weights read every step at 40 GB/s, profiled in four models of
    # other lengths and widths than the one asked: the time follows the steps and the width.
    def layer(steps: int, hidden: int) -> Kernel:
        return Kernel("RNNSeq", "other", (), ((1, steps, hidden), (1, 1, hidden), (1, 3 * hidden, hidden),
                                              (1, 3 * hidden, hidden)))

    def seconds(steps: int, hidden: int) -> float:
        return 20e-6 + steps * 3 * hidden * hidden * 4 / 40e9

    rows = [kernel_row(layer(steps, hidden), seconds(steps, hidden), f"m{i}", runtime="openvino")
            for i, (steps, hidden) in enumerate(((100, 256), (256, 128), (50, 512), (400, 64)))]
    model = KernelModel.fit(rows, [])
    candidate = Candidate("openvino", "cpu", Precision.fp32, (), 4)
    asked = ((200, 256), (30, 512), (1000, 128), (128, 192))  # (weights once, the old sizing: 0.43, 1.9, 0.27, 0.77)
    times = kernel_seconds(only(model).kinds, "openvino", "cpu", [layer(*a) for a in asked], BOX, candidate)
    assert times is not None
    assert [t.seconds for t in times] == pytest.approx([seconds(*a) for a in asked], rel=0.05)


def test_one_size_of_calls_is_read_as_an_efficiency_not_a_fixed_cost(fixed: KernelModel) -> None:
    # Every Conv call of the fixed table has the same size: the penalty puts it all on the roofline (efficiency 0.5).
    assert only(fixed).kinds[("onnxruntime", "cpu", "Conv")].prior == pytest.approx((0.0, 2.0, 0.0), abs=1e-3)
    assert only(fixed).kinds[("onnxruntime", "cpu", "Relu")].prior == pytest.approx((0.0, 0.0, 1.25), abs=1e-3)


def test_the_fit_is_cached_as_arrays_and_loads_back_equal(tmp_path: Path, fixed: KernelModel) -> None:
    data = KernelData.of(*fixed_table())
    first = KernelModel.cached(data, tmp_path)
    assert len(list(tmp_path.glob("*.forest"))) == 1
    again = KernelModel.cached(data, tmp_path)  # loaded, not fit: the same arrays
    box = only(fixed)
    for model in (first, again):
        assert only(model).calibration == pytest.approx(box.calibration) and only(model).dispatch == box.dispatch
        assert only(model).signatures == box.signatures and only(model).machine_kinds == box.machine_kinds
        assert only(model).precisions == box.precisions
        assert (only(model).key, only(model).ceilings) == (box.key, box.ceilings)
    assert (predict_fixed(again, target("box", 1.0), (CONV, RELU))
            == predict_fixed(fixed, target("box", 1.0), (CONV, RELU)))
    # A kind's arrays are decoded when first asked; a damaged byte anywhere refuses the whole file, which is refit.
    saved = next(tmp_path.glob("*.forest"))
    data_bytes = saved.read_bytes()
    saved.write_bytes(data_bytes[:-1] + bytes([data_bytes[-1] ^ 1]))
    refit = KernelModel.cached(data, tmp_path)
    assert saved.read_bytes() == data_bytes and only(refit).calibration == pytest.approx(only(fixed).calibration)


def test_the_forest_answers_for_a_runtime_without_kernel_rows_and_the_plan_says_which(tmp_path: Path,
                                                                                      monkeypatch) -> None:
    from modak.predict import training

    monkeypatch.setattr(training, "shipped_kernel_files", lambda: [])  # the local rows below are the only ones
    loaded, source, workload = cnn()
    ceilings = target_ceilings(loaded.target, loaded.target_doc)
    here = MachineCeilings.of_target(ceilings, "cpu")

    def planned(workload, candidate, threads):  # one kernel per ONNX node, named by its op type
        return tuple(Kernel(op.op_type, op.op_class if op.op_class in OP_CLASSES else "other", (op.name,),
                            flops=float(op.flops), bytes=float(op.bytes)) for op in workload.ops)

    rows, recs = [], []
    for i, scale in enumerate((0.5, 0.8, 1.0, 1.3, 2.0, 3.0)):  # six "models": the CNN's kernels at other sizes
        model = f"cnn{i}"
        kernels = [replace(k, flops=k.flops * scale, bytes=k.bytes * scale) for k in planned(workload, None, 0)]
        times = [max(roofline_seconds(k, here, Candidate("onnxruntime", "cpu", Precision.fp32, (), None))) / 0.4
                 for k in kernels]
        rows += [kernel_row(k, t, model, machine="here", threads=0, ceilings=here) for k, t in zip(kernels, times)]
        recs.append(reconciliation(model, sum(times) * (1.1 + 0.02 * i), sum(times), len(kernels), machine="here",
                                   threads=0, ceilings=here))
    store = tmp_path / "perf.sqlite"
    with PerfStore(store) as perf:  # the local store's kernel rows: the default predictor asks the kernel model first
        perf.add_kernels(rows, recs)
    default = default_predictor(store).make()  # what the plan asks where it remembers no prediction
    assert isinstance(default, FallbackPredictor) and isinstance(default.predictors[0], KernelPredictor)
    assert default.name == f"{PREDICTOR}+{GPU_TERMS}+learned+roofline"
    # The runtime's report of the graph is the seam: the CNN's ONNX nodes, one kernel each.
    predictor = replace(default, predictors=(replace(default.predictors[0], kernels_of=planned),
                                             *default.predictors[1:]))
    plan = make_plan(loaded, source, workload, predictor=predictor)
    document = plan.to_dict()
    by_runtime: dict[str, set[str]] = {}
    for candidate in document["candidates"]:
        by_runtime.setdefault(candidate["runtime"], set()).add(candidate["predictor"])
    assert by_runtime.pop("onnxruntime") == {PREDICTOR}
    assert by_runtime and set().union(*by_runtime.values()) == {"learned"}
    predictors = next(r for r in document["reasons"] if r.startswith("predictors: "))
    assert f"{PREDICTOR} for onnxruntime" in predictors and "learned for " in predictors
    assert "kernels: the sum over the kernels the runtime plans" in predictors
    chosen = document["candidates"][0]
    assert document["reasons"][0].endswith(f"({chosen['predictor']})")
    json.dumps(document)


def test_for_model_binds_the_graph_through_the_fallback(fixed: KernelModel) -> None:
    bound = for_model(FallbackPredictor((KernelPredictor(fixed), RooflinePredictor())), Path("model.onnx"))
    assert isinstance(bound, FallbackPredictor) and isinstance(bound.predictors[0], KernelPredictor)
    assert bound.predictors[0].onnx_path == Path("model.onnx") and bound.predictors[1] == RooflinePredictor()
    loaded, _, workload = cnn()
    candidate = Candidate("onnxruntime", "cpu", Precision.fp32, (), 4)
    # Without a graph, no planned kernels: no answer, the next predictor's.
    assert KernelPredictor(fixed).predict(workload, target("box", 1.0), candidate,
                                          load_catalog()["onnxruntime"]) is None


def test_a_changed_shipped_file_is_another_data_key(tmp_path: Path, monkeypatch) -> None:
    import os

    from modak.predict import training

    shipped = tmp_path / "kernels-box.csv"
    write_kernel_csv(shipped, fixed_table()[0])
    monkeypatch.setattr(training, "shipped_kernel_files", lambda: [shipped])
    first = kernel_set(tmp_path / "none.sqlite")
    assert first is not None and kernel_set(tmp_path / "none.sqlite").key == first.key  # unchanged: the same fit
    status = shipped.stat()
    content = shipped.read_bytes()
    shipped.write_bytes(content.replace(b"m0", b"m9"))  # the same size, other bytes, written later
    os.utime(shipped, ns=(status.st_atime_ns, status.st_mtime_ns + 1))
    assert shipped.stat().st_size == status.st_size and kernel_set(tmp_path / "none.sqlite").key != first.key


def test_the_default_predictor_asks_the_kernel_model_first_where_there_are_kernel_rows(tmp_path: Path,
                                                                                       monkeypatch) -> None:
    from modak.predict import training

    shipped = kernel_set(tmp_path / "none.sqlite")  # the shipped kernel files alone
    chain = f"{PREDICTOR}+{GPU_TERMS}+learned+roofline"  # the GPU model answers GPU candidates only
    assert shipped is not None and default_predictor(tmp_path / "none.sqlite").name == chain
    store = tmp_path / "perf.sqlite"
    with PerfStore(store) as perf:
        perf.add_kernels(*fixed_table())
    data = kernel_set(store)
    assert data is not None and data.key != shipped.key
    rows, recs = data.load()
    assert set(fixed_table()[0]) <= set(rows) and set(fixed_table()[1]) <= set(recs)  # the local rows, merged
    again = kernel_set(store)
    assert again is not None and data.key == again.key != KernelData.of(*fixed_table()).key  # shipped files too
    monkeypatch.setattr(training, "shipped_kernel_files", lambda: [])  # the fits below: of the local rows alone
    assert default_predictor(store).name == chain
    given = default_predictor(store).make()
    assert isinstance(given, FallbackPredictor) and isinstance(given.predictors[0], KernelPredictor)
    box = next(m for m in given.predictors[0].model.machines if m.key == BOX.key)  # the local rows' machine
    assert box.kinds.keys() >= {("onnxruntime", "cpu", "Conv"), ("onnxruntime", "cpu", "Relu")}
    rows, recs = fixed_table()
    with PerfStore(store) as perf:  # a damaged row in the store: the plan's predictor refuses it, located
        perf.add_kernels([replace(rows[0], seconds=-1.0)], [])
    with pytest.raises(InputError, match=r"^kernel_rows\[\d+\]\.seconds: -1\.0 is not a time"):
        make_plan(*cnn(), predictor=default_predictor(store))


def test_a_local_configuration_replaces_its_shipped_kernel_rows(tmp_path: Path, monkeypatch) -> None:
    import modak.predict.training as training

    rows, recs = fixed_table()
    shipped = tmp_path / "perfmodels"
    shipped.mkdir()
    write_kernel_csv(shipped / "kernels-box.csv", rows)
    write_reconcile_csv(shipped / "reconcile-box.csv", recs)
    (shipped / "box.csv").write_text("")  # a file of measurements: not the kernel model's
    monkeypatch.setattr(training, "data_dir", lambda name: tmp_path / name)
    assert [p.name for p in training.shipped_kernel_files()] == ["kernels-box.csv", "reconcile-box.csv"]
    store = tmp_path / "perf.sqlite"
    data = kernel_set(store)
    assert data is not None and data.load() == (rows, recs)
    again = [replace(r, seconds=r.seconds * 2) for r in rows[:2]]  # model m0 profiled again locally
    with PerfStore(store) as perf:
        perf.add_kernels(again, [replace(recs[0], step_s=0.01)])
    local = kernel_set(store)
    assert local is not None and local.key != data.key
    assert local.load() == (rows[2:] + again, recs[1:] + [replace(recs[0], step_s=0.01)])


def test_only_runtimes_whose_plan_is_their_profile_are_fit() -> None:
    """torch.compile's profiled kernels (Inductor's) are stored but not learned from: its plan names eager ops."""
    rows, recs = fixed_table()
    for runtime in ("pytorch", "torch-compile"):
        rows += [replace(r, runtime=runtime) for r in rows if r.runtime == "onnxruntime"]
        recs += [replace(r, runtime=runtime) for r in recs if r.runtime == "onnxruntime"]
    model = KernelModel.fit(rows, recs)
    assert model.calibrated("pytorch", "cpu") and not model.calibrated("torch-compile", "cpu")
    assert {key[0] for key in only(model).kinds} == {"onnxruntime", "pytorch"}



def test_a_probed_layer_teaches_its_kernels_not_what_a_step_adds(fixed: KernelModel) -> None:
    """A one-layer session's step is mostly the fixed cost of a run (here 50 ms around a 0.5 ms kernel): its
    kernel rows fit the kinds; dispatch, the profiler's cost and the calibration come from whole models' steps."""
    rows, recs = fixed_table()
    layer = f"{PROBE_MODEL_PREFIX}m0-onnxruntime-0123456789ab"
    model = KernelModel.fit([*rows, kernel_row(RELU, 0.5 * MS, layer)],
                            [*recs, reconciliation(layer, 50 * MS, 0.5 * MS, 1)])
    relu = ("onnxruntime", "cpu", "Relu")
    assert only(model).kinds[relu].rows == only(fixed).kinds[relu].rows + 1
    assert (only(model).dispatch, only(model).profiling) == (only(fixed).dispatch, only(fixed).profiling)
    assert only(model).calibration.keys() == only(fixed).calibration.keys()
    assert all(only(model).calibration[key] == pytest.approx(value) for key, value in only(fixed).calibration.items())
    # Layers alone: nothing to calibrate a step with, so the kernel model answers no step.
    alone = KernelModel.fit([kernel_row(RELU, 0.5 * MS, layer)], [reconciliation(layer, 50 * MS, 0.5 * MS, 1)])
    assert not alone.calibrated("onnxruntime", "cpu")
