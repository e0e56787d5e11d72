"""Variance study: how much one stored measurement varies, with the old protocol and with the new one.

12 configurations (6 zoo workloads × ONNX Runtime and PyTorch eager, step times from tens of microseconds to tens of
milliseconds) are launched ``--launches`` times in each of ``--sessions`` sessions; in every round each
(configuration, protocol) pair launches once, in a random order, so both protocols see the same machine.

* old: what `modak bench` did before (one launch is one measurement: warm-up, then 10 steps timed one by one, no
  pinning, no explicit wait policy, garbage collection on);
* new: the launch `modak bench` runs now (steps timed for ``--min-seconds``, sub-millisecond steps grouped, GC
  frozen, OpenMP threads pinned, explicit wait policy); a stored row is the median of 3 launches.

A measurement's error is its relative distance from the configuration's median over all launches of its protocol
(both sessions). The table prints, per step-duration bin, the median and 90th percentile error of one
measurement: old (one launch), new (one launch) and new (a row: median of 3 launches, every 3-subset of a
session's launches); the row's error against its own session's median (the protocol's noise, without the VM's
drift between sessions); and the between-session drift of each protocol's session medians.

    python -m benchmarks.data.noise [--launches 8] [--sessions 2] [--min-seconds 1.0] [--seed 0] [--save FILE.json]
    python -m benchmarks.data.noise --load FILE.json        # the table again from saved launches
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.tools.zoo_jobs import zoo_plan
from modak.bench.dispatch import LaunchTask, run_task
from modak.bench.harness import launch_command, launch_environment
from modak.spec.loader import load_spec
from modak.spec.target import Target

WORKLOADS = [("mlp", 1), ("mlp", 64), ("mnist_cnn", 1), ("mnist_cnn", 64), ("mobilenet_v2", 1), ("resnet18", 1)]
RUNTIMES = ("onnxruntime", "pytorch")
BINS = ((0.0, 1e-3, "< 1 ms"), (1e-3, 1e-2, "1-10 ms"), (1e-2, 1e9, ">= 10 ms"))
OLD_RUNNER = """
import json, statistics, time
from modak.runtime import open_model, request_from_environment
model = open_model(request_from_environment())
feeds = model.example_inputs()
model.step(feeds)
warm_until = time.perf_counter() + 0.2
while time.perf_counter() < warm_until:
    model.step(feeds)
times = []
for _ in range(10):
    t0 = time.perf_counter()
    model.step(feeds)
    times.append((time.perf_counter() - t0) / model.batches_per_step)
print(json.dumps({"status": "ok", "step_median_s": statistics.median(times)}))
"""
OLD_UNSET = ("OMP_PROC_BIND", "OMP_PLACES", "OMP_WAIT_POLICY", "MODAK_WAIT_POLICY")


def configurations(target_path: Path) -> list[tuple[str, object, object]]:
    target, target_doc = load_spec(target_path, Target)
    found = []
    for model, batch in WORKLOADS:
        plan = zoo_plan(model, batch, "inference", ["fp32"], target, target_doc)
        for runtime in RUNTIMES:
            candidate = (plan.stock.candidate if runtime == "pytorch" and plan.stock
                         else next(r.candidate for r in plan.ranked if r.candidate.runtime == runtime))
            found.append((f"{model}/b{batch}/{runtime}", plan, candidate))
    return found


def tasks(configs: list, folder: Path, min_seconds: float) -> dict[tuple[str, str], LaunchTask]:
    built = {}
    for name, plan, candidate in configs:
        sub = folder / name.replace("/", "-")
        sub.mkdir(parents=True, exist_ok=True)
        env = launch_environment(plan, candidate, sub / "plan.json", folder / "work")
        new = launch_command(sys.executable, "-m", "modak.runtime", "measure", "--min-seconds", str(min_seconds),
                             "--budget", str(max(3.0, 2 * min_seconds)), "--no-check")
        old = launch_command("env", *(f"-u{v}" for v in OLD_UNSET), sys.executable, "-c", OLD_RUNNER)
        built[(name, "new")] = LaunchTask(name, env, tuple(new), 600, sub)
        built[(name, "old")] = LaunchTask(name, env, tuple(old), 600, sub)
    return built


def run(args: argparse.Namespace) -> dict:
    configs = configurations(args.target)
    rng = random.Random(args.seed)
    launches: dict[str, dict[str, list[list[float]]]] = {}
    with tempfile.TemporaryDirectory(prefix="modak-noise-") as scratch:
        built = tasks(configs, Path(scratch), args.min_seconds)
        started = time.monotonic()
        for session in range(args.sessions):
            for index in range(args.launches):
                order = list(built)
                rng.shuffle(order)
                for name, protocol in order:
                    result = run_task(built[(name, protocol)])
                    per = launches.setdefault(name, {}).setdefault(protocol, [[] for _ in range(args.sessions)])
                    if result.get("status") == "ok":
                        per[session].append(result["step_median_s"])
                    else:
                        print(f"{name} {protocol}: {result.get('error')}", file=sys.stderr)
                print(f"session {session + 1} round {index + 1}/{args.launches} "
                      f"({time.monotonic() - started:.0f} s)", file=sys.stderr, flush=True)
    return launches


def errors(values: list[float], reference: float) -> list[float]:
    return [abs(v / reference - 1.0) for v in values]


def table(launches: dict) -> str:
    rows = {label: {"old": [], "new1": [], "new3": [], "own3": [], "drift_old": [], "drift_new": []}
            for *_, label in BINS}
    detail = [f"{'configuration':<28} {'median ms':>10} {'old err':>8} {'new err':>8} {'row err':>8}"]
    for name, per in sorted(launches.items()):
        old_all = [v for s in per["old"] for v in s]
        new_all = [v for s in per["new"] for v in s]
        if len(old_all) < 2 or len(new_all) < 3:
            continue
        ref_old, ref_new = statistics.median(old_all), statistics.median(new_all)
        label = next(lbl for low, high, lbl in BINS if low <= ref_new < high)
        triples = [statistics.median(t) for s in per["new"] for t in itertools.combinations(s, 3)]
        bin_ = rows[label]
        bin_["old"] += errors(old_all, ref_old)
        bin_["new1"] += errors(new_all, ref_new)
        bin_["new3"] += errors(triples, ref_new)
        for session in per["new"]:
            if len(session) >= 3:
                bin_["own3"] += errors([statistics.median(t) for t in itertools.combinations(session, 3)],
                                       statistics.median(session))
        sessions = [s for s in per["old"] if s], [s for s in per["new"] if s]
        if len(sessions[0]) >= 2 and len(sessions[1]) >= 2:
            bin_["drift_old"].append(abs(statistics.median(sessions[0][0]) / statistics.median(sessions[0][1]) - 1))
            bin_["drift_new"].append(abs(statistics.median(sessions[1][0]) / statistics.median(sessions[1][1]) - 1))
        detail.append(f"{name:<28} {ref_new * 1e3:10.3f} {statistics.median(errors(old_all, ref_old)):8.1%} "
                      f"{statistics.median(errors(new_all, ref_new)):8.1%} "
                      f"{statistics.median(errors(triples, ref_new)):8.1%}")

    def q(values: list[float], p: float) -> str:
        if not values:
            return f"{'-':>6}"
        ordered = sorted(values)
        return f"{ordered[min(len(ordered) - 1, int(p * len(ordered)))]:6.1%}"

    lines = [f"{'step bin':<10} {'configs':>7} | {'one measurement: median / p90 error':^56} | "
             f"{'own session':^17} | {'session drift':^17}",
             f"{'':<10} {'':>7} | {'old (1 launch)':^17} {'new (1 launch)':^17} {'new row (3)':^17} | "
             f"{'new row (3)':^17} | {'old':>8} {'new':>8}"]
    for *_, label in BINS:
        b = rows[label]
        lines.append(f"{label:<10} {len(b['drift_new']):7d} | {q(b['old'], .5)} / {q(b['old'], .9)}    "
                     f"{q(b['new1'], .5)} / {q(b['new1'], .9)}    {q(b['new3'], .5)} / {q(b['new3'], .9)}    | "
                     f"{q(b['own3'], .5)} / {q(b['own3'], .9)}  | "
                     f"{q(b['drift_old'], .5)}   {q(b['drift_new'], .5)}")
    return "\n".join(detail + [""] + lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", type=Path, default=Path("perfmodels/targets/ci-epyc-2c-b.yaml"))
    parser.add_argument("--launches", type=int, default=8)
    parser.add_argument("--sessions", type=int, default=2)
    parser.add_argument("--min-seconds", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--save", type=Path)
    parser.add_argument("--load", type=Path)
    args = parser.parse_args()
    launches = json.loads(args.load.read_text()) if args.load else run(args)
    if args.save:
        args.save.write_text(json.dumps(launches, indent=1))
    print(table(launches))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
