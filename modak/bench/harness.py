"""Measure candidates for real: one fresh process per candidate, rows stored as soon as they are measured.

Each candidate runs ``python -m modak.image.runner measure`` with the environment its container entrypoint would
set (thread counts, the candidate's parameter environment, a preloaded allocator), so that what is measured
is what the image would run. Ctrl-C stops the current candidate; everything measured before is kept.
"""

from __future__ import annotations

import datetime as dt
import glob
import json
import os
import platform
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

from modak.measurements.store import Measurement, PerfStore, as_json
from modak.candidates.catalog import Recipe, load_catalog, value_key
from modak.candidates.enumerate import Candidate
from modak.errors import InputError
from modak.plan import Plan
from modak.image.runtimes.base import RunRequest
from modak.spec.models import Precision
from modak.workload.analysis import WorkloadProfile
from modak.workload.source import ModelSource

DEFAULT_TIMEOUT_S = 1800.0


@dataclass(frozen=True)
class BenchSettings:
    repeat: int = 20
    budget_s: float = 10.0  # seconds of timed steps per candidate, at most
    timeout_s: float = DEFAULT_TIMEOUT_S  # whole candidate (prepare, tune, check, time), at most



def select_candidates(plan: Plan, selection: list[str]) -> list[Candidate]:
    """``all``, ``top-K`` (by predicted objective), or candidate names / runtime names."""
    ranked = [r.candidate for r in plan.ranked]
    if selection in ([], ["all"]):
        return ranked
    if len(selection) == 1 and selection[0].startswith("top-"):
        count = selection[0][4:]
        if not count.isdigit() or int(count) < 1:
            raise InputError(f"--candidates {selection[0]}: expected top-K with K a positive number")
        return ranked[: int(count)]
    chosen: list[Candidate] = []
    for wanted in selection:
        matches = [c for c in ranked if c.name == wanted or c.runtime == wanted or c.name.startswith(wanted + " ")]
        if not matches:
            raise InputError(f"--candidates: no candidate named '{wanted}' (see `modak plan`)")
        chosen.extend(m for m in matches if m not in chosen)
    return chosen


def run_request(plan: Plan, source: ModelSource, candidate: Candidate, workdir: Path) -> RunRequest:
    """The runner's request for ``candidate`` of ``plan``."""
    job = plan.loaded.job
    return RunRequest(
        runtime=candidate.runtime, device=candidate.device, precision=candidate.precision.value,
        params=dict(candidate.params), threads=candidate.threads, task=job.task.value,
        onnx_path=str(source.onnx_path), zoo=source.zoo, batch_size=job.model.batch_size,
        input_shapes={k: list(v) for k, v in source.input_shapes.items()}, workdir=str(workdir))


def candidate_env(recipe: Recipe, candidate: Candidate) -> dict[str, str]:
    """Environment the container entrypoint would export for ``candidate``."""
    env: dict[str, str] = {}
    values = dict(candidate.params)
    for parameter in recipe.parameters:
        if parameter.name in values:
            env.update(parameter.env.get(value_key(values[parameter.name]), {}))
    if candidate.threads:
        for name in ("MODAK_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "TVM_NUM_THREADS"):
            env[name] = str(candidate.threads)
    preload = env.pop("MODAK_PRELOAD", None)
    if preload:
        # The entrypoint's search: /usr/lib*/ to depth 2 (e.g. /usr/lib/x86_64-linux-gnu/).
        found = sorted(glob.glob(f"/usr/lib*/{preload}") + glob.glob(f"/usr/lib*/*/{preload}"))
        if not found:
            raise FileNotFoundError(f"{preload} is not installed on this machine (apt-get install libjemalloc2)")
        env["LD_PRELOAD"] = found[0]
    return env


def bench(plan: Plan, source: ModelSource, candidates: Iterable[Candidate], store: PerfStore,
          settings: BenchSettings = BenchSettings(), workdir: Path | None = None,
          on_result: Callable[[Candidate, Measurement], None] | None = None,
          catalog: dict[str, Recipe] | None = None) -> list[Measurement]:
    """Measure ``candidates`` one by one, adding each row to ``store`` as soon as it is measured."""
    catalog = catalog or load_catalog()
    workdir = workdir or Path(tempfile.gettempdir()) / "modak-work"
    rows: list[Measurement] = []
    for candidate in candidates:
        result = _run_one(plan, source, candidate, catalog[candidate.runtime], settings, workdir)
        row = measurement_row(plan, candidate, result)
        store.add([row])
        rows.append(row)
        if on_result:
            on_result(candidate, row)
    return rows


def _run_one(plan: Plan, source: ModelSource, candidate: Candidate, recipe: Recipe, settings: BenchSettings,
             workdir: Path) -> dict:
    try:
        env = {**os.environ, **candidate_env(recipe, candidate)}
    except FileNotFoundError as exc:
        return {"status": "error", "error": str(exc)}
    request = run_request(plan, source, candidate, workdir / candidate.runtime)
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as handle:
        handle.write(request.to_json())
    command = [sys.executable, "-m", "modak.image.runner", "measure", handle.name, "--repeat", str(settings.repeat),
               "--budget", str(settings.budget_s)]
    try:
        process = subprocess.run(command, env=env, capture_output=True, text=True, timeout=settings.timeout_s)
    except subprocess.TimeoutExpired:
        return {"status": "error", "error": f"timed out after {settings.timeout_s:.0f} s"}
    finally:
        os.unlink(handle.name)
    lines = process.stdout.strip().splitlines()
    try:
        return json.loads(lines[-1])
    except (IndexError, json.JSONDecodeError):
        tail = (process.stderr.strip().splitlines() or ["no output"])[-1]
        return {"status": "error", "error": f"runner exited with {process.returncode}: {tail}"[:2000]}


def workload_columns(workload: WorkloadProfile) -> dict[str, Any]:
    """A store row's columns that describe the workload (as the analysis computes them)."""
    by_class = workload.by_op_class()
    return {"flops": float(workload.flops), "bytes": float(workload.bytes),
            "forward_flops": float(workload.forward_flops), "parameters": workload.parameters,
            "nodes": len(workload.ops), "op_class_flops": as_json({k: g.flops for k, g in by_class.items()}),
            "op_class_bytes": as_json({k: g.bytes for k, g in by_class.items()})}


def measurement_row(plan: Plan, candidate: Candidate, result: dict) -> Measurement:
    """A store row from the plan's workload and target and the runner's result."""
    workload, ceilings, job = plan.workload, plan.ceilings, plan.loaded.job
    device = ceilings.gpu if candidate.device == "gpu" and ceilings.gpu else ceilings.cpu  # where it ran
    return Measurement(
        machine=plan.loaded.target.name, microarchitecture=ceilings.microarchitecture, cores=ceilings.cores,
        peak_fp32_gflops=device.peak_gflops[Precision.fp32], peak_bf16_gflops=device.peak_gflops.get(Precision.bf16),
        bandwidth_gbs=device.bandwidth_gbs, gpu=ceilings.gpu.name if ceilings.gpu else None,
        model=workload.model_name, task=job.task.value, batch_size=job.model.batch_size,
        input_shapes=as_json({k: list(v) for k, v in workload.input_shapes.items()}),
        **workload_columns(workload),
        runtime=candidate.runtime, device=candidate.device, precision=candidate.precision.value,
        params=as_json(dict(candidate.params)), threads=candidate.threads,
        status=result.get("status", "error"), step_median_s=result.get("step_median_s"),
        step_p10_s=result.get("step_p10_s"), step_p90_s=result.get("step_p90_s"), repeats=result.get("repeats", 0),
        throughput_per_s=result.get("throughput_per_s"), compile_s=result.get("compile_s"),
        peak_rss_mb=result.get("peak_rss_mb"), max_abs_error=result.get("max_abs_error"),
        error=result.get("error"), versions=as_json({**result.get("versions", {}), "host": platform.node()}),
        measured_at=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"))
