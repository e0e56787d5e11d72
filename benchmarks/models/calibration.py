"""Does one calibration run on a new machine improve predictions there? Error before vs after.

The "new machine" is this one restricted to one CPU (run the script under ``taskset -c 0``), probed as its
own target: a different allocation with its own ceilings. On it, every campaign-grid candidate of each listed
workload is measured once (``--save`` keeps those rows as CSV; ``--load`` scores saved rows again without
measuring). Then, for every ordered pair of workloads (calibration, held-out):

- before: the learned model trained on the shipped data only (``perfmodels/*.csv``) predicts the held-out
  workload's candidates on the new target;
- after: the calibration workload's rows are added as local rows (as ``modak bench`` would store them) and
  the model is refit; it predicts the same held-out candidates again.

Every pair is printed (no pair is chosen): MAPE and top-1 regret before/after, and their means over pairs.

    taskset -c 0 python -m benchmarks.models.calibration --save calibration.csv
    python -m benchmarks.models.calibration --load calibration.csv
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

import yaml

from benchmarks.data.campaign import CONFIG, grid_catalog
from benchmarks.tools.zoo_jobs import zoo_plan
from modak.bench.harness import BenchSettings, bench
from modak.candidates.catalog import load_catalog
from modak.hardware.probe import probe, to_target
from modak.measurements.store import Measurement, PerfStore, read_csv, write_csv
from modak.predict.learned import LearnedPredictor, example_from_row
from modak.predict.training import LOCAL_WEIGHT, ok_rows, shipped_rows
from modak.spec.document import SpecDocument
from modak.spec.loader import validate
from modak.spec.target import Target

WORKLOADS = ("mobilenet_v2:inference:8", "resnet18:inference:8", "mlp:inference:64", "mnist_cnn:training:64")


def workload(text: str) -> tuple[str, str, int]:
    model, task, batch = text.split(":")
    return model, task, int(batch)


def measure(workloads: list[tuple[str, str, int]], name: str) -> list[Measurement]:
    """Probe this allocation as a new target and measure every grid candidate of each workload on it."""
    config = yaml.safe_load(CONFIG.read_text())
    catalog = grid_catalog(config["grid"], None)
    result = probe()
    target = validate(to_target(result, name), Target)
    print(f"new machine: {target.cpu.sockets * target.cpu.cores_per_socket} core(s), "
          f"{target.cpu.peaks.fp32_gflops} GFLOP/s fp32, {target.cpu.peaks.memory_bandwidth_gbs} GB/s", flush=True)
    doc = SpecDocument(Path(f"<probe {name}>"))
    settings = BenchSettings(launches=3, min_seconds=0.5, budget_s=2.0)
    rows: list[Measurement] = []
    with tempfile.TemporaryDirectory() as tmp, PerfStore(Path(tmp) / "local.sqlite") as store:
        for model, task, batch in workloads:
            plan = zoo_plan(model, batch, task, config["precision"], target, doc, catalog)
            measured = ok_rows(bench(plan, [r.candidate for r in plan.ranked], store, settings))
            print(f"measured {len(measured)} candidates of {model}/{task}/b{batch}", flush=True)
            rows += measured
    return rows


def errors(held: list[Measurement], predictions: list[tuple]) -> tuple[float, float]:
    """(MAPE, top-1 regret) of step-time predictions for one workload's measured rows."""
    mape = statistics.mean(abs(p[0] - r.step_median_s) / r.step_median_s for p, r in zip(predictions, held))
    pick = min(range(len(held)), key=lambda i: predictions[i][0])
    return mape, held[pick].step_median_s / min(r.step_median_s for r in held) - 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workloads", nargs="+", type=workload, default=[workload(w) for w in WORKLOADS],
                        help="model:task:batch, at least two")
    parser.add_argument("--name", default="ci-epyc-1cpu")
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--save", type=Path, help="write the measured rows to this CSV")
    source.add_argument("--load", type=Path, help="score rows saved by --save instead of measuring")
    args = parser.parse_args()
    if len(args.workloads) < 2:
        parser.error("--workloads needs at least two workloads")
    shipped = ok_rows(shipped_rows())
    catalog = load_catalog()
    if not shipped:
        raise SystemExit("no shipped rows in perfmodels/: run the campaign first")
    rows = ok_rows(read_csv(args.load)) if args.load else measure(args.workloads, args.name)
    if args.save:
        write_csv(args.save, rows)
    by_workload = {w: [r for r in rows if (r.model, r.task, r.batch_size) == w] for w in args.workloads}
    by_workload = {w: held for w, held in by_workload.items() if held}
    before = {w: errors(held,
                        LearnedPredictor.fit(shipped).predict_examples([example_from_row(r, catalog) for r in held]))
              for w, held in by_workload.items()}

    print(f"\n{'calibrated on':<26} {'held out':<26} {'n':>3} {'MAPE before':>11} {'after':>7} "
          f"{'regret before':>13} {'after':>7}")
    pairs = []
    for calibration, cal_rows in by_workload.items():
        model = LearnedPredictor.fit(shipped + cal_rows, [1.0] * len(shipped) + [LOCAL_WEIGHT] * len(cal_rows))
        for held_out, held in by_workload.items():
            if held_out == calibration:
                continue
            after = errors(held, model.predict_examples([example_from_row(r, catalog) for r in held]))
            pairs.append((before[held_out], after))
            print(f"{':'.join(map(str, calibration)):<26} {':'.join(map(str, held_out)):<26} {len(held):3d} "
                  f"{before[held_out][0]:11.1%} {after[0]:7.1%} {before[held_out][1]:13.1%} {after[1]:7.1%}")
    improved = sum(a[0] < b[0] for b, a in pairs)
    print(f"mean over {len(pairs)} pairs: MAPE {statistics.mean(b[0] for b, _ in pairs):.1%} -> "
          f"{statistics.mean(a[0] for _, a in pairs):.1%} (improved in {improved}), regret "
          f"{statistics.mean(b[1] for b, _ in pairs):.1%} -> {statistics.mean(a[1] for _, a in pairs):.1%}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
