"""Two nodes of a network-namespace Slurm (tests/support/slurm_pair.py): the measured step of a data-parallel job
of two tasks, run in a SIF through the rendered job script, beside ``modak scale``'s prediction, and one task alone
beside its prediction, measured in interleaved rounds in one run.

The job is examples/cnn-train-cpu's network and train.py with ``scaling``, on a target of two one-core nodes
whose network is the link measured between the namespaces (a veth pair: a kernel memory copy, no wire; see
:func:`tests.support.slurm_pair.measure_link`). Each round runs, in random order:

1. one worker: ``srun --nodes=1`` of ``apptainer run SIF python3 train.py STEPS`` (the job's command, no torchrun);
2. two workers: ``sbatch --wait job.sh``, the job script ``modak render`` wrote (srun, apptainer run, torchrun);
3. two alone: the one worker of 1 on both nodes at once, with no process group between them.

Each run's step is its train.py's median step (the slower worker's, for two). The two nodes share this machine's
two cores, memory bandwidth and caches, which a real cluster's nodes do not: run 3 measures what that sharing
costs, so run 2 minus run 3 is what the data-parallel exchange itself adds (gloo's all-reduce over the link and its
threads), against the model's exposed all-reduce. Needs root, Slurm and Apptainer
(``.ci/provision.sh``), and this machine's probe (the plan's ``cpu: local``: the first run probes, about 40 s).

    python -m benchmarks.tools.two_nodes [--rounds 3] [--steps 60] [--json]
"""

from __future__ import annotations

import argparse
import json
import random
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from tests.support.slurm_pair import NODES, SlurmPair, measure_link, write_ddp_job

ROOT = Path(__file__).resolve().parents[2]
MEDIAN = re.compile(r"^done: .* median step ([\d.]+) ms")


def modak(*args: str | Path, pair: SlurmPair | None = None) -> subprocess.CompletedProcess:
    argv = [sys.executable, "-m", "modak", *map(str, args)]
    result = pair.run(argv, timeout=3600, cwd=ROOT) if pair else subprocess.run(
        argv, capture_output=True, text=True, cwd=ROOT, stdin=subprocess.DEVNULL)
    if result.returncode != 0:
        raise SystemExit(f"modak {' '.join(map(str, args))} failed ({result.returncode}): {result.stderr[-3000:]}")
    return result


def step_seconds(log: str) -> float:
    """The slowest worker's median step in a train.py log."""
    steps = [float(m[1]) / 1e3 for m in map(MEDIAN.match, log.splitlines()) if m]
    if not steps:
        raise SystemExit(f"no 'done:' line in the log:\n{log[-3000:]}")
    return max(steps)


def alone(pair: SlurmPair, out: Path, sif: Path, steps: int, nodes: int) -> float:
    """The job's command without torchrun, once on each of ``nodes`` nodes at once."""
    result = pair.run(["srun", f"--nodes={nodes}", "--ntasks-per-node=1", "--cpus-per-task=1", "apptainer", "run",
                       sif, "python3", "train.py", str(steps)], timeout=1800, cwd=out)
    if result.returncode != 0:
        raise SystemExit(f"{nodes} lone worker(s) failed: {result.stderr[-3000:]}")
    return step_seconds(result.stdout)


def two_workers(pair: SlurmPair, out: Path, steps: int) -> float:
    result = pair.run(["sbatch", "--wait", "--parsable", "--output", "two-%j.out", "job.sh", "python3", "train.py",
                       str(steps)], timeout=1800, cwd=out)
    job = result.stdout.strip().splitlines()[-1] if result.stdout.strip() else "?"
    log = (out / f"two-{job}.out").read_text() if (out / f"two-{job}.out").exists() else result.stderr
    if result.returncode != 0:
        raise SystemExit(f"two workers failed: {log[-3000:]}")
    return step_seconds(log)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    folder = Path(tempfile.mkdtemp(prefix="modak-two-nodes."))
    wheelhouse = folder / "wheels"
    wheelhouse.mkdir()
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:", "-q", "-d",
                    str(wheelhouse), "torch==2.13.0"], check=True)
    with SlurmPair(folder / "cluster") as pair:
        link = measure_link(pair)
        job = write_ddp_job(folder / "spec", link, wheelhouse, args.steps)
        out = folder / "out"
        built = json.loads(modak("build", job, "-o", out, "--no-smoke", "--json").stdout)
        sif = Path(built["image"]["ref"])
        arms = {"one": lambda: alone(pair, out, sif, args.steps, 1), "two": lambda: two_workers(pair, out, args.steps),
                "two-alone": lambda: alone(pair, out, sif, args.steps, 2)}
        runs: dict[str, list[float]] = {arm: [] for arm in arms}
        order = random.Random(args.seed)
        for _ in range(args.rounds):
            for arm in order.sample(list(arms), len(arms)):
                runs[arm].append(arms[arm]())
    points = {p["workers"]: p for p in json.loads(modak("scale", job, "--json").stdout)["points"]}
    medians = {arm: statistics.median(times) for arm, times in runs.items()}
    measured = {1: medians["one"], 2: medians["two"]}
    fit = json.loads(modak("scale", job, "--json", "--measured", *(f"{n}={s:.6f}" for n, s in measured.items()))
                     .stdout)["fit"]
    report: dict[str, Any] = {
        "link": {"bandwidth_gbps": link.bandwidth_gbps, "latency_us": link.latency_us, "what": link.describe()},
        "nodes": list(NODES), "steps": args.steps, "rounds": args.rounds, "choice": built["choice"],
        "workers": {n: {"measured_step_seconds": measured[n], "runs": runs[arm],
                        "predicted_step_seconds": points[n]["step_seconds"],
                        "measured_over_predicted": measured[n] / points[n]["step_seconds"]}
                    for n, arm in ((1, "one"), (2, "two"))},
        "two_alone": {"measured_step_seconds": medians["two-alone"], "runs": runs["two-alone"]},
        "exchange": {"measured_seconds": medians["two"] - medians["two-alone"],
                     "predicted_exposed_seconds": points[2]["exposed_comm_seconds"]},
        "efficiency": {"measured": measured[1] / measured[2], "predicted": points[2]["efficiency"]},
        "fit": fit}
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    print(f"link: {link.describe()}")
    print(f"choice: {built['choice']}; {args.rounds} interleaved rounds of {args.steps} steps")
    print(f"{'workers':>7} {'measured ms':>12} {'predicted ms':>13} {'measured/predicted':>19}  runs (ms)")
    for n in (1, 2):
        row = report["workers"][n]
        print(f"{n:>7} {row['measured_step_seconds'] * 1e3:>12.1f} {row['predicted_step_seconds'] * 1e3:>13.1f} "
              f"{row['measured_over_predicted']:>19.2f}  {', '.join(f'{t * 1e3:.1f}' for t in row['runs'])}")
    lone = report["two_alone"]
    print(f"{'2 alone':>7} {lone['measured_step_seconds'] * 1e3:>12.1f} {'':>13} {'':>19}  "
          f"{', '.join(f'{t * 1e3:.1f}' for t in lone['runs'])}")
    exchange = report["exchange"]
    print(f"what the exchange adds (2 workers - 2 alone): measured {exchange['measured_seconds'] * 1e3:.1f} ms, "
          f"predicted exposed all-reduce {exchange['predicted_exposed_seconds'] * 1e3:.2f} ms")
    efficiency = report["efficiency"]
    print(f"efficiency of 2 workers: measured {efficiency['measured']:.2f}, predicted {efficiency['predicted']:.2f}")
    print(f"modak scale --measured fit: {json.dumps(fit)[:400]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
