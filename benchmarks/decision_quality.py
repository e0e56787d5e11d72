"""Decision quality of the plan, zero-shot: per held-out workload, the learned model is trained without any
row of that workload's model, the plan picks a candidate, and then the pick, the stock deployment (PyTorch
eager, framework defaults) and the campaign's measured best are measured side by side in this run,
alternating. Prints the pick's speedup over stock and its regret against the measured best.

    python benchmarks/decision_quality.py --target perfmodels/targets/ci-epyc-2c-b.yaml \
        --data perfmodels/cpu-ci-epyc-2c-b.csv [--models mnist_cnn resnet18] [--rounds 2]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

from campaign import grid_catalog

import yaml
from modak.bench.harness import BenchSettings
from zoo_jobs import measure_side_by_side, stock_candidate, zoo_plan
from modak.measurements.store import PerfStore, read_csv
from modak.candidates.enumerate import Candidate
from modak.predict.base import FallbackPredictor
from modak.predict.learned import LearnedPredictor
from modak.predict.roofline import RooflinePredictor
from modak.spec.loader import load_spec
from modak.spec.models import Precision, Target

CONFIG = Path(__file__).with_name("campaign.yaml")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", type=Path, required=True)
    parser.add_argument("--data", type=Path, required=True, help="campaign CSV (perfmodels/cpu-*.csv)")
    parser.add_argument("--models", nargs="+")
    parser.add_argument("--task", choices=["inference", "training"])
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    target, target_doc = load_spec(args.target, Target)
    config = yaml.safe_load(CONFIG.read_text())
    catalog = grid_catalog(config["grid"], None)  # the space the campaign measured
    rows = [r for r in read_csv(args.data) if r.status == "ok" and r.machine == target.name]
    workloads = sorted({(r.model, r.task, r.batch_size) for r in rows
                        if (not args.models or r.model in args.models) and (not args.task or r.task == args.task)})
    settings = BenchSettings(launches=3, min_seconds=0.5, budget_s=2.0)
    print(f"{'workload':<28} {'zero-shot pick':<58} {'stock ms':>9} {'pick ms':>9} {'best ms':>9} "
          f"{'vs stock':>8} {'regret':>7}")
    speedups, regrets = [], []
    with tempfile.TemporaryDirectory() as tmp, PerfStore(Path(tmp) / "side-by-side.sqlite") as store:
        for model, task, batch in workloads:
            learned = LearnedPredictor([r for r in rows if r.model != model])
            plan = zoo_plan(model, batch, task, config["precision"], target, target_doc, catalog,
                                    FallbackPredictor((learned, RooflinePredictor())))
            same = [r for r in rows if (r.model, r.task, r.batch_size) == (model, task, batch)]
            top = min(same, key=lambda r: r.step_median_s)
            best = Candidate(top.runtime, top.device, Precision(top.precision), tuple(json.loads(top.params).items()),
                             top.threads)
            pick = plan.choice.candidate
            medians = measure_side_by_side(plan, {"stock": stock_candidate(plan), "pick": pick, "best": best},
                                           args.rounds, settings, store)
            if None in medians.values():
                print(f"{model}/{task}/b{batch}: a configuration failed to run ({medians}); skipped")
                continue
            speedup = medians["stock"] / medians["pick"]
            regret = max(0.0, medians["pick"] / min(medians["best"], medians["pick"]) - 1.0)
            speedups.append(speedup)
            regrets.append(regret)
            print(f"{model + '/' + task + '/b' + str(batch):<28} {pick.name[:58]:<58} {medians['stock'] * 1e3:9.3f} "
                  f"{medians['pick'] * 1e3:9.3f} {medians['best'] * 1e3:9.3f} {speedup:7.2f}x {regret:6.1%}",
                  flush=True)
    if speedups:
        regrets.sort()
        print(f"{len(speedups)} workloads: speedup over stock geometric mean {statistics.geometric_mean(speedups):.2f}x; "
              f"regret median {statistics.median(regrets):.1%}, p90 {regrets[min(len(regrets) - 1, int(0.9 * len(regrets)))]:.1%}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
