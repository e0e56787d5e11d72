"""`modak pack` against measurement: pairs of jobs co-located on this machine's 2 cores, each job's slowdown
against running alone, predicted vs measured.

For each pair, `modak pack` plans both jobs alone on this machine (`cpu: local`, both cores) and predicts two
arrangements: disjoint cores (one core each, each job re-planned for one core) and time-slicing (both on both
cores, re-planned for shared cores). Each job is then measured alone (on cores {0, 1}), and in each arrangement
beside the other job (which runs its own plan continuously on its cores, started before the measured launch), in
interleaved rounds of random order. For disjoint cores each job is also measured on its own core with the other
core idle, which splits the error in two: the plan's step on one core (``1 core`` against alone) and what the
neighbour on the other core takes (``neighbour``: beside it against on its core idle; the model predicts 1.00
unless memory bandwidth binds). Printed per job and arrangement: predicted and measured slowdown and the error
(target: within 15%), also judged over the measured slowdown's interval (paired by round: within 15% over all of
it, outside, or undecided), and each arrangement's aggregate throughput (sum of alone / shared step).
Run it under `flock -x /tmp/modak-quiet.lock` on a quiet machine.

    flock -x /tmp/modak-quiet.lock python -m benchmarks.models.pack [--rounds 3] \\
        [--pairs mnist-cnn:mlp mnist-cnn:mnist-cnn]
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
from pathlib import Path

from benchmarks.models.allocations import (
    WARM_UP_S,
    beside,
    job_runner,
    measure,
    round_ratio,
    within_verdict,
    write_jobs,
    write_target,
)
from modak import api
from modak.advise.pack import Arrangement, Planner, evaluate
from modak.measurements.store import PerfStore

CORES = {0, 1}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--pairs", nargs="+", default=["mnist-cnn:mlp", "mnist-cnn:mobilenet-onnx"],
                        help="JOB:JOB pairs of mnist-cnn, mlp, mobilenet-onnx")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    predictor = api.predictor()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        target = write_target(folder, 2, price=None)
        jobs = {path.stem: path for path in write_jobs(folder / "jobs")}
        packs = {pair: api.pack([jobs[name] for name in pair.split(":")], target, using=predictor)
                 for pair in args.pairs}
        # What is measured: (pair, arrangement mode or "alone", job index); each is one launch per round.
        arrangements: dict[tuple[str, str], Arrangement] = {}
        for pair, result in packs.items():
            options = [o for g in result.groups for o in g.options]
            if not options:  # the pair runs apart: measure the arrangements pack weighed all the same
                options = evaluate(result.jobs, result.jobs[0].loaded.target,
                                   Planner(lambda loaded: api.plan_loaded(loaded, predictor)))[1]
            for option in options:
                arrangements[(pair, option.mode)] = option
        cases = [(pair, mode, i) for pair in packs for mode in ("alone", "cores", "cores idle", "time-slicing")
                 for i in (0, 1) if mode == "alone" or (pair, mode.split()[0]) in arrangements]
        times: dict[tuple[str, str, int], dict[int, float]] = {case: {} for case in cases}
        shuffle = random.Random(args.seed).shuffle
        with PerfStore(folder / "pack.sqlite") as store:
            for round_ in range(args.rounds):
                shuffle(cases)
                for pair, mode, i in cases:
                    result = packs[pair]
                    if mode == "alone":
                        plan = result.jobs[i].alone
                        step = measure(plan, plan.choice.candidate, store, CORES)
                    elif mode == "cores idle":
                        plan = arrangements[(pair, "cores")].placements[i].plan
                        assert plan is not None
                        step = measure(plan, plan.choice.candidate, store, {i})
                    else:
                        placements = arrangements[(pair, mode)].placements
                        mine, other = placements[i], placements[1 - i]
                        assert mine.plan is not None and other.plan is not None
                        my_cores = {i} if mode == "cores" else CORES
                        other_cores = {1 - i} if mode == "cores" else CORES
                        command, env = job_runner(other.plan, other.plan.choice.candidate, folder / "runner")
                        with beside(command, other_cores, env, WARM_UP_S):
                            step = measure(mine.plan, mine.plan.choice.candidate, store, my_cores)
                    if step is not None:
                        times[(pair, mode, i)][round_] = step
                print(f"round {round_ + 1}/{args.rounds} done", file=sys.stderr, flush=True)
    print(f"{'pair':<26} {'arrangement':<13} {'job':<15} {'alone ms':>9} {'shared ms':>9} {'pred':>6} {'meas':>6} "
          f"{'error':>7}")
    errors, verdicts = [], []
    for pair, result in packs.items():
        alone = {i: statistics.median(times[(pair, "alone", i)].values()) for i in (0, 1) if times[(pair, "alone", i)]}
        for mode in ("cores", "time-slicing"):
            if (pair, mode) not in arrangements:
                continue
            arrangement = arrangements[(pair, mode)]
            gains = []
            for i, placement in enumerate(arrangement.placements):
                shared = times[(pair, mode, i)]
                if i not in alone or not shared or placement.slowdown is None:
                    print(f"{pair:<26} {mode:<13} {placement.job.label:<15} not measured")
                    continue
                measured = statistics.median(shared.values()) / alone[i]
                error = placement.slowdown / measured - 1
                errors.append(error)
                paired = round_ratio(shared, times[(pair, "alone", i)])
                verdict = within_verdict(placement.slowdown, paired)
                verdicts.append(verdict)
                gains.append(1 / measured)
                split = ""
                idle = times.get((pair, "cores idle", i))
                if mode == "cores" and idle and placement.plan is not None:
                    one_core = statistics.median(idle.values()) / alone[i]
                    predicted_one = placement.plan.choice.prediction.step_seconds / placement.job.alone_step
                    split = (f"   1 core: pred {predicted_one:.2f} meas {one_core:.2f}; "
                             f"neighbour: pred {placement.slowdown / predicted_one:.2f} "
                             f"meas {measured / one_core:.2f}")
                print(f"{pair:<26} {mode:<13} {placement.job.label:<15} {alone[i] * 1e3:9.3f} "
                      f"{statistics.median(shared.values()) * 1e3:9.3f} {placement.slowdown:6.2f} {measured:6.2f} "
                      f"{error:+7.1%}   paired {paired.describe()}: {verdict}" + split)
            print(f"{pair:<26} {mode:<13} {'(aggregate)':<15} throughput predicted {arrangement.gain:.2f}x, "
                  f"measured {sum(gains):.2f}x running them one after another", flush=True)
        chosen = next((g.chosen for g in result.groups if g.chosen), None)
        print(f"{pair:<26} modak pack chooses: " + (f"{chosen.mode} ({chosen.describe()})" if chosen
                                                   else f"run apart ({result.groups[0].reason})"))
    if errors:
        within = sum(abs(e) <= 0.15 for e in errors)
        print(f"slowdown error: median |error| {statistics.median(abs(e) for e in errors):.1%}, "
              f"max {max(abs(e) for e in errors):.1%}; {within}/{len(errors)} within 15%")
        print(f"over the rounds' paired intervals: {verdicts.count('within')} within 15%, "
              f"{verdicts.count('outside')} outside, {verdicts.count('undecided')} undecided of {len(verdicts)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
