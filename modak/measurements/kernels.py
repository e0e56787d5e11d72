"""Kernel rows: the operator-level model's labels (#40), one per kernel of a profiled launch, and the
reconciliation of each profiled launch with its candidate's unprofiled step time.

A profiled launch runs beside the timed launches of a candidate, never mixed with them (profiling inflates
times); its :class:`modak.image.kernels.Profile` becomes one :class:`KernelRow` per kernel and one
:class:`Reconciliation`. Both carry the machine, runtime, threads and precision they were measured at.
"""

from __future__ import annotations

from dataclasses import dataclass

from modak.image.kernels import Kernel


@dataclass(frozen=True)
class KernelRow:
    """The time one step of a candidate spent in one kernel, on one machine."""

    machine: str  # the perf store's machine name (as Measurement.machine)
    runtime: str
    device: str  # "cpu" or "gpu"
    threads: int
    precision: str
    params: str  # JSON: the candidate's parameters (as Measurement.params)
    model: str  # the workload it was profiled in (a kernel's time does not depend on it; splits do)
    batch_size: int
    kernel: Kernel
    seconds: float  # per step, summed over its calls
    calls: int
    source: str  # what reported it (Profile.source)
    session: str  # the bench session (as Measurement.session)
    measured_at: str


@dataclass(frozen=True)
class Reconciliation:
    """One profiled launch against its candidate's unprofiled step: what the kernels add up to, what the
    runtime reported outside any kernel, and the step time profiling did not see."""

    machine: str
    runtime: str
    device: str
    threads: int
    precision: str
    params: str
    model: str
    batch_size: int
    step_s: float  # the candidate's unprofiled median step (its Measurement)
    profiled_step_s: float  # the profiled launch's step wall time
    kernel_s: float  # the sum over its kernel rows
    unmapped_s: float  # Profile.unmapped_seconds
    kernels: int  # how many kernel rows
    source: str
    session: str
    measured_at: str
