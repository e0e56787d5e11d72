"""modak probe --kernels: the zoo's layers, their cut graphs, the adaptive sampler's budget, and a real tiny probe
whose kernel rows carry the machine name plans of target local use."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import pytest

from modak.bench.kprobe import INITIAL_SHARE, ROUND_SIZE, Layer, _draw, cut, sample, zoo_layers
from modak.measurements.kernels import KernelRow


def _dims(value_info) -> list:
    return [d.dim_param or d.dim_value for d in value_info.type.tensor_type.shape.dim]


def test_layers_are_the_zoo_models_planned_kernels_and_cut_as_they_appear():
    import onnx

    from modak.workload.kernels import planned_kernels
    from modak.workload.zoo import export_onnx

    layers = zoo_layers(["mnist_cnn"], runtimes=("onnxruntime",), batches=(1, 8))
    path = export_onnx("mnist_cnn")
    planned = {k.key() for b in (1, 8) for k in planned_kernels("onnxruntime", path, b, {"input": [1, 28, 28]},
                                                               "fp32", 0, zoo="mnist_cnn") if k.nodes}
    assert {(layer.kind, layer.shapes, layer.attributes) for layer in layers} == planned
    assert {layer.batch_size for layer in layers} == {1, 8}
    convs = [layer for layer in layers if layer.kind.endswith("Conv")]
    assert convs and all(len(layer.nodes) == 2 for layer in convs)  # Conv+Relu, as ONNX Runtime fuses them
    graph_nodes = {n.name for n in onnx.load(str(path)).graph.node}
    for layer in layers:
        if layer.kind == "Flatten":
            continue
        model = cut(path, layer.nodes)
        assert [n.name for n in model.graph.node] == list(layer.nodes)
        assert set(layer.nodes) <= graph_nodes
        (first,) = model.graph.input
        assert [layer.batch_size, *_dims(first)[1:]] == list(layer.shapes[0])  # the batch left symbolic


def _layers(count: int, kinds: int = 3) -> list[Layer]:
    return [Layer("onnxruntime", f"K{i % kinds}", ((i + 1, 4),), "{}", float(i + 1), 8.0 * (i + 1), "m", (f"n{i}",), 1)
            for i in range(count)]


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_the_budget_stops_the_sampler_before_a_launch_past_it():
    clock, launched = _Clock(), []

    def measure(layer: Layer) -> tuple[list[KernelRow], list]:
        launched.append(layer)
        clock.now += 10.0  # each layer's launches take 10 s of the fake clock
        return [], []

    done = sample(_layers(50), measure, budget_s=95.0, clock=clock)
    assert len(launched) == 10  # started at 0, 10, ..., 90 s; none at 100 s
    assert done.measured == launched and len(set(id(x) for x in launched)) == 10
    assert len(done.errors) == 2  # launches at 0-30 s (the initial draw to 38 s), then two rounds: 40-70, 80-90 s
    clock.now, launched[:] = 0.0, []
    sample(_layers(3), measure, budget_s=95.0, clock=clock)
    assert len(launched) == 3  # every layer once, then it stops early
    clock.now, launched[:] = 0.0, []
    done = sample(_layers(5), measure, budget_s=0.0, clock=clock)
    assert len(launched) == 1 and done.measured == launched  # a spent budget still measures the first layer


def _row(layer: Layer, seconds: float) -> KernelRow:
    from modak.image.kernels import Kernel

    kernel = Kernel(layer.kind, "conv", layer.nodes, layer.shapes, "{}", layer.flops, layer.bytes)
    return KernelRow(machine="local", microarchitecture="icelake", cores=2, peak_fp32_gflops=300.0,
                     peak_bf16_gflops=None, bandwidth_gbs=30.0, gpu=None, runtime=layer.runtime, device="cpu",
                     threads=2, precision="fp32", params="{}", model="m", batch_size=1, kernel=kernel,
                     seconds=seconds, calls=1, source="test", session="s", measured_at="t")


def test_rounds_draw_unseen_kinds_then_the_kind_with_the_largest_error():
    clock, launched = _Clock(), []

    def measure(layer: Layer) -> tuple[list[KernelRow], list]:
        launched.append(layer)
        clock.now += 1.0
        return [_row(layer, 1.0)], []

    def predict(before, row: KernelRow) -> float:  # K2 is mispredicted tenfold, the others by 10%
        return 10.0 if row.kernel.kind == "K2" else 1.1

    layers = _layers(80, kinds=4)  # 20 of each kind: more than the rounds take
    budget = 20.0
    initial = math.ceil(budget * INITIAL_SHARE)
    done = sample(layers, measure, budget_s=budget, predict=predict, clock=clock)
    assert len(launched) == budget and len(done.errors) == (budget - initial) / ROUND_SIZE
    assert sorted(x.kind for x in launched[initial:initial + ROUND_SIZE]) == ["K0", "K1", "K2", "K3"]  # each once
    assert [x.kind for x in launched[-ROUND_SIZE:]] == ["K2"] * ROUND_SIZE  # then the worst kind's layers
    assert max(done.errors[-1], key=done.errors[-1].get) == ("onnxruntime", "K2")


def test_a_kernel_timed_at_zero_is_scored_at_the_profiler_s_resolution():
    """ONNX Runtime and OpenVINO report whole microseconds: a kernel row of 0 s is scored as the fit reads it
    (half a microsecond), not divided by."""
    clock = _Clock()

    def measure(layer: Layer) -> tuple[list[KernelRow], list]:
        clock.now += 1.0
        return [_row(layer, 0.0)], []

    done = sample(_layers(20, kinds=2), measure, budget_s=10.0, predict=lambda before, row: 1e-6, clock=clock)
    assert done.errors and all(value == pytest.approx(1.0) for value in done.errors[-1].values())  # 1 us / 0.5 us


def test_a_round_measures_each_kind_not_measured_yet_first():
    layers = _layers(12, kinds=4)
    batch = _draw(layers[1:], layers[:1], {}, random.Random(0))  # K0 measured, none predicted
    assert {x.kind for x in batch[:3]} == {"K1", "K2", "K3"}


def test_a_tiny_kernel_probe_stores_rows_under_the_machine_name_plans_use(tmp_path: Path):
    from modak import api
    from modak.measurements.store import PerfStore

    store = tmp_path / "perf.sqlite"
    probed = api.probe_kernels(0.3, store, ("written-target",), ["mnist_cnn"], ["onnxruntime"])
    job = tmp_path / "job.yaml"
    job.write_text(json.dumps({"apiVersion": "modak/v1", "kind": "Job", "name": "j", "target": "local",
                               "task": "inference", "model": {"zoo": "mnist_cnn", "input_shape": [1, 28, 28]}}))
    local = api.load(job).target.name
    assert probed.machines == (local, "written-target")
    assert probed.layers >= 1 and probed.rows >= 1
    ceilings = set()
    with PerfStore(store) as perf:
        for machine in probed.machines:
            rows = perf.kernel_rows(machine=machine)
            assert len(rows) == probed.rows
            assert {r.runtime for r in rows} == {"onnxruntime"}
            # the whole model first (what a step adds to its kernels), then its layers
            assert {r.model for r in rows if not r.model.startswith("probe-")} == {"mnist_cnn"}
            assert all(r.seconds > 0 and r.threads >= 1 for r in rows)
            ceilings |= {(r.microarchitecture, r.cores, r.peak_fp32_gflops, r.bandwidth_gbs) for r in rows}
            assert len(perf.reconciliations(machine=machine)) == probed.reconciliations
        assert len(ceilings) == 1 and min(next(iter(ceilings))[1:]) > 0  # the probe's ceilings, on every row
        assert perf.rows() == []  # the probe's brief timed launches are no campaign measurements
    files = api.export_kernels(tmp_path / "out", store, local)
    assert files


def test_budget_without_kernels_is_refused(capsys: pytest.CaptureFixture[str]):
    from modak.cli import main

    assert main(["probe", "--budget", "1"]) == 2
    assert "--budget" in capsys.readouterr().err


def test_new_machine_quick_prints_the_curve_of_probe_minutes_per_seed_and_their_spread(
        capsys: pytest.CaptureFixture[str], tmp_path: Path):
    from benchmarks.models.new_machine import MARKS_MIN, QUICK_MODELS, main
    from modak.measurements.store import PerfStore

    kept = tmp_path / "probes"
    assert main(["perfmodels/cpu-ci-icelake-2c.csv", "--quick", "--seeds", "0", "1", "--keep", str(kept)]) == 0
    for seed in (0, 1):  # each probe's rows kept for a later look
        with PerfStore(kept / f"probe-seed{seed}.sqlite") as store:
            assert store.kernel_rows() and store.reconciliations()
    lines = capsys.readouterr().out.splitlines()
    marks = len(MARKS_MIN)
    for seed, first in ((0, 0), (1, marks + 2)):
        assert lines[first].startswith(f"probe (seed {seed}): ") and f"of {len(QUICK_MODELS)} models" in lines[first]
        assert int(lines[first].split(" of ")[0].split()[-1]) >= 1  # one layer at least, however long the analysis
        layers = [int(line.split()[1]) for line in lines[first + 2:first + 2 + marks]]
        assert layers == sorted(layers)  # later marks fit on more of the probe's layers (how many: the clock's)
    spread = lines[2 * (marks + 2):]
    assert spread[0] == "spread over seeds 0, 1:" and len(spread) == 2 + marks


def test_the_spread_over_seeds_is_each_marks_lowest_median_and_highest_mape():
    from benchmarks.models.new_machine import Point, spread

    curves = [[Point(2.0, 10, 50, 30, 168, 20.0), Point(15.0, 90, 400, 60, 168, 11.0)],
              [Point(2.0, 12, 55, 0, 168, None), Point(15.0, 80, 380, 50, 168, 30.0)],
              [Point(2.0, 11, 52, 20, 168, 40.0), Point(15.0, 85, 390, 55, 168, 14.0)]]
    assert spread(curves) == [(2.0, (0, 30), (20.0, 30.0, 40.0)), (15.0, (50, 60), (11.0, 14.0, 30.0))]
    assert spread([curves[1][:1]]) == [(2.0, (0, 0), None)]
