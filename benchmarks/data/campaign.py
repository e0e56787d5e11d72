"""Measure the zoo x runtimes x parameter grid of ``benchmarks/data/campaign.yaml`` on this machine.

Every configuration goes through the same harness as ``modak bench`` (one fresh process each, output
checked against the fp32 reference before timing) into a perf store, which is then exported to CSV under
``perfmodels/``. ``--resume`` skips configurations the store already measured successfully. ``--kernels`` also
profiles each configuration measured ok in a launch of its own after its timed rounds (``modak bench --kernels``)
and exports its kernel rows and reconciliations beside ``--export`` (``kernels-<target>.csv``,
``reconcile-<target>.csv``).

    python -m benchmarks.data.campaign --target perfmodels/targets/ci-epyc-2c-b.yaml \
        --store perfmodels/campaign-b.sqlite --export perfmodels/cpu-ci-epyc-2c-b.csv --resume
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace
from pathlib import Path

import msgspec
import yaml

from benchmarks.tools.zoo_jobs import zoo_plan
from modak.bench.harness import KERNEL_STEPS, BenchSettings, bench, measurement_row
from modak.candidates.catalog import Recipe, load_catalog
from modak.measurements.kernels import KERNEL_CSV, RECONCILE_CSV, write_kernel_csv, write_reconcile_csv
from modak.measurements.store import PerfStore
from modak.spec.loader import load_spec
from modak.spec.target import Target

CONFIG = Path(__file__).with_name("campaign.yaml")  # the campaign's workloads and parameter grid


def grid_catalog(grid: dict[str, dict[str, list]], runtimes: set[str] | None) -> dict[str, Recipe]:
    """The shipped recipes restricted to the grid's runtimes, with the grid's parameter values."""
    catalog: dict[str, Recipe] = {}
    for name, recipe in load_catalog().items():
        if name not in grid or (runtimes and name not in runtimes):
            continue
        parameters = tuple(msgspec.structs.replace(p, values=tuple(grid[name][p.name])) if p.name in grid[name] else p
                           for p in recipe.parameters)
        catalog[name] = msgspec.structs.replace(recipe, parameters=parameters)
    return catalog


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", type=Path, default=CONFIG)
    parser.add_argument("--target", type=Path, required=True, help="Target of this machine (modak probe)")
    parser.add_argument("--store", type=Path, required=True)
    parser.add_argument("--export", type=Path, help="CSV to write this machine's rows to at the end")
    parser.add_argument("--runtimes", nargs="+", help="only these runtimes")
    parser.add_argument("--models", nargs="+", help="only these zoo models")
    parser.add_argument("--resume", action="store_true", help="skip configurations already measured ok")
    parser.add_argument("--kernels", action="store_true",
                        help="also store kernel rows from one profiled launch per configuration measured ok")
    parser.add_argument("--stop-after", type=float, metavar="SECONDS",
                        help="start no further workload after this many seconds (a workload's rows are stored "
                             "together at its end, so stopping between workloads loses nothing; --resume goes on)")
    args = parser.parse_args()

    config = yaml.safe_load(args.config.read_text())
    target, target_doc = load_spec(args.target, Target)
    runtimes = set(args.runtimes) if args.runtimes else None
    settings = BenchSettings(**config["settings"])
    if args.kernels:
        settings = replace(settings, kernel_steps=KERNEL_STEPS)
    catalog = grid_catalog(config["grid"], runtimes)
    work: list[tuple[str, int, str, dict[str, Recipe]]] = [
        (entry["model"], batch, entry["task"], catalog) for entry in config["workloads"]
        for batch in entry["batches"] if not args.models or entry["model"] in args.models]
    for extra in config.get("extra", []):
        if (runtimes and extra["runtime"] not in runtimes) or (args.models and extra["model"] not in args.models):
            continue
        single = {extra["runtime"]: {k: [v] for k, v in extra["params"].items()}}
        work.append((extra["model"], extra["batch"], extra["task"], grid_catalog(single, None)))

    started = time.perf_counter()
    with PerfStore(args.store) as store:
        done = {r.key for r in store.rows(machine=target.name, status="ok")} if args.resume else set()
        for model, batch, task, recipes in work:
            if args.stop_after is not None and time.perf_counter() - started > args.stop_after:
                print(f"[{time.perf_counter() - started:6.0f} s] --stop-after: stopping before {model} {task} "
                      f"batch {batch}", flush=True)
                break
            plan = zoo_plan(model, batch, task, config["precision"], target, target_doc, recipes)
            todo = [r.candidate for r in plan.ranked
                    if measurement_row(plan, r.candidate, {}).key not in done]
            print(f"[{time.perf_counter() - started:6.0f} s] {model} {task} batch {batch}: {len(todo)} to measure",
                  flush=True)

            for candidate, row in zip(todo, bench(plan, todo, store, settings)):
                timing = (f"{row.step_median_s * 1e3:.4g} ms [{row.ci_low_s * 1e3:.4g}, {row.ci_high_s * 1e3:.4g}]"
                          if row.step_median_s and row.ci_low_s and row.ci_high_s else row.status)
                print(f"    {candidate.name}: {timing}" + (f"  [{row.error[:160]}]" if row.error else ""), flush=True)
        if args.export:
            count = store.export_csv(args.export, machine=target.name)
            print(f"exported {count} rows to {args.export}")
            if args.kernels:
                path = args.export.parent / KERNEL_CSV.format(machine=target.name)
                print(f"exported {write_kernel_csv(path, store.kernel_rows(machine=target.name))} rows to {path}")
                path = args.export.parent / RECONCILE_CSV.format(machine=target.name)
                count = write_reconcile_csv(path, store.reconciliations(machine=target.name))
                print(f"exported {count} rows to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
