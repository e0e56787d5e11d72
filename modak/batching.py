"""``model.batch_size: auto``: the job planned at each batch size of :data:`AUTO_BATCH_SIZES`, and the plan of the
batch with the most predicted samples per second within the job's limits."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import msgspec

from modak.plan import MEMORY_SHARE, BatchOption, NoCandidate, Plan, step_memory_gb
from modak.spec.loader import LoadedJob

AUTO_BATCH_SIZES = tuple(2 ** i for i in range(9))  # what model.batch_size auto tries: 1, 2, 4, ..., 256


def choose_batch(loaded: LoadedJob, plan_at: Callable[[LoadedJob], Plan]) -> Plan:
    """``model.batch_size: auto``: plan the job at each of :data:`AUTO_BATCH_SIZES` (``plan_at`` plans a job of
    concrete batch size) and return the plan of the batch with the most predicted samples per second (the batch
    over its choice's objective seconds; a tie goes to the smaller batch) among those within the limits: a batch
    where no candidate is within the job's constraints (``max_latency_ms``: a step is one batch) is excluded, and
    so is one whose step may hold more than :data:`MEMORY_SHARE` of its choice's device memory
    (:func:`step_memory_gb`). The plan carries every batch tried (``batches``) and says why in its reasons."""
    plans: dict[int, Plan] = {}
    options: list[BatchOption] = []
    for batch in AUTO_BATCH_SIZES:
        try:
            plan = plan_at(with_batch(loaded, batch))
        except NoCandidate as exc:
            options.append(BatchOption(batch, None, None, None, ", ".join(exc.limits) or "no candidate"))
            continue
        choice = plan.choice
        memory = step_memory_gb(plan.workload)
        device = plan.ceilings.gpu if choice.candidate.device == "gpu" else plan.ceilings.cpu
        assert device is not None
        over = memory > MEMORY_SHARE * device.memory_gb
        options.append(BatchOption(batch, choice.candidate.name, choice.objective_seconds, memory,
                                   "memory" if over else None))
        if not over:
            plans[batch] = plan
    limits = _batch_limits(loaded)
    table = ", ".join(option.describe() for option in options)
    if not plans:
        raise loaded.job_doc.error(("model", "batch_size"), f"no batch size is within the limits ({limits}): {table}")
    best = max(plans, key=lambda b: (b / plans[b].choice.objective_seconds, -b))
    chosen = plans[best]
    reason = (f"batch_size auto chose {best}: the most predicted samples per second within {limits}; per batch, "
              f"samples/s (step): {table}")
    return replace(chosen, batches=tuple(options), reasons=(chosen.reasons[0], reason, *chosen.reasons[1:]))


def with_batch(loaded: LoadedJob, batch: int) -> LoadedJob:
    """``loaded`` with the job's ``model.batch_size`` set to ``batch``."""
    job = loaded.job
    return replace(loaded, job=msgspec.structs.replace(job, model=msgspec.structs.replace(job.model, batch_size=batch)))


def _batch_limits(loaded: LoadedJob) -> str:
    """The limits an auto batch is chosen within, in words."""
    latency = loaded.job.constraints.max_latency_ms
    return ((f"constraints.max_latency_ms ({latency:g} ms) and " if latency is not None else "")
            + f"memory ({MEMORY_SHARE:.0%} of the device's)")
