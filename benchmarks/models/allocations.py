"""Benchmark-only helpers for ``whatif.py`` and ``pack.py``: CPU allocations of this machine as targets, small jobs,
and launches of the measurement harness pinned to a core set (beside a co-runner or another job)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import yaml

from modak.bench.harness import BenchSettings, bench, launch_command, launch_environment
from modak.candidates.enumerate import Candidate
from modak.measurements.stats import Ratio, ratio
from modak.measurements.store import PerfStore
from modak.plan import Plan

BUSY_LOOP = (sys.executable, "-c", "while True: pass")
SETTINGS = BenchSettings(launches=1, min_seconds=1.0, budget_s=2.0, retries=0)  # contention is on purpose
WARM_UP_S = 6.0  # a background job's launch prepares and checks its model before it steps: wait this long


def write_target(folder: Path, cores: int, co_runners: int = 0, price: float | None = 1.0) -> Path:
    """A target file for ``cores`` of this machine (its cached probe), shared with ``co_runners`` busy processes."""
    document = {"apiVersion": "modak/v1", "kind": "Target",
                "name": f"here-{cores}c" + (f"-{co_runners}busy" if co_runners else ""),
                "cpu": "local",
                "scheduler": {"kind": "none", "cores_per_job": cores,
                              "allocation": "shared" if co_runners else "exclusive", "co_runners": co_runners}}
    if price is not None:
        document["cost"] = {"per_node_hour": price}
    path = folder / f"{document['name']}.yaml"
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path


def write_jobs(folder: Path) -> list[Path]:
    """Three small inference jobs: the bundled MNIST CNN, the zoo MLP, and MobileNetV2 as an ONNX file (exported
    from the zoo), objective throughput over 10,000 steps."""
    from modak.workload import zoo

    folder.mkdir(parents=True, exist_ok=True)
    exported = Path(zoo.export_onnx("mobilenet_v2"))
    for source in (exported, exported.with_name(exported.name + ".data")):  # the graph and its external weights
        if source.exists():
            (folder / source.name).write_bytes(source.read_bytes())
    specs = {"mnist-cnn": {"zoo": "mnist_cnn", "input_shape": [1, 28, 28], "batch_size": 64},
             "mlp": {"zoo": "mlp", "batch_size": 64},
             "mobilenet-onnx": {"onnx": exported.name, "input_shape": [3, 224, 224], "batch_size": 2}}
    paths = []
    for name, model in specs.items():
        path = folder / f"{name}.yaml"
        path.write_text(yaml.safe_dump({"apiVersion": "modak/v1", "kind": "Job", "name": name, "task": "inference",
                                        "model": model, "precision": ["fp32"],
                                        "objective": {"metric": "throughput", "steps": 10000}}, sort_keys=False))
        paths.append(path)
    return paths


@contextlib.contextmanager
def pinned(cores: set[int]) -> Iterator[None]:
    """This process (and what it starts) on ``cores`` meanwhile."""
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cores)
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


@contextlib.contextmanager
def beside(command: list[str] | tuple[str, ...] | None, cores: set[int], env: dict[str, str] | None = None,
           warm_up: float = 0.0) -> Iterator[None]:
    """``command`` running on ``cores`` meanwhile (None: nothing), killed afterwards."""
    if command is None:
        yield
        return
    process = subprocess.Popen(["taskset", "-c", ",".join(map(str, sorted(cores))), *command],
                               env={**os.environ, **(env or {})}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(warm_up)
        yield
    finally:
        process.kill()
        process.wait()


def job_runner(plan: Plan, candidate: Candidate, folder: Path) -> tuple[list[str], dict[str, str]]:
    """A command that runs ``candidate`` of ``plan`` continuously (the measurement launch with a long budget)."""
    folder.mkdir(parents=True, exist_ok=True)
    env = launch_environment(plan, candidate, folder / "plan.json", folder / "work")
    return launch_command(sys.executable, "-m", "modak.runtime", "measure", "--min-seconds", "3600",
                          "--budget", "3600"), env


def measure(plan: Plan, candidate: Candidate, store: PerfStore, cores: set[int],
            settings: BenchSettings = SETTINGS) -> float | None:
    """One harness launch of ``candidate`` pinned to ``cores``: its mean time per batch over the timed window (None:
    it failed). The mean, not the median: beside a co-runner, time slices split the samples into undisturbed and
    stalled ones (one core beside a busy loop: p10 at the alone step, p90 at 2.7x), and the median then follows
    whichever group is larger (the MLP's 2.7x, the MNIST CNN's 1.8x, where their means are 2.2x and 2.0x), while
    throughput, what ``whatif`` ranks and ``pack`` adds up, is the mean."""
    reports: list[dict] = []
    with pinned(cores):
        bench(plan, [candidate], store, replace(settings, launches=1),
              on_launch=lambda _, report: reports.append(report))
    means = [r["step_mean_s"] for r in reports if r.get("status") == "ok" and r.get("step_mean_s")]
    return means[-1] if means else None


def round_ratio(a: dict[int, float], b: dict[int, float]) -> Ratio:
    """``a / b`` of two cases' steps by round (``{round: step}``; the rounds both measured), with its t interval."""
    rounds = sorted(set(a) & set(b))
    return ratio([a[r] for r in rounds], [b[r] for r in rounds], paired=True)


def decided_tau(predicted: list[float], measured: list[dict[int, float]]) -> tuple[float, int, int, int]:
    """Kendall's tau over the pairs the measurement orders: a pair counts when its paired ratio's interval
    excludes 1 (concordant when the prediction orders it the same way); pairs it cannot order (near-ties within
    the noise) are left out. Returns (tau, concordant, discordant, undecided); tau is NaN when no pair is decided."""
    concordant = discordant = undecided = 0
    for i in range(len(predicted)):
        for j in range(i + 1, len(predicted)):
            r = round_ratio(measured[i], measured[j])
            if not (r.faster() or r.slower()):
                undecided += 1
            elif (predicted[i] < predicted[j]) == r.faster():
                concordant += 1
            else:
                discordant += 1
    decided = concordant + discordant
    return ((concordant - discordant) / decided if decided else float("nan")), concordant, discordant, undecided


def within_verdict(predicted: float, measured: Ratio, tolerance: float = 0.15) -> str:
    """Whether ``predicted`` is shown within ``tolerance`` of the measured ratio (predicted / measured within
    1 +- tolerance over the measurement's whole interval: "within"), shown outside it ("outside"), or neither."""
    low, high = predicted / measured.high, predicted / measured.low  # predicted / measured, as an interval
    if 1 - tolerance <= low and high <= 1 + tolerance:
        return "within"
    if high < 1 - tolerance or low > 1 + tolerance:
        return "outside"
    return "undecided"


def kendall_tau(a: list[float], b: list[float]) -> float:
    """Kendall's tau-b of two rankings' values (ties count as neither concordant nor discordant)."""
    concordant = discordant = ties_a = ties_b = 0
    for i in range(len(a)):
        for j in range(i + 1, len(a)):
            x, y = a[i] - a[j], b[i] - b[j]
            if x == 0 and y == 0:
                continue
            if x == 0:
                ties_a += 1
            elif y == 0:
                ties_b += 1
            elif (x > 0) == (y > 0):
                concordant += 1
            else:
                discordant += 1
    pairs = ((concordant + discordant + ties_a) * (concordant + discordant + ties_b)) ** 0.5
    return (concordant - discordant) / pairs if pairs else 1.0
