"""``modak pack``: which jobs can share a node (its CPU cores) or a GPU (MPS, MIG slices, time-slicing), each
job's predicted slowdown against running alone on the target, the aggregate throughput, and the job scripts that
apply the sharing.

The sharing model. Every job is first planned alone on the target (its *alone* step). A way of sharing (an
*arrangement*) gives each job a share; the job is planned again on a target describing that share (so that its
runtime, threads and wait policy fit it), and the sharing model adds what the jobs still take from each other:

* CPU, ``cores``: disjoint core sets (job i gets k_i of the C cores, contiguous from core 0 in job order). Job i's
  step is its plan's on a target of k_i cores (``scheduler.cores_per_job``: compute peaks scale with the cores),
  times the memory-bandwidth term below. The cores' split is searched (every split for C <= 16, else multiples of
  C/16).
* CPU, ``time-slicing``: every job on all C cores (the target's ``allocation: shared``, so the thread pools wait
  passively). Job i keeps ``d_i = p_i T_i + (1 - p_i)`` cores busy (T_i threads; p_i the parallel share of its
  step: the roofline's compute and memory terms, against its serial per-operator overhead); a co-runner keeps
  one. With demand D = sum d / C above 1, the operating system's fair share slows every job by
  ``D (1 + OVERSUBSCRIPTION_COST (D - 1))`` (time slices, context switches and cache refills), and a job whose
  pools spin (``wait_policy=spin``) wastes its slices waiting: ``SPIN_PENALTY``. The parallel share of a step
  on T >= 2 threads ends at a barrier (an intra-op pool's regions; OpenVINO's throughput streams, whose step is a
  wave of requests all waited for), so it goes at the pace of the slowest thread, not at the average share: the
  others' load beyond the cores the job leaves free, E = sum_{j != i} d_j + T_i - C, sits on its cores, and the
  most crowded of them runs its thread at 1 / K, K = 1 + max(E / T_i, min(E, 1)) (one busy co-runner on one of
  two cores: K = 2, where the average share gives D = 1.5). That share slows by max(K, D) instead of D.
* Memory bandwidth (``cores`` and ``time-slicing``): job i draws b_i = B_i / step_i GB/s, with B_i the bytes of its
  memory-bound operators (the roofline's memory term times the bandwidth it assumed). Beyond the node's bandwidth
  (sum b / bandwidth = P > 1), the memory-bound share m_i of each step stretches: ``1 + m_i (P - 1)``.
* GPU, ``mps``: kernels of all jobs run at once. Job i's kernels keep the GPU busy u_i of its step (the roofline's
  compute and memory terms against launch overhead); with U = sum u, each job slows by ``max(1, U)``, or by the
  bandwidth term if that is larger. Its clients get ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` = 100 u_i / U (its
  share of the busy time: at least its own utilization while U <= 1).
* GPU, ``mig``: each job on a slice of its own (``recipes/hardware/mig.yaml``: compute and memory slices per
  profile); its step is its plan's on a GPU of the slice's share of SMs, bandwidth and memory. Slices isolate: no
  other term. Every set of profiles that fits the GPU is searched.
* GPU, ``time-slicing``: without MPS the GPU runs one process's context at a time, in time slices, and does not
  fill the gaps of the one it runs (its launch overhead) with the others' kernels (what MPS adds): each of n jobs
  slows by n, so time-slicing gains no throughput (published: 1.05-1.11 n, ``benchmarks/published/share_published.py``).

Each arrangement is refused when the jobs' memory (parameters and every operator's output, the plan's upper
bound; training: parameters x 4) exceeds :data:`MEMORY_SHARE` of the capacity they share (the node's memory, the
GPU's, or a slice's), or a job's slowdown exceeds its ``constraints.max_slowdown`` or its step its
``constraints.max_latency_ms``. The aggregate throughput gain is the sum over jobs of alone step / shared step
(each job's share of its alone throughput; running them one after another gives 1). The arrangement with the
largest gain is chosen if it raises throughput by at least :data:`MIN_GAIN`; otherwise the jobs run apart.
With more than two jobs, groups are formed first-fit: a job joins the first group whose best arrangement stays
within every limit with it and gains from it.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path
from typing import Any

from modak.documents import document, duration, rounded
from modak.errors import InputError
from modak.plan import MEMORY_SHARE, Plan, step_memory_gb
from modak.predict.base import Predictor
from modak.render.ir import Sharing, cpuset
from modak.spec.loader import LoadedJob, read_catalog
from modak.spec.models import GpuPeaks, Target, Task

OVERSUBSCRIPTION_COST = 0.1  # extra time per unit of CPU oversubscription (see the module docstring)
SPIN_PENALTY = 1.25  # a spinning pool on time-sliced cores
MIN_GAIN = 1.05  # the least aggregate throughput gain (x) worth sharing for: less is within the model's error
_TRAINING_STATE_FACTOR = 4  # bytes a training step holds per parameter byte (weights, gradients, optimizer state)
MODES = ("cores", "time-slicing", "mps", "mig")  # the ways of sharing, as --modes names them
_GRID = 16  # the core splits searched: every split up to this many cores, else multiples of cores / _GRID


# ----------------------------------------------------------------------------------------------------------------
# The sharing model


@dataclass(frozen=True)
class Load:
    """What the sharing model knows of one process on its share: a job's plan, or a busy co-runner."""

    name: str
    step_seconds: float
    cpu_demand: float  # cores it keeps busy on average (CPU jobs and co-runners)
    gpu_utilization: float  # share of its step the GPU runs its kernels (GPU jobs)
    memory_fraction: float  # share of its step bound by memory bandwidth
    bandwidth_gbs: float  # memory bandwidth it draws on average
    spins: bool = False  # its idle pool threads busy-wait (wait_policy=spin)
    threads: int = 1  # CPU threads it runs on
    synchronized: float = 0.0  # share of its step in regions across its threads that end at a barrier

    def straggler(self, others: float, cores: int) -> float:
        """K: the slowdown of this load's slowest thread beside ``others`` cores of load on ``cores`` cores (see
        the module docstring)."""
        excess = max(0.0, others + self.threads - cores)
        return 1.0 + max(excess / self.threads, min(excess, 1.0))


def co_runner(index: int = 0) -> Load:
    """A CPU-bound process with one busy thread (a co-runner of ``scheduler.co_runners``)."""
    return Load(f"co-runner {index + 1}", 0.0, 1.0, 0.0, 0.0, 0.0)


def load_of(plan: Plan, name: str | None = None) -> Load:
    """The load of ``plan``'s chosen candidate, from its prediction's roofline terms (see the module docstring)."""
    choice = plan.choice
    terms = dict(choice.prediction.terms)
    compute, memory, overhead = (max(0.0, terms.get(k, 0.0)) for k in ("compute_s", "memory_s", "overhead_s"))
    total = compute + memory + overhead
    parallel = (compute + memory) / total if total else 1.0
    step = choice.prediction.step_seconds
    gpu = choice.candidate.device == "gpu"
    threads = choice.candidate.threads or plan.ceilings.cores
    spins = choice.candidate.param("wait_policy") == "spin"
    demand = 0.0 if gpu else (float(threads) if spins else parallel * threads + (1.0 - parallel))
    assumed = terms.get("bandwidth_gbs", 0.0)
    bandwidth = min(memory * assumed / step, assumed) if step > 0 else 0.0
    return Load(name or plan.loaded.job.name, step, demand, parallel if gpu else 0.0,
                memory / total if total else 0.0, bandwidth, spins, threads,
                0.0 if gpu or threads < 2 else parallel)


def oversubscription(loads: Sequence[Load], cores: int) -> float:
    """D: the cores the loads keep busy over the cores they share."""
    return sum(load.cpu_demand for load in loads) / cores


def time_sliced_slowdowns(loads: Sequence[Load], cores: int) -> list[float]:
    """Each load's slowdown when all of them are time-sliced on ``cores`` cores (memory bandwidth aside)."""
    demand = max(1.0, oversubscription(loads, cores))
    contention = 1.0 + OVERSUBSCRIPTION_COST * (demand - 1.0)
    total = sum(load.cpu_demand for load in loads)
    slowdowns = []
    for load in loads:
        pace = max(demand, load.straggler(total - load.cpu_demand, cores))
        slowdowns.append((load.synchronized * pace + (1.0 - load.synchronized) * demand) * contention
                         * (SPIN_PENALTY if load.spins and demand > 1.0 else 1.0))
    return slowdowns


def bandwidth_slowdowns(loads: Sequence[Load], bandwidth_gbs: float, paces: Sequence[float] | None = None) -> list[float]:
    """Each load's slowdown from sharing ``bandwidth_gbs`` of memory bandwidth; ``paces``: the loads' slowdowns
    from other causes, which lower what they draw."""
    paces = paces or [1.0] * len(loads)
    drawn = sum(load.bandwidth_gbs / pace for load, pace in zip(loads, paces))
    pressure = drawn / bandwidth_gbs if bandwidth_gbs > 0 else 0.0
    return [1.0 + load.memory_fraction * max(0.0, pressure - 1.0) for load in loads]


def mps_slowdowns(loads: Sequence[Load], bandwidth_gbs: float) -> list[float]:
    """Each GPU load's slowdown under MPS: the summed SM utilization, or memory bandwidth where it binds."""
    busy = max(1.0, sum(load.gpu_utilization for load in loads))
    return [max(busy, memory) for memory in bandwidth_slowdowns(loads, bandwidth_gbs)]


def mps_percentages(loads: Sequence[Load]) -> list[int]:
    """``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` per load: its share of the summed utilization (at least its own)."""
    total = sum(load.gpu_utilization for load in loads)
    if total <= 0:
        return [100 // len(loads)] * len(loads)
    return [min(100, max(1, round(100 * load.gpu_utilization / total))) for load in loads]


def gpu_time_sliced_slowdowns(loads: Sequence[Load]) -> list[float]:
    """Each GPU load's slowdown when the processes take turns on the GPU in time slices (no MPS): a process's gaps
    are not filled by the others' kernels, so each of n processes that keep work queued gets 1/n of the time."""
    return [float(len(loads))] * len(loads)


def co_runner_slowdown(plan: Plan, co_runners: int) -> float:
    """The slowdown of ``plan``'s choice beside ``co_runners`` busy single-thread processes on its cores (the
    target's ``scheduler.co_runners``): :func:`time_sliced_slowdowns`, as ``modak pack`` predicts time-slicing."""
    if co_runners <= 0 or plan.choice.candidate.device == "gpu":
        return 1.0
    loads = [load_of(plan), *(co_runner(i) for i in range(co_runners))]
    return time_sliced_slowdowns(loads, plan.ceilings.cores)[0]


def memory_need_gb(plan: Plan) -> float:
    """The most memory the job's step may hold (GB): parameters and every operator's output (inference; an upper
    bound), plus weights' gradients and optimizer state when training."""
    workload = plan.workload
    if workload.task is Task.training:
        return (workload.parameter_bytes * _TRAINING_STATE_FACTOR + sum(op.output_bytes for op in workload.ops)) / 1e9
    return step_memory_gb(workload)


# ----------------------------------------------------------------------------------------------------------------
# MIG slices


@dataclass(frozen=True)
class MigProfile:
    name: str  # 3g.40gb
    compute: int  # compute slices of 7
    memory: int  # memory slices of 8
    memory_gb: float
    instances: int  # at most this many on one GPU
    sm_share: float  # the share of the whole GPU's SMs all 7 compute slices hold

    @property
    def compute_fraction(self) -> float:
        return self.compute / 7 * self.sm_share

    @property
    def memory_fraction(self) -> float:
        return self.memory / 8


@lru_cache(maxsize=None)
def mig_profiles(gpu: str) -> tuple[MigProfile, ...]:
    """The MIG profiles of GPU model ``gpu`` (a canonical name of the GPU catalog), smallest first; () if it has
    none (not MIG-capable, or not in ``recipes/hardware/mig.yaml``)."""
    table = read_catalog("hardware/mig.yaml")
    entry = table.get(gpu)
    if not entry:
        return ()
    return tuple(sorted((MigProfile(name, int(p["compute"]), int(p["memory"]), float(p["memory_gb"]),
                                    int(p["instances"]), float(entry["sm_share"]))
                         for name, p in entry["profiles"].items()), key=lambda p: (p.compute, p.memory)))


def slices_fit(profiles: Sequence[MigProfile]) -> bool:
    """Whether the slices fit one GPU: at most 7 compute and 8 memory slices, each profile within its instances."""
    counts: dict[str, int] = {}
    for profile in profiles:
        counts[profile.name] = counts.get(profile.name, 0) + 1
    return (sum(p.compute for p in profiles) <= 7 and sum(p.memory for p in profiles) <= 8
            and all(counts[p.name] <= p.instances for p in profiles))


# ----------------------------------------------------------------------------------------------------------------
# Jobs, arrangements, groups


@dataclass(frozen=True)
class PackJob:
    """One job to pack: its label (its name, numbered when names repeat), file, and plan alone on the target."""

    label: str
    file: Path
    loaded: LoadedJob
    alone: Plan

    @property
    def device(self) -> str:
        return self.alone.choice.candidate.device

    @property
    def max_slowdown(self) -> float | None:
        return self.loaded.job.constraints.max_slowdown

    @property
    def max_latency_ms(self) -> float | None:
        return self.loaded.job.constraints.max_latency_ms

    @property
    def alone_step(self) -> float:
        return self.alone.choice.prediction.step_seconds

    def to_dict(self) -> dict[str, Any]:
        choice = self.alone.choice
        return {"name": self.label, "file": str(self.file), "device": self.device,
                "candidate": choice.candidate.name, "threads": choice.candidate.threads,
                "batch_size": self.alone.workload.batch_size, "step_seconds": rounded(choice.prediction.step_seconds),
                "memory_gb": rounded(memory_need_gb(self.alone)), "max_slowdown": self.max_slowdown,
                "max_latency_ms": self.max_latency_ms}


@dataclass(frozen=True)
class Placement:
    """One job's share in an arrangement and its prediction there."""

    job: PackJob
    share: str  # in words: "cores 0-3", "all 8 cores, time-sliced", "MPS, 40% of the SMs", "MIG 3g.40gb"
    sharing: Sharing
    plan: Plan | None  # its plan on the share (None: no candidate can run there)
    step_seconds: float | None  # predicted step sharing (None: cannot run there)
    over: tuple[str, ...] = ()  # the job's limits the prediction exceeds

    @property
    def slowdown(self) -> float | None:
        return None if self.step_seconds is None else self.step_seconds / self.job.alone_step

    def to_dict(self) -> dict[str, Any]:
        sharing = self.sharing
        return {"job": self.job.label, "share": self.share,
                "candidate": self.plan.choice.candidate.name if self.plan else None,
                "threads": self.plan.choice.candidate.threads if self.plan else None,
                "step_seconds": None if self.step_seconds is None else rounded(self.step_seconds),
                "alone_step_seconds": rounded(self.job.alone_step),
                "slowdown": None if self.slowdown is None else rounded(self.slowdown),
                "max_slowdown": self.job.max_slowdown, "within_limits": not self.over, "over": list(self.over),
                "cpuset": sharing.cpuset, "mps_percentage": sharing.mps_percentage,
                "mig_profile": sharing.mig_profile, "mig_index": sharing.mig_profile and sharing.mig_index}


@dataclass(frozen=True)
class Arrangement:
    """One way for a group of jobs to share: every job's placement, the memory check and why it is refused."""

    mode: str  # cores, time-slicing, mps, mig
    device: str  # cpu or gpu
    placements: tuple[Placement, ...]
    memory_gb: float
    capacity_gb: float  # the memory they share (node, GPU); for MIG the slices' (each checked on its own)
    refused: tuple[str, ...]  # why it cannot be used; () when it can

    @property
    def feasible(self) -> bool:
        return not self.refused

    @property
    def gain(self) -> float:
        """Aggregate throughput over running the jobs one after another: the sum of alone step / shared step."""
        return sum(1.0 / p.slowdown for p in self.placements if p.slowdown)

    def describe(self) -> str:
        return f"{self.mode}: " + ", ".join(f"{p.job.label} on {p.share}" for p in self.placements)

    def to_dict(self) -> dict[str, Any]:
        return {"mode": self.mode, "device": self.device, "gain": rounded(self.gain), "feasible": self.feasible,
                "refused": list(self.refused), "memory_gb": rounded(self.memory_gb),
                "memory_capacity_gb": rounded(self.capacity_gb), "placements": [p.to_dict() for p in self.placements]}


@dataclass(frozen=True)
class Group:
    """Jobs that share a node or GPU (or one job alone) and why."""

    jobs: tuple[PackJob, ...]
    chosen: Arrangement | None  # None: the job runs alone, or sharing was refused
    reason: str
    options: tuple[Arrangement, ...] = ()  # every arrangement evaluated for the group's jobs

    @property
    def shared(self) -> bool:
        return self.chosen is not None

    def to_dict(self) -> dict[str, Any]:
        return {"jobs": [job.label for job in self.jobs], "shared": self.shared, "reason": self.reason,
                "arrangement": self.chosen.to_dict() if self.chosen else None,
                "options": [option.to_dict() for option in self.options]}


@dataclass(frozen=True)
class PackResult:
    target: str
    target_file: Path
    jobs: tuple[PackJob, ...]
    groups: tuple[Group, ...]
    notes: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return document({"target": self.target, "target_file": str(self.target_file),
                         "model": {"oversubscription_cost": OVERSUBSCRIPTION_COST, "spin_penalty": SPIN_PENALTY,
                                   "min_gain": MIN_GAIN, "memory_share": MEMORY_SHARE},
                         "jobs": [job.to_dict() for job in self.jobs],
                         "groups": [group.to_dict() for group in self.groups], "notes": list(self.notes)})

    def describe(self) -> list[str]:
        """The advice in lines: per group what shares and how, each job's slowdown, or why the jobs run apart."""
        lines = []
        for index, group in enumerate(self.groups, 1):
            names = ", ".join(job.label for job in group.jobs)
            if group.chosen is None:
                lines.append(f"group {index} ({names}): run apart: {group.reason}")
                continue
            best = group.chosen
            lines.append(f"group {index} ({names}): share by {best.mode}, aggregate throughput {best.gain:.2f}x "
                         f"running them one after another; memory {best.memory_gb:.3g} of {best.capacity_gb:.3g} GB")
            for p in best.placements:
                assert p.slowdown is not None and p.step_seconds is not None
                limit = f" (limit {p.job.max_slowdown:g}x)" if p.job.max_slowdown else ""
                lines.append(f"  {p.job.label}: {p.share}: {p.plan.choice.candidate.name if p.plan else '-'}; "
                             f"step {duration(p.step_seconds)} vs {duration(p.job.alone_step)} alone: "
                             f"slowdown {p.slowdown:.2f}x{limit}")
            lines.append(f"  {group.reason}")
        return lines + [f"note: {note}" for note in self.notes]


# ----------------------------------------------------------------------------------------------------------------
# Packing


class Planner:
    """Plans jobs on share targets, each (job, share) once (what :func:`evaluate` plans with)."""

    def __init__(self, predictor: Predictor, store: Path | None) -> None:
        self.predictor, self.store = predictor, store
        self._plans: dict[tuple[str, str], Plan | str] = {}

    def plan(self, job: PackJob, target: Target) -> Plan | str:
        """``job`` planned on ``target``; a string (why) when no candidate can run there."""
        from modak import api

        key = (job.label, target.model_dump_json())
        if key not in self._plans:
            try:
                self._plans[key] = api.plan_loaded(replace(job.loaded, target=target), self.predictor, self.store)
            except InputError as exc:
                self._plans[key] = exc.message
        return self._plans[key]


def share_target(target: Target, suffix: str, **scheduler: Any) -> Target:
    """``target`` with scheduler settings changed (``cores_per_job``, ``allocation``), named for the share."""
    settings = {"co_runners": 0, **scheduler}
    name = f"{target.name}-{suffix}"[:63].rstrip("._-")
    return target.model_copy(update={"name": name, "scheduler": target.scheduler.model_copy(update=settings)})


def mig_target(target: Target, plan: Plan, profile: MigProfile) -> Target:
    """``target`` with one GPU of ``profile``'s share of ``plan``'s GPU (peaks, bandwidth, memory)."""
    gpu = plan.ceilings.gpu
    assert gpu is not None and target.gpus is not None
    f = profile.compute_fraction
    peaks = {key: gpu.peak_gflops[p] / 1000 * f for p, key in
             ((p, f"{p.value}_tops" if p.value == "int8" else f"{p.value}_tflops") for p in gpu.peak_gflops)}
    gpus = target.gpus.model_copy(update={
        "count": 1, "memory_gb": profile.memory_gb,
        "peaks": GpuPeaks(**peaks, memory_bandwidth_gbs=gpu.bandwidth_gbs * profile.memory_fraction)})
    name = f"{target.name}-mig-{profile.name}"[:63].rstrip("._-")
    return target.model_copy(update={"name": name, "gpus": gpus})


def core_splits(cores: int, jobs: int) -> list[tuple[int, ...]]:
    """Ways to give ``jobs`` jobs disjoint cores using all ``cores`` (every split up to :data:`_GRID` cores, else
    multiples of cores / _GRID, the last job taking the rest)."""
    if jobs > cores:
        return []
    step = 1 if cores <= _GRID else cores // _GRID
    options = range(step, cores, step)
    splits = []
    for head in itertools.product(options, repeat=jobs - 1):
        rest = cores - sum(head)
        if rest >= 1:
            splits.append((*head, rest))
    return splits


def _limits(job: PackJob, step: float) -> tuple[str, ...]:
    """The job's limits a shared step of ``step`` seconds exceeds."""
    over = []
    slowdown = step / job.alone_step
    if job.max_slowdown is not None and slowdown > job.max_slowdown * (1 + 1e-9):
        over.append(f"slowdown {slowdown:.2f}x exceeds its constraints.max_slowdown ({job.max_slowdown:g}x)")
    if job.max_latency_ms is not None and step * 1e3 > job.max_latency_ms:
        over.append(f"step {duration(step)} exceeds its constraints.max_latency_ms ({job.max_latency_ms:g} ms)")
    return tuple(over)


def _arrangement(mode: str, device: str, placements: list[Placement], memory: float, capacity: float,
                 extra: list[str] | None = None) -> Arrangement:
    refused = list(extra or [])
    for p in placements:
        if p.step_seconds is None:
            refused.append(f"{p.job.label} cannot run on {p.share}")
        refused += [f"{p.job.label}: {why}" for why in p.over]
    if memory > MEMORY_SHARE * capacity:
        refused.append(f"memory: the jobs may hold {memory:.3g} GB, more than {MEMORY_SHARE:.0%} of the "
                       f"{capacity:.3g} GB they share")
    return Arrangement(mode, device, tuple(placements), memory, capacity, tuple(refused))


def _placement(job: PackJob, share: str, sharing: Sharing, plan: Plan | str, factor: float = 1.0) -> Placement:
    if isinstance(plan, str):
        return Placement(job, share, sharing, None, None, (plan,))
    step = plan.choice.prediction.step_seconds * factor
    return Placement(job, share, sharing, plan, step, _limits(job, step))


def cpu_arrangements(jobs: Sequence[PackJob], target: Target, planner: Planner) -> list[Arrangement]:
    """Disjoint core splits and time-slicing of CPU jobs on one node (or allocation) of ``target``."""
    first = jobs[0].alone
    cores, bandwidth = first.ceilings.cores, first.ceilings.cpu.bandwidth_gbs
    memory = sum(memory_need_gb(job.alone) for job in jobs)
    capacity = first.ceilings.cpu.memory_gb
    names = [job.label for job in jobs]
    partners = [tuple(n for n in names if n != job.label) for job in jobs]
    result = []
    for split in core_splits(cores, len(jobs)):
        starts = list(itertools.accumulate((0, *split)))
        plans = [planner.plan(job, share_target(target, f"{k}c", cores_per_job=k, allocation="exclusive"))
                 for job, k in zip(jobs, split)]
        ok = [p for p in plans if not isinstance(p, str)]
        factors = bandwidth_slowdowns([load_of(p) for p in ok], bandwidth) if len(ok) == len(plans) else [1.0] * len(plans)
        placements = []
        for job, k, start, plan, partner, factor in zip(jobs, split, starts, plans, partners, factors):
            cores_of = cpuset(range(start, start + k))
            placements.append(_placement(job, f"cores {cores_of}", Sharing("cores", "cpu", partner, cpuset=cores_of),
                                         plan, factor))
        result.append(_arrangement("cores", "cpu", placements, memory, capacity))
    plans = [planner.plan(job, share_target(target, "shared", allocation="shared")) for job in jobs]
    if all(not isinstance(p, str) for p in plans):
        loads = [load_of(p) for p in plans]  # type: ignore[arg-type]
        sliced = time_sliced_slowdowns(loads, cores)
        factors = [s * b for s, b in zip(sliced, bandwidth_slowdowns(loads, bandwidth, sliced))]
    else:
        factors = [1.0] * len(plans)
    placements = [_placement(job, f"all {cores} cores, time-sliced", Sharing("time-slicing", "cpu", partner), plan, f)
                  for job, plan, partner, f in zip(jobs, plans, partners, factors)]
    result.append(_arrangement("time-slicing", "cpu", placements, memory, capacity))
    return result


def gpu_arrangements(jobs: Sequence[PackJob], target: Target, planner: Planner) -> list[Arrangement]:
    """MPS, MIG slices and time-slicing of GPU jobs on one GPU of ``target``."""
    first = jobs[0].alone
    gpu = first.ceilings.gpu
    assert gpu is not None
    names = [job.label for job in jobs]
    partners = [tuple(n for n in names if n != job.label) for job in jobs]
    memory = sum(memory_need_gb(job.alone) for job in jobs)
    loads = [load_of(job.alone, job.label) for job in jobs]
    result = []
    percentages = mps_percentages(loads)
    placements = [_placement(job, f"MPS, {pct}% of the SMs", Sharing("mps", "gpu", partner, mps_percentage=pct),
                             job.alone, factor)
                  for job, partner, pct, factor in zip(jobs, partners, percentages,
                                                       mps_slowdowns(loads, gpu.bandwidth_gbs))]
    result.append(_arrangement("mps", "gpu", placements, memory, gpu.memory_gb))
    profiles = mig_profiles(gpu.name)
    best_mig: Arrangement | None = None
    for combo in itertools.product(profiles, repeat=len(jobs)):
        if not slices_fit(combo):
            continue
        seen: dict[str, int] = {}
        placements = []
        over: list[str] = []
        for job, partner, profile in zip(jobs, partners, combo):
            index = seen.get(profile.name, 0)
            seen[profile.name] = index + 1
            need = memory_need_gb(job.alone)
            if need > MEMORY_SHARE * profile.memory_gb:
                over.append(f"memory: {job.label} may hold {need:.3g} GB, more than {MEMORY_SHARE:.0%} of a "
                            f"{profile.name} slice")
            placements.append(_placement(job, f"MIG {profile.name}",
                                         Sharing("mig", "gpu", partner, mig_profile=profile.name, mig_index=index),
                                         planner.plan(job, mig_target(target, job.alone, profile))))
        arrangement = _arrangement("mig", "gpu", placements, memory, sum(p.memory_gb for p in combo), over)
        if best_mig is None or _better(arrangement, best_mig):
            best_mig = arrangement
    if best_mig is not None:
        result.append(best_mig)
    placements = [_placement(job, "the GPU, time-sliced", Sharing("time-slicing", "gpu", partner), job.alone, factor)
                  for job, partner, factor in zip(jobs, partners, gpu_time_sliced_slowdowns(loads))]
    result.append(_arrangement("time-slicing", "gpu", placements, memory, gpu.memory_gb))
    return result


def _better(a: Arrangement, b: Arrangement) -> bool:
    """Whether ``a`` beats ``b``: within limits first, then the larger gain."""
    return (a.feasible, a.gain) > (b.feasible, b.gain)


def evaluate(jobs: Sequence[PackJob], target: Target, planner: Planner,
             modes: Sequence[str] = MODES) -> tuple[Arrangement | None, list[Arrangement], str]:
    """The best arrangement of ``jobs`` sharing one node or GPU among ``modes`` (None: none within the limits gains
    :data:`MIN_GAIN`), every arrangement evaluated, and why."""
    devices = {job.device for job in jobs}
    if len(devices) > 1:
        return None, [], ("their plans run on different devices (" + ", ".join(f"{j.label}: {j.device}" for j in jobs)
                          + "): modak pack co-locates jobs of one device kind")
    options = [o for o in (gpu_arrangements if devices == {"gpu"} else cpu_arrangements)(jobs, target, planner)
               if o.mode in modes]
    if not options:
        return None, [], f"no way of sharing a {devices.pop()} among the modes allowed ({', '.join(modes)})"
    feasible = [o for o in options if o.feasible]
    if not feasible:
        why = "; ".join(f"{o.mode}{' ' + _shares(o) if o.mode in ('cores', 'mig') else ''}: {', '.join(o.refused)}"
                        for o in options)
        return None, options, f"no way of sharing is within the limits ({why})"
    best = max(feasible, key=lambda o: o.gain)
    if best.gain < MIN_GAIN:
        return None, options, (f"sharing would not raise throughput: the best, {best.describe()}, gives "
                               f"{best.gain:.2f}x running them one after another (less than {MIN_GAIN:g}x)")
    others = [o for o in feasible if o is not best]
    runner = max(others, key=lambda o: o.gain) if others else None
    return best, options, (f"{best.mode} gives the most throughput within every job's limits: {best.gain:.2f}x"
                           + (f" (next: {runner.mode} {runner.gain:.2f}x)" if runner else ""))


def _shares(arrangement: Arrangement) -> str:
    return "(" + ", ".join(p.share for p in arrangement.placements) + ")"


def pack(job_files: Sequence[str | Path], target_file: str | Path, predictor: Predictor,
         store: Path | None = None, modes: Sequence[str] = MODES) -> PackResult:
    """Plan each job alone on the target, then group the jobs first-fit into nodes or GPUs they can share by one
    of ``modes`` (the site's choice, e.g. only ``mig``)."""
    from modak import api

    if len(job_files) < 2:
        raise InputError("modak pack needs at least two jobs")
    unknown = [m for m in modes if m not in MODES]
    if unknown or not modes:
        raise InputError(f"--modes: unknown mode(s) {', '.join(unknown) or '(none given)'} (known: {', '.join(MODES)})")
    loaded_jobs = [api.load(path, target_file) for path in job_files]
    names = [loaded.job.name for loaded in loaded_jobs]
    labels = [name if names.count(name) == 1 else f"{name}-{names[:i + 1].count(name)}"
              for i, name in enumerate(names)]
    jobs = [PackJob(label, Path(path), loaded, api.plan_loaded(loaded, predictor, store))
            for label, path, loaded in zip(labels, job_files, loaded_jobs)]
    target = loaded_jobs[0].target
    planner = Planner(predictor, store)
    groups: list[tuple[list[PackJob], Arrangement | None, list[Arrangement], str]] = []
    refusals: dict[str, list[str]] = {}
    for job in jobs:
        for index, (members, best, _, _) in enumerate(groups):
            candidate, options, why = evaluate([*members, job], target, planner, modes)
            if candidate is not None and (best is None or candidate.gain > best.gain):
                groups[index] = ([*members, job], candidate, options, why)
                break
            refusals.setdefault(job.label, []).append(f"with {', '.join(m.label for m in members)}: {why}")
            for member in members:
                refusals.setdefault(member.label, []).append(f"with {job.label}: {why}")
        else:
            groups.append(([job], None, [], ""))
    result = []
    for members, best, options, why in groups:
        if best is None:
            reason = "; ".join(refusals.get(members[0].label, [])) or "no other job to share with"
            result.append(Group(tuple(members), None, reason, tuple(options)))
        else:
            result.append(Group(tuple(members), best, why, tuple(options)))
    notes = []
    if any(job.device == "gpu" for job in jobs):
        notes.append("GPU sharing is predicted, not measured here: MPS and time-slicing from the jobs' predicted "
                     "kernel utilization, MIG from the slice table (recipes/hardware/mig.yaml)")
    return PackResult(target.name, loaded_jobs[0].files.target_file, tuple(jobs), tuple(result), tuple(notes))


def render_pack(result: PackResult, out_dir: Path) -> list[Path]:
    """Render every job into ``out_dir/<job>/``: with its share's plan and sharing settings when its group shares,
    else its plan alone; and ``out_dir/pack.json``, the decision. The folders written."""
    import json

    from modak import api
    from modak.paths import write_atomic

    written = []
    for group in result.groups:
        if group.chosen is None:
            for job in group.jobs:
                api.render_plan(job.alone, out_dir / job.label)
                written.append(out_dir / job.label)
            continue
        for placement in group.chosen.placements:
            assert placement.plan is not None
            api.render_plan(placement.plan, out_dir / placement.job.label, placement.sharing)
            written.append(out_dir / placement.job.label)
    write_atomic(out_dir / "pack.json", json.dumps(result.to_dict(), indent=2, sort_keys=True) + "\n")
    return written


__all__ = ["Arrangement", "Group", "Load", "PackJob", "PackResult", "Placement", "Planner", "bandwidth_slowdowns",
           "co_runner_slowdown", "core_splits", "evaluate", "gpu_time_sliced_slowdowns", "load_of", "memory_need_gb",
           "mig_profiles", "mps_percentages", "mps_slowdowns", "pack", "render_pack", "slices_fit",
           "time_sliced_slowdowns"]
