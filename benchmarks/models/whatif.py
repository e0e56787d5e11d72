"""`modak whatif` against measurement: CPU allocations of this machine as targets, predicted vs measured ranking.

Targets (written to a temporary folder, `cpu: local`): 1 core and 2 cores (`scheduler.cores_per_job`), each quiet
and with one co-runner (`allocation: shared`, `co_runners: 1`: a busy Python loop pinned to the same cores). For
three small inference jobs (the MNIST CNN, the zoo MLP, MobileNetV2 from an ONNX file exported from the zoo),
`modak whatif` predicts each target's step for the plan's choice there; each (job, target) is then measured with
the harness (one launch per round, `taskset`-style affinity on cores {0} or {0, 1}, the co-runner on the same
cores), in interleaved rounds of random order. Printed per job: predicted and measured step and rank, and Kendall's
tau of the two rankings (target: tau >= 0.8), also over the pairs of targets the rounds order (the paired ratio's
90% interval excludes 1; near-ties the measurement cannot order are left out and counted); per co-runner target
the measured slowdown with its interval against the predicted one (within 15% over the whole interval, outside it,
or undecided). Run it under `flock -x /tmp/modak-quiet.lock` on a quiet machine.

    flock -x /tmp/modak-quiet.lock python -m benchmarks.models.whatif [--rounds 3] [--jobs mnist-cnn mlp]
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
from pathlib import Path

from benchmarks.models.allocations import (
    BUSY_LOOP,
    beside,
    decided_tau,
    kendall_tau,
    measure,
    round_ratio,
    within_verdict,
    write_jobs,
    write_target,
)
from modak import api
from modak.measurements.store import PerfStore


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--jobs", nargs="+", help="job names (default: all three)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    predictor = api.predictor()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        targets = [write_target(folder, cores, co) for cores in (1, 2) for co in (0, 1)]
        jobs = [j for j in write_jobs(folder / "jobs") if not args.jobs or j.stem in args.jobs]
        results = {job: api.whatif(job, targets, using=predictor) for job in jobs}
        cases = [(job, outcome) for job, result in results.items() for outcome in result.outcomes]
        times: dict[tuple[Path, str], dict[int, float]] = {(job, o.target): {} for job, o in cases}
        order = list(range(len(cases)))
        shuffle = random.Random(args.seed).shuffle
        with PerfStore(folder / "whatif.sqlite") as store:
            for round_ in range(args.rounds):
                shuffle(order)
                for index in order:
                    job, o = cases[index]
                    cores = set(range(o.plan.ceilings.cores))
                    busy = o.plan.loaded.target.scheduler.co_runners
                    with beside(BUSY_LOOP if busy else None, cores):
                        step = measure(o.plan, o.plan.choice.candidate, store, cores)
                    if step is not None:
                        times[(job, o.target)][round_] = step
                print(f"round {round_ + 1}/{args.rounds} done", file=sys.stderr, flush=True)
    taus, decided_taus = [], []
    print(f"{'job':<16} {'target':<14} {'candidate':<34} {'pred ms':>8} {'meas ms':>8} {'err':>6} "
          f"{'pred rank':>9} {'meas rank':>9}")
    for job, result in results.items():
        measured = {o.target: statistics.median(times[(job, o.target)].values()) for o in result.outcomes
                    if times[(job, o.target)]}
        outcomes = [o for o in result.outcomes if o.target in measured]
        # Ranked by samples per second, as whatif ranks throughput jobs (the batch is the same on every target).
        predicted_rate = [o.samples_per_second for o in outcomes]
        measured_rate = [o.plan.workload.batch_size / measured[o.target] for o in outcomes]
        measured_rank = {o.target: 1 + sorted(measured_rate, reverse=True).index(r)
                         for o, r in zip(outcomes, measured_rate)}
        for o in outcomes:
            error = o.step_seconds / measured[o.target] - 1
            print(f"{result.job:<16} {o.target:<14} {o.plan.choice.candidate.name[:34]:<34} "
                  f"{o.step_seconds * 1e3:8.3f} {measured[o.target] * 1e3:8.3f} {error:+6.0%} {o.rank:>9} "
                  f"{measured_rank[o.target]:>9}")
        tau = kendall_tau(predicted_rate, measured_rate)
        taus.append(tau)
        decided = decided_tau([o.step_seconds for o in outcomes], [times[(job, o.target)] for o in outcomes])
        decided_taus.append(decided[0])
        by_target = {o.target: o for o in outcomes}
        print(f"{result.job:<16} Kendall tau {tau:+.2f} (target >= 0.8); over the pairs the rounds order: "
              f"{decided[0]:+.2f} ({decided[1]} concordant, {decided[2]} discordant, {decided[3]} undecided)")
        for t, o in by_target.items():
            quiet = t.replace("-1busy", "")
            if t != quiet and quiet in by_target:
                r = round_ratio(times[(job, t)], times[(job, quiet)])
                print(f"{'':<16} co-runner slowdown on {quiet}: measured {r.describe()}, predicted {o.sharing:.2f}x "
                      f"({within_verdict(o.sharing, r)} 15%)", flush=True)
    if taus:
        print(f"mean Kendall tau {statistics.mean(taus):+.2f} over {len(taus)} jobs; "
              f"{sum(t >= 0.8 for t in taus)}/{len(taus)} at or above 0.8")
        print(f"over the pairs the rounds order: {sum(t >= 0.8 for t in decided_taus)}/{len(decided_taus)} jobs at or "
              f"above 0.8 ({', '.join(f'{t:+.2f}' for t in decided_taus)})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
