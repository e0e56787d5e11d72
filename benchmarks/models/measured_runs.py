"""A job's own runs on this machine against the kernel model's predictions of its other candidates: how far does one
measured run per runtime and precision (``modak bench --candidates each-runtime``) correct them?

The job is planned with an empty store (the predictions before), then every candidate of the given runtimes is
measured with the harness (``modak bench``'s: one launch each per round, a new random order every round). The rows
of the first plan's ``each-runtime`` selection among them go into a second store, and the job is planned again with
it: the plan corrects the kernel model's predictions by those runs (:mod:`modak.predict.measured`). Printed: each
measured candidate's step and the predictions' errors before and after; over the candidates that are not runs, MAPE
and the shares within ±10% and ±25%; and each plan's pick among the measured candidates against the measured best
(hit: shown within 5% of it, as ``modak model eval`` decides). Run it on a quiet machine:

    flock -x /tmp/modak-quiet.lock python -m benchmarks.models.measured_runs JOB [--target TARGET]
        [--runtimes onnxruntime openvino] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

from modak import api
from modak.bench.harness import EACH_RUNTIME, BenchSettings, select_candidates
from modak.measurements.store import Measurement, PerfStore
from modak.plan import Plan, RankedCandidate
from modak.predict.evaluate import decision
from modak.predict.measured import measures


def row_of(rows: list[Measurement], ranked: RankedCandidate) -> Measurement | None:
    """The row among ``rows`` that measured the ranked candidate, if one did."""
    return next((r for r in rows if measures(r, ranked.candidate)), None)


def pick(plan: Plan, rows: list[Measurement]) -> Measurement:
    """The row of the plan's best-ranked candidate among those measured."""
    return next(row for r in plan.ranked if (row := row_of(rows, r)) is not None)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("job", type=Path, help="job spec (YAML), an inference job")
    parser.add_argument("--target", help="target spec or 'local' (default: the job's)")
    parser.add_argument("--runtimes", nargs="+", default=["onnxruntime", "openvino"],
                        help="runtimes whose candidates are all measured (default: onnxruntime openvino, the ones "
                             "the kernel model plans from any ONNX graph)")
    parser.add_argument("--rounds", type=int, default=3, help="launches per candidate, one per round (3)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as folder:
        empty, full, runs = (Path(folder) / name for name in ("empty.sqlite", "full.sqlite", "runs.sqlite"))
        before = api.plan_job(args.job, args.target, store=empty)
        measured = api.bench(before, args.runtimes, BenchSettings(launches=args.rounds), full)[0]
        rows = [r for r in measured if r.status == "ok"]
        chosen = [c for c in select_candidates(before, [EACH_RUNTIME]) if c.runtime in args.runtimes]
        run_rows = [r for r in rows if any(measures(r, c) for c in chosen)]
        with PerfStore(runs) as store:
            store.add(run_rows)
        after = api.plan_job(args.job, args.target, store=runs)
    predicted = [{r.candidate: r.prediction for r in plan.ranked} for plan in (before, after)]
    print(f"{before.workload.model_name} on {before.loaded.target.name} "
          f"({before.ceilings.microarchitecture}, {before.ceilings.cores} cores): {len(rows)} candidates measured, "
          f"{len(run_rows)} of them the runs that correct the others")
    for other in measured:
        if other.status != "ok":
            print(f"not scored: {other.runtime}/{other.precision} {other.params}: {other.status} ({other.error})")
    print(f"{'':4s} {'candidate (the parameters that vary)':60s} {'step ms':>8s} {'before':>7s} {'after':>7s}  "
          "predictor")
    errors: tuple[list[float], list[float]] = ([], [])
    varying = {key for row in rows for key, value in json.loads(row.params).items()
               if any(json.loads(other.params).get(key) != value for other in rows if other.runtime == row.runtime)}
    for ranked in sorted(before.ranked, key=lambda r: r.candidate.name):
        row = row_of(rows, ranked)
        if row is None:
            continue
        # rounded first: a run's own corrected prediction is its measurement up to float rounding, printed +0.0%
        error = [round(p[ranked.candidate].step_seconds / row.step_s - 1, 6) + 0.0 for p in predicted]
        run = row in run_rows
        if not run:
            for into, err in zip(errors, error):
                into.append(abs(err))
        c = ranked.candidate
        name = f"{c.runtime}/{c.precision.value} " + " ".join(f"{k}={v}" for k, v in c.params if k in varying)
        print(f"{'run' if run else '':4s} {name:60s} {row.step_s * 1e3:8.3f} {error[0]:+7.1%} {error[1]:+7.1%}  "
              f"{ranked.prediction.predictor}")
    for label, errs in zip(("before", "after"), errors):
        if errs:
            within = [statistics.mean(x <= bound for x in errs) for bound in (0.10, 0.25)]
            print(f"{label:7s} {len(errs)} candidates not runs: MAPE {statistics.mean(errs):.1%}, "
                  f"within ±10% {within[0]:.0%}, within ±25% {within[1]:.0%}")
    best = min(rows, key=lambda r: r.step_s)
    for label, plan in (("before", before), ("after", after)):
        chosen_row = pick(plan, rows)
        verdict = decision(chosen_row, best)
        print(f"pick {label:7s} {chosen_row.runtime}/{chosen_row.precision} {chosen_row.params}: "
              f"{chosen_row.step_s * 1e3:.3f} ms, {verdict.ratio.estimate:.2f}x the best ({verdict.verdict})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
