"""Measure candidates for real with the measurement protocol: interleaved rounds of fresh launches, each watched
for contention, aggregated into one stored row per candidate with its interval.

Each launch is ``python -m modak.image.launch -- python -m modak.runtime measure``: the launcher is what the
image's entrypoint runs, so the candidate gets the environment its image would set on this allocation (thread
counts, pinning, the pools' wait policy, the parameters' variables, a preloaded allocator) from the same code,
and what is measured is what ships. The launch times steps for a duration, with garbage collection frozen, and
reports what else used its CPUs meanwhile (:mod:`modak.runtime.measure`).

A session runs rounds: every candidate still in the race launches once per round, in a random order, so slow
drift of the machine hits all candidates alike and launch ``i`` of two candidates can be compared as a pair. A
launch that ran beside other work (other processes' CPU time, steal time, a slowed canary) or while its CPUs sat
far apart (a slowed round trip between them: :mod:`modak.runtime.corelink`; a launch first waits for them to come
near, where the host's best is known) is launched again up to
``retries`` times; if it stays contended, its row is stored with status ``contended``, which no model learns from,
and the user is told. Rows are stored after every round (Ctrl-C keeps them). Dispatchers run a round's launches
here, one at a time, or as a Slurm job array (:mod:`modak.bench.dispatch`).

Asked for kernels (``BenchSettings.kernel_steps``), a session ends with one profiled launch of each candidate
measured ok (``python -m modak.runtime measure --profile STEPS``), after all its timed rounds and never among them
(profiling inflates times): its per-kernel times become the perf store's kernel rows, reconciled with the row's
unprofiled median (:func:`modak.measurements.profiles.kernel_rows`); its step time never enters the row. A
profiled launch whose step ran well past the timed median (:func:`inflated`: it ran beside other work, and its
kernel times with it) is launched again, up to :data:`PROFILE_TRIES` launches in all; the least inflated is kept.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import math
import platform
import random
import shutil
import statistics
import sys
import tempfile
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from modak.bench.dispatch import Dispatcher, LaunchTask, LocalDispatcher
from modak.candidates.enumerate import Candidate
from modak.errors import InputError
from modak.image.deployment import MODEL_FILE, MODEL_VARIABLE, PLAN_VARIABLE, WORKDIR_VARIABLE
from modak.image.kernels import Profile
from modak.measurements.profiles import kernel_rows
from modak.measurements.stats import median_interval, spread
from modak.measurements.store import Measurement, PerfStore, as_json
from modak.paths import write_atomic
from modak.plan import Plan
from modak.runtime.measure import contention_reasons
from modak.spec.models import Precision
from modak.workload.analysis import WorkloadProfile, analyze

DEFAULT_TIMEOUT_S = 1800.0
BENCH_WORKDIR = Path(tempfile.gettempdir()) / "modak-work"  # runtimes' work folders (TVM tuning databases, ...)
PROTOCOL = 2
# A launch's canary (its report's ``<canary>_s``) past this many times the host's best marks it, saying why:
# - ``canary``, a one-core loop: beside other work (quiet VMs vary 1.9x, see notes);
# - ``core_rtt``, a round trip between its CPUs: the vCPUs sat on distant cores (perfmodels/README.md, "The
#   seventeenth round": near and far round trips on a VM).
CANARIES = {"canary": (2.5, "a fixed loop ran {:.2f}x slower than its best on this host"),
            "core_rtt": (2.0, "a round trip between its CPUs took {:.2f}x its best on this host (they sat on "
                              "distant cores)")}
KERNEL_STEPS = 10  # profiled steps of the launch that labels kernels (modak bench --kernels)
PROFILE_TRIES = 3  # profiled launches of a candidate at most: again while its step looks inflated
# A profiled step past PROFILE_INFLATION times the timed median plus PROFILE_ALLOWANCE_S (the profiler's own cost on
# a one-layer graph) is inflated (perfmodels/README.md, "The seventh round": what profiling adds on a quiet machine).
PROFILE_INFLATION = 1.2
PROFILE_ALLOWANCE_S = 50e-6


@dataclass(frozen=True)
class BenchSettings:
    """The measurement protocol's knobs."""

    launches: int = 3  # launches per candidate, one per interleaved round
    min_seconds: float = 1.0  # timed seconds per launch, at least
    budget_s: float = 10.0  # timed seconds per launch, at most
    timeout_s: float = DEFAULT_TIMEOUT_S  # one launch (prepare, tune, check, time), at most
    retries: int = 2  # launches again of a launch that ran on a busy machine
    seed: int | None = None  # the rounds' order (None: random)
    kernel_steps: int = 0  # profiled steps of one launch per candidate after its timed rounds (0: no kernel rows)

    def __post_init__(self) -> None:
        if (self.launches < 1 or self.min_seconds < 0 or self.budget_s <= 0 or self.retries < 0
                or self.kernel_steps < 0):
            raise InputError("launches must be at least 1, --min-seconds not negative, --budget positive, "
                             "and retries and profiled steps not negative")


EACH_RUNTIME = "each-runtime"  # --candidates: the predicted best of each runtime and precision


def select_candidates(plan: Plan, selection: list[str]) -> list[Candidate]:
    """``all``, ``top-K`` (by predicted objective), ``each-runtime`` (the predicted best of each runtime and
    precision: what corrects the kernel model's predictions of the others, :mod:`modak.predict.measured`), or
    candidate names / runtime names."""
    ranked = [r.candidate for r in plan.ranked]
    if selection in ([], ["all"]):
        return ranked
    if selection == [EACH_RUNTIME]:
        best: dict[tuple, Candidate] = {}
        for candidate in ranked:
            best.setdefault((candidate.runtime, candidate.device, candidate.precision), candidate)
        return list(best.values())
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
    """Where the launcher finds ``candidate``'s deployment, model (an int8 candidate's quantized model) and work
    folder (the image bakes the same variables with its own paths); ``plan_file`` gets the deployment. The user's
    own module, for a PyTorch runtime, is linked beside the graph in ``workdir/model``, as the image has it."""
    write_atomic(plan_file, json.dumps({"deployment": plan.deployment(candidate).to_dict()}, sort_keys=True))
    model = plan.model_file(candidate)
    if plan.user_files() and plan.recipe(candidate).model_format == "torch":
        folder = workdir / "model"
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        graph = (model, *(model.parent / name for name in plan.source.data_files)) if model else ()
        for path in (*graph, *plan.user_files()):
            (folder / path.name).symlink_to(path)
        model = folder / MODEL_FILE  # absent for a model no exporter could export: the runtime builds the module
    return {PLAN_VARIABLE: str(plan_file), MODEL_VARIABLE: str(model), WORKDIR_VARIABLE: str(workdir)}


def launch_command(*command: str) -> list[str]:
    """``command`` started through the image's launcher with this Python."""
    return [sys.executable, "-m", "modak.image.launch", "--", *command]


@dataclass
class Session:
    """One measurement session: rounds of launches of ``candidates``, each candidate's launches kept in round order.

    ``run_round(alive)`` launches every candidate of ``alive`` once (random order), re-launches contended ones,
    stores the updated rows and returns them; a candidate whose launch fails leaves the session."""

    plan: Plan
    store: PerfStore
    settings: BenchSettings = BenchSettings()
    dispatcher: Dispatcher = field(default_factory=LocalDispatcher)
    workdir: Path = BENCH_WORKDIR
    on_launch: Callable[[Candidate, dict], None] | None = None
    on_profile: Callable[[Candidate, dict], None] | None = None
    id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    launches: dict[str, list[dict]] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)
    rounds: int = 0

    def __post_init__(self) -> None:
        self._random = random.Random(self.settings.seed)
        self._scratch = Path(tempfile.mkdtemp(prefix=f"modak-session-{self.id}-", dir=self.workdir.parent
                                              if self.workdir.parent.exists() else None))

    def close(self) -> None:
        shutil.rmtree(self._scratch, ignore_errors=True)

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def task(self, candidate: Candidate, profile: bool = False) -> LaunchTask:
        """The launch of ``candidate``: its deployment written to this session's folder; timed, or with
        ``profile`` its profiled launch (``settings.kernel_steps`` steps)."""
        folder = self._scratch / _slug(candidate.name)
        folder.mkdir(parents=True, exist_ok=True)
        env = launch_environment(self.plan, candidate, folder / "plan.json", self.workdir / candidate.runtime)
        options = (("--profile", str(self.settings.kernel_steps)) if profile else
                   ("--min-seconds", str(self.settings.min_seconds), "--budget", str(self.settings.budget_s)))
        command = launch_command(sys.executable, "-m", "modak.runtime", "measure", *options)
        best = self.store.canary_best(platform.node(), "core_rtt")  # this host's: only launches run here wait
        near = CANARIES["core_rtt"][0] * best if best and isinstance(self.dispatcher, LocalDispatcher) else None
        return LaunchTask(candidate.name, env, tuple(command), self.settings.timeout_s, folder, near)

    def run_round(self, alive: Sequence[Candidate]) -> dict[str, Measurement]:
        """Launch each candidate of ``alive`` once, in random order; the updated rows by candidate name (also
        stored)."""
        order = [c for c in alive if c.name not in self.failed]
        self._random.shuffle(order)
        results = dict(zip((c.name for c in order), self.dispatcher.run([self.task(c) for c in order])))
        busy = {name: self._verdict(result) for name, result in results.items()}
        for _ in range(self.settings.retries):
            again = [c for c in order if busy[c.name]]
            if not again:
                break
            for candidate, result in zip(again, self.dispatcher.run([self.task(c) for c in again])):
                result["retried_after"] = busy[candidate.name]
                _carry_near_wait(result, results[candidate.name])
                results[candidate.name], busy[candidate.name] = result, self._verdict(result)
        rows: dict[str, Measurement] = {}
        for candidate in order:
            result = results[candidate.name]
            result["busy"] = busy[candidate.name]
            if result.get("status") == "ok":
                self._remember_canary(result)
                self.launches.setdefault(candidate.name, []).append(result)
            else:  # leaves the session; launches measured before are kept in its row
                self.failed[candidate.name] = result.get("error") or result.get("status", "error")
            if self.on_launch:
                self.on_launch(candidate, result)
            rows[candidate.name] = self.row(candidate, result)
        self.store.add(rows.values())
        self.rounds += 1
        return rows

    def profile(self, candidates: Sequence[Candidate], rows: dict[str, Measurement],
                statuses: Sequence[str] = ("ok",)) -> dict[str, dict]:
        """A profiled launch of each of ``candidates`` whose row in ``rows`` has one of ``statuses``, once their
        timed rounds are over (launched again while :func:`inflated`, the least inflated kept); its kernel rows and
        reconciliation stored (:func:`store_profile`). What each gave, by candidate name."""
        todo = [c for c in candidates if c.name in rows and rows[c.name].status in statuses]
        best: dict[str, dict] = {}
        again = todo
        for _ in range(PROFILE_TRIES):
            for candidate, report in zip(again, self.dispatcher.run([self.task(c, profile=True) for c in again])):
                kept = best.get(candidate.name)
                if kept is None or (report.get("status") == "ok" and _profiled_step(report) < _profiled_step(kept)):
                    best[candidate.name] = report
            again = [c for c in again if inflated(best[c.name], rows[c.name].step_s)]
            if not again:
                break
        results: dict[str, dict] = {}
        for candidate in todo:
            results[candidate.name] = store_profile(self.store, self.plan, candidate, rows[candidate.name],
                                                    best[candidate.name])
            if self.on_profile:
                self.on_profile(candidate, results[candidate.name])
        return results

    def row(self, candidate: Candidate, last: dict) -> Measurement:
        """``candidate``'s row from its launches so far (the failing ``last`` result if it has none)."""
        launches = self.launches.get(candidate.name)
        if not launches:
            return measurement_row(self.plan, candidate, last)
        return aggregate_row(self.plan, candidate, launches, self.id)

    def _verdict(self, result: dict) -> list[str]:
        """Why ``result``'s launch was not alone on its CPUs (empty: it was)."""
        report = result.get("contention") or {}
        best = {canary: self.store.canary_best(platform.node(), canary) for canary in CANARIES}
        return contention_reasons(report) + slowed_canaries(report, best)

    def _remember_canary(self, result: dict) -> None:
        report = result.get("contention") or {}
        for canary in CANARIES:
            if report.get(f"{canary}_s") and not result["busy"]:
                self.store.record_canary(platform.node(), report[f"{canary}_s"], canary)


def _carry_near_wait(result: dict, replaced: dict) -> None:
    """Add to ``result``'s ``near_wait_s`` (the seconds its launch waited for its CPUs to come near) what the launch
    it replaced waited, so that a stored launch says what all its tries waited."""
    mine, before = result.get("contention"), replaced.get("contention")
    if isinstance(mine, dict) and isinstance(before, dict) and before.get("near_wait_s"):
        mine["near_wait_s"] = round(float(mine.get("near_wait_s") or 0.0) + float(before["near_wait_s"]), 1)


def slowed_canaries(report: Mapping[str, Any], best: Mapping[str, float | None]) -> list[str]:
    """Why a launch's ``report`` says it ran slowed: each canary of :data:`CANARIES` past its limit times its
    ``best`` on this host (empty: none)."""
    reasons = []
    for canary, (limit, why) in CANARIES.items():
        seconds, fastest = report.get(f"{canary}_s"), best.get(canary)
        if seconds and fastest and seconds > limit * fastest:
            reasons.append(why.format(seconds / fastest))
    return reasons


def inflated(report: dict, step_s: float | None) -> bool:
    """Whether ``report``, a profiled launch that went well, ran a step past :data:`PROFILE_INFLATION` times
    ``step_s``, its candidate's timed median, plus :data:`PROFILE_ALLOWANCE_S`."""
    if report.get("status") != "ok" or not step_s:
        return False
    return _profiled_step(report) > PROFILE_INFLATION * step_s + PROFILE_ALLOWANCE_S


def _profiled_step(report: dict) -> float:
    try:
        return float(report["profile"]["step_seconds"])
    except (KeyError, TypeError, ValueError):
        return math.inf


def _slug(name: str) -> str:
    digest = hashlib.sha256(name.encode()).hexdigest()[:8]
    return "".join(ch if ch.isalnum() else "-" for ch in name)[:60] + f"-{digest}"


def bench(plan: Plan, candidates: Iterable[Candidate], store: PerfStore, settings: BenchSettings = BenchSettings(),
          workdir: Path = BENCH_WORKDIR, dispatcher: Dispatcher | None = None,
          on_round: Callable[[int, list[Measurement]], None] | None = None,
          on_launch: Callable[[Candidate, dict], None] | None = None,
          on_profile: Callable[[Candidate, dict], None] | None = None) -> list[Measurement]:
    """Measure ``candidates`` of ``plan`` in ``settings.launches`` interleaved rounds, storing rows after every
    round, then (``settings.kernel_steps``) profile each candidate measured ok once; the final rows (one per
    candidate)."""
    candidates = list(candidates)
    with Session(plan, store, settings, dispatcher or LocalDispatcher(), workdir, on_launch, on_profile) as session:
        rows: dict[str, Measurement] = {}
        for index in range(settings.launches):
            alive = [c for c in candidates if c.name not in session.failed]
            if not alive:
                break
            measured = session.run_round(alive)
            rows.update(measured)
            if on_round:
                on_round(index, list(measured.values()))
        if settings.kernel_steps:
            session.profile(candidates, rows)
        return [rows[c.name] for c in candidates if c.name in rows]


def store_profile(store: PerfStore, plan: Plan, candidate: Candidate, row: Measurement, report: dict) -> dict:
    """Store the kernel rows and the reconciliation of ``report``, the profiled launch of ``candidate`` whose
    unprofiled row is ``row``; what it gave: ``status`` ok with the counts and times stored, else error and why
    (the timed row stays as it was)."""
    if report.get("status") != "ok":
        return {"status": "error", "error": report.get("error") or f"the profiled launch reported {report}"[:300]}
    try:
        profile = Profile.from_json(json.dumps(report["profile"]))
        kernels, reconciliation = kernel_rows(profile, row, candidate_analysis(plan, candidate))
    except (KeyError, TypeError, ValueError, InputError) as exc:  # InputError: an int8 model the analysis refuses
        return {"status": "error", "error": f"its profile cannot be stored: {type(exc).__name__}: {exc}"[:2000]}
    if not kernels:  # the runtime ran the graph as no kernel (folded it to constants): nothing to learn from
        return {"status": "error", "error": "its profile reports no kernel"}
    store.add_kernels(kernels, [reconciliation])
    return {"status": "ok", "kernels": len(kernels), "kernel_s": reconciliation.kernel_s,
            "unmapped_s": reconciliation.unmapped_s, "profiled_step_s": reconciliation.profiled_step_s,
            "step_s": reconciliation.step_s}


def candidate_analysis(plan: Plan, candidate: Candidate) -> WorkloadProfile:
    """The analysis of the ONNX graph ``candidate`` runs: the plan's, or an int8 candidate's quantized model's."""
    model = plan.model_file(candidate)
    if model is None or model == plan.source.onnx_path:
        return plan.workload
    workload = plan.workload
    return analyze(model, workload.batch_size, plan.source.input_shapes, workload.task, name=workload.model_name)


def aggregate_row(plan: Plan, candidate: Candidate, launches: list[dict], session: str) -> Measurement:
    """One row from a candidate's launches: the median over launches, its interval and spread, and what else ran
    during each launch; ``contended`` if any launch stayed contended after its retries."""
    medians = [float(r["step_median_s"]) for r in launches]
    center, low, high = median_interval(medians)
    busy = [r for r in launches if r.get("busy")]
    merged = {
        "status": "contended" if busy else "ok", "threads": launches[-1].get("threads"),
        "step_median_s": center, "step_p10_s": min(r["step_p10_s"] for r in launches),  # the launches' envelope
        "step_p90_s": max(r["step_p90_s"] for r in launches),
        "repeats": sum(int(r.get("repeats", 0)) for r in launches),
        "throughput_per_s": plan.workload.batch_size / center,
        "compile_s": statistics.median(r.get("compile_s") or 0.0 for r in launches),
        "peak_rss_mb": max(r.get("peak_rss_mb") or 0.0 for r in launches),
        "max_abs_error": max(r.get("max_abs_error") or 0.0 for r in launches),
        "error": ("; ".join(sorted({reason for r in busy for reason in r["busy"]})) if busy else None),
        "versions": launches[-1].get("versions", {})}
    contention = [{**(r.get("contention") or {}), "busy": r.get("busy") or [], "retried_after": r.get("retried_after")}
                  for r in launches]
    row = measurement_row(plan, candidate, merged)
    return Measurement(**{**row.__dict__, "protocol": PROTOCOL, "launches": len(launches),
                          "launch_medians": as_json(medians), "session": session, "ci_low_s": low, "ci_high_s": high,
                          "spread": spread(medians), "contention": as_json(contention)})


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
        model=workload.model_name, task=job.task.value, batch_size=workload.batch_size,
        input_shapes=as_json({k: list(v) for k, v in workload.input_shapes.items()}),
        **workload_columns(workload),
        runtime=candidate.runtime, device=candidate.device, precision=candidate.precision.value,
        params=as_json(dict(candidate.params)), threads=result.get("threads") or candidate.threads,
        status=result.get("status", "error"), step_median_s=result.get("step_median_s"),
        step_p10_s=result.get("step_p10_s"), step_p90_s=result.get("step_p90_s"), repeats=result.get("repeats", 0),
        throughput_per_s=result.get("throughput_per_s"), compile_s=result.get("compile_s"),
        peak_rss_mb=result.get("peak_rss_mb"), max_abs_error=result.get("max_abs_error"),
        error=result.get("error"), versions=as_json({**result.get("versions", {}), "host": platform.node()}),
        measured_at=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"))
