"""Measure candidates for real: one fresh process per candidate, rows stored as soon as they are measured.

Each candidate runs as ``python -m modak.image.launch -- python -m modak.runtime measure``: the launcher is
what the image's entrypoint runs, so the candidate gets the environment its image would set on this allocation
(thread counts, the parameters' variables, a preloaded allocator) from the same code, and what is measured is
what ships. Ctrl-C stops the current candidate; everything measured before is kept.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

from modak.candidates.enumerate import Candidate
from modak.errors import InputError
from modak.image.deployment import MODEL_VARIABLE, PLAN_VARIABLE, WORKDIR_VARIABLE
from modak.measurements.store import Measurement, PerfStore, as_json
from modak.paths import write_atomic
from modak.plan import Plan
from modak.spec.models import Precision
from modak.workload.analysis import WorkloadProfile

DEFAULT_TIMEOUT_S = 1800.0
BENCH_WORKDIR = Path(tempfile.gettempdir()) / "modak-work"  # runtimes' work folders (TVM tuning databases, ...)


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


def launch_environment(plan: Plan, candidate: Candidate, plan_file: Path, workdir: Path) -> dict[str, str]:
    """Where the launcher finds ``candidate``'s deployment, model and work folder (the image bakes the same
    variables with its own paths); ``plan_file`` gets the deployment."""
    write_atomic(plan_file, json.dumps({"deployment": plan.deployment(candidate).to_dict()}, sort_keys=True))
    return {PLAN_VARIABLE: str(plan_file), MODEL_VARIABLE: str(plan.source.onnx_path), WORKDIR_VARIABLE: str(workdir)}


def launch_command(*command: str) -> list[str]:
    """``command`` started through the image's launcher with this Python."""
    return [sys.executable, "-m", "modak.image.launch", "--", *command]


def bench(plan: Plan, candidates: Iterable[Candidate], store: PerfStore, settings: BenchSettings = BenchSettings(),
          workdir: Path = BENCH_WORKDIR, on_start: Callable[[Candidate], None] | None = None,
          on_result: Callable[[Candidate, Measurement], None] | None = None) -> list[Measurement]:
    """Measure ``candidates`` of ``plan`` one by one, adding each row to ``store`` as soon as it is measured."""
    rows: list[Measurement] = []
    for candidate in candidates:
        if on_start:
            on_start(candidate)
        row = measurement_row(plan, candidate, _run_one(plan, candidate, settings, workdir))
        store.add([row])
        rows.append(row)
        if on_result:
            on_result(candidate, row)
    return rows


def _run_one(plan: Plan, candidate: Candidate, settings: BenchSettings, workdir: Path) -> dict:
    with tempfile.TemporaryDirectory(prefix="modak-bench-") as scratch:
        env = {**os.environ, **launch_environment(plan, candidate, Path(scratch) / "plan.json",
                                                   workdir / candidate.runtime)}
        command = launch_command(sys.executable, "-m", "modak.runtime", "measure", "--repeat",
                                 str(settings.repeat), "--budget", str(settings.budget_s))
        try:
            process = subprocess.run(command, env=env, capture_output=True, text=True, timeout=settings.timeout_s)
        except subprocess.TimeoutExpired:
            return {"status": "error", "error": f"timed out after {settings.timeout_s:.0f} s"}
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
        params=as_json(dict(candidate.params)), threads=result.get("threads") or candidate.threads,
        status=result.get("status", "error"), step_median_s=result.get("step_median_s"),
        step_p10_s=result.get("step_p10_s"), step_p90_s=result.get("step_p90_s"), repeats=result.get("repeats", 0),
        throughput_per_s=result.get("throughput_per_s"), compile_s=result.get("compile_s"),
        peak_rss_mb=result.get("peak_rss_mb"), max_abs_error=result.get("max_abs_error"),
        error=result.get("error"), versions=as_json({**result.get("versions", {}), "host": platform.node()}),
        measured_at=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"))
