"""Helpers for tests of the kernel model."""

from __future__ import annotations

from modak.predict.kernel_model import KernelModel, MachineModel


def only(model: KernelModel) -> MachineModel:
    """The one machine model of ``model`` (fit on one machine's rows, as the tests' tables are)."""
    (machine,) = model.machines
    return machine
