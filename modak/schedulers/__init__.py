"""Schedulers that take a rendered job script: Slurm, PBS and none (bash), one module each, registered in
:data:`SCHEDULERS` (see :mod:`modak.schedulers.base` for adding one)."""

# Each registers itself; in the order the spec's scheduler.kind lists them (slurm, pbs, none).
from modak.schedulers import slurm, pbs, bash  # noqa: F401, I001
from modak.schedulers.base import SCHEDULERS, ArrayScheduler, Scheduler, Submission

__all__ = ["SCHEDULERS", "ArrayScheduler", "Scheduler", "Submission", "scheduler"]


def scheduler(name: str) -> Scheduler:
    """The scheduler called ``name`` (a target's ``scheduler.kind``)."""
    return SCHEDULERS.get(name)(name)
