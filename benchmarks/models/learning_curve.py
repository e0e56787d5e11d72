"""How the learned model's error on a never-measured model falls with the number of model architectures it learns from.

Leave-one-model-out on one machine's rows (``--machine``), as ``modak model eval`` does it, but with only ``k`` of
the other models in training (every machine's rows of them; each held-out model's fold draws its own random subset,
``--draws`` times). Per ``k``: MAPE, median Kendall tau and hit rate (``modak.predict.evaluate.score``), mean over
the draws [min–max]. Then the learning curve's usual form, MAPE ~ a k^-alpha, fit by least squares in log-log on
every draw's point, and the slope between the two largest sizes in points per doubling: how many architectures
each, continued, would need for ``--target`` (#13's 15%).

    python -m benchmarks.models.learning_curve --machine ci-zen3-2c --sizes 2 4 8 16 20 --draws 3

``--without`` and ``--held-out`` check the curve on models added later: the older models' scores with the data as
it was (``--without NEW...``) against the same scores with the new models' rows in training (``--held-out OLD...``).
"""

from __future__ import annotations

import argparse
import math
import random
import statistics

import numpy as np

from modak.candidates.catalog import load_catalog
from modak.predict.evaluate import Scores, score
from modak.predict.learned import LearnedPredictor, example_from_row
from modak.predict.training import ok_rows, shipped_rows


def curve_point(rows, machine: str, held_out: list[str], k: int, draw: int, catalog) -> Scores:
    """Leave-one-model-out scores of ``machine``'s rows of the models ``held_out``, each fold trained on ``k``
    random other models (draw ``draw`` of the subsets)."""
    models = sorted({r.model for r in rows})
    predicted: dict[int, float] = {}
    intervals: dict[int, tuple[float, float]] = {}
    uncovered = 0
    for held in held_out:
        others = [m for m in models if m != held]
        chosen = set(random.Random(f"{held}/{k}/{draw}").sample(others, min(k, len(others))))
        train = [r for r in rows if r.model in chosen]
        test = [(i, r) for i, r in enumerate(rows) if r.model == held and r.machine == machine]
        model = LearnedPredictor.fit(train, seed=draw, catalog=catalog)
        covered = [(i, r) for i, r in test if (r.runtime, r.device, r.precision) in model.coverage]
        uncovered += len(test) - len(covered)
        for (i, _), (step, low, high, _, _) in zip(covered, model.predict_examples(
                [example_from_row(r, catalog) for _, r in covered])):
            predicted[i] = step
            intervals[i] = (low, high)
    return score(f"k={k}", "learned", rows, predicted, uncovered, intervals, draw, catalog)


def cell(values: list[float], fmt: str) -> str:
    """mean [min–max] of ``values``."""
    return f"{format(statistics.mean(values), fmt)} [{format(min(values), fmt)}–{format(max(values), fmt)}]"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--machine", required=True, help="the machine whose rows are held out and scored")
    parser.add_argument("--sizes", type=int, nargs="+", default=[2, 4, 8, 16],
                        help="numbers of other models in training; one larger than there are means all")
    parser.add_argument("--draws", type=int, default=3, help="random subsets (and forest seeds) per size")
    parser.add_argument("--target", type=float, default=0.15, help="the MAPE to extrapolate to")
    parser.add_argument("--without", nargs="+", default=[], metavar="MODEL",
                        help="leave these models' rows out altogether (the data as it was before them)")
    parser.add_argument("--held-out", nargs="+", metavar="MODEL",
                        help="hold out and score only these models (default: every model of the machine)")
    args = parser.parse_args()
    catalog = load_catalog()
    rows = [r for r in ok_rows(shipped_rows()) if r.model not in args.without]
    held_out = sorted({r.model for r in rows if r.machine == args.machine
                       and (args.held_out is None or r.model in args.held_out)})
    if not held_out:
        raise SystemExit(f"no shipped row of machine '{args.machine}' to hold out")
    available = len({r.model for r in rows}) - 1
    sizes = sorted({min(k, available) for k in args.sizes})
    print(f"{args.machine}: {sum(r.machine == args.machine and r.model in held_out for r in rows)} held-out rows "
          f"of {len(held_out)} models; {available + 1} models in the shipped rows; k = other models in training")
    points = []
    print(f"  {'k':>3}  {'MAPE':<24}{'tau':<18}{'hit rate':<20}")
    for k in sizes:
        scores = [curve_point(rows, args.machine, held_out, k, draw, catalog) for draw in range(args.draws)]
        points += [(k, s.mape) for s in scores]
        print(f"  {k:>3}  {cell([s.mape for s in scores], '.1%'):<24}"
              f"{cell([s.kendall_tau_median for s in scores], '.2f'):<18}"
              f"{cell([s.hit_rate for s in scores], '.0%'):<20}", flush=True)
    if len(sizes) < 2:
        return
    # A learning curve's usual form: error ~ a * k^-alpha, a line in log-log, fit on every draw's point.
    slope, intercept = np.polyfit([math.log(k) for k, _ in points], [math.log(m) for _, m in points], 1)
    print(f"MAPE ~ {math.exp(intercept):.2f} x k^{slope:.2f}: x{2 ** slope:.2f} per doubling of architectures")
    if slope < 0:
        print(f"  continued, {args.target:.0%} at k ~ {math.exp((math.log(args.target) - intercept) / slope):.0f}")
    last = [statistics.mean(m for k, m in points if k == size) for size in sizes[-2:]]
    local = (last[1] - last[0]) / math.log2(sizes[-1] / sizes[-2])
    print(f"  between the two largest sizes: {100 * local:+.1f} points per doubling"
          + (f"; continued, {args.target:.0%} at k ~ {sizes[-1] * 2 ** ((args.target - last[1]) / local):.0f}"
             if local < 0 else ""))


if __name__ == "__main__":
    main()
