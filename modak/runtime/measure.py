"""Time the deployment in this process (``modak measure``) and the image's smoke test (``modak self-test``).

Both prepare the model through :func:`modak.runtime.open_model`, the code every image command runs, from the
deployment the launcher applied (:mod:`modak.image.launch`: ``$MODAK_PLAN``, ``$MODAK_MODEL``, ``$MODAK_WORKDIR``
and the thread count it set):

* ``python -m modak.image.launch -- python -m modak.runtime measure`` is what ``modak bench`` starts once per
  candidate (a fresh process, so thread settings and memory peaks belong to that candidate alone);
* ``modak self-test`` is the build's smoke test in the image: warm-up, then at least 20 timed steps.
"""

from __future__ import annotations

import json
import os
import resource
import statistics
import sys
import time
import traceback
from collections.abc import Mapping
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np

from modak.image.deployment import PLAN_FILE, PLAN_VARIABLE
from modak.image.runtimes.base import TOLERANCE, RunRequest, relative_error
from modak.runtime import Model, open_model, request_from_environment

_PACKAGES = ("numpy", "onnx", "onnxruntime", "onnxruntime-gpu", "torch", "openvino", "apache-tvm", "jax", "jaxlib",
             "torchax")
TRAINING_CHECK_STEPS = 2  # the second loss depends on the first update, so gradients and optimizer are checked


def measure(request: RunRequest, repeat: int = 20, budget_s: float = 10.0, check: bool = True) -> dict[str, Any]:
    """Prepare, check against the fp32 reference, warm up, then time ``repeat`` steps (within ``budget_s``)."""
    result: dict[str, Any] = {"status": "error", "versions": _versions()}
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
    times = step_times(model, feeds, repeat, budget_s)
    median = statistics.median(times)
    result.update(
        status="ok", step_median_s=median, step_p10_s=_quantile(times, 0.1), step_p90_s=_quantile(times, 0.9),
        repeats=len(times), throughput_per_s=request.batch_size / median,
        compile_s=model.prepare_seconds + max(0.0, first_s - median), peak_rss_mb=_peak_rss_mb())
    return result


def step_times(model: Model, feeds: dict[str, np.ndarray], repeat: int, budget_s: float,
               minimum: int = 3) -> list[float]:
    """Sorted seconds per batch of up to ``repeat`` steps (at least ``minimum``, more only within ``budget_s``),
    after a warm-up of one step and up to 0.5 s."""
    deadline = time.perf_counter() + budget_s
    warm_until = time.perf_counter() + min(0.5, budget_s / 10)
    model.step(feeds)
    while time.perf_counter() < warm_until:
        model.step(feeds)
    times: list[float] = []
    while len(times) < repeat and (len(times) < minimum or time.perf_counter() < deadline):
        t0 = time.perf_counter()
        model.step(feeds)
        times.append((time.perf_counter() - t0) / model.batches_per_step)
    return sorted(times)


def reference_outputs(request: RunRequest, inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
    """fp32 reference: ONNX Runtime on the ONNX graph (inference) or PyTorch eager (training losses)."""
    if request.task == "training":
        from modak.image.runtimes import pytorch

        fp32 = RunRequest(**{**request.__dict__, "runtime": "pytorch", "precision": "fp32", "params": {},
                             "device": "cpu"})
        session = pytorch.prepare(fp32, inputs)
        return _flatten([session.run(inputs) for _ in range(TRAINING_CHECK_STEPS)])
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
    for package in _PACKAGES:
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            continue
    return versions


SELF_TEST_STEPS = 20


def measure_deployment(repeat: int, budget_s: float, check: bool) -> dict[str, Any]:
    """:func:`measure` of the deployment the launcher applied, with the threads it used."""
    request = request_from_environment()
    return {**measure(request, repeat, budget_s, check), "threads": request.threads}


def self_test(steps: int = SELF_TEST_STEPS, budget_s: float = 120.0, serve_check: bool = False) -> dict[str, Any]:
    """Warm up, time at least ``steps`` steps (more within ``budget_s``), and set the median against the interval
    the plan predicted for its choice; with ``serve_check``, also serve the model and send it one infer request
    (:func:`modak.runtime.serve.self_check`)."""
    request = request_from_environment()
    model = open_model(request)
    feeds = model.example_inputs()
    outputs = model.step(feeds)
    times = step_times(model, feeds, repeat=max(steps, 1), budget_s=budget_s, minimum=steps)
    median = statistics.median(times)
    report: dict[str, Any] = {
        "status": "ok", "runtime": request.runtime, "device": request.device, "precision": request.precision,
        "params": request.params, "threads": request.threads, "prepare_seconds": round(model.prepare_seconds, 4),
        "steps": len(times), "step_seconds": round(median, 6),
        "step_p10_seconds": round(_quantile(times, 0.1), 6), "step_p90_seconds": round(_quantile(times, 0.9), 6),
        "outputs": {spec.name: list(np.shape(o)) for spec, o in zip(model.outputs, outputs)},
        "versions": _versions()}
    report.update(compare_with_prediction(median, _chosen_candidate(), request.threads))
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
    """Run ``action`` and print its JSON report (a failure becomes a report too); exit 0 when it says ok, else 3."""
    try:
        result = action()
    except Exception as exc:  # reported as data: the harness and the build record the failure
        last = traceback.extract_tb(exc.__traceback__)[-1]
        result = {"status": "error", "error": f"{type(exc).__name__}: {exc}"[:2000],
                  "where": f"{Path(last.filename).name}:{last.lineno}", "versions": _versions()}
    print(json.dumps(result, sort_keys=True), flush=True)
    return 0 if result["status"] == "ok" else 3
