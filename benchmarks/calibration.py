"""Does one calibration run on a new machine improve predictions there? Error before vs after.

The "new machine" is this one restricted to one CPU (run the script under ``taskset -c 0``), probed as its
own target: a different allocation with its own ceilings. On it, every campaign-grid candidate of a
calibration workload and of a held-out workload is measured. Then:

- before: the learned model trained on the shipped data only (``perfmodels/*.csv``) predicts the held-out
  workload's candidates on the new target;
- after: the calibration workload's rows are added as local rows (as ``modak bench`` would store them) and
  the model is refit; it predicts the same held-out candidates again.

Printed: per candidate measured vs predicted before/after, and MAPE and top-1 regret before/after.

    taskset -c 0 python benchmarks/calibration.py [--calibrate mobilenet_v2:inference:8] \
        [--held-out resnet18:inference:8]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

import yaml
from campaign import grid_catalog

from modak.bench.harness import BenchSettings, bench, zoo_plan
from modak.bench.probe import probe, to_target
from modak.bench.store import PerfStore
from modak.predict.evaluate import LOCAL_WEIGHT, ok_rows, shipped_rows
from modak.predict.learned import LearnedPredictor, example_from_row
from modak.spec.loader import SpecDocument
from modak.spec.models import Target

CONFIG = Path(__file__).with_name("campaign.yaml")


def workload(text: str) -> tuple[str, str, int]:
    model, task, batch = text.split(":")
    return model, task, int(batch)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calibrate", type=workload, default=("mobilenet_v2", "inference", 8))
    parser.add_argument("--held-out", type=workload, default=("resnet18", "inference", 8))
    parser.add_argument("--name", default="ci-epyc-1cpu")
    args = parser.parse_args()
    config = yaml.safe_load(CONFIG.read_text())
    catalog = grid_catalog(config["grid"], None)
    shipped = ok_rows(shipped_rows())
    if not shipped:
        raise SystemExit("no shipped rows in perfmodels/: run the campaign first")

    result = probe()
    target = Target.model_validate(to_target(result, args.name))
    print(f"new machine: {target.cpu.sockets * target.cpu.cores_per_socket} core(s), "
          f"{target.cpu.peaks.fp32_gflops} GFLOP/s fp32, {target.cpu.peaks.memory_bandwidth_gbs} GB/s")
    doc = SpecDocument(Path(f"<probe {args.name}>"))
    settings = BenchSettings(repeat=10, budget_s=2.0)
    with tempfile.TemporaryDirectory() as tmp, PerfStore(Path(tmp) / "local.sqlite") as store:
        measured = {}
        for label, (model, task, batch) in (("calibration", args.calibrate), ("held-out", args.held_out)):
            plan, source = zoo_plan(model, batch, task, config["precision"], target, doc, catalog)
            rows = bench(plan, source, [r.candidate for r in plan.ranked], store, settings)
            measured[label] = ok_rows(rows)
            print(f"measured {len(measured[label])} candidates of {model}/{task}/b{batch} ({label})")
    held = measured["held-out"]
    examples = [example_from_row(r) for r in held]
    before = LearnedPredictor(shipped).predict_examples(examples)
    after = LearnedPredictor(shipped + measured["calibration"],
                             [1.0] * len(shipped) + [LOCAL_WEIGHT] * len(measured["calibration"])).predict_examples(examples)

    print(f"\n{'candidate':<70} {'measured ms':>11} {'before ms':>10} {'after ms':>10}")
    for row, b, a in zip(held, before, after):
        name = f"{row.runtime}/{row.precision} {row.params}"
        print(f"{name[:70]:<70} {row.step_median_s * 1e3:11.3f} {b[0] * 1e3:10.3f} {a[0] * 1e3:10.3f}")
    best = min(r.step_median_s for r in held)
    for label, predictions in (("before", before), ("after", after)):
        errors = [abs(p[0] - r.step_median_s) / r.step_median_s for p, r in zip(predictions, held)]
        pick = min(range(len(held)), key=lambda i: predictions[i][0])
        print(f"{label:>6}: MAPE {statistics.mean(errors):6.1%}, median APE {statistics.median(errors):6.1%}, "
              f"top-1 regret {held[pick].step_median_s / best - 1:6.1%} (picked {held[pick].runtime})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
