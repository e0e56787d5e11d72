"""The GPU model's terms (#68 item 2, modak/predict/gpu.py) on fixed tables: the launch fit, the host transfer, the
regime, the capture counted as compile time, and the host link from the catalog or a probe. No timings."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import yaml

from modak import api
from modak.candidates.candidate import Candidate
from modak.candidates.catalog import load_catalog
from modak.hardware.ceilings import PAGEABLE_SHARE, HostLink, target_ceilings
from modak.predict.gpu import (
    GpuPredictor,
    GpuRow,
    GpuTerms,
    LaunchKey,
    device_seconds,
    fit_launch,
    host_bytes,
    prior_node_us,
    transfer_seconds,
)
from modak.spec.models import Precision
from modak.workload.analysis import OpStats, step_profile

EAGER = LaunchKey("pytorch", "inference", casts=False, graphs=False)


def _row(nodes: int, step_ms: float, device_ms: float = 0.0, transfer_ms: float = 0.0, model: str = "m",
         key: LaunchKey = EAGER) -> GpuRow:
    return GpuRow(key, model, nodes, step_ms * 1e-3, device_ms * 1e-3, transfer_ms * 1e-3, 20.0)


def test_the_launch_fit_recovers_the_per_node_cost_of_launch_bound_rows() -> None:
    # launch-bound rows at 18 µs per node (+ 20 µs per call), and a compute-bound one that must not pull it up
    rows = [_row(100, (100 * 18 + 20) / 1e3), _row(300, (300 * 18 + 20) / 1e3, transfer_ms=0.0),
            _row(200, 30.0, device_ms=30.0)]
    fit = fit_launch(rows)[EAGER]
    assert fit.rows == 3 and fit.node_us == pytest.approx(18.0, rel=0.03)  # the grid's 5% steps
    assert fit.log_error_p90 < 0.03
    assert fit_launch(rows[:1]) == {}  # one row: the recipe's prior stands


def test_the_launch_fit_subtracts_the_host_copies() -> None:
    rows = [_row(100, 1.82 + 0.5, transfer_ms=0.5), _row(200, 3.62 + 1.0, transfer_ms=1.0)]
    assert fit_launch(rows)[EAGER].node_us == pytest.approx(18.0, rel=0.03)


def test_keys_split_autocast_casts_and_graphs() -> None:
    fp32 = Candidate("pytorch", "gpu", Precision.fp32, (("cuda_graphs", False),), None)
    tf32 = Candidate("pytorch", "gpu", Precision.tf32, (), None)
    bf16 = Candidate("pytorch", "gpu", Precision.bf16, (), None)
    fp16 = Candidate("pytorch", "gpu", Precision.fp16, (("cuda_graphs", True),), None)
    assert LaunchKey.of(fp32, "inference") == LaunchKey.of(tf32, "inference") == EAGER
    assert LaunchKey.of(bf16, "inference").casts and not LaunchKey.of(bf16, "inference").graphs
    assert LaunchKey.of(fp16, "inference") == LaunchKey("pytorch", "inference", True, True)
    perf = load_catalog()["pytorch"].performance["gpu"]
    assert prior_node_us(perf, LaunchKey("pytorch", "inference", False, True)) == perf.graph_node_overhead_us
    assert prior_node_us(perf, EAGER) == perf.node_overhead_us
    assert prior_node_us(perf, LaunchKey("pytorch", "training", False, False)) == 3 * perf.node_overhead_us


def test_transfer_is_bytes_over_the_links_bandwidth_pinned_or_pageable() -> None:
    link = HostLink(50.0, 20.0, 40.0, 10.0)
    assert transfer_seconds(link, 50e6, 40e6, pinned=True) == pytest.approx(1e-3 + 1e-3)
    assert transfer_seconds(link, 20e6, 10e6, pinned=False) == pytest.approx(1e-3 + 1e-3)
    pcie5 = HostLink.of_catalog("H100")  # alias of H100-SXM, host_link pcie5 (63 GB/s per direction)
    assert (pcie5.h2d_pinned_gbs, pcie5.h2d_pageable_gbs) == (63.0, 63.0 * PAGEABLE_SHARE) and not pcie5.measured
    assert HostLink.of_catalog("no such GPU") == HostLink.unknown()


def test_the_step_and_its_regime() -> None:
    launch = GpuTerms(launch_s=3e-3, transfer_s=0.5e-3, compute_s=1e-3, memory_s=0.5e-3)
    assert launch.step_s == pytest.approx(3.5e-3) and launch.regime == "launch"
    compute = GpuTerms(launch_s=1e-3, transfer_s=0.5e-3, compute_s=4e-3, memory_s=1e-3)
    assert compute.step_s == pytest.approx(5.5e-3) and compute.regime == "compute"
    assert GpuTerms(1e-3, 9e-3, 1e-3, 1e-3).regime == "transfer"
    assert GpuTerms(1e-3, 0.0, 1e-3, 2e-3).regime == "memory"


def test_device_seconds_per_op_class() -> None:
    perf = load_catalog()["pytorch"].performance["gpu"]
    compute, memory = device_seconds({"conv": 1e12, "elementwise": 0.0}, {"conv": 1e6, "elementwise": 7e9}, perf,
                                     {}, Precision.fp32, 100_000.0, 1000.0)
    assert compute == pytest.approx(1e12 / (100e12 * perf.compute_efficiency["conv"]))
    assert memory == pytest.approx(7e9 / (1000e9 * perf.memory_efficiency))
    _, half = device_seconds({}, {"elementwise": 7e9}, perf, {}, Precision.bf16, 100_000.0, 1000.0)
    assert half == pytest.approx(memory / 2)  # bf16 tensors move half the bytes


def _plan_inputs(tmp_path: Path, probed: dict | None = None) -> tuple:
    target = {"apiVersion": "modak/v1", "kind": "Target", "name": "g",
              "cpu": {"microarchitecture": "sapphirerapids", "cores_per_socket": 16}, "memory": {"size_gb": 128},
              "gpus": {"model": "H100-SXM", "count": 1, **({"peaks": probed} if probed else {})}}
    (tmp_path / "t.yaml").write_text(yaml.safe_dump(target))
    (tmp_path / "j.yaml").write_text(yaml.safe_dump({
        "apiVersion": "modak/v1", "kind": "Job", "name": "j", "target": "t.yaml", "task": "inference",
        "model": {"zoo": "mlp", "batch_size": 4}, "device": "gpu"}))
    loaded = api.load(tmp_path / "j.yaml")
    return loaded, target_ceilings(loaded.target, loaded.target_doc)


def test_a_probed_host_link_replaces_the_catalogs(tmp_path: Path) -> None:
    probed = {"h2d_pinned_gbs": 25.0, "h2d_pageable_gbs": 9.0, "d2h_pinned_gbs": 24.0, "d2h_pageable_gbs": 8.0}
    _, ceilings = _plan_inputs(tmp_path, probed)
    assert ceilings.gpu.host_link == HostLink(25.0, 9.0, 24.0, 8.0, measured=True)
    _, catalog = _plan_inputs(tmp_path)
    assert catalog.gpu.host_link == HostLink.of_catalog("H100-SXM")


def test_the_predictor_on_a_fixed_workload(tmp_path: Path) -> None:
    _, ceilings = _plan_inputs(tmp_path)
    catalog = load_catalog()
    recipe = catalog["pytorch"]
    ops = tuple(OpStats(f"n{i}", "Gemm", "matmul", 10**6, 2 * 10**6, 4096, 4096, 4096) for i in range(12))
    workload = step_profile("mlp", "inference", 4, {"input": (784,)}, ops, 0, 0)
    assert host_bytes(workload) == (4 * 4 * 784, 0.0)  # no graph outputs known: inputs from their shapes
    fitted = [_row(len(ops), (len(ops) * 10.0 + 20.0) / 1e3), _row(2 * len(ops), (2 * len(ops) * 10.0 + 20) / 1e3)]
    predictor = GpuPredictor(lambda: [], catalog)
    predictor._fits = fit_launch(fitted)
    eager = Candidate("pytorch", "gpu", Precision.fp32, (("channels_last", False), ("cuda_graphs", False),
                                                           ("io", "pageable")), None)
    graphed = Candidate("pytorch", "gpu", Precision.fp32, (("channels_last", False), ("cuda_graphs", True),
                                                             ("io", "pinned")), None)
    a = predictor.predict(workload, ceilings, eager, recipe)
    b = predictor.predict(workload, ceilings, graphed, recipe)
    assert a is not None and b is not None
    assert a.term("launch_s") == pytest.approx((len(ops) * 10.0 + 20.0) * 1e-6, rel=0.03)
    perf = recipe.performance["gpu"]
    assert b.term("launch_s") == pytest.approx((len(ops) * perf.graph_node_overhead_us + 20.0) * 1e-6)
    link = ceilings.gpu.host_link
    assert a.term("transfer_s") == pytest.approx(4 * 4 * 784 / (link.h2d_pageable_gbs * 1e9))
    assert b.term("transfer_s") == pytest.approx(4 * 4 * 784 / (link.h2d_pinned_gbs * 1e9))
    assert a.regime == "launch" and a.step_seconds == pytest.approx(a.term("transfer_s") + a.term("launch_s"))
    assert b.compile_seconds == pytest.approx(a.compile_seconds + perf.capture_seconds
                                              + perf.capture_seconds_per_node * len(ops))
    assert a.term("launch_fit_rows") == 2 and b.term("launch_fit_rows") == 0
    cpu = Candidate("pytorch", "cpu", Precision.fp32, (), 16)
    assert predictor.predict(workload, ceilings, cpu, recipe) is None  # the CPU's predictors answer it
    assert math.isclose(a.high_seconds / a.step_seconds, 1.25)  # launch-bound on its fit's exact rows: the floor
