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

``--floor`` also composes each answered row from its own profiled launch's kernel times (the kernels' error taken
away: what a perfect kernel predictor would score with the same dispatch and calibration), and prints how far the
row's own launches spread (the share whose slowest launch is over 10% and 25% above its fastest), and scores the
kernel model again on the rows whose launches agree within 25%: what the composition and the measurement themselves
leave.

``--fewer-groups K ...`` asks whether more groups' rows would help: each group is also held out from fits on K of the
other groups (``--draws`` random draws of them, seed 0), and each such fit is scored against the fit on all of them
on the rows both answer (fewer groups answer fewer rows: unpaired, the figures would compare other rows).

``--own-launch`` asks whether a short profile of the new model itself would: each group is also held out from a fit
that has, besides the other groups' rows, one profiled launch of each of its models per machine and runtime (fp32
where it has one, then the smallest batch, the first parameters: :func:`own_launches`). Both fits are scored on the
group's other rows.

``--measured-runs`` scores what the plan does with the workload's own runs measured on its target
(:mod:`modak.predict.measured`): in each workload (machine, model, batch, input shapes) of the group, one run per
runtime and precision (the predicted fastest, :func:`measured_runs`) corrects the fit's other predictions, which are
scored against the same rows uncorrected; and the picks of both among all the workload's answered rows (the runs at
their corrected prediction, which is their measurement), against the measured best as ``modak model eval`` decides
them, beside the pick of the fastest run alone.

    python -m benchmarks.models.kernels_held_out --split family --machines ci-emeraldrapids-2c ci-zen4-2c
    python -m benchmarks.models.kernels_held_out --split target --machines ci-emeraldrapids-2c ci-zen4-2c
    python -m benchmarks.models.kernels_held_out --split family --machines ci-emeraldrapids-2c ci-zen4-2c \
        --fewer-groups 2 4 --own-launch --jobs 2
    python -m benchmarks.models.kernels_held_out --split family --machines ci-emeraldrapids-2c ci-zen4-2c \
        --measured-runs --jobs 2
"""

from __future__ import annotations

import argparse
import functools
import itertools
import random
import statistics
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from functools import partial
from pathlib import Path

from modak.measurements.kernels import (
    KERNEL_CSV,
    RECONCILE_CSV,
    KernelRow,
    Reconciliation,
    probed_from,
    read_kernel_csv,
    read_reconcile_csv,
)
from modak.measurements.store import Measurement, read_csv
from modak.predict.base import Prediction
from modak.predict.evaluate import HIT, UNDECIDED, decision, family, launch_times, planned_for_row
from modak.predict.kernel_fit import KernelEstimate
from modak.predict.kernel_model import Composition, KernelModel
from modak.predict.kernel_names import PREDICTOR
from modak.predict.kernel_terms import MachineCeilings
from modak.predict.learned import candidate_from_row
from modak.predict.measured import corrected, corrections
from modak.predict.training import ok_rows

PERFMODELS = Path(__file__).resolve().parents[2] / "perfmodels"
# A row's group, of its machine and model.
SPLITS: dict[str, Callable[[str, str], str]] = {"family": lambda machine, model: family(model),
                                                "model": lambda machine, model: model,
                                                "target": lambda machine, model: machine}

AGREED = 0.25  # --floor: rows whose launches agree within this are scored apart (the ±25% target's tolerance)
Answer = tuple[str, str, str, float, float, float, float]  # machine, model, runtime, measured, step, low, high


# A worker scores several fits against each group's fit on all the others, and --own-launch comes back to the
# groups after --fewer-groups: room for every family's fit (7), so none is fit twice in a worker.
@functools.lru_cache(maxsize=8)
def fit_without(group: str, split: str, machines: tuple[str, ...], among: frozenset[str] | None = None,
                launches: frozenset[tuple] = frozenset()) -> KernelModel:
    """The kernel model fit on the rows of the groups other than ``group`` (of ``among`` only, where given), and of
    the profiled ``launches`` (configurations, :func:`_configuration`)."""
    group_of = SPLITS[split]
    rows, recs, _ = _data(machines)

    def kept(row: KernelRow | Reconciliation) -> bool:
        of = group_of(row.machine, probed_from(row.model))
        return of != group and (among is None or of in among) or _configuration(row) in launches

    return KernelModel.fit([r for r in rows if kept(r)], [r for r in recs if kept(r)])


def composition(model: KernelModel, row: Measurement) -> Composition | None:
    """``row`` composed by ``model`` from the kernels its runtime plans; None where the model does not answer it."""
    if not model.calibrated(row.runtime, row.device):
        return None
    return model.compose(tuple(planned_for_row(row)), MachineCeilings.of_row(row), candidate_from_row(row))


def answer_of(row: Measurement, c: Composition) -> Answer:
    """``row``'s answer by the composition ``c``."""
    return row.machine, row.model, row.runtime, row.step_s, c.step_s, c.low_s, c.high_s


def composed(model: KernelModel, row: Measurement) -> Answer | None:
    """:func:`composition` as an answer."""
    c = composition(model, row)
    return None if c is None else answer_of(row, c)


def held_out(group: str, split: str, machines: tuple[str, ...]) -> tuple[list[Answer], list[Answer]]:
    """The answered rows of ``group`` on ``machines``, by the kernel model fit without the group, and the same rows
    composed from their own profiled kernel times (where the row's launch was profiled)."""
    group_of = SPLITS[split]
    rows, _, whole = _data(machines)
    model = fit_without(group, split, machines)
    profiled: dict[tuple, list[KernelRow]] = {}
    for kernel_row in rows:
        if group_of(kernel_row.machine, probed_from(kernel_row.model)) == group:
            profiled.setdefault(_configuration(kernel_row), []).append(kernel_row)
    answers, floor = [], []
    for row in whole:
        answer = composed(model, row) if group_of(row.machine, row.model) == group else None
        if answer is None:
            continue
        answers.append(answer)
        machine, candidate = MachineCeilings.of_row(row), candidate_from_row(row)
        own = profiled.get(_configuration(row))
        answering = model.answering((row.runtime, row.device), machine, candidate.precision)
        if own and answering is not None:
            f = answering.composition([KernelEstimate(r.seconds, False, False) for r in own], candidate,
                                      answering.knows((row.runtime, row.device), machine))
            floor.append((row.machine, row.model, row.runtime, row.step_s, f.step_s, f.low_s, f.high_s))
    return answers, floor


def paired(group: str, split: str, machines: tuple[str, ...], among: frozenset[str] | None = None,
           launches: frozenset[tuple] = frozenset()) -> list[tuple[Answer, Answer]]:
    """The rows of ``group`` (but ``launches``) that both the fit on every other group and the fit of
    :func:`fit_without` with ``among`` and ``launches`` answer: (the first's answer, the second's)."""
    group_of = SPLITS[split]
    scored = [w for w in _data(machines)[2]
              if group_of(w.machine, w.model) == group and _configuration(w) not in launches]
    every, other = fit_without(group, split, machines), fit_without(group, split, machines, among, launches)
    pairs = [(composed(every, w), composed(other, w)) for w in scored]
    return [(a, b) for a, b in pairs if a is not None and b is not None]


def own_launches(group: str, split: str, machines: tuple[str, ...]) -> frozenset[tuple]:
    """One profiled launch of each model of ``group`` per machine and runtime: fp32 where it has one, then the
    smallest batch, the first parameters (their JSON), the fewest threads."""
    group_of = SPLITS[split]
    chosen: dict[tuple, tuple] = {}
    for w in sorted(_data(machines)[2], key=lambda w: (w.precision != "fp32", w.batch_size, w.params, w.threads or 0)):
        if group_of(w.machine, w.model) == group:
            chosen.setdefault((w.machine, w.model, w.runtime), _configuration(w))
    return frozenset(chosen.values())


def measured_runs(rows: Sequence[Measurement], predicted: Sequence[float]) -> list[Measurement]:
    """One of ``rows`` per workload (machine, model, batch, input shapes), runtime and precision: the one
    ``predicted`` fastest (of a tie, the first), what ``modak bench --candidates each-runtime`` measures."""
    chosen: dict[tuple, Measurement] = {}
    for _, i in sorted((p, i) for i, p in enumerate(predicted)):
        chosen.setdefault((*_workload(rows[i]), rows[i].runtime, rows[i].precision), rows[i])
    return list(chosen.values())


def corrected_by_runs(group: str, split: str, machines: tuple[str, ...]
                      ) -> tuple[list[tuple[Answer, Answer]], list[tuple[str, str]]]:
    """The answered rows of ``group`` but its :func:`measured_runs` (of its answered rows), by the fit without the
    group: (uncorrected, corrected as the plan corrects them) for each; and the verdicts (uncorrected, corrected) of
    each workload's pick among its answered rows, of workloads with two or more, and of its fastest run alone (what
    measuring the runs decides without the predictions)."""
    group_of = SPLITS[split]
    model = fit_without(group, split, machines)
    workloads: dict[tuple, list[tuple[Measurement, Composition]]] = {}
    for w in _data(machines)[2]:
        if group_of(w.machine, w.model) == group and (c := composition(model, w)) is not None:
            workloads.setdefault(_workload(w), []).append((w, c))
    pairs, verdicts = [], []
    for composed_members in workloads.values():
        members = [(w, answer_of(w, c)) for w, c in composed_members]
        rows = [w for w, _ in members]
        runs = measured_runs(rows, [a[4] for _, a in members])
        candidates = [candidate_from_row(w) for w in rows]
        predictions: list[Prediction | None] = [Prediction(c.step_s, c.low_s, c.high_s, 0.0, (), "compute", PREDICTOR,
                                                           run_spread=c.run_spread) for _, c in composed_members]
        fixed = corrected(candidates, predictions, corrections(candidates, predictions, runs))
        after: list[Answer] = [(a[0], a[1], a[2], a[3], p.step_seconds, p.low_seconds, p.high_seconds)
                               for (_, a), p in zip(members, fixed) if p is not None]
        pairs += [(a, b) for (w, a), b in zip(members, after) if w not in runs]
        if len(rows) >= 2:
            best = min(rows, key=lambda w: w.step_s)
            before_s, after_s = [a[4] for _, a in members], [a[4] for a in after]
            fastest_run = min(runs, key=lambda w: w.step_s)
            verdicts.append((decision(_pick(rows, before_s), best).verdict,
                             decision(_pick(rows, after_s), best).verdict, decision(fastest_run, best).verdict))
    return pairs, verdicts


def _pick(rows: Sequence[Measurement], predicted: Sequence[float]) -> Measurement:
    """The row predicted fastest; of rows tied in the prediction, the slowest (as ``modak model eval`` picks)."""
    fastest = min(predicted)
    return max((w for w, p in zip(rows, predicted) if p == fastest), key=lambda w: w.step_s)


def _workload(row: Measurement) -> tuple:
    return row.machine, row.model, row.batch_size, row.input_shapes


def fewer_groups(groups: Sequence[str], sizes: Sequence[int], draws: int) -> list[tuple[str, int, frozenset[str]]]:
    """(held-out group, K, K of the other groups) for each group and K in ``sizes`` below the number of other
    groups: ``draws`` distinct draws each (all, where there are fewer), seeded."""
    rng = random.Random(0)
    jobs = []
    for group in groups:
        others = [g for g in groups if g != group]
        for size in sizes:
            if size < len(others):
                combos = list(itertools.combinations(others, size))
                jobs += [(group, size, frozenset(c)) for c in rng.sample(combos, min(draws, len(combos)))]
    return jobs


def _configuration(row: Measurement | KernelRow | Reconciliation) -> tuple:
    """What ties a whole-model row to the kernel rows of its profiled launch."""
    return (row.machine, row.runtime, row.device, row.threads or 0, row.precision, row.params, row.model,
            row.batch_size, row.session)


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


def launch_spread(row: Measurement) -> float:
    """Slowest / fastest - 1 of the row's own launches (0 for one launch)."""
    times = launch_times(row)
    return max(times) / min(times) - 1


def spread_line(name: str, rows: Sequence[Measurement]) -> str:
    """One printed line of the rows' own launches: how many have several, the median of slowest / fastest - 1, and
    the shares over 10% and 25%."""
    spreads = [launch_spread(r) for r in rows if len(launch_times(r)) > 1]
    if not spreads:
        return f"{name:30s} {0:4d}"
    return (f"{name:30s} {len(spreads):4d} {100 * statistics.median(spreads):6.1f}%"
            f" {100 * sum(s > 0.10 for s in spreads) / len(spreads):6.1f}%"
            f" {100 * sum(s > 0.25 for s in spreads) / len(spreads):6.1f}%")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--split", choices=sorted(SPLITS), default="family")
    parser.add_argument("--machines", nargs="+", required=True, metavar="MACHINE",
                        help="machines whose shipped files are fit and scored (perfmodels/cpu-MACHINE.csv, ...)")
    parser.add_argument("--jobs", type=int, default=1, help="groups fit in parallel (1)")
    parser.add_argument("--floor", action="store_true",
                        help="also the answered rows composed from their own profiled kernels, and their launches' "
                             "spread")
    parser.add_argument("--fewer-groups", nargs="+", type=int, default=[], metavar="K",
                        help="also each group from fits on K of the other groups, paired with the fit on all of them")
    parser.add_argument("--draws", type=int, default=2, help="--fewer-groups: draws of K groups per group (2)")
    parser.add_argument("--own-launch", action="store_true",
                        help="also each group from a fit with one profiled launch of each of its models per machine "
                             "and runtime, scored on its other rows")
    parser.add_argument("--measured-runs", action="store_true",
                        help="also the group's rows corrected by one measured run per workload, runtime and "
                             "precision, as the plan corrects them, and the picks with and without")
    args = parser.parse_args(argv)
    group_of = SPLITS[args.split]
    machines = tuple(args.machines)
    whole = _data(machines)[2]
    groups = sorted({group_of(r.machine, r.model) for r in whole})
    with ProcessPoolExecutor(args.jobs) as pool:
        results = dict(zip(groups, pool.map(partial(held_out, split=args.split, machines=machines), groups)))
        fewer = fewer_groups(groups, args.fewer_groups, args.draws)
        fewer_pairs = list(pool.map(paired, [g for g, _, _ in fewer], itertools.repeat(args.split),
                                    itertools.repeat(machines), [among for _, _, among in fewer]))
        own_pairs = list(pool.map(paired, groups, itertools.repeat(args.split), itertools.repeat(machines),
                                  itertools.repeat(None), [own_launches(g, args.split, machines) for g in groups])
                         ) if args.own_launch else []
        by_runs = list(pool.map(partial(corrected_by_runs, split=args.split, machines=machines), groups)
                       ) if args.measured_runs else []
    answers = [a for group in groups for a in results[group][0]]
    floor = [a for group in groups for a in results[group][1]]
    subsets = ([("all", lambda a: True)]
               + [(f"  {g}", lambda a, g=g: group_of(a[0], a[1]) == g) for g in groups if args.split != "target"]
               + [(f"  machine {m}", lambda a, m=m: a[0] == m) for m in args.machines]
               + [(f"  runtime {r}", lambda a, r=r: a[2] == r) for r in sorted({w.runtime for w in whole})])
    print(f"the kernel model alone, {args.split} held out, {', '.join(args.machines)}: {len(whole)} inference rows")
    print(f"{'':30s} {'answered':>9s} {'MAPE':>7s} {'±10%':>7s} {'±25%':>7s} {'80% int':>7s}")
    for name, keep in subsets:
        print(line(name, [a for a in answers if keep(a)], sum(keep((w.machine, w.model, w.runtime)) for w in whole)))
    if args.floor:
        print("\nthe floor: the same rows composed from their own profiled kernels (fit and calibration as above)")
        print(f"{'':30s} {'answered':>9s} {'MAPE':>7s} {'±10%':>7s} {'±25%':>7s} {'80% int':>7s}")
        for name, keep in subsets:
            print(line(name, [a for a in floor if keep(a)], sum(keep(a) for a in answers)))
        row_of = {(w.machine, w.model, w.runtime, w.step_s): w for w in whole}
        scored = [row_of[a[0], a[1], a[2], a[3]] for a in answers]  # each answer's whole-model row
        print("\nthe answered rows' own launches: slowest / fastest - 1")
        print(f"{'':30s} {'rows':>4s} {'median':>7s} {'>10%':>7s} {'>25%':>7s}")
        for name, keep in subsets:
            print(spread_line(name, [w for w in scored if keep((w.machine, w.model, w.runtime))]))
        print(f"\nthe kernel model on the answered rows whose own launches agree within {AGREED:.0%} (the measurement "
              "pins the step down to the tolerance)")
        print(f"{'':30s} {'answered':>9s} {'MAPE':>7s} {'±10%':>7s} {'±25%':>7s} {'80% int':>7s}")
        agreed = [a for a, w in zip(answers, scored) if launch_spread(w) <= AGREED]
        for name, keep in subsets:
            print(line(name, [a for a in agreed if keep(a)], sum(keep(a) for a in answers)))
    if fewer:
        print(f"\nfewer groups: fit on K of the other groups ({args.draws} draws each, seed 0) against all of them, "
              "on the held-out rows both answer")
        print(f"{'':30s} {'answered':>9s} {'MAPE':>7s} {'±10%':>7s} {'±25%':>7s} {'80% int':>7s}")
        for size in args.fewer_groups:
            pairs = [p for (_, k, _), ps in zip(fewer, fewer_pairs) if k == size for p in ps]
            print(line(f"K = {size}: fit on K groups", [b for _, b in pairs], len(pairs)))
            print(line("  the same rows, fit on all", [a for a, _ in pairs], len(pairs)))
    if own_pairs:
        print("\none profiled launch of each held-out model per machine and runtime added to the fit, on the group's "
              "other rows both fits answer")
        print(f"{'':30s} {'answered':>9s} {'MAPE':>7s} {'±10%':>7s} {'±25%':>7s} {'80% int':>7s}")
        for name, pick in (("without the launch", 0), ("with the launch", 1)):
            print(line(name, [p[pick] for ps in own_pairs for p in ps], sum(map(len, own_pairs))))
            for group, ps in zip(groups, own_pairs):
                print(line(f"  {group}", [p[pick] for p in ps], len(ps)))
    if by_runs:
        print("\none measured run per workload, runtime and precision corrects the other rows' predictions "
              "(modak.predict.measured), on the rows that are not runs")
        print(f"{'':30s} {'answered':>9s} {'MAPE':>7s} {'±10%':>7s} {'±25%':>7s} {'80% int':>7s}")
        for name, pick in (("uncorrected", 0), ("corrected by the runs", 1)):
            for label, keep in subsets:
                chosen = [p[pick] for ps, _ in by_runs for p in ps if keep(p[0])]
                print(line(label if label != "all" else name, chosen, len(chosen)))
        verdicts = [v for _, vs in by_runs for v in vs]
        print(f"\npicks of {len(verdicts)} workloads among their answered rows (hit: within 5% of the best)")
        for name, pick in (("uncorrected", 0), ("corrected by the runs", 1), ("the fastest run alone", 2)):
            mine = [v[pick] for v in verdicts]
            print(f"{name:30s} hit {100 * mine.count(HIT) / len(mine):5.1f}%  undecided "
                  f"{100 * mine.count(UNDECIDED) / len(mine):5.1f}%  miss "
                  f"{100 * (len(mine) - mine.count(HIT) - mine.count(UNDECIDED)) / len(mine):5.1f}%")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
