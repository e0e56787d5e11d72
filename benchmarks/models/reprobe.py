"""Another probe of a known machine: how the learned model predicts it, and what ``SAME_KIND_SPREAD`` must be.

A VM probed in another session measures other ceilings (the Ice Lake kind: 356.4, 307.1 and 232.1 GFLOP/s fp32 on
three days), so its machine signature is new to the model, though its kind (microarchitecture and cores) is not.
Each CSV given holds rows measured on such a re-probe (``perfmodels/repeats/``), carrying that session's ceilings.
The model is fit on the shipped rows (``perfmodels/*.csv``, seeds 0 .. n-1) and predicts every row three ways:

- *the plan's*: the re-probe's own ceilings, no machine offset, the interval widened by a same-kind spread ``s``;
- *the sibling's offset*: the same, plus the offset learned for the known machine of the kind;
- *as the known machine*: that machine's ceilings and offset (the re-probe ignored), its interval not widened.

Printed per file: MAPE and mean log error of each; for the plan's, the share of rows inside the 80% interval for
several ``s`` and the ``s`` that puts 80% in. Calibrated on all files, and on each but one and scored on that one.

    python -m benchmarks.models.reprobe perfmodels/repeats/cpu-ci-zen3-2c-session3.csv \\
        perfmodels/repeats/cpu-ci-icelake-2c-session4.csv --seeds 3
"""

from __future__ import annotations

import argparse
import math
import statistics
from dataclasses import dataclass, replace
from pathlib import Path

from modak.candidates.catalog import load_catalog
from modak.measurements.store import read_csv
from modak.predict import learned
from modak.predict.learned import LearnedPredictor, example_from_row
from modak.predict.training import ok_rows, shipped_rows

WAYS = {"plan": "the plan's (own ceilings, no offset)", "offset": "with the sibling's offset",
        "known": "as the known machine (its ceilings and offset)"}
SPREADS = (0.0, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, learned.NEW_MACHINE_SPREAD)


@dataclass(frozen=True)
class Predicted:
    """One row's prediction: measured and predicted step, the trees' own log half-widths."""

    measured: float
    step: float
    trees_low: float  # log(step / low) without any widening
    trees_high: float

    def inside(self, spread: float) -> bool:
        """Whether the measured time is inside the 80% interval widened by ``spread`` in quadrature."""
        low = self.step / math.exp(math.hypot(self.trees_low, learned.Z80 * spread))
        high = self.step * math.exp(math.hypot(self.trees_high, learned.Z80 * spread))
        return low <= self.measured <= high


def predictions(model: LearnedPredictor, path: Path, catalog) -> dict[str, list[Predicted]]:
    """The three ways' predictions (see the module's docstring) for the rows of ``path``."""
    rows = ok_rows(read_csv(path))
    examples = [example_from_row(r, catalog) for r in rows]
    out: dict[str, list[Predicted]] = {way: [] for way in WAYS}
    for row, example, (step, low, high, _, _) in zip(rows, examples, model.predict_examples(examples)):
        machine, same_kind, new_model = model.unseen_spread(example)
        if machine or new_model or not same_kind:
            raise SystemExit(f"{path}: {row.machine} is not another probe of a known kind with known models "
                             f"(kind {example.kind})")
        widen = (learned.Z80 * same_kind) ** 2
        trees_low = math.sqrt(max(0.0, math.log(step / low) ** 2 - widen))
        trees_high = math.sqrt(max(0.0, math.log(high / step) ** 2 - widen))
        known = next(m for m, kind in model.known_machines.items() if kind == example.kind)
        offset = model.machine_offsets.get(known, 0.0)
        as_known = example_from_row(replace(row, peak_fp32_gflops=known[2], bandwidth_gbs=known[3]), catalog)
        (known_step, known_low, known_high, _, _), = model.predict_examples([as_known])
        out["plan"].append(Predicted(row.step_median_s, step, trees_low, trees_high))
        out["offset"].append(Predicted(row.step_median_s, step / math.exp(offset), trees_low, trees_high))
        out["known"].append(Predicted(row.step_median_s, known_step, math.log(known_step / known_low),
                                      math.log(known_high / known_step)))
    return out


def calibrated(predicted: list[Predicted], target: float = 0.8) -> float:
    """The smallest spread that puts ``target`` of the rows inside their interval (bisection)."""
    low, high = 0.0, 2.0
    for _ in range(40):
        middle = (low + high) / 2
        low, high = (middle, high) if statistics.mean(p.inside(middle) for p in predicted) < target else (low, middle)
    return high


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("csv", nargs="+", type=Path, help="rows of a re-probed machine of a known kind")
    parser.add_argument("--seeds", type=int, default=1)
    args = parser.parse_args()
    catalog = load_catalog()
    shipped = ok_rows(shipped_rows())
    by_file: dict[Path, dict[str, list[Predicted]]] = {path: {way: [] for way in WAYS} for path in args.csv}
    for seed in range(args.seeds):
        model = LearnedPredictor.fit(shipped, seed=seed, catalog=catalog)
        for path in args.csv:
            for way, predicted in predictions(model, path, catalog).items():
                by_file[path][way] += predicted
    print(f"shipped rows {len(shipped)}, seeds {args.seeds}; SAME_KIND_SPREAD now {learned.SAME_KIND_SPREAD}")
    for path, ways in by_file.items():
        print(f"\n{path} ({len(ways['plan']) // args.seeds} rows)")
        spread = learned.SAME_KIND_SPREAD
        for way, predicted in ways.items():
            errors = [math.log(p.step / p.measured) for p in predicted]
            print(f"  {WAYS[way]}: MAPE {statistics.mean(abs(math.exp(e) - 1) for e in errors):.1%}, mean log error "
                  f"{statistics.mean(errors):+.3f}, SD {statistics.pstdev(errors):.3f}, inside the 80% interval "
                  f"{statistics.mean(p.inside(0.0 if way == 'known' else spread) for p in predicted):.1%}")
        print("  the plan's, inside the 80% interval: " + ", ".join(
            f"s={s:.3g} {statistics.mean(p.inside(s) for p in ways['plan']):.1%}" for s in SPREADS))
        print(f"  s for 80%: {calibrated(ways['plan']):.3f}")
    plans = {path: ways["plan"] for path, ways in by_file.items()}
    print(f"\nall files: s for 80% {calibrated([p for predicted in plans.values() for p in predicted]):.3f}")
    if len(plans) > 1:
        for path, predicted in plans.items():
            s = calibrated([p for other, rows in plans.items() if other != path for p in rows])
            print(f"calibrated without {path.name}: s {s:.3f}; inside on it "
                  f"{statistics.mean(p.inside(s) for p in predicted):.1%}")


if __name__ == "__main__":
    main()
