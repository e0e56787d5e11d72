"""Time the deployment in this process (``modak measure``) and the image's smoke test (``modak self-test``).

Both prepare the model through :func:`modak.runtime.open_model`, the code every image command runs, from the
deployment the launcher applied (:mod:`modak.image.launch`: ``$MODAK_PLAN``, ``$MODAK_MODEL``, ``$MODAK_WORKDIR``
and the thread count it set):

* ``python -m modak.image.launch -- python -m modak.runtime measure`` is what ``modak bench`` starts once per
  candidate (a fresh process, so thread settings and memory peaks belong to that candidate alone);
* ``modak self-test`` is the build's smoke test in the image: warm-up, then at least 20 timed steps;
* ``python -m modak.runtime measure --profile STEPS`` is ``modak bench``'s profiled launch of a candidate, beside
  (never mixed with) its timed launches: the runtime's ``profile`` instead of timing (:func:`profile_deployment`).
"""

from __future__ import annotations

import gc
import json
import math
import os
import resource
import statistics
import sys
import time
import traceback
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np

from modak.errors import EXIT_OK, EXIT_RUN_FAILED
from modak.image.deployment import PLAN_FILE, PLAN_VARIABLE, location, read_deployment
from modak.image.runtimes.base import (
    TOLERANCE,
    RunRequest,
    adapters,
    has_graph,
    load_profiler,
    make_inputs,
    relative_error,
)
from modak.runtime import Model, open_model, request_from_environment
from modak.runtime.corelink import round_trip_seconds

_PACKAGES = ("numpy", "onnx")  # besides every runtime's own (Adapter.packages)
TRAINING_CHECK_STEPS = 2  # the second loss depends on the first update, so gradients and optimizer are checked


MIN_SAMPLE_S = 1e-3  # a timed sample spans enough steps to last this long (sub-millisecond steps are grouped)
MIN_SAMPLES = 3


def measure(request: RunRequest, min_seconds: float = 1.0, budget_s: float = 10.0,
            check: bool = True) -> dict[str, Any]:
    """Prepare, check against the fp32 reference, warm up, then time steps for ``min_seconds`` (at most
    ``budget_s``), watching what else runs on this process's CPUs meanwhile (:class:`CpuWatch`)."""
    result: dict[str, Any] = {"status": "error", "versions": _versions()}
    canary = canary_seconds()  # before the runtime starts threads of its own
    cpus = sorted(os.sched_getaffinity(0))
    core_rtt = round_trip_seconds(cpus)
    model = open_model(request)
    feeds = model.example_inputs()
    per_run = model.batches_per_step  # a step may process several batches (OpenVINO streams)
    first_start = time.perf_counter()
    outputs = [model.step(feeds) for _ in range(TRAINING_CHECK_STEPS if request.task == "training" else 1)]
    first_s = (time.perf_counter() - first_start) / len(outputs) / per_run
    if check:
        reference = reference_outputs(request, dict(model.sample_batch))
        first_batch = [[o[:request.batch_size] if request.task == "inference" else o for o in run] for run in outputs]
        error = relative_error(_flatten(first_batch), reference)
        result["max_abs_error"] = error
        if not error <= TOLERANCE[request.precision]:
            result.update(status="incorrect",
                          error=f"output differs from the fp32 reference by {error:.3g} (relative), "
                                f"tolerance {TOLERANCE[request.precision]:g}")
            return result
    with CpuWatch() as watch:
        timing = step_times(model, feeds, min_seconds, budget_s)
    times = timing.samples
    median = statistics.median(times)
    result.update(
        status="ok", step_median_s=median, step_p10_s=_quantile(times, 0.1), step_p90_s=_quantile(times, 0.9),
        repeats=timing.steps, samples=len(times), timed_seconds=timing.seconds,
        # The time per batch over the whole timed window (throughput's view): where time slices with another
        # process split the samples into fast and stalled ones, the median follows whichever half is larger.
        step_mean_s=timing.seconds / timing.steps / per_run,
        throughput_per_s=request.batch_size / median,
        compile_s=model.prepare_seconds + max(0.0, first_s - median), peak_rss_mb=_peak_rss_mb(),
        contention={**watch.report(), "canary_s": canary, "core_rtt_s": core_rtt,
                    "core_rtt_cpus": [cpus[0], cpus[-1]]},
        protocol={"min_seconds": min_seconds, "min_sample_s": MIN_SAMPLE_S, "steps_per_sample": timing.group,
                  "gc": "frozen", **{k: os.environ[k] for k in PROTOCOL_VARIABLES if k in os.environ}})
    return result


PROTOCOL_VARIABLES = ("MODAK_WAIT_POLICY", "OMP_WAIT_POLICY", "OMP_PROC_BIND", "OMP_PLACES", "MODAK_CPUS")


@dataclass(frozen=True)
class Timing:
    """Timed samples (seconds per batch, sorted), the steps each sample grouped, all steps, seconds timed."""

    samples: list[float]
    group: int
    steps: int
    seconds: float


def step_times(model: Model, feeds: dict[str, np.ndarray], min_seconds: float = 1.0, budget_s: float = 10.0,
               min_samples: int = MIN_SAMPLES) -> Timing:
    """Time ``model``'s steps by duration: after a warm-up (one step, then up to 0.5 s), samples of ``group``
    steps each (enough to last :data:`MIN_SAMPLE_S`) until ``min_seconds`` are timed and ``min_samples`` taken;
    more than ``min_samples`` only within ``budget_s``. Garbage collection is frozen and off while timing."""
    per_run = model.batches_per_step
    start = time.perf_counter()
    model.step(feeds)
    fastest = time.perf_counter() - start
    warm_until = time.perf_counter() + min(0.5, budget_s / 10)
    while time.perf_counter() < warm_until:
        t0 = time.perf_counter()
        model.step(feeds)
        fastest = min(fastest, time.perf_counter() - t0)
    group = max(1, math.ceil(MIN_SAMPLE_S / max(fastest, 1e-9)))
    samples: list[float] = []
    gc.collect()
    gc.freeze()
    gc.disable()
    try:
        begin = time.perf_counter()
        deadline = begin + max(budget_s, min_seconds)
        while len(samples) < min_samples or (time.perf_counter() - begin < min_seconds
                                             and time.perf_counter() < deadline):
            t0 = time.perf_counter()
            for _ in range(group):
                model.step(feeds)
            samples.append((time.perf_counter() - t0) / group / per_run)
        seconds = time.perf_counter() - begin
    finally:
        gc.enable()
        gc.unfreeze()
    return Timing(sorted(samples), group, len(samples) * group, seconds)


class CpuWatch:
    """What else ran on this process's CPUs while the ``with`` block ran: the other processes' CPU time (busy
    time of these CPUs in ``/proc/stat`` minus this process's own), the hypervisor's steal time, both in cores,
    and the load average. Fields are None where ``/proc`` cannot be read."""

    def __enter__(self) -> CpuWatch:
        self._cpus = sorted(os.sched_getaffinity(0))
        self._start = (time.perf_counter(), _own_cpu_seconds(), _cpu_ticks(self._cpus))
        return self

    def __exit__(self, *exc: object) -> None:
        self._end = (time.perf_counter(), _own_cpu_seconds(), _cpu_ticks(self._cpus))

    def report(self) -> dict[str, Any]:
        (w0, own0, ticks0), (w1, own1, ticks1) = self._start, self._end
        wall = max(w1 - w0, 1e-9)
        report: dict[str, Any] = {"cpus": len(self._cpus), "wall_s": round(wall, 4),
                                  "own_cores": round((own1 - own0) / wall, 3), "load1": round(os.getloadavg()[0], 2),
                                  "other_cores": None, "steal_cores": None}
        if ticks0 and ticks1:
            hz = os.sysconf("SC_CLK_TCK")
            busy = (ticks1[0] - ticks0[0]) / hz
            report["other_cores"] = round(max(0.0, busy - (own1 - own0)) / wall, 3)
            report["steal_cores"] = round((ticks1[1] - ticks0[1]) / hz / wall, 3)
        return report


OTHER_CORES_LIMIT = 0.2  # other processes' CPU use (cores, or 10% of the CPUs if more) that marks a timing
STEAL_CORES_LIMIT = 0.1


def contention_reasons(report: Mapping[str, Any]) -> list[str]:
    """Why a :class:`CpuWatch` report shows a shared machine (empty: it looked quiet)."""
    reasons = []
    other, steal = report.get("other_cores"), report.get("steal_cores")
    if other is not None and other > max(OTHER_CORES_LIMIT, 0.1 * report.get("cpus", 1)):
        reasons.append(f"other processes used {other:.2f} of {report.get('cpus')} CPUs")
    if steal is not None and steal > STEAL_CORES_LIMIT:
        reasons.append(f"the hypervisor took {steal:.2f} CPUs (steal time)")
    return reasons


def _own_cpu_seconds() -> float:
    times = os.times()
    return times.user + times.system


def _cpu_ticks(cpus: list[int]) -> tuple[int, int] | None:
    """(busy, steal) clock ticks of ``cpus`` since boot, from ``/proc/stat``."""
    wanted = {f"cpu{c}" for c in cpus}
    busy = steal = 0
    try:
        with open("/proc/stat", encoding="ascii") as stat:
            for line in stat:
                words = line.split()
                if words and words[0] in wanted:
                    user, nice, system, _idle, _iowait, irq, softirq, stolen = (int(w) for w in words[1:9])
                    busy += user + nice + system + irq + softirq
                    steal += stolen
    except (OSError, ValueError):
        return None
    return busy, steal


def canary_seconds() -> float:
    """Seconds of a fixed single-threaded Python loop (best of 5): how fast one core is for this process now (run
    it before a runtime starts threads: spinning pools slow it)."""
    best = math.inf
    for _ in range(5):
        t0 = time.perf_counter()
        sum(i * i for i in range(100_000))
        best = min(best, time.perf_counter() - t0)
    return round(best, 6)


def reference_outputs(request: RunRequest, inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
    """The reference: ONNX Runtime on the ONNX graph (inference) or PyTorch eager (training losses; the outputs of
    the user's own model that has no ONNX export).

    For int8 the graph is the quantized one, so the check says that the runtime executes that graph (within int8's
    tolerance: runtimes round int8 arithmetic differently); how far int8 moves from fp32 is the plan's accuracy
    gate, measured once on the calibration samples (:mod:`modak.quantize.gate`, on the host)."""
    if request.task == "training" or not has_graph(request):  # without a graph, eager is the reference
        from modak.image.runtimes import pytorch

        fp32 = RunRequest(**{**request.__dict__, "runtime": "pytorch", "precision": "fp32", "params": {},
                             "device": "cpu"})
        session = pytorch.prepare(fp32, inputs)
        steps = TRAINING_CHECK_STEPS if request.task == "training" else 1
        return _flatten([session.run(inputs) for _ in range(steps)])
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = request.threads or 0
    session = ort.InferenceSession(request.onnx_path, options, providers=["CPUExecutionProvider"])
    return session.run(None, inputs)


def _flatten(runs: list[list[np.ndarray]]) -> list[np.ndarray]:
    return [np.asarray(o) for run in runs for o in run]


def _quantile(sorted_times: list[float], q: float) -> float:
    return sorted_times[min(len(sorted_times) - 1, int(q * len(sorted_times)))]


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def _versions() -> dict[str, str]:
    versions = {"python": sys.version.split()[0]}
    for package in dict.fromkeys([*_PACKAGES, *(p for a in adapters().values() for p in a.packages)]):
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            continue
    return versions


SELF_TEST_STEPS = 20


def measure_deployment(min_seconds: float, budget_s: float, check: bool) -> dict[str, Any]:
    """:func:`measure` of the deployment the launcher applied, with the threads it used."""
    request = request_from_environment()
    return {**measure(request, min_seconds, budget_s, check), "threads": request.threads}


def profile_deployment(steps: int) -> dict[str, Any]:
    """:func:`profile` of the deployment the launcher applied, with the threads it used."""
    request = request_from_environment()
    return {**profile(request, steps), "threads": request.threads}


def profile(request: RunRequest, steps: int) -> dict[str, Any]:
    """The runtime's profile of ``steps`` steps (:func:`modak.image.runtimes.base.load_profiler`) as the report's
    ``profile``: no timed steps, no reference check (profiling inflates times; the timed launches check)."""
    result: dict[str, Any] = {"status": "error", "versions": _versions()}
    profiler = load_profiler(request.runtime)
    if profiler is None:
        result["error"] = f"runtime {request.runtime} reports no profile"
        return result
    report = profiler(request, make_inputs(request), steps)
    protocol = {"profile_steps": steps, **{k: os.environ[k] for k in PROTOCOL_VARIABLES if k in os.environ}}
    result.update(status="ok", profile=asdict(report), peak_rss_mb=_peak_rss_mb(), protocol=protocol)
    return result


def self_test(steps: int = SELF_TEST_STEPS, budget_s: float = 120.0, serve_check: bool = False) -> dict[str, Any]:
    """Warm up, time at least ``steps`` steps (more within ``budget_s``), and set the median against the interval
    the plan predicted for its choice; with ``serve_check``, also serve the model and send it one infer request
    (:func:`modak.runtime.serve.self_check`)."""
    request = request_from_environment()
    model = open_model(request, read_deployment(location(PLAN_VARIABLE)))  # the plan's: its tokenizer too
    feeds = model.example_inputs()
    outputs = model.step(feeds)
    with CpuWatch() as watch:
        timing = step_times(model, feeds, min_seconds=0.0, budget_s=budget_s, min_samples=max(steps, 1))
    times = timing.samples
    median = statistics.median(times)
    contention = watch.report()
    report: dict[str, Any] = {
        "status": "ok", "runtime": request.runtime, "device": request.device, "precision": request.precision,
        "params": request.params, "threads": request.threads, "prepare_seconds": round(model.prepare_seconds, 4),
        "steps": timing.steps, "samples": len(times), "step_seconds": round(median, 6), "contention": contention,
        "step_p10_seconds": round(_quantile(times, 0.1), 6), "step_p90_seconds": round(_quantile(times, 0.9), 6),
        "outputs": {spec.name: list(np.shape(o)) for spec, o in zip(model.outputs, outputs)},
        "versions": _versions()}
    report.update(compare_with_prediction(median, _chosen_candidate(), request.threads))
    busy = contention_reasons(contention)
    if busy:
        report["message"] += f"; measured while {', '.join(busy)}"
    if serve_check:
        from modak.runtime.serve import self_check

        report["serve"] = self_check(model)
        if report["serve"].get("status") != "ok":
            report.update(status="error", error=f"serving failed: {report['serve'].get('error')}")
    return report


def compare_with_prediction(median: float, chosen: Mapping[str, Any] | None, threads: int | None) -> dict[str, Any]:
    """The plan's predicted step and interval next to the measured median, and a sentence saying how they relate."""
    if not chosen or "interval_seconds" not in chosen:
        return {"message": f"measured {median * 1e3:.3g} ms per step; the plan has no prediction to compare"}
    low, high = (float(x) for x in chosen["interval_seconds"])
    predicted = float(chosen["step_seconds"])
    within = low <= median <= high
    where = "within" if within else ("below" if median < low else "above")
    message = (f"measured {median * 1e3:.3g} ms per step ({threads} threads), predicted {predicted * 1e3:.3g} ms "
               f"[{low * 1e3:.3g}, {high * 1e3:.3g}]: {where} the predicted interval")
    if not within:
        message += (f" ({median / predicted:.2f}x the prediction; the plan assumed {chosen.get('threads')} threads "
                    "on the target's cores: check the allocation and what else runs here)")
    return {"predicted_step_seconds": predicted, "predicted_interval_seconds": [low, high],
            "within_prediction": within, "message": message}


def _chosen_candidate() -> dict[str, Any] | None:
    """The plan's ranked entry for its choice, or None when the plan file has none."""
    try:
        plan = json.loads(Path(os.environ.get(PLAN_VARIABLE) or PLAN_FILE).read_text(encoding="utf-8"))
        return next(c for c in plan["candidates"] if c["name"] == plan["choice"])
    except (OSError, ValueError, KeyError, TypeError, StopIteration):
        return None


def run_reported(action: Any) -> int:
    """Run ``action`` and print its JSON report (a failure becomes a report too); exit 0 when it says ok, else 3
    (:data:`~modak.errors.EXIT_RUN_FAILED`)."""
    try:
        result = action()
    except Exception as exc:  # reported as data: the harness and the build record the failure
        last = traceback.extract_tb(exc.__traceback__)[-1]
        result = {"status": "error", "error": f"{type(exc).__name__}: {exc}"[:2000],
                  "where": f"{Path(last.filename).name}:{last.lineno}", "versions": _versions()}
    print(json.dumps(result, sort_keys=True), flush=True)
    return EXIT_OK if result["status"] == "ok" else EXIT_RUN_FAILED
