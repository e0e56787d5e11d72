"""A profiled launch as the perf store's labels: one :class:`~modak.measurements.kernels.KernelRow` per kernel of
its :class:`~modak.image.kernels.Profile`, with FLOPs, bytes and op class from the host's analysis of the ONNX file
it ran, and its :class:`~modak.measurements.kernels.Reconciliation` with the candidate's unprofiled step time."""

from __future__ import annotations

import datetime as dt
import math
from typing import Any

from modak.image.kernels import OP_CLASSES, Kernel, Profile
from modak.measurements.kernels import CEILINGS, KernelRow, Reconciliation
from modak.measurements.store import Measurement
from modak.workload.analysis import OpStats, WorkloadProfile, covering


def kernel_rows(profile: Profile, measurement: Measurement, analysis: WorkloadProfile,
                measured_at: str | None = None) -> tuple[tuple[KernelRow, ...], Reconciliation]:
    """The kernel rows and the reconciliation of ``profile``, a profiled launch of ``measurement``'s candidate
    (whose unprofiled step time it is reconciled with, and whose machine ceilings they carry) that ran the ONNX
    graph ``analysis`` analysed.

    A kernel that names the nodes it covers gets their FLOPs and bytes per call (their sum over the step divided
    by its calls) and the op class of the costliest of them; one that names none keeps what the image reported.
    ``measured_at``: when the profiled launch ran (default now). A measurement without a step time, a profile
    with a time no step can take, or a kernel naming a node the analysis does not have or an unknown op class, is a
    :class:`ValueError`."""
    step = measurement.step_s
    _check(profile)
    stamp = measured_at or dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    ops = {op.name: op for op in analysis.ops}
    common: dict[str, Any] = dict(machine=measurement.machine, runtime=measurement.runtime, device=measurement.device,
                  threads=measurement.threads or 0, precision=measurement.precision, params=measurement.params,
                  model=measurement.model, batch_size=measurement.batch_size, source=profile.source,
                  session=measurement.session or "", measured_at=stamp, task=measurement.task,
                  **{column: getattr(measurement, column) for column in CEILINGS})
    rows = tuple(KernelRow(kernel=_analysed(timed.kernel, timed.calls, ops, measurement.model),
                           seconds=timed.seconds, calls=timed.calls, **common)
                 for timed in profile.kernels)
    reconciliation = Reconciliation(step_s=step, profiled_step_s=profile.step_seconds,
                                    kernel_s=profile.kernel_seconds(), unmapped_s=profile.unmapped_seconds,
                                    kernels=len(rows), **common)
    return rows, reconciliation


def _check(profile: Profile) -> None:
    times = [profile.unmapped_seconds, *(k.seconds for k in profile.kernels)]
    if not (math.isfinite(profile.step_seconds) and profile.step_seconds > 0):
        raise ValueError(f"the profiled step took {profile.step_seconds} s")
    if not all(math.isfinite(t) and t >= 0 for t in times) or any(k.calls < 1 for k in profile.kernels):
        raise ValueError("the profile has a negative or infinite time, or a kernel called less than once")
    unknown = sorted({k.kernel.op for k in profile.kernels if k.kernel.op} - set(OP_CLASSES))
    if unknown:
        raise ValueError(f"the profile names unknown op classes: {', '.join(unknown)}")


def _analysed(kernel: Kernel, calls: int, ops: dict[str, OpStats], model: str) -> Kernel:
    """``kernel`` costed by the nodes it covers (:func:`~modak.workload.analysis.covering`); one naming a node the
    analysis of ``model`` does not have is a :class:`ValueError`."""
    unknown = [n for n in kernel.nodes if n not in ops]
    if unknown:
        raise ValueError(f"kernel {kernel.kind} covers {len(unknown)} node(s) the analysis of {model} does not "
                         f"have: {', '.join(unknown[:3])}")
    return covering(kernel, [ops[n] for n in kernel.nodes], calls)
