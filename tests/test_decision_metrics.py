"""Decision metrics of `modak model eval`: the pick against the measured best by an equivalence test on their
launches (paired by round within a session), captured speedup over stock, family grouping, seed spread."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

from modak.candidates.catalog import load_catalog
from modak.measurements.store import Measurement
from modak.output import print_scores
from modak.predict import evaluate as evaluation
from modak.predict.evaluate import (
    HIT,
    MISS,
    UNDECIDED,
    Scores,
    captured_speedup,
    decision,
    score,
    seed_spread,
    stock_row,
)

STOCK = {"allocator": "default", "channels_last": False, "threads": "all"}  # PyTorch's recipe defaults


def row(step: float, launches: list[float] | None = None, session: str | None = None, model: str = "resnet18",
        runtime: str = "onnxruntime", precision: str = "fp32", params: dict | None = None,
        batch: int = 1) -> Measurement:
    """A measured row of ``model`` at batch ``batch``; ``launches``: its per-launch medians (protocol 2)."""
    return Measurement(
        machine="m", microarchitecture="x86_64_v3", cores=2, peak_fp32_gflops=100.0, peak_bf16_gflops=None,
        bandwidth_gbs=20.0, gpu=None, model=model, task="inference", batch_size=batch, input_shapes="{}",
        flops=1e9, bytes=1e8, forward_flops=1e9, parameters=1000, nodes=10,
        op_class_flops=json.dumps({"matmul": 1e9}), op_class_bytes=json.dumps({"matmul": 1e8}),
        runtime=runtime, device="cpu", precision=precision,
        params=json.dumps(params if params is not None else {"threads": "all", "step": step}, sort_keys=True),
        threads=2, status="ok", step_median_s=step, step_p10_s=step, step_p90_s=step, repeats=10,
        throughput_per_s=1 / step, compile_s=1.0, peak_rss_mb=100.0, max_abs_error=0.0, error=None, versions="{}",
        measured_at="2026-01-01T00:00:00Z", protocol=2 if launches else 1, launches=len(launches or [step]),
        launch_medians=json.dumps(launches) if launches else None, session=session)


DRIFT = [1.0, 1.3, 0.9, 1.1, 1.2, 0.95]  # the machine's speed over six rounds (ms per step)


def test_a_pick_equivalent_within_noise_is_a_hit() -> None:
    best = row(1e-3, [d * 1e-3 for d in DRIFT], "s")
    pick = row(1.01e-3, [d * f * 1e-3 for d, f in zip(DRIFT, (1.0, 1.02, 1.01, 1.0, 1.02, 1.01))], "s")
    result = decision(pick, best)
    assert result.verdict == HIT and result.ratio.paired and result.ratio.rounds == 6 and not result.one_launch
    assert result.ratio.high <= 1.05 and result.ratio.estimate == pytest.approx(1.0099, abs=1e-4)


def test_a_consistently_slower_pick_is_a_miss_and_pairing_cancels_the_drift() -> None:
    """20% slower in every round: paired, the interval is [1.2, 1.2]; across sessions the drift widens it."""
    best = [d * 1e-3 for d in DRIFT]
    pick = [t * 1.2 for t in best]
    paired = decision(row(1.2e-3, pick, "s"), row(1e-3, best, "s"))
    assert paired.verdict == MISS and paired.ratio.paired
    assert (paired.ratio.low, paired.ratio.estimate, paired.ratio.high) == pytest.approx((1.2, 1.2, 1.2))
    unpaired = decision(row(1.2e-3, pick, "a"), row(1e-3, best, "b"))
    assert not unpaired.ratio.paired and unpaired.ratio.estimate == pytest.approx(1.2)
    assert unpaired.ratio.low < 1.1 and unpaired.ratio.high > 1.3


def test_noisy_unpaired_launches_near_three_percent_are_undecided() -> None:
    best = row(1e-3, [1.0e-3, 1.25e-3, 0.85e-3, 1.1e-3, 0.9e-3], "a")
    pick = row(1.03e-3, [1.3e-3, 0.8e-3, 1.05e-3, 1.2e-3, 0.95e-3], "b")
    result = decision(pick, best)
    assert result.verdict == UNDECIDED and not result.ratio.paired
    assert result.ratio.low < 1.0 < 1.05 < result.ratio.high


def test_one_launch_each_reduces_the_test_to_the_point_ratio() -> None:
    near, far = decision(row(1.03e-3), row(1e-3)), decision(row(1.06e-3), row(1e-3))
    assert near.verdict == HIT and far.verdict == MISS and near.one_launch and far.one_launch
    assert (near.ratio.low, near.ratio.high) == pytest.approx((1.03, 1.03))


def test_a_pick_tied_with_the_best_is_a_hit() -> None:
    result = decision(row(1e-3, params={"a": 1}), row(1e-3, params={"a": 2}))
    assert result.verdict == HIT and result.ratio.estimate == 1.0 and not result.one_launch


def test_captured_speedup_is_the_picks_share_of_the_best_speedup_over_stock() -> None:
    stock = row(4e-3, runtime="pytorch", params=STOCK)
    assert captured_speedup(4e-3, 2e-3, 1e-3) == pytest.approx(0.5)
    catalog = load_catalog()
    assert stock_row([row(1e-3), stock], catalog) is stock
    assert stock_row([row(1e-3, runtime="pytorch", params={**STOCK, "threads": "half"})], catalog) is None
    assert stock_row([row(1e-3, runtime="pytorch", precision="bf16", params=STOCK)], catalog) is None


def test_scores_count_hits_undecided_and_captured_speedup() -> None:
    """Workload 1 (batch 1): stock 4 ms, the pick 2 ms, the best 1 ms, one launch each: a miss capturing half.
    Workload 2 (batch 8, no stock row): the pick at 1.03x the best, one launch each: a hit by the point ratio.
    Workload 3 (batch 16): two rows predicted alike, so the pick is the slower one: undecided by its launches;
    a third row, equivalent to the best, is not picked."""
    stock = row(4e-3, runtime="pytorch", params=STOCK)
    rows = [stock, row(2e-3), row(1e-3),
            row(1.03e-3, batch=8), row(1e-3, batch=8),
            row(1.03e-3, [1.3e-3, 0.8e-3, 1.05e-3, 1.2e-3, 0.95e-3], "b", batch=16),
            row(1e-3, [1.0e-3, 1.25e-3, 0.85e-3, 1.1e-3, 0.9e-3], "a", batch=16),
            row(1.001e-3, batch=16)]
    predicted = {0: 5e-3, 1: 1e-3, 2: 3e-3, 3: 1e-3, 4: 2e-3, 5: 1e-3, 6: 1e-3, 7: 2e-3}
    result = score("scheme", "test", rows, predicted, 0, {})
    assert (result.workloads, result.no_stock, result.one_launch) == (3, 2, 2)
    assert result.hit_rate == pytest.approx(1 / 3) and result.undecided == pytest.approx(1 / 3)
    assert result.miss_rate == pytest.approx(1 / 3)
    assert result.captured_median == pytest.approx(0.5) and result.captured_p10 == pytest.approx(0.5)
    assert result.pick_speedup == pytest.approx(2.0)


def test_ratio_to_stock_above_the_trees_90th_percentile_checks_the_stock_guard() -> None:
    """Measured ratios to stock (0.5 and 0.25) against the trees' paired ratios: above all of the first row's trees
    (0.20-0.29), inside the second's (0.30-1.20): one of two above the 90th percentile. Without trees: NaN."""
    stock, slow, fast = row(4e-3, runtime="pytorch", params=STOCK), row(2e-3), row(1e-3)
    stock_trees = tuple([5e-3] * 10)
    trees = {0: stock_trees, 1: tuple(5e-3 * (0.20 + 0.01 * k) for k in range(10)),
             2: tuple(5e-3 * (0.30 + 0.10 * k) for k in range(10))}
    assert evaluation.stock_ratio_above_p90(slow, stock, trees[1], stock_trees)
    assert not evaluation.stock_ratio_above_p90(fast, stock, trees[2], stock_trees)
    predicted = {0: 5e-3, 1: 1e-3, 2: 3e-3}
    assert score("s", "learned", [stock, slow, fast], predicted, 0, {}, trees=trees).stock_ratio_above_p90 == 0.5
    assert math.isnan(score("s", "learned", [stock, slow, fast], predicted, 0, {}).stock_ratio_above_p90)


def test_seed_spread_is_reported_as_mean_min_max(capsys, monkeypatch) -> None:
    assert seed_spread([0.1, 0.3, 0.2]) == pytest.approx((0.2, 0.1, 0.3))
    assert all(math.isnan(v) for v in seed_spread([math.nan]))
    base: dict[str, Any] = dict(split="leave-one-model-out", rows=10, uncovered=0, answered=(), within_10=0.5,
                                within_25=0.9, mape_calibrated=0.1,
                kendall_tau_median=0.5,
                kendall_tau_noise=0.8,
                interval_coverage=math.nan, stock_ratio_above_p90=math.nan, workloads=2, hit_rate=0.5, undecided=0.0,
                one_launch=2,
                captured_median=0.9, captured_p10=0.8, pick_speedup=2.0, no_stock=0)
    monkeypatch.delenv("COLUMNS", raising=False)
    print_scores([Scores(predictor="forest", seed=0, mape=0.1, **base),
                  Scores(predictor="forest", seed=1, mape=0.3, **base),
                  Scores(predictor="baseline", seed=None, mape=0.5, **base)])
    text = capsys.readouterr().out
    assert "forest over 2 seeds: mean [min–max]" in text
    mape = next(line for line in text.splitlines() if line.strip("│ ").startswith("MAPE ")).strip("│ ").split()
    assert [cell for cell in mape if cell != "│"] == ["MAPE", "20.0%", "[10.0–30.0%]", "50.0%"]
    assert max(len(line) for line in text.splitlines()) <= 100


def test_calibrated_mape_and_the_launches_own_tau() -> None:
    """Predictions 2x every measured time: MAPE 100%, but after one stock run the rest is exact. Three
    configurations whose launches rank them the same way in two rounds and reversed in the third: the launches'
    own tau is the mean over the three pairs of rounds, (1 - 1 - 1) / 3."""
    stock = row(4e-3, [4e-3, 4e-3, 1e-3], "s", runtime="pytorch", params=STOCK)
    others = [row(2e-3, [2e-3, 2e-3, 2e-3], "s"), row(1e-3, [1e-3, 1e-3, 4e-3], "s", params={"threads": "half"})]
    rows = [stock, *others]
    result = score("s", "learned", rows, {i: 2 * r.step_s for i, r in enumerate(rows)}, 0, {})
    assert result.mape == pytest.approx(1.0) and result.mape_calibrated == pytest.approx(0.0)
    assert evaluation.launch_tau(rows) == pytest.approx(-1 / 3)
    assert result.kendall_tau_noise == pytest.approx(-1 / 3)
    assert math.isnan(evaluation.launch_tau(rows[:2]))
