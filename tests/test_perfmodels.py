"""The shipped measurements against their machines' ceilings: a row's FLOP/s above its peak means the peak is
not a ceiling, and every roofline term and utilization feature built on it is wrong."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from modak.measurements.kernels import is_label_csv
from modak.measurements.store import read_csv

PERFMODELS = Path(__file__).resolve().parents[1] / "perfmodels"
# published/ holds figures from papers (benchmarks/published/scale_published.py) and gpu-runs/ a GPU session's own
# files (benchmarks/data/gpu_session.py), not the perf store's measured rows; kernels-*.csv and reconcile-*.csv hold
# the operator-level model's labels (tests/test_kernel_store.py reads them).
CSV_FILES = sorted(p for p in PERFMODELS.rglob("*.csv")
                   if p.relative_to(PERFMODELS).parts[0] not in ("published", "gpu-runs") and not is_label_csv(p))


def achieved_over_peak(row) -> float:
    peak = row.peak_bf16_gflops if row.precision == "bf16" else row.peak_fp32_gflops
    return row.flops / row.step_median_s / 1e9 / peak


@pytest.mark.parametrize("path", CSV_FILES, ids=lambda p: str(p.relative_to(PERFMODELS)))
def test_no_shipped_row_runs_faster_than_its_machines_peak(path: Path) -> None:
    rows = [r for r in read_csv(path) if r.status == "ok" and r.step_median_s and r.precision in ("fp32", "bf16")]
    assert rows
    over = sorted(((achieved_over_peak(r), r.model, r.runtime, r.precision, r.batch_size) for r in rows), reverse=True)
    assert over[0][0] <= 1.0, f"rows above their peak: {[o for o in over if o[0] > 1.0][:5]}"


def test_the_shipped_targets_state_the_peaks_their_rows_carry() -> None:
    for target_file in sorted((PERFMODELS / "targets").glob("*.yaml")):
        target = yaml.safe_load(target_file.read_text())
        rows = [r for path in CSV_FILES for r in read_csv(path) if r.machine == target["name"]]
        assert rows, target_file
        if "gpus" in target:  # GPU peaks in TFLOP/s, as gpu_session.py probes them
            peaks = target["gpus"]["peaks"]
            assert {r.peak_fp32_gflops for r in rows} == {round(peaks["fp32_tflops"] * 1000, 1)}
            assert {r.peak_bf16_gflops for r in rows} == {round(peaks["bf16_tflops"] * 1000, 1)}
            assert {r.bandwidth_gbs for r in rows} == {peaks["memory_bandwidth_gbs"]}
            continue
        peaks = target["cpu"]["peaks"]
        assert {r.peak_fp32_gflops for r in rows} == {peaks["fp32_gflops"]}
        bf16 = {peaks["bf16_gflops"]} if "bf16_gflops" in peaks else set()  # none: no native bf16
        assert {r.peak_bf16_gflops for r in rows if r.peak_bf16_gflops} == bf16


def test_a_gpu_target_plans_its_rows_device() -> None:
    """The probed GPU target is a valid target whose ceilings are the probe's (not the catalog's)."""
    from modak.hardware.ceilings import target_ceilings
    from modak.spec.loader import load_spec
    from modak.spec.models import Precision
    from modak.spec.target import Target

    for target_file in sorted((PERFMODELS / "targets").glob("gpu-*.yaml")):
        target, doc = load_spec(target_file, Target)
        ceilings = target_ceilings(target, doc)
        peaks = yaml.safe_load(target_file.read_text())["gpus"]["peaks"]
        assert ceilings.gpu is not None and ceilings.gpu.measured
        assert ceilings.gpu.peak_gflops[Precision.bf16] == peaks["bf16_tflops"] * 1000
