"""How many launches would the equivalence test (pick within 5% of the best, 90% paired interval) need here?

Per workload of a protocol-2 campaign CSV: the runner-up's paired per-round ratio to the best, its log standard
deviation over the rounds and its 90% interval; then, at the median deviation, the launches a tie would need for a
half-width of 5%.

    python -m benchmarks.data.equivalence_resolution perfmodels/cpu-ci-zen3-2c.csv
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from pathlib import Path

from scipy.stats import t

from modak.measurements.stats import CONFIDENCE, EQUIVALENCE_MARGIN
from modak.measurements.store import read_csv
from modak.predict.training import ok_rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("csv", type=Path)
    args = parser.parse_args()
    quantile = 0.5 + CONFIDENCE / 2
    workloads: dict[tuple, list] = {}
    for row in ok_rows(read_csv(args.csv)):
        if row.launch_medians:
            workloads.setdefault((row.machine, row.model, row.task, row.batch_size), []).append(row)
    deviations, halves, near = [], [], 0
    for key, rows in sorted(workloads.items()):
        best, second = sorted(rows, key=lambda r: r.step_median_s)[:2]
        if best.session != second.session:  # not paired by round
            continue
        logs = [math.log(a / b) for a, b in zip(json.loads(second.launch_medians), json.loads(best.launch_medians))]
        deviation = statistics.stdev(logs)
        half = t.ppf(quantile, len(logs) - 1) * deviation / math.sqrt(len(logs))
        ratio = math.exp(statistics.mean(logs))
        near += ratio < 1.10
        deviations.append(deviation)
        halves.append(half)
        print(f"{'/'.join(map(str, key[1:])):<28} runner-up/best {ratio:.3f}  paired sd(log) {deviation:.3f}  "
              f"90% interval x[{math.exp(-half):.3f}, {math.exp(half):.3f}]")
    if not deviations:
        print("no workload with two rows of one session")
        return 1
    typical = statistics.median(deviations)
    needed = next(n for n in range(2, 10_000)
                  if t.ppf(quantile, n - 1) * typical / math.sqrt(n) <= math.log(1 + EQUIVALENCE_MARGIN))
    print(f"{len(deviations)} workloads; runner-up within 10% of the best in {near}; "
          f"median paired sd(log) {typical:.3f}; "
          f"median half-width x{math.exp(statistics.median(halves)):.3f}; launches a tie needs for a half-width <= "
          f"{EQUIVALENCE_MARGIN:.0%}: {needed}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
