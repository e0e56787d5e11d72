"""Does `modak tune` find the best configuration, and how close is the zero-shot plan? Per workload:

1. exhaustive: every candidate of the plan measured with the protocol (``--launches`` interleaved rounds): the
   reference best, and the set of candidates statistically equivalent to it (paired ratio within 5%). With
   ``--exhaustive-store`` (a campaign's perf store, ``benchmarks/data/campaign.py``) and ``--config`` (its grid), the
   campaign's rows are that measurement: every candidate of the same space, measured with the same protocol on
   this machine, so it is not measured a second time;
2. zero-shot: the plan's choice (no measurement of this workload on this machine); stock: the stock deployment,
   what the job gets without modak;
3. `modak tune` with 5 and with 10 trials (``--trials``; each in a fresh store, so no race sees another's rows);
4. other-session (``--other-session``, a campaign's store of this machine from an earlier session): the fastest
   candidate of that session. It is what a model that knew this machine's rows perfectly, as measured then, would
   pick: the ceiling of any prediction learned from rows of another session, which the VM's drift between sessions
   bounds.

The plan's model is fit on the shipped data without the workload's model (``--hold-out``, the default:
leave-one-model-out, as for a model modak has never measured). Without it, a shipped campaign of this machine
would hand the zero-shot plan the very times it is judged by.

A pick is a hit when it is the best or its ratio to the best, from the exhaustive measurement, is shown within
5% (``modak.predict.evaluate.verdict``; paired by round when both were measured in one session); captured
speedup = (stock / pick) / (stock / best) = best / pick, from the same ratio (and rounds) as the verdict. The
table prints per workload: pick, ratio to the best with its interval, verdict, trials, wall time; under a race
that missed the best, its standings.

Three launches cannot resolve a near-tie at 5% (about 26 would be needed for a 3% difference under 5% launch
noise). With ``--resolve N`` (exhaustive measured in this session, not from a store), an undecided pick and the
best are measured again, side by side in further interleaved rounds of this session, 4 at a time, until the
paired ratio over all their rounds is shown within 5% or shown slower, or N rounds were added: the verdict
against the same session's exhaustive measurement, with the launches it took.

    python -m benchmarks.models.tune_quality [--workloads mlp:64 mnist_cnn:64:training mobilenet_v2:1] [--launches 3]
        [--min-seconds 0.5] [--budget 300] [--trials 5 10] [--resolve 24] [--keep DIR]
        [--exhaustive-store S --config benchmarks/data/campaign.yaml]
        [--other-session S --config benchmarks/data/campaign.yaml]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import yaml

from benchmarks.data.campaign import grid_catalog
from benchmarks.tools.zoo_jobs import zoo_plan
from modak.bench.harness import BenchSettings, bench, measurement_row
from modak.bench.tune import TuneSettings, describe, tune
from modak.measurements.stats import Ratio, ratio
from modak.measurements.store import Measurement, PerfStore
from modak.plan import Plan
from modak.predict.base import FallbackPredictor, Predictor
from modak.predict.data import TrainingData
from modak.predict.default import default_predictor
from modak.predict.evaluate import HIT, UNDECIDED, verdict
from modak.predict.learned import LearnedPredictor
from modak.predict.roofline import RooflinePredictor
from modak.predict.training import training_data
from modak.spec.loader import load_spec
from modak.spec.target import Target


def held_out_predictor(model: str, store: Path) -> Predictor:
    """The plan's predictor fit on the shipped rows (and ``store``'s) of every model but ``model``."""
    rows, weights = training_data(store)
    kept = [(r, w) for r, w in zip(rows, weights) if r.model != model]
    learned = LearnedPredictor.cached(TrainingData.of([r for r, _ in kept], [w for _, w in kept]))
    return FallbackPredictor((learned, RooflinePredictor()))


def candidate_names(plan: Plan) -> dict[str, str]:
    """The plan's candidates' names by the key of their measurement rows."""
    return {measurement_row(plan, r.candidate, {}).key: r.candidate.name for r in plan.ranked}


def exhaustive_rows(plan: Plan, store: PerfStore, machine: str, model: str, task: str,
                    batch: int) -> dict[str, Measurement]:
    """The plan's candidates' protocol rows in a campaign store, by candidate name (ok rows with launches)."""
    names = candidate_names(plan)
    return {names[row.key]: row
            for row in store.rows(machine=machine, model=model, task=task, batch_size=batch, status="ok")
            if row.key in names and row.launch_medians}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", type=Path, default=Path("perfmodels/targets/ci-epyc-2c-b.yaml"))
    parser.add_argument("--workloads", nargs="+", default=["mlp:64", "mnist_cnn:64", "mobilenet_v2:1"],
                        help="zoo model:batch[:task] (task: inference, the default, or training)")
    parser.add_argument("--launches", type=int, default=3)
    parser.add_argument("--min-seconds", type=float, default=0.5)
    parser.add_argument("--budget", type=float, default=300.0, help="seconds per tune run")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--trials", nargs="*", type=int, default=[5, 10],
                        help="a tune run per number of trials (none: exhaustive and zero-shot only)")
    parser.add_argument("--exclude", nargs="*", default=["tvm"], help="runtimes left out (TVM tunes for minutes)")
    parser.add_argument("--config", type=Path, help="a campaign's config: plan with its grid")
    parser.add_argument("--exhaustive-store", type=Path, help="a campaign's perf store: its rows are the exhaustive "
                        "measurement (give the campaign's --config too)")
    parser.add_argument("--resolve", type=int, default=0, metavar="N",
                        help="measure an undecided pick and the best again, side by side, for up to N more rounds "
                        "(exhaustive measured in this session only)")
    parser.add_argument("--other-session", type=Path, metavar="STORE",
                        help="a campaign's perf store of this machine from another session (give its --config): its "
                        "fastest row's candidate is judged too, as 'other-session', what a model that knew this "
                        "machine perfectly from that session would pick")
    parser.add_argument("--keep", type=Path, metavar="DIR",
                        help="write the perf stores (exhaustive rounds, resolve rounds, every trial) to DIR, one per "
                        "workload and method, instead of a temporary directory")
    parser.add_argument("--no-hold-out", dest="hold_out", action="store_false",
                        help="fit the plan's model on all shipped data, the workload's model included")
    args = parser.parse_args()
    if (args.exhaustive_store or args.other_session) and not args.config:
        parser.error("a campaign's store needs the campaign's --config (the candidate space it measured)")
    if args.exhaustive_store and args.resolve:
        parser.error("--resolve adds rounds to a session measured here: not with --exhaustive-store")
    target, target_doc = load_spec(args.target, Target)
    catalog = grid_catalog(yaml.safe_load(args.config.read_text())["grid"], None) if args.config else None
    protocol = BenchSettings(launches=args.launches, min_seconds=args.min_seconds, budget_s=3.0, seed=args.seed)
    print(f"{'workload':<22} {'method':<13} {'trials':>6} {'seconds':>8} {'pick/best [90%]':>26} {'rounds':>6} "
          f"{'verdict':>10} {'captured':>8}  pick")
    summary: dict[str, list[tuple[str, float, int, float]]] = {}
    if args.keep and args.keep.exists() and any(args.keep.iterdir()):
        parser.error(f"--keep {args.keep}: not empty (a tune run's store must start without another run's rows)")
    if args.keep:
        args.keep.mkdir(parents=True, exist_ok=True)
    with contextlib.nullcontext(str(args.keep)) if args.keep else tempfile.TemporaryDirectory(
            prefix="modak-tunequality-") as scratch:
        for spec in args.workloads:
            model, batch, task = (spec.split(":") + ["inference"])[:3]
            none = Path(scratch) / "none.sqlite"  # shipped data only
            predictor = held_out_predictor(model, none) if args.hold_out else default_predictor(none)
            full = zoo_plan(model, int(batch), task, ["fp32", "bf16"], target, target_doc, catalog, predictor)
            plan = replace(full, ranked=tuple(r for r in full.ranked if r.candidate.runtime not in args.exclude))
            space = [r.candidate for r in plan.ranked]
            names = candidate_names(plan)
            started = time.monotonic()
            if args.exhaustive_store:
                with PerfStore(args.exhaustive_store) as store:
                    rows = exhaustive_rows(plan, store, target.name, model, task, int(batch))
                exhaustive_s = float("nan")
            else:
                with PerfStore(Path(scratch) / f"{model}-{batch}-{task}-all.sqlite") as store:
                    rows = {names[r.key]: r for r in bench(plan, space, store, protocol)
                            if r.status == "ok" and r.launch_medians}
                exhaustive_s = time.monotonic() - started
            times = {name: json.loads(r.launch_medians) for name, r in rows.items()}
            sessions = {name: r.session for name, r in rows.items()}
            if not times:
                print(f"{spec:<22} no candidate measured ok")
                continue
            best = min(times, key=lambda n: statistics.median(times[n]))

            resolved: dict[str, Ratio] = {}

            def resolve(pick: str) -> Ratio:
                """The pick over the best on their exhaustive rounds plus up to ``--resolve`` more, added 4 at a
                time until the verdict is not undecided."""
                pair = [next(c for c in space if c.name == n) for n in (pick, best)]
                a, b = list(times[pick]), list(times[best])
                added = 0
                with PerfStore(Path(scratch) / f"{model}-{batch}-{task}-resolve.sqlite") as store:
                    while added < args.resolve:
                        more = min(4, args.resolve - added)
                        called = bench(plan, pair, store, replace(protocol, launches=more, seed=None))
                        measured = {names[row.key]: json.loads(row.launch_medians) for row in called
                                    if row.status == "ok" and row.launch_medians}
                        if len(measured) < 2 and not any(row.status == "contended" for row in called):
                            break  # a candidate failed: no more rounds of it to add
                        added += more
                        counts = [len(measured.get(name, [])) for name in (pick, best)]
                        if counts != [more, more]:  # launches or a whole row refused as contended
                            print(f"    {spec}: {counts[0]} and {counts[1]} of {more} launches measured; rounds not "
                                  "added (they would not pair)", flush=True)
                            continue
                        a, b = a + measured[pick], b + measured[best]
                        if verdict(ratio(a, b)) != UNDECIDED:
                            break
                return ratio(a, b)

            def judge(method: str, pick: str | None, trials: int, seconds: float) -> str:
                if pick is None or pick not in times:
                    print(f"{spec:<22} {method:<13} {trials:6d} {seconds:8.0f} {'-':>26} {'':>6} {'no pick':>10}")
                    summary.setdefault(method, []).append(("miss", float("nan"), trials, seconds))
                    return "miss"
                r = ratio(times[pick], times[best], paired=sessions[pick] == sessions[best])
                outcome = HIT if pick == best else verdict(r)
                if outcome == UNDECIDED and args.resolve:
                    r = resolved[pick] if pick in resolved else resolve(pick)
                    resolved[pick] = r
                    outcome = verdict(r)
                captured = 1.0 / r.estimate  # (stock / pick) / (stock / best), from the rounds the verdict judged
                summary.setdefault(method, []).append((outcome, captured, trials, seconds))
                print(f"{spec:<22} {method:<13} {trials:6d} {seconds:8.0f} {r.describe():>26} {r.rounds:6d} "
                      f"{outcome:>10} {captured:8.3f}  {pick[:70]}", flush=True)
                return outcome

            judge("exhaustive", best, len(times), exhaustive_s)
            judge("zero-shot", plan.choice.candidate.name, 0, 0.0)
            if plan.stock is not None:
                judge("stock", plan.stock.candidate.name, 0, 0.0)
            if args.other_session:
                with PerfStore(args.other_session) as store:
                    earlier = exhaustive_rows(plan, store, target.name, model, task, int(batch))
                judge("other-session", min(earlier, key=lambda n: earlier[n].step_median_s) if earlier else None, 0,
                      0.0)
            for trials in args.trials:
                started = time.monotonic()
                with PerfStore(Path(scratch) / f"{model}-{batch}-{task}-tune{trials}.sqlite") as store:
                    result = tune(plan, store, TuneSettings(budget_s=args.budget, trials=trials, protocol=protocol))
                if judge(f"tune-{trials}", result.winner, len(result.shortlist), time.monotonic() - started) != HIT:
                    print("\n".join(f"    {line}" for line in describe(result)), flush=True)  # how the race went
    print()
    for method, outcomes in summary.items():
        hits = sum(o == HIT for o, *_ in outcomes)
        captured = [c for _, c, *_ in outcomes if c == c]
        seconds = [s for *_, s in outcomes if s == s]
        print(f"{method:<13} hit rate {hits}/{len(outcomes)} = {hits / len(outcomes):.0%}"
              + (f", captured speedup median {statistics.median(captured):.3f}" if captured else "")
              + f", trials median {statistics.median(t for _, _, t, _ in outcomes):g}"
              + (f", wall time median {statistics.median(seconds):.0f} s"
                 if seconds and method not in ("zero-shot", "stock", "other-session") else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
