"""The noise floor of the measurements: how well does one campaign run predict another run of itself?

Re-measure part of the campaign on the same machine into a second CSV, for example

    python -m benchmarks.data.campaign --target perfmodels/targets/ci-epyc-2c-b.yaml --store /tmp/again.sqlite \
        --export /tmp/again.csv --models mlp resnet18
    python -m benchmarks.data.repeatability perfmodels/cpu-ci-epyc-2c-b.csv /tmp/again.csv

Run A's measured step times are then scored as if they were predictions of run B's, with the same metrics as
``modak model eval`` (MAPE, Kendall tau per workload, hit rate and captured speedup of the top-1 pick). No
predictor can be expected to beat these numbers on run B: they are what the machine's run-to-run variation
alone costs.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from modak.measurements.store import read_csv
from modak.output import print_scores
from modak.predict.evaluate import score
from modak.predict.training import ok_rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("first", type=Path, help="campaign CSV of run A")
    parser.add_argument("second", type=Path, help="campaign CSV of run B (same machine, re-measured)")
    args = parser.parse_args()
    # Matched by configuration, not by machine name: run B may carry its own session's name and ceilings.
    first = {r.key[1:]: r.step_median_s for r in ok_rows(read_csv(args.first))}
    second = ok_rows(read_csv(args.second))
    matched = {i: first[r.key[1:]] for i, r in enumerate(second) if r.key[1:] in first}
    if not matched:
        raise SystemExit(f"no configuration of {args.second} was measured ok in {args.first}")
    print(f"{len(matched)} configurations measured ok in both runs "
          f"({len(second) - len(matched)} of run B's are not in run A)")
    print_scores([score("run A predicts run B", "measured (run A)", second, matched, len(second) - len(matched), {})])
    ratios = sorted(second[i].step_median_s / t for i, t in matched.items())
    drift = ratios[len(ratios) // 2]
    rescaled = score("run A x median drift", "measured (run A)", second, {i: t * drift for i, t in matched.items()},
                     len(second) - len(matched), {})
    print(f"run B / run A step time: median {drift:.2f} (the machine's drift between the runs), "
          f"range {ratios[0]:.2f}-{ratios[-1]:.2f}; MAPE with run A scaled by that drift: {rescaled.mape:.1%}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
