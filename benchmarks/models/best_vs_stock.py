"""Per workload: the campaign's best configuration vs the stock one (PyTorch eager, framework defaults).

The best configuration is read from the campaign CSV; both are then measured again here, side by side in
this run, alternating (stock, best, stock, best, ...) so that machine noise hits both alike. The table
prints each one's median over the rounds and the speedup best/stock.

With ``--int8`` (inference workloads), the plan of the workload with int8 allowed (default accuracy gate, random
calibration samples) adds its best candidate of each quantization method that passed the gate; they are measured in
the same interleaved rounds, and each int8 row prints its speedup over stock and over the fp32/bf16 best, next to
its accuracy figure.

With ``--batch-auto`` (instead of the above, inference workloads): per workload, the plan's choice at the
campaign's batch vs the plan with ``batch_size: auto`` (its choice at the batch it chose), both with the default
predictor, measured in interleaved rounds (each launch of one, in a new random order every round, as their
batches differ); the table prints each one's samples/s and the measured and predicted ratios. ``--co-runner``
adds, per workload, the plan's best candidate that has a ``wait_policy`` measured with ``spin`` and with ``passive``
beside a busy process on one core (retries off: every launch is contended on purpose), and what the plan chooses
when the target says its cores are shared.

    python -m benchmarks.models.best_vs_stock --target perfmodels/targets/ci-epyc-2c-b.yaml \
        --data perfmodels/cpu-ci-epyc-2c-b.csv [--rounds 2] [--models mnist_cnn resnet18] [--int8]
    python -m benchmarks.models.best_vs_stock --target perfmodels/targets/ci-epyc-2c-b.yaml \
        --data perfmodels/cpu-ci-epyc-2c-b.csv --batch-auto [--co-runner] [--rounds 1] [--models mnist_cnn]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

import msgspec

from benchmarks.tools.zoo_jobs import measure_plans, measure_side_by_side, stock_candidate, zoo_plan
from modak.bench.harness import BenchSettings
from modak.candidates.enumerate import Candidate
from modak.measurements.store import PerfStore, read_csv
from modak.plan import Plan, RankedCandidate
from modak.predict.base import Predictor
from modak.predict.default import default_predictor
from modak.spec.document import SpecDocument
from modak.spec.loader import load_spec
from modak.spec.models import AUTO_BATCH, Precision
from modak.spec.target import Target


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", type=Path, required=True)
    parser.add_argument("--data", type=Path, required=True, help="campaign CSV (perfmodels/cpu-*.csv)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--models", nargs="+")
    parser.add_argument("--task", choices=["inference", "training"])
    parser.add_argument("--int8", action="store_true", help="also the best int8 candidate of each quantization method")
    parser.add_argument("--batch-auto", action="store_true",
                        help="instead: the campaign's batch vs the plan's batch_size auto choice (inference)")
    parser.add_argument("--co-runner", action="store_true",
                        help="with --batch-auto: also wait_policy spin vs passive beside a busy co-runner")
    args = parser.parse_args()
    target, target_doc = load_spec(args.target, Target)
    rows = [r for r in read_csv(args.data) if r.status == "ok" and r.machine == target.name
            and (not args.models or r.model in args.models) and (not args.task or r.task == args.task)]
    best: dict[tuple[str, str, int], object] = {}
    for row in rows:
        key = (row.model, row.task, row.batch_size)
        if key not in best or row.step_median_s < best[key].step_median_s:
            best[key] = row
    settings = BenchSettings(launches=3, min_seconds=0.5, budget_s=2.0)
    if args.batch_auto:
        workloads = sorted({(model, batch) for model, task, batch in best if task == "inference"})
        return batch_auto(workloads, target, target_doc, args.rounds, settings, args.co_runner)
    print(f"{'workload':<28} {'best configuration':<72} {'stock ms':>9} {'best ms':>9} {'speedup':>8}")
    speedups = []
    with tempfile.TemporaryDirectory() as tmp, PerfStore(Path(tmp) / "side-by-side.sqlite") as store:
        for (model, task, batch), row in sorted(best.items()):
            int8 = args.int8 and task == "inference"
            plan = zoo_plan(model, batch, task, ["fp32", "bf16", "int8"] if int8 else ["fp32", "bf16"], target,
                            target_doc)
            params = tuple(json.loads(row.params).items())
            winner = Candidate(row.runtime, row.device, Precision(row.precision), params, row.threads)
            quantized = int8_leaders(plan) if int8 else {}
            medians = measure_side_by_side(plan, {"stock": stock_candidate(plan), "best": winner,
                                                  **{label: r.candidate for label, r in quantized.items()}},
                                           args.rounds, settings, store)
            if None in (medians["stock"], medians["best"]):
                print(f"{model}/{task}/b{batch}: a configuration failed to run; skipped")
                continue
            s, b = medians["stock"], medians["best"]
            speedups.append(s / b)
            name = f"{row.runtime}/{row.precision} " + " ".join(f"{k}={v}" for k, v in params)
            print(f"{model + '/' + task + '/b' + str(batch):<28} {name[:72]:<72} {s * 1e3:9.3f} {b * 1e3:9.3f} "
                  f"{s / b:7.2f}x", flush=True)
            for label, ranked in quantized.items():
                q = medians[label]
                measured = "failed to run" if q is None else (f"{q * 1e3:9.3f} ms, {s / q:.2f}x stock, "
                                                              f"{b / q:.2f}x the best above")
                print(f"{'':<28}   {label:<69} {measured}; {ranked.accuracy.figure()}", flush=True)
            for reason in (r for r in plan.reasons
                           if r.startswith("int8 ") and ("failed" in r or "not quantized" in r)):
                print(f"{'':<28}   {reason}", flush=True)
    if speedups:
        print(f"geometric mean speedup over stock: {statistics.geometric_mean(speedups):.2f}x "
              f"(median {statistics.median(speedups):.2f}x, {len(speedups)} workloads)")
    return 0


def batch_auto(workloads: list[tuple[str, int]], target: Target, target_doc: SpecDocument, rounds: int,
               settings: BenchSettings, co_runner: bool) -> int:
    """The campaign's batch vs the plan's auto batch, measured; with ``co_runner``, spin vs passive beside one."""
    predictor = default_predictor()
    auto_plans: dict[str, Plan] = {}
    print(f"{'workload':<22} {'auto':>5} {'fixed /s':>10} {'auto /s':>10} {'measured':>9} {'predicted':>9}  choices")
    ratios = []
    with tempfile.TemporaryDirectory() as tmp, PerfStore(Path(tmp) / "batch-auto.sqlite") as store:
        for model, batch in workloads:
            fixed = zoo_plan(model, batch, "inference", ["fp32", "bf16"], target, target_doc, predictor=predictor)
            if model not in auto_plans:
                auto_plans[model] = zoo_plan(model, AUTO_BATCH, "inference", ["fp32", "bf16"], target, target_doc,
                                             predictor=predictor)
            auto = auto_plans[model]
            chosen = auto.workload.batch_size
            medians = measure_plans({"fixed": (fixed, fixed.choice.candidate), "auto": (auto, auto.choice.candidate)},
                                    rounds, settings, store)
            workload = f"{model}/b{batch}"
            if None in medians.values():
                print(f"{workload}: a configuration failed to run; skipped")
                continue
            fixed_rate, auto_rate = batch / medians["fixed"], chosen / medians["auto"]
            predicted = (chosen / auto.choice.objective_seconds) / (batch / fixed.choice.objective_seconds)
            ratios.append(auto_rate / fixed_rate)
            print(f"{workload:<22} {chosen:>5} {fixed_rate:10.4g} {auto_rate:10.4g} {auto_rate / fixed_rate:8.2f}x "
                  f"{predicted:8.2f}x  {fixed.choice.candidate.name} | {auto.choice.candidate.name}", flush=True)
            if co_runner:
                wait_policies(fixed, target, target_doc, rounds, settings, store, predictor)
    if ratios:
        print(f"geometric mean of auto/fixed samples per second: {statistics.geometric_mean(ratios):.2f}x "
              f"({len(ratios)} workloads)")
    return 0


def wait_policies(plan: Plan, target: Target, target_doc: SpecDocument, rounds: int, settings: BenchSettings,
                  store: PerfStore, predictor: Predictor) -> None:
    """The plan's best candidate with a wait policy, spin vs passive, beside a busy process; and the choice of the
    same plan on a target whose cores are shared."""
    spin = next((r.candidate for r in plan.ranked if r.candidate.param("wait_policy") == "spin"), None)
    if spin is None:
        print(f"{'':<22} no candidate with a wait_policy")
        return
    passive = replace(spin, params=tuple((k, "passive" if k == "wait_policy" else v) for k, v in spin.params))
    shared = msgspec.structs.replace(target, scheduler=msgspec.structs.replace(target.scheduler, allocation="shared"))
    workload = plan.workload
    on_shared = zoo_plan(workload.model_name, workload.batch_size, "inference", ["fp32", "bf16"], shared, target_doc,
                         predictor=predictor).choice.candidate
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        medians = measure_side_by_side(plan, {"spin": spin, "passive": passive}, rounds,
                                       replace(settings, retries=0), store)
    finally:
        busy.kill()
        busy.wait()
    s, p = medians["spin"], medians["passive"]
    measured = ("failed to run" if s is None or p is None
                else f"spin {s * 1e3:.3f} ms, passive {p * 1e3:.3f} ms: passive {s / p:.2f}x as fast")
    print(f"{'':<22} beside a co-runner, {spin.runtime}: {measured}; on shared cores the plan chooses "
          f"{on_shared.name}", flush=True)


def int8_leaders(plan: Plan) -> dict[str, RankedCandidate]:
    """The plan's best candidate of each quantization method that passed the accuracy gate, labelled."""
    leaders: dict[str, RankedCandidate] = {}
    for ranked in plan.ranked:  # best first
        if ranked.accuracy is not None:
            leaders.setdefault(f"int8 {ranked.candidate.runtime} {ranked.accuracy.method}", ranked)
    return leaders


if __name__ == "__main__":
    raise SystemExit(main())
