"""Refresh the workload columns of campaign CSVs after the analysis' cost model changed.

A stored row carries the workload's features as the analysis computed them when it was measured (FLOPs,
bytes, per op class, nodes, parameters). When the cost model is corrected, those columns are recomputed
from the zoo model, batch and task of each row; no measured or machine column is touched. A kernel CSV's rows
(``kernels-<machine>.csv``) get their op class, FLOPs and bytes again from the nodes they cover.

    python -m benchmarks.data.reanalyze perfmodels/cpu-*.csv perfmodels/kernels-*.csv
"""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path

from benchmarks.tools.zoo_jobs import zoo_plan
from modak.bench.harness import workload_columns
from modak.measurements.kernels import KERNEL_CSV, KernelRow, read_kernel_csv, write_kernel_csv
from modak.measurements.store import read_csv, write_csv
from modak.spec.loader import load_spec
from modak.spec.target import Target
from modak.workload.analysis import OpStats, WorkloadProfile, covering

TARGETS = Path(__file__).resolve().parents[2] / "perfmodels" / "targets"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("csv", nargs="+", type=Path)
    args = parser.parse_args()
    workloads: dict[tuple, tuple[WorkloadProfile, dict[str, OpStats]]] = {}

    def workload(machine: str, model: str, task: str, batch: int, precision: str) -> tuple[WorkloadProfile,
                                                                                            dict[str, OpStats]]:
        """The analysis of a row's workload, and its nodes by name."""
        key = (machine, model, task, batch)
        if key not in workloads:
            target, doc = load_spec(TARGETS / f"{machine}.yaml", Target)
            analysis = zoo_plan(model, batch, task, [precision], target, doc).workload
            workloads[key] = analysis, {op.name: op for op in analysis.ops}
        return workloads[key]

    for path in args.csv:
        if path.name.startswith(KERNEL_CSV.split("{")[0]):
            kernels = read_kernel_csv(path)
            refreshed_kernels = [_costed(row, workload(row.machine, row.model, row.task, row.batch_size,
                                                       row.precision)[1]) for row in kernels]
            changed = sum(a != b for a, b in zip(kernels, refreshed_kernels))
            write_kernel_csv(path, refreshed_kernels)
            print(f"{path}: {changed} of {len(kernels)} rows changed")
            continue
        rows = list(read_csv(path))
        refreshed = [replace(row, **workload_columns(workload(row.machine, row.model, row.task, row.batch_size,
                                                                  row.precision)[0]))
                     for row in rows]
        changed = sum(a != b for a, b in zip(rows, refreshed))
        write_csv(path, refreshed)
        print(f"{path}: {changed} of {len(rows)} rows changed")
    return 0


def _costed(row: KernelRow, ops: dict[str, OpStats]) -> KernelRow:
    """``row`` with its kernel costed again by the nodes it covers, ``ops`` by name (one covering none keeps its
    own costs)."""
    if not row.kernel.nodes:
        return row
    return replace(row, kernel=covering(row.kernel, [ops[n] for n in row.kernel.nodes], row.calls))


if __name__ == "__main__":
    raise SystemExit(main())
