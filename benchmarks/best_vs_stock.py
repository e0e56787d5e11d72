"""Per workload: the campaign's best configuration vs the stock one (PyTorch eager, framework defaults).

The best configuration is read from the campaign CSV; both are then measured again here, side by side in
this run, alternating (stock, best, stock, best, ...) so that machine noise hits both alike. The table
prints each one's median over the rounds and the speedup best/stock.

With ``--int8`` (inference workloads), the plan of the workload with int8 allowed (default accuracy gate, random
calibration samples) adds its best candidate of each quantization method that passed the gate; they are measured in
the same interleaved rounds, and each int8 row prints its speedup over stock and over the fp32/bf16 best, next to
its accuracy figure.

    python benchmarks/best_vs_stock.py --target perfmodels/targets/ci-epyc-2c-b.yaml \
        --data perfmodels/cpu-ci-epyc-2c-b.csv [--rounds 2] [--models mnist_cnn resnet18] [--int8]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

from modak.bench.harness import BenchSettings
from zoo_jobs import measure_side_by_side, stock_candidate, zoo_plan
from modak.measurements.store import PerfStore, read_csv
from modak.candidates.enumerate import Candidate
from modak.plan import Plan, RankedCandidate
from modak.spec.loader import load_spec
from modak.spec.models import Precision, Target

def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", type=Path, required=True)
    parser.add_argument("--data", type=Path, required=True, help="campaign CSV (perfmodels/cpu-*.csv)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--models", nargs="+")
    parser.add_argument("--task", choices=["inference", "training"])
    parser.add_argument("--int8", action="store_true", help="also the best int8 candidate of each quantization method")
    args = parser.parse_args()
    target, target_doc = load_spec(args.target, Target)
    rows = [r for r in read_csv(args.data) if r.status == "ok" and r.machine == target.name
            and (not args.models or r.model in args.models) and (not args.task or r.task == args.task)]
    best: dict[tuple[str, str, int], object] = {}
    for row in rows:
        key = (row.model, row.task, row.batch_size)
        if key not in best or row.step_median_s < best[key].step_median_s:
            best[key] = row
    settings = BenchSettings(launches=3, min_seconds=0.5, budget_s=2.0)
    print(f"{'workload':<28} {'best configuration':<72} {'stock ms':>9} {'best ms':>9} {'speedup':>8}")
    speedups = []
    with tempfile.TemporaryDirectory() as tmp, PerfStore(Path(tmp) / "side-by-side.sqlite") as store:
        for (model, task, batch), row in sorted(best.items()):
            int8 = args.int8 and task == "inference"
            plan = zoo_plan(model, batch, task, ["fp32", "bf16", "int8"] if int8 else ["fp32", "bf16"], target,
                            target_doc)
            params = tuple(json.loads(row.params).items())
            winner = Candidate(row.runtime, row.device, Precision(row.precision), params, row.threads)
            quantized = int8_leaders(plan) if int8 else {}
            medians = measure_side_by_side(plan, {"stock": stock_candidate(plan), "best": winner,
                                                  **{label: r.candidate for label, r in quantized.items()}},
                                           args.rounds, settings, store)
            if None in (medians["stock"], medians["best"]):
                print(f"{model}/{task}/b{batch}: a configuration failed to run; skipped")
                continue
            s, b = medians["stock"], medians["best"]
            speedups.append(s / b)
            name = f"{row.runtime}/{row.precision} " + " ".join(f"{k}={v}" for k, v in params)
            print(f"{model + '/' + task + '/b' + str(batch):<28} {name[:72]:<72} {s * 1e3:9.3f} {b * 1e3:9.3f} "
                  f"{s / b:7.2f}x", flush=True)
            for label, ranked in quantized.items():
                q = medians[label]
                measured = "failed to run" if q is None else (f"{q * 1e3:9.3f} ms, {s / q:.2f}x stock, "
                                                              f"{b / q:.2f}x the best above")
                print(f"{'':<28}   {label:<69} {measured}; {ranked.accuracy.figure()}", flush=True)
            for reason in (r for r in plan.reasons if r.startswith("int8 ") and ("failed" in r or "not quantized" in r)):
                print(f"{'':<28}   {reason}", flush=True)
    if speedups:
        print(f"geometric mean speedup over stock: {statistics.geometric_mean(speedups):.2f}x "
              f"(median {statistics.median(speedups):.2f}x, {len(speedups)} workloads)")
    return 0


def int8_leaders(plan: Plan) -> dict[str, RankedCandidate]:
    """The plan's best candidate of each quantization method that passed the accuracy gate, labelled."""
    leaders: dict[str, RankedCandidate] = {}
    for ranked in plan.ranked:  # best first
        if ranked.accuracy is not None:
            leaders.setdefault(f"int8 {ranked.candidate.runtime} {ranked.accuracy.method}", ranked)
    return leaders


if __name__ == "__main__":
    raise SystemExit(main())
