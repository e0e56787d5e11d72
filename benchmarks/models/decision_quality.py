"""Decision quality of the plan, zero-shot: per held-out workload, the learned model is trained without any
row of that workload's model, the plan picks a candidate, and then the pick, the stock deployment (PyTorch
eager, framework defaults) and the campaign's measured best are measured side by side in this run, in
alternating rounds. Per workload: the pick/best ratio paired by round with its t interval and the
verdict of ``modak model eval`` (hit: shown within 5% of the best; miss: shown more than 5% slower; undecided:
the rounds cannot tell), the pick's speedup over stock and the share of the best's speedup it captures.

    python -m benchmarks.models.decision_quality --target perfmodels/targets/ci-epyc-2c-b.yaml \
        --data perfmodels/cpu-ci-epyc-2c-b.csv [--models mnist_cnn resnet18] [--rounds 5]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

import numpy as np
import yaml

from benchmarks.data.campaign import CONFIG, grid_catalog
from benchmarks.tools.zoo_jobs import measure_rounds, stock_candidate, zoo_plan
from modak.bench.harness import BenchSettings
from modak.candidates.enumerate import Candidate
from modak.measurements.stats import Ratio, ratio
from modak.measurements.store import PerfStore, read_csv
from modak.predict.base import FallbackPredictor
from modak.predict.evaluate import HIT, MISS, UNDECIDED, captured_speedup, verdict
from modak.predict.learned import LearnedPredictor, candidate_from_row
from modak.predict.roofline import RooflinePredictor
from modak.spec.loader import load_spec
from modak.spec.target import Target


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", type=Path, required=True)
    parser.add_argument("--data", type=Path, required=True, help="campaign CSV (perfmodels/cpu-*.csv)")
    parser.add_argument("--models", nargs="+")
    parser.add_argument("--task", choices=["inference", "training"])
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds (the paired t interval is over them)")
    args = parser.parse_args()
    target, target_doc = load_spec(args.target, Target)
    config = yaml.safe_load(CONFIG.read_text())
    catalog = grid_catalog(config["grid"], None)  # the space the campaign measured
    rows = [r for r in read_csv(args.data) if r.status == "ok" and r.machine == target.name]
    workloads = sorted({(r.model, r.task, r.batch_size) for r in rows
                        if (not args.models or r.model in args.models) and (not args.task or r.task == args.task)})
    settings = BenchSettings(min_seconds=0.5, budget_s=2.0)
    print(f"{'workload':<28} {'zero-shot pick':<40} {'stock ms':>9} {'pick ms':>9} {'best ms':>9} "
          f"{'vs stock':>8} {'pick/best [90% interval]':>26} {'verdict':>9} {'captured':>8}")
    results: list[tuple[str, float, float]] = []
    with tempfile.TemporaryDirectory() as tmp, PerfStore(Path(tmp) / "side-by-side.sqlite") as store:
        for model, task, batch in workloads:
            learned = LearnedPredictor.fit([r for r in rows if r.model != model])
            plan = zoo_plan(model, batch, task, config["precision"], target, target_doc, catalog,
                            FallbackPredictor((learned, RooflinePredictor())))
            same = [r for r in rows if (r.model, r.task, r.batch_size) == (model, task, batch)]
            best = candidate_from_row(min(same, key=lambda r: r.step_median_s))
            pick = plan.choice.candidate
            times = measure_rounds(plan, {"stock": stock_candidate(plan), "pick": pick, "best": best},
                                   args.rounds, settings, store)
            if any(len(values) < args.rounds for values in times.values()):
                print(f"{model}/{task}/b{batch}: a configuration failed in some round ({times}); skipped")
                continue
            r, outcome, speedup, captured = judge(times, same_configuration(pick, best))
            results.append((outcome, speedup, captured))
            medians = {label: statistics.median(values) for label, values in times.items()}
            print(f"{model + '/' + task + '/b' + str(batch):<28} {pick.name[:40]:<40} {medians['stock'] * 1e3:9.3f} "
                  f"{medians['pick'] * 1e3:9.3f} {medians['best'] * 1e3:9.3f} {speedup:7.2f}x "
                  f"{r.describe():>26} {outcome:>9} {captured:8.3f}", flush=True)
    if results:
        print(summary(results))
    return 0


def same_configuration(a: Candidate, b: Candidate) -> bool:
    """Whether two candidates are one configuration (whatever the order of their parameters)."""
    return (a.runtime, a.device, a.precision, dict(a.params), a.threads) == \
        (b.runtime, b.device, b.precision, dict(b.params), b.threads)


def judge(times: dict[str, list[float]], same: bool) -> tuple[Ratio, str, float, float]:
    """(pick/best ratio paired by round, verdict, pick's speedup over stock, captured speedup) from the rounds'
    times of "stock", "pick" and "best"; ``same``: the pick is the campaign's best configuration (a hit). The
    best's time is the faster of the two, so a pick that beats the campaign's best captures all."""
    r = ratio(times["pick"], times["best"], paired=True)
    stock, pick, best = (statistics.median(times[label]) for label in ("stock", "pick", "best"))
    return r, HIT if same else verdict(r), stock / pick, captured_speedup(stock, pick, min(best, pick))


def summary(results: list[tuple[str, float, float]]) -> str:
    """Hit, undecided and miss shares, captured speedup (median, p10) and the pick's speedup over stock."""
    outcomes = [o for o, _, _ in results]
    captured = [c for _, _, c in results]
    shares = ", ".join(f"{name} {outcomes.count(name) / len(outcomes):.0%}" for name in (HIT, UNDECIDED, MISS))
    return (f"{len(results)} workloads: {shares}; captured speedup median {statistics.median(captured):.3f}, "
            f"p10 {float(np.percentile(captured, 10)):.3f}; pick over stock geometric mean "
            f"{statistics.geometric_mean(s for _, s, _ in results):.2f}x")


if __name__ == "__main__":
    raise SystemExit(main())
