"""Does `modak tune` find the best configuration, and how close is the zero-shot plan? Per workload, side by side in
one run:

1. exhaustive: every candidate of the plan measured with the protocol (``--launches`` interleaved rounds): the
   reference best, and the set of candidates statistically equivalent to it (paired ratio within 5%);
2. zero-shot: the plan's choice (no measurement on this machine);
3. `modak tune` with 5 and with 10 trials (each in a fresh store, so no race sees another's rows).

A pick is a hit when it is the best or its paired ratio to the best, from the exhaustive session, is shown within
5% (``modak.predict.evaluate.verdict``); captured speedup = (stock / pick) / (stock / best) with the exhaustive
medians. The table prints per workload: pick, ratio to the best with its interval, verdict, trials, wall time.

    python benchmarks/tune_quality.py [--workloads mlp:64 mnist_cnn:64 mobilenet_v2:1] [--launches 3]
        [--min-seconds 0.5] [--budget 300]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from modak.bench.harness import BenchSettings, bench
from modak.bench.tune import TuneSettings, tune
from modak.measurements.stats import ratio
from modak.measurements.store import PerfStore
from modak.predict.default import default_predictor
from modak.predict.evaluate import HIT, captured_speedup, verdict
from modak.spec.loader import load_spec
from modak.spec.models import Target
from zoo_jobs import zoo_plan


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", type=Path, default=Path("perfmodels/targets/ci-epyc-2c-b.yaml"))
    parser.add_argument("--workloads", nargs="+", default=["mlp:64", "mnist_cnn:64", "mobilenet_v2:1"],
                        help="zoo model:batch (inference)")
    parser.add_argument("--launches", type=int, default=3)
    parser.add_argument("--min-seconds", type=float, default=0.5)
    parser.add_argument("--budget", type=float, default=300.0, help="seconds per tune run")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--exclude", nargs="*", default=["tvm"], help="runtimes left out (TVM tunes for minutes)")
    args = parser.parse_args()
    target, target_doc = load_spec(args.target, Target)
    protocol = BenchSettings(launches=args.launches, min_seconds=args.min_seconds, budget_s=3.0, seed=args.seed)
    print(f"{'workload':<18} {'method':<10} {'trials':>6} {'seconds':>8} {'pick/best [90%]':>26} {'verdict':>10} "
          f"{'captured':>8}  pick")
    summary: dict[str, list[tuple[str, float]]] = {}
    with tempfile.TemporaryDirectory(prefix="modak-tunequality-") as scratch:
        for spec in args.workloads:
            model, batch = spec.split(":")
            predictor = default_predictor(Path(scratch) / "none.sqlite")  # shipped data only: zero-shot here
            full = zoo_plan(model, int(batch), "inference", ["fp32", "bf16"], target, target_doc, predictor=predictor)
            plan = replace(full, ranked=tuple(r for r in full.ranked if r.candidate.runtime not in args.exclude))
            space = [r.candidate for r in plan.ranked]
            started = time.monotonic()
            with PerfStore(Path(scratch) / f"{model}-{batch}-all.sqlite") as store:
                rows = bench(plan, space, store, protocol)
            exhaustive_s = time.monotonic() - started
            times = {c.name: json.loads(r.launch_medians or "[]") for c, r in zip(space, rows)
                     if r.status == "ok" and r.launch_medians}
            best = min(times, key=lambda n: statistics.median(times[n]))
            stock = plan.stock.candidate.name if plan.stock and plan.stock.candidate.name in times else None

            def judge(method: str, pick: str | None, trials: int, seconds: float) -> None:
                if pick is None or pick not in times:
                    print(f"{spec:<18} {method:<10} {trials:6d} {seconds:8.0f} {'-':>26} {'no pick':>10}")
                    summary.setdefault(method, []).append(("miss", float("nan")))
                    return
                r = ratio(times[pick], times[best], paired=True)
                outcome = HIT if pick == best else verdict(r)
                captured = (captured_speedup(*(statistics.median(times[n]) for n in (stock, pick, best)))
                            if stock else float("nan"))
                summary.setdefault(method, []).append((outcome, captured))
                print(f"{spec:<18} {method:<10} {trials:6d} {seconds:8.0f} {r.describe():>26} {outcome:>10} "
                      f"{captured:8.3f}  {pick[:70]}", flush=True)

            judge("exhaustive", best, len(space), exhaustive_s)
            judge("zero-shot", plan.choice.candidate.name, 0, 0.0)
            for trials in (5, 10):
                started = time.monotonic()
                with PerfStore(Path(scratch) / f"{model}-{batch}-tune{trials}.sqlite") as store:
                    result = tune(plan, store, TuneSettings(budget_s=args.budget, trials=trials, protocol=protocol))
                judge(f"tune-{trials}", result.winner, len(result.shortlist), time.monotonic() - started)
    print()
    for method, outcomes in summary.items():
        hits = sum(o == HIT for o, _ in outcomes)
        captured = [c for _, c in outcomes if c == c]
        print(f"{method:<10} hit rate {hits}/{len(outcomes)} = {hits / len(outcomes):.0%}"
              + (f", captured speedup median {statistics.median(captured):.3f}" if captured else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
