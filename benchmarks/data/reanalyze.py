"""Refresh the workload columns of campaign CSVs after the analysis' cost model changed.

A stored row carries the workload's features as the analysis computed them when it was measured (FLOPs,
bytes, per op class, nodes, parameters). When the cost model is corrected, those columns are recomputed
from the zoo model, batch and task of each row; no measured or machine column is touched.

    python -m benchmarks.data.reanalyze perfmodels/cpu-*.csv
"""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path

from benchmarks.tools.zoo_jobs import zoo_plan
from modak.bench.harness import workload_columns
from modak.measurements.store import Measurement, read_csv, write_csv
from modak.spec.loader import load_spec
from modak.spec.models import Target

TARGETS = Path(__file__).resolve().parents[2] / "perfmodels" / "targets"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("csv", nargs="+", type=Path)
    args = parser.parse_args()
    for path in args.csv:
        rows = list(read_csv(path))
        columns: dict[tuple, dict[str, object]] = {}
        refreshed: list[Measurement] = []
        for row in rows:
            key = (row.machine, row.model, row.task, row.batch_size)
            if key not in columns:
                target, doc = load_spec(TARGETS / f"{row.machine}.yaml", Target)
                plan = zoo_plan(row.model, row.batch_size, row.task, [row.precision], target, doc)
                columns[key] = workload_columns(plan.workload)
            refreshed.append(replace(row, **columns[key]))
        changed = sum(a != b for a, b in zip(rows, refreshed))
        write_csv(path, refreshed)
        print(f"{path}: {changed} of {len(rows)} rows changed")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
