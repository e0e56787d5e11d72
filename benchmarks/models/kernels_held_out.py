"""The kernel model alone on held-out models or families (#40's targets), on the rows it answers: faster than
``modak model eval`` (no forest, no picks), for comparing changes to the kernel model.

For each group of the split (a zoo family of :data:`modak.predict.evaluate.FAMILIES`, a model, or a target), the
kernel model is fit on the shipped kernel rows and reconciliations of every other group (a probe layer's rows go
with the model it was cut from), then each inference row of the group on the given machines (their shipped
whole-model rows, status ok) is composed from the kernels its runtime plans, as ``modak model eval`` composes it.
Held out by target, a machine's rows are composed by the nearest other machine's model, transferred by ceilings.
Deterministic: the figures depend on the data and the code, not on the machine's load.
Printed per group, per machine and per runtime, and for all answered rows: rows answered, MAPE, the shares within
±10% and ±25%, and the share inside the 80% interval.

    python -m benchmarks.models.kernels_held_out --split family --machines ci-emeraldrapids-2c ci-zen4-2c
    python -m benchmarks.models.kernels_held_out --split target --machines ci-emeraldrapids-2c ci-zen4-2c
"""

from __future__ import annotations

import argparse
import functools
import statistics
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from functools import partial
from pathlib import Path

from modak.measurements.kernels import KERNEL_CSV, RECONCILE_CSV, probed_from, read_kernel_csv, read_reconcile_csv
from modak.measurements.store import Measurement, read_csv
from modak.predict.evaluate import family, planned_for_row
from modak.predict.kernels import KernelModel, MachineCeilings
from modak.predict.learned import candidate_from_row
from modak.predict.training import ok_rows

PERFMODELS = Path(__file__).resolve().parents[2] / "perfmodels"
# A row's group, of its machine and model.
SPLITS: dict[str, Callable[[str, str], str]] = {"family": lambda machine, model: family(model),
                                                "model": lambda machine, model: model,
                                                "target": lambda machine, model: machine}

Answer = tuple[str, str, str, float, float, float, float]  # machine, model, runtime, measured, step, low, high


def held_out(group: str, split: str, machines: tuple[str, ...]) -> list[Answer]:
    """The answered rows of ``group`` on ``machines``, by the kernel model fit without the group."""
    group_of = SPLITS[split]
    rows, recs, whole = _data(machines)
    model = KernelModel.fit([r for r in rows if group_of(r.machine, probed_from(r.model)) != group],
                            [r for r in recs if group_of(r.machine, probed_from(r.model)) != group])
    answers = []
    for row in whole:
        if group_of(row.machine, row.model) != group or not model.calibrated(row.runtime, row.device):
            continue
        c = model.compose(tuple(planned_for_row(row)), MachineCeilings.of_row(row), candidate_from_row(row))
        if c is not None:
            answers.append((row.machine, row.model, row.runtime, row.step_s, c.step_s, c.low_s, c.high_s))
    return answers


@functools.cache  # once per worker process, whichever groups it fits
def _data(machines: tuple[str, ...]) -> tuple[list, list, list[Measurement]]:
    rows, recs, whole = [], [], []
    for machine in machines:
        rows += read_kernel_csv(PERFMODELS / KERNEL_CSV.format(machine=machine))
        recs += read_reconcile_csv(PERFMODELS / RECONCILE_CSV.format(machine=machine))
        whole += [r for r in ok_rows(read_csv(PERFMODELS / f"cpu-{machine}.csv")) if r.task == "inference"]
    return rows, recs, whole


def line(name: str, answers: Sequence[Answer], rows: int) -> str:
    """One printed line: rows answered of ``rows``, MAPE, within ±10% and ±25%, in the 80% interval."""
    if not answers:
        return f"{name:30s} {0:4d}/{rows:<4d}"
    errors = [abs(step / measured - 1) for _, _, _, measured, step, _, _ in answers]
    inside = sum(low <= measured <= high for _, _, _, measured, _, low, high in answers)
    return (f"{name:30s} {len(answers):4d}/{rows:<4d} {100 * statistics.mean(errors):6.1f}%"
            f" {100 * sum(e <= 0.10 for e in errors) / len(errors):6.1f}%"
            f" {100 * sum(e <= 0.25 for e in errors) / len(errors):6.1f}% {100 * inside / len(answers):6.1f}%")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--split", choices=sorted(SPLITS), default="family")
    parser.add_argument("--machines", nargs="+", required=True, metavar="MACHINE",
                        help="machines whose shipped files are fit and scored (perfmodels/cpu-MACHINE.csv, ...)")
    parser.add_argument("--jobs", type=int, default=1, help="groups fit in parallel (1)")
    args = parser.parse_args(argv)
    group_of = SPLITS[args.split]
    machines = tuple(args.machines)
    whole = _data(machines)[2]
    groups = sorted({group_of(r.machine, r.model) for r in whole})
    with ProcessPoolExecutor(args.jobs) as pool:
        results = dict(zip(groups, pool.map(partial(held_out, split=args.split, machines=machines), groups)))
    answers = [a for group in groups for a in results[group]]
    print(f"the kernel model alone, {args.split} held out, {', '.join(args.machines)}: {len(whole)} inference rows")
    print(f"{'':30s} {'answered':>9s} {'MAPE':>7s} {'±10%':>7s} {'±25%':>7s} {'80% int':>7s}")
    print(line("all", answers, len(whole)))
    for name, keep in ([(f"  {g}", lambda a, g=g: group_of(a[0], a[1]) == g) for g in groups if args.split != "target"]
                       + [(f"  machine {m}", lambda a, m=m: a[0] == m) for m in args.machines]
                       + [(f"  runtime {r}", lambda a, r=r: a[2] == r) for r in sorted({w.runtime for w in whole})]):
        print(line(name, [a for a in answers if keep(a)],
                   sum(keep((w.machine, w.model, w.runtime)) for w in whole)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
