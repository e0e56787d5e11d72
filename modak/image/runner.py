"""Run the deployment in this process and print what happened as JSON.

Both commands read the deployment the launcher applied (:mod:`modak.image.launch`: ``$MODAK_PLAN``,
``$MODAK_MODEL``, ``$MODAK_WORKDIR`` and the thread count it set), so they run what the image runs:

* ``python -m modak.image.launch -- python -m modak.image.runner measure`` is what ``modak bench`` starts once per
  candidate (a fresh process, so thread settings and memory peaks belong to that candidate alone);
* ``python -m modak.image.runner --self-test`` is the image's smoke test: one step, then runtime, threads and
  step time.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import time
import traceback
from importlib import metadata
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from modak.image.deployment import MODEL_VARIABLE, PLAN_VARIABLE, WORKDIR_VARIABLE, location, read_deployment
from modak.image.runtimes.base import TOLERANCE, RunRequest, load_runtime, make_inputs, relative_error

_PACKAGES = ("numpy", "onnx", "onnxruntime", "onnxruntime-gpu", "torch", "openvino", "apache-tvm", "jax", "jaxlib",
             "torchax")
TRAINING_CHECK_STEPS = 2  # the second loss depends on the first update, so gradients and optimizer are checked


def measure(request: RunRequest, repeat: int = 20, budget_s: float = 10.0, check: bool = True) -> dict[str, Any]:
    """Prepare, check against the fp32 reference, warm up, then time ``repeat`` steps (within ``budget_s``)."""
    result: dict[str, Any] = {"status": "error", "versions": _versions()}
    inputs = make_inputs(request)
    runtime = load_runtime(request.runtime)
    start = time.perf_counter()
    session = runtime.prepare(request, inputs)
    prepare_s = time.perf_counter() - start
    per_run = getattr(session, "batches_per_step", 1)  # a run may process several batches (OpenVINO streams)
    first_start = time.perf_counter()
    outputs = [session.run() for _ in range(TRAINING_CHECK_STEPS if request.task == "training" else 1)]
    first_s = (time.perf_counter() - first_start) / len(outputs) / per_run
    if check:
        reference = reference_outputs(request, inputs)
        error = relative_error(_flatten(outputs), reference)
        result["max_abs_error"] = error
        if not error <= TOLERANCE[request.precision]:
            result.update(status="incorrect",
                          error=f"output differs from the fp32 reference by {error:.3g} (relative), "
                                f"tolerance {TOLERANCE[request.precision]:g}")
            return result
    deadline = time.perf_counter() + budget_s
    warm_until = time.perf_counter() + min(0.5, budget_s / 10)
    session.run()
    while time.perf_counter() < warm_until:
        session.run()
    times: list[float] = []
    while len(times) < repeat and (len(times) < 3 or time.perf_counter() < deadline):
        t0 = time.perf_counter()
        session.run()
        times.append((time.perf_counter() - t0) / per_run)
    times.sort()
    median = statistics.median(times)
    result.update(
        status="ok", step_median_s=median, step_p10_s=_quantile(times, 0.1), step_p90_s=_quantile(times, 0.9),
        repeats=len(times), throughput_per_s=request.batch_size / median,
        compile_s=prepare_s + max(0.0, first_s - median), peak_rss_mb=_peak_rss_mb())
    return result


def reference_outputs(request: RunRequest, inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
    """fp32 reference: ONNX Runtime on the ONNX graph (inference) or PyTorch eager (training losses)."""
    if request.task == "training":
        from modak.image.runtimes import pytorch

        fp32 = RunRequest(**{**request.__dict__, "runtime": "pytorch", "precision": "fp32", "params": {},
                             "device": "cpu"})
        session = pytorch.prepare(fp32, inputs)
        return _flatten([session.run() for _ in range(TRAINING_CHECK_STEPS)])
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = request.threads or 0
    session = ort.InferenceSession(request.onnx_path, options, providers=["CPUExecutionProvider"])
    return session.run(None, inputs)


def request_from_environment(environ: Mapping[str, str] = os.environ) -> RunRequest:
    """The run request of the deployment the launcher applied: plan, model file, work folder, threads."""
    deployment = read_deployment(location(PLAN_VARIABLE, environ))
    threads = environ.get("MODAK_THREADS", "")
    return RunRequest(
        runtime=deployment.runtime, device=deployment.device, precision=deployment.precision,
        params=dict(deployment.params), threads=int(threads) if threads.isdigit() else None, task=deployment.task,
        onnx_path=location(MODEL_VARIABLE, environ), zoo=deployment.zoo,
        batch_size=deployment.batch_size, input_shapes={k: list(v) for k, v in deployment.input_shapes.items()},
        workdir=location(WORKDIR_VARIABLE, environ))


def self_test() -> dict[str, Any]:
    """One step of the deployment the launcher applied."""
    request = request_from_environment()
    inputs = make_inputs(request)
    start = time.perf_counter()
    session = load_runtime(request.runtime).prepare(request, inputs)
    prepare_s = time.perf_counter() - start
    session.run()
    start = time.perf_counter()
    outputs = session.run()
    step_s = (time.perf_counter() - start) / getattr(session, "batches_per_step", 1)
    return {"status": "ok", "runtime": request.runtime, "device": request.device, "precision": request.precision,
            "params": request.params, "threads": request.threads, "prepare_seconds": round(prepare_s, 4),
            "step_seconds": round(step_s, 6), "outputs": [list(np.shape(o)) for o in outputs],
            "versions": _versions()}


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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m modak.image.runner")
    parser.add_argument("--self-test", action="store_true", help="one step of the image's configured runtime")
    parser.add_argument("action", nargs="?", choices=["measure"], help="check, warm up and time the deployment")
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--budget", type=float, default=10.0, help="seconds of timed steps at most")
    parser.add_argument("--no-check", action="store_true", help="skip the reference check")
    args = parser.parse_args(argv)
    try:
        if args.self_test:
            result = self_test()
        elif args.action == "measure":
            request = request_from_environment()
            result = {**measure(request, args.repeat, args.budget, check=not args.no_check),
                      "threads": request.threads}
        else:
            parser.error("give --self-test or measure")
    except Exception as exc:  # reported as data: the harness records the failure and moves on
        last = traceback.extract_tb(exc.__traceback__)[-1]
        result = {"status": "error", "error": f"{type(exc).__name__}: {exc}"[:2000],
                  "where": f"{Path(last.filename).name}:{last.lineno}", "versions": _versions()}
    print(json.dumps(result, sort_keys=True), flush=True)
    return 0 if result["status"] == "ok" else 3


if __name__ == "__main__":
    raise SystemExit(main())
