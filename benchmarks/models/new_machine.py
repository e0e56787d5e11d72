"""A new machine in minutes (#40's check of item 4): ``probe --kernels`` on this machine within a budget, then
leave-one-model-out on this machine's campaign rows with the kernel model fit on the probe's rows only (no
whole-model row of any machine is learned from).

The probe runs once per seed (:func:`modak.bench.kprobe.probe_kernels`, into a throw-away store, or ``--keep``'s);
the curve refits the kernel model on the whole models and layers measured within the first 2, 5, 10 and 15
minutes. A held-out model's own rows (its whole steps, and the probe's layers drawn from it) are dropped from the
fit, so a campaign model is predicted from the other models' layers only. Each campaign row of an ONNX runtime on
the CPU (inference, status ok) is composed from the kernels its runtime plans
(:func:`modak.workload.kernels.planned_kernels`); a row whose kinds the fit does not cover is counted as uncovered.
Printed: minutes, layers, kernel rows, covered rows, MAPE.

With several ``--seeds``, the probes run back to back first (the only part that measures), then each is scored;
the spread over the seeds (median, lowest, highest MAPE per mark) is printed last: one probe's adaptive draw is one
sample of what a new machine's user gets.

    python -m benchmarks.models.new_machine perfmodels/cpu-<this machine>.csv --budget 15
    python -m benchmarks.models.new_machine perfmodels/cpu-<this machine>.csv --seeds 1 2 3
    python -m benchmarks.models.new_machine CAMPAIGN.csv --quick   # a tiny probe: a smoke test, not a figure
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from modak.bench.kprobe import PROBE_MODEL_PREFIX, Sampling, probe_kernels, probe_runtimes
from modak.candidates.candidate import Candidate, Precision
from modak.measurements.store import Measurement, PerfStore, read_csv
from modak.predict.kernel_model import KernelModel
from modak.predict.kernel_terms import MachineCeilings
from modak.predict.training import ok_rows

MARKS_MIN = (2.0, 5.0, 10.0, 15.0)  # the curve's probe minutes
QUICK_BUDGET_MIN = 0.3
QUICK_MODELS = ("mnist_cnn", "mlp")


@dataclass(frozen=True)
class Point:
    """One point of the curve: the probe's first ``minutes``, what they measured, and the held-out MAPE."""

    minutes: float
    layers: int
    rows: int
    covered: int
    campaign: int
    mape: float | None


def campaign_rows(paths: Sequence[Path], runtimes: Sequence[str]) -> list[Measurement]:
    """The campaign's rows the kernel model can answer: inference on the CPU by an ONNX runtime, status ok."""
    return [r for r in ok_rows(row for path in paths for row in read_csv(path))
            if r.runtime in runtimes and r.device == "cpu" and r.task == "inference"]


def curve(done: Sampling, rows: Sequence[Measurement], marks: Sequence[float]) -> list[Point]:
    """Leave-one-model-out MAPE of ``rows`` by the kernel model fit on the layers measured within each mark."""
    from modak.workload.kernels import planned_kernels
    from modak.workload.zoo import export_onnx

    models = sorted({r.model for r in rows})
    planned = {}
    for row in rows:
        shapes = json.loads(row.input_shapes)
        planned[id(row)] = planned_kernels(row.runtime, export_onnx(row.model, shapes), row.batch_size, shapes,
                                           row.precision, row.threads or 0, params=json.loads(row.params),
                                           zoo=row.model)
    points = []
    for minutes in marks:
        layers = [layer for layer, end in zip(done.measured, done.finished) if end <= minutes * 60]
        names = {layer.name: layer.model for layer in layers}
        names |= {model: model for model, end in done.wholes if end <= minutes * 60}
        probe_rows = [r for r in done.rows if r.model in names]
        errors: list[float] = []
        for held in models:
            keep = {name for name, model in names.items() if model != held}
            fit = _fit(done, keep)
            for row in (r for r in rows if r.model == held):
                composed = (fit.compose(planned[id(row)], MachineCeilings.of_row(probe_rows[0]), row_candidate_of(row))
                            if fit else None)
                if composed is not None and row.step_s:
                    errors.append(abs(composed.step_s / row.step_s - 1))
        points.append(Point(minutes, len(layers), len(probe_rows), len(errors), len(rows),
                            100 * statistics.mean(errors) if errors else None))
    return points


def _fit(done: Sampling, keep: set[str]) -> KernelModel | None:
    rows = [r for r in done.rows if r.model in keep]
    recs = [r for r in done.reconciliations if r.model in keep]
    if not rows:
        return None
    return KernelModel.fit(rows, recs)


def row_candidate_of(row: Measurement) -> Candidate:
    """The candidate a campaign row was measured with (as a kernel row's)."""
    return Candidate(row.runtime, "cpu", Precision(row.precision), tuple(json.loads(row.params).items()),
                     row.threads)


def spread(curves: Sequence[Sequence[Point]]) -> list[tuple[float, tuple[int, int], tuple[float, float, float] | None]]:
    """Per mark of ``curves`` (one per seed): the minutes, the fewest and most rows covered, and the lowest, median
    and highest MAPE of the seeds that covered any (None where none did)."""
    marks = []
    for points in zip(*curves):
        mapes = [p.mape for p in points if p.mape is not None]
        covered = [p.covered for p in points]
        marks.append((points[0].minutes, (min(covered), max(covered)),
                      (min(mapes), statistics.median(mapes), max(mapes)) if mapes else None))
    return marks


def _percent(mape: float | None) -> str:
    return f"{mape:6.1f}%" if mape is not None else "      -"


def main(argv: Sequence[str] | None = None) -> int:
    from modak import api
    from modak.predict.roofline import RooflinePredictor

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("campaign", type=Path, nargs="+", help="this machine's campaign rows (CSV)")
    parser.add_argument("--budget", type=float, default=max(MARKS_MIN), metavar="MIN", help="probe minutes (15)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0], metavar="SEED",
                        help="one probe per seed (its draw of zoo models and layers), the spread printed last (0)")
    parser.add_argument("--keep", type=Path, metavar="DIR",
                        help="keep each probe's store as DIR/probe-seed<SEED>.sqlite (default: thrown away)")
    parser.add_argument("--quick", action="store_true",
                        help=f"a {QUICK_BUDGET_MIN}-minute probe of {', '.join(QUICK_MODELS)} on onnxruntime only")
    args = parser.parse_args(argv)
    budget = QUICK_BUDGET_MIN if args.quick else args.budget
    runtimes = ("onnxruntime",) if args.quick else probe_runtimes()
    rows = campaign_rows(args.campaign, runtimes)
    if args.quick:
        rows = [r for r in rows if r.model in QUICK_MODELS]
    marks = [budget * m / max(MARKS_MIN) for m in MARKS_MIN] if args.quick else [m for m in MARKS_MIN if m <= budget]
    roofline = RooflinePredictor()
    if args.keep:
        args.keep.mkdir(parents=True, exist_ok=True)
    probes = []
    for seed in args.seeds:
        with tempfile.TemporaryDirectory(prefix="modak-new-machine-") as scratch, \
                PerfStore((args.keep or Path(scratch)) / f"probe-seed{seed}.sqlite") as store:
            done = probe_kernels(lambda job: api.plan_loaded(api.load(job, "local"), roofline), store, budget,
                                 QUICK_MODELS if args.quick else None, runtimes, seed)
        assert all(r.model.startswith(PROBE_MODEL_PREFIX) or r.model in dict(done.wholes) for r in done.rows)
        probes.append((seed, done))
    curves = []
    for seed, done in probes:
        print(f"probe{f' (seed {seed})' if len(probes) > 1 else ''}: {len(done.wholes)} whole models, "
              f"{len(done.measured)} of {done.drawn_from} layers, {len(done.rows)} kernel rows; "
              f"campaign: {len(rows)} rows of {len({r.model for r in rows})} models")
        print(f"{'minutes':>8} {'layers':>7} {'rows':>6} {'covered':>8} {'MAPE':>7}")
        curves.append(curve(done, rows, marks))
        for point in curves[-1]:
            print(f"{point.minutes:8.2f} {point.layers:7d} {point.rows:6d} {point.covered:5d}/{point.campaign:<3d}"
                  f" {_percent(point.mape)}")
    if len(curves) > 1:
        print(f"spread over seeds {', '.join(map(str, args.seeds))}:")
        print(f"{'minutes':>8} {'covered':>11} {'median':>7} {'lowest':>7} {'highest':>7}")
        for minutes, covered, mapes in spread(curves):
            print(f"{minutes:8.2f} {covered[0]:5d}-{covered[1]:<5d} {_percent(mapes[1] if mapes else None)}"
                  f" {_percent(mapes[0] if mapes else None)} {_percent(mapes[2] if mapes else None)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
