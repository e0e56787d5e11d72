"""The sharing model: what processes sharing a node's cores and memory bandwidth, or a GPU, take from each other
(``modak pack`` arranges jobs with it; ``modak whatif`` applies it to a target's busy co-runners).

Each process is a :class:`Load`, made from a plan's chosen candidate and its prediction's roofline terms:

* CPU, time-sliced (all C cores shared): job i keeps ``d_i = p_i T_i + (1 - p_i)`` cores busy (T_i threads; p_i
  the parallel share of its step: the roofline's compute and memory terms, against its serial per-operator
  overhead); a co-runner keeps one. With demand D = sum d / C above 1, the operating system's fair share slows
  every job by ``D (1 + OVERSUBSCRIPTION_COST (D - 1))`` (time slices, context switches and cache refills), and a
  job whose pools spin (``wait_policy=spin``) wastes its slices waiting: ``SPIN_PENALTY``. The parallel share of a
  step on T >= 2 threads ends at a barrier (an intra-op pool's regions; OpenVINO's throughput streams, whose step
  is a wave of requests all waited for), so it goes at the pace of the slowest thread, not at the average share:
  the others' load beyond the cores the job leaves free, E = sum_{j != i} d_j + T_i - C, sits on its cores, and
  the most crowded of them runs its thread at 1 / K, K = 1 + max(E / T_i, min(E, 1)) (one busy co-runner on one
  of two cores: K = 2, where the average share gives D = 1.5). That share slows by max(K, D) instead of D.
* Memory bandwidth (disjoint cores and time-slicing): job i draws b_i = B_i / step_i GB/s, with B_i the bytes of
  its memory-bound operators (the roofline's memory term times the bandwidth it assumed). Beyond the node's
  bandwidth (sum b / bandwidth = P > 1), the memory-bound share m_i of each step stretches: ``1 + m_i (P - 1)``.
* GPU, MPS: kernels of all jobs run at once. Job i's kernels keep the GPU busy u_i of its step (the roofline's
  compute and memory terms against launch overhead); with U = sum u, each job slows by ``max(1, U)``, or by the
  bandwidth term if that is larger. Its clients get ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` = 100 u_i / U (its
  share of the busy time: at least its own utilization while U <= 1).
* GPU, time-sliced: without MPS the GPU runs one process's context at a time, in time slices, and does not fill
  the gaps of the one it runs (its launch overhead) with the others' kernels (what MPS adds): each of n jobs
  slows by n, so time-slicing gains no throughput (published: 1.05-1.11 n, ``benchmarks/published/share_published.py``).

A job's memory (:func:`memory_need_gb`) is its parameters and every operator's output, the plan's upper bound;
training: parameters x :data:`modak.plan.TRAINING_STATE_FACTOR`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from modak.plan import TRAINING_STATE_FACTOR, Plan, step_memory_gb
from modak.spec.models import Task

OVERSUBSCRIPTION_COST = 0.1  # extra time per unit of CPU oversubscription (see the module docstring)
SPIN_PENALTY = 1.25  # a spinning pool on time-sliced cores


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


def bandwidth_slowdowns(loads: Sequence[Load], bandwidth_gbs: float,
                        paces: Sequence[float] | None = None) -> list[float]:
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
        return (workload.parameter_bytes * TRAINING_STATE_FACTOR + sum(op.output_bytes for op in workload.ops)) / 1e9
    return step_memory_gb(workload)
