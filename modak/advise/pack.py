"""``modak pack``: which jobs can share a node (its CPU cores) or a GPU (MPS, MIG slices, time-slicing), each
job's predicted slowdown against running alone on the target, the aggregate throughput, and the shares their job
scripts apply (:class:`modak.render.sharing.Sharing`).

Every job is first planned alone on the target (its *alone* step). A way of sharing (an *arrangement*) gives each
job a share; the job is planned again on a target describing that share (so that its runtime, threads and wait
policy fit it), and the sharing model (:mod:`modak.advise.contention`) adds what the jobs still take from each
other:

* CPU, ``cores``: disjoint core sets (job i gets k_i of the C cores, contiguous from core 0 in job order). Job i's
  step is its plan's on a target of k_i cores (``scheduler.cores_per_job``: compute peaks scale with the cores),
  times the memory-bandwidth term. The cores' split is searched (every split for C <= 16, else multiples of
  C/16).
* CPU, ``time-slicing``: every job on all C cores (the target's ``allocation: shared``, so the thread pools wait
  passively), slowed by the time-sliced and memory-bandwidth terms.
* GPU, ``mps`` and ``time-slicing``: the jobs' plans alone, slowed by the MPS or time-sliced terms.
* GPU, ``mig``: each job on a slice of its own (``recipes/hardware/mig.yaml``: compute and memory slices per
  profile); its step is its plan's on a GPU of the slice's share of SMs, bandwidth and memory. Slices isolate: no
  other term. Every set of profiles that fits the GPU is searched.

Each arrangement is refused when the jobs' memory (:func:`modak.advise.contention.memory_need_gb`) exceeds
:data:`MEMORY_SHARE` of the capacity they share (the node's memory, the GPU's, or a slice's), or a job's slowdown
exceeds its ``constraints.max_slowdown`` or its step its ``constraints.max_latency_ms``. The aggregate throughput
gain is the sum over jobs of alone step / shared step (each job's share of its alone throughput; running them one
after another gives 1). The arrangement with the largest gain is chosen if it raises throughput by at least
:data:`MIN_GAIN`; otherwise the jobs run apart. With more than two jobs, groups are formed first-fit: a job joins
the first group whose best arrangement stays within every limit with it and gains from it.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from functools import cache
from pathlib import Path
from typing import Any

import msgspec

from modak.advise.contention import (
    OVERSUBSCRIPTION_COST,
    SPIN_PENALTY,
    bandwidth_slowdowns,
    gpu_time_sliced_slowdowns,
    load_of,
    memory_need_gb,
    mps_percentages,
    mps_slowdowns,
    time_sliced_slowdowns,
)
from modak.documents import SCHEMA_VERSION, duration, encoded, rounded
from modak.documents import pack as doc
from modak.errors import InputError
from modak.plan import MEMORY_SHARE, Plan
from modak.render.sharing import SHARING_MODES, Sharing, cpuset
from modak.spec.loader import LoadedJob, read_catalog
from modak.spec.target import GpuPeaks, Target

MIN_GAIN = 1.05  # the least aggregate throughput gain (x) worth sharing for: less is within the model's error
_GRID = 16  # the core splits searched: every split up to this many cores, else multiples of cores / _GRID


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


@cache
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

    def record(self) -> doc.JobAlone:
        """A row of the document's ``jobs``."""
        choice = self.alone.choice
        return doc.JobAlone(name=self.label, file=str(self.file), device=self.device,  # type: ignore[arg-type]
                            candidate=choice.candidate.name, threads=choice.candidate.threads,
                            batch_size=self.alone.workload.batch_size,
                            step_seconds=rounded(choice.prediction.step_seconds),
                            memory_gb=rounded(memory_need_gb(self.alone)), max_slowdown=self.max_slowdown,
                            max_latency_ms=self.max_latency_ms)


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

    def record(self) -> doc.Placement:
        """A row of an arrangement's ``placements``."""
        sharing = self.sharing
        return doc.Placement(job=self.job.label, share=self.share,
                             candidate=self.plan.choice.candidate.name if self.plan else None,
                             threads=self.plan.choice.candidate.threads if self.plan else None,
                             step_seconds=None if self.step_seconds is None else rounded(self.step_seconds),
                             alone_step_seconds=rounded(self.job.alone_step),
                             slowdown=None if self.slowdown is None else rounded(self.slowdown),
                             max_slowdown=self.job.max_slowdown, within_limits=not self.over, over=list(self.over),
                             cpuset=sharing.cpuset, mps_percentage=sharing.mps_percentage,
                             mig_profile=sharing.mig_profile,
                             mig_index=sharing.mig_index if sharing.mig_profile else None)


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

    def record(self) -> doc.Arrangement:
        """One of a group's arrangements."""
        return doc.Arrangement(mode=self.mode, device=self.device,  # type: ignore[arg-type]
                               gain=rounded(self.gain), feasible=self.feasible, refused=list(self.refused),
                               memory_gb=rounded(self.memory_gb), memory_capacity_gb=rounded(self.capacity_gb),
                               placements=[p.record() for p in self.placements])


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

    def record(self) -> doc.Group:
        """A row of the document's ``groups``."""
        return doc.Group(jobs=[job.label for job in self.jobs], shared=self.shared, reason=self.reason,
                         arrangement=self.chosen.record() if self.chosen else None,
                         options=[option.record() for option in self.options])


@dataclass(frozen=True)
class PackResult:
    target: str
    target_file: Path
    jobs: tuple[PackJob, ...]
    groups: tuple[Group, ...]
    notes: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """``modak pack --json``: a :class:`~modak.documents.pack.PackDocument`."""
        return encoded(doc.PackDocument(
            schema_version=SCHEMA_VERSION, target=self.target, target_file=str(self.target_file),
            model=doc.SharingModel(oversubscription_cost=OVERSUBSCRIPTION_COST, spin_penalty=SPIN_PENALTY,
                                   min_gain=MIN_GAIN, memory_share=MEMORY_SHARE),
            jobs=[job.record() for job in self.jobs], groups=[group.record() for group in self.groups],
            notes=list(self.notes)))


# ----------------------------------------------------------------------------------------------------------------
# Packing


class Planner:
    """Plans jobs on share targets, each (job, share) once (what :func:`evaluate` plans with)."""

    def __init__(self, plan_on: Callable[[LoadedJob], Plan]) -> None:
        self.plan_on = plan_on  # plans a loaded job (:func:`modak.api.plan_loaded` with the predictor chosen)
        self._plans: dict[tuple[str, bytes], Plan | str] = {}

    def plan(self, job: PackJob, target: Target) -> Plan | str:
        """``job`` planned on ``target``; a string (why) when no candidate can run there."""
        key = (job.label, msgspec.json.encode(target))
        if key not in self._plans:
            try:
                self._plans[key] = self.plan_on(replace(job.loaded, target=target))
            except InputError as exc:
                self._plans[key] = exc.message
        return self._plans[key]


def share_target(target: Target, suffix: str, **scheduler: Any) -> Target:
    """``target`` with scheduler settings changed (``cores_per_job``, ``allocation``), named for the share."""
    settings = {"co_runners": 0, **scheduler}
    name = f"{target.name}-{suffix}"[:63].rstrip("._-")
    return msgspec.structs.replace(target, name=name, scheduler=msgspec.structs.replace(target.scheduler, **settings))


def mig_target(target: Target, plan: Plan, profile: MigProfile) -> Target:
    """``target`` with one GPU of ``profile``'s share of ``plan``'s GPU (peaks, bandwidth, memory)."""
    gpu = plan.ceilings.gpu
    assert gpu is not None and target.gpus is not None
    f = profile.compute_fraction
    peaks = {key: gpu.peak_gflops[p] / 1000 * f for p, key in
             ((p, f"{p.value}_tops" if p.value == "int8" else f"{p.value}_tflops") for p in gpu.peak_gflops)}
    gpus = msgspec.structs.replace(
        target.gpus, count=1, memory_gb=profile.memory_gb,
        peaks=GpuPeaks(**peaks, memory_bandwidth_gbs=gpu.bandwidth_gbs * profile.memory_fraction))
    name = f"{target.name}-mig-{profile.name}"[:63].rstrip("._-")
    return msgspec.structs.replace(target, name=name, gpus=gpus)


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
        factors = (bandwidth_slowdowns([load_of(p) for p in ok], bandwidth) if len(ok) == len(plans)
                   else [1.0] * len(plans))
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
             modes: Sequence[str] = tuple(SHARING_MODES)) -> tuple[Arrangement | None, list[Arrangement], str]:
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


def pack(jobs: Sequence[tuple[Path, LoadedJob]], plan_on: Callable[[LoadedJob], Plan],
         modes: Sequence[str] = tuple(SHARING_MODES)) -> PackResult:
    """Plan each job (its file and the job loaded on the target they would share) alone with ``plan_on``, then
    group the jobs first-fit into nodes or GPUs they can share by one of ``modes`` (the site's choice, e.g. only
    ``mig``). :func:`modak.api.pack` loads and plans them."""
    if len(jobs) < 2:
        raise InputError("modak pack needs at least two jobs")
    unknown = [m for m in modes if m not in SHARING_MODES]
    if unknown or not modes:
        raise InputError(f"--modes: unknown mode(s) {', '.join(unknown) or '(none given)'} "
                         f"(known: {', '.join(SHARING_MODES)})")
    loaded_jobs = [loaded for _, loaded in jobs]
    names = [loaded.job.name for loaded in loaded_jobs]
    labels = [name if names.count(name) == 1 else f"{name}-{names[:i + 1].count(name)}"
              for i, name in enumerate(names)]
    packed = [PackJob(label, Path(path), loaded, plan_on(loaded)) for label, (path, loaded) in zip(labels, jobs)]
    target = loaded_jobs[0].target
    planner = Planner(plan_on)
    groups: list[tuple[list[PackJob], Arrangement | None, list[Arrangement], str]] = []
    refusals: dict[str, list[str]] = {}
    for job in packed:
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
    if any(job.device == "gpu" for job in packed):
        notes.append("GPU sharing is predicted, not measured here: MPS and time-slicing from the jobs' predicted "
                     "kernel utilization, MIG from the slice table (recipes/hardware/mig.yaml)")
    return PackResult(target.name, loaded_jobs[0].files.target_file, tuple(packed), tuple(result), tuple(notes))


__all__ = ["Arrangement", "Group", "PackJob", "PackResult", "Placement", "Planner", "core_splits", "evaluate",
           "mig_profiles", "pack", "slices_fit"]
