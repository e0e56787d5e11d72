"""How a job shares its node or GPU with other jobs (``modak pack``): the ways of sharing, and one job's share as
its job script applies it."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

# The ways of sharing, as ``modak pack --modes`` names them, each with the devices it can share.
SHARING_MODES: dict[str, tuple[str, ...]] = {
    "cores": ("cpu",),  # disjoint core sets
    "time-slicing": ("cpu", "gpu"),  # all cores, or the GPU, shared in time slices
    "mps": ("gpu",),  # CUDA MPS: the jobs' kernels run at once
    "mig": ("gpu",),  # a MIG slice each
}
_CPUSET = re.compile(r"\d+(-\d+)?(,\d+(-\d+)?)*")
_MIG_PROFILE = re.compile(r"\d+g\.\d+gb")


@dataclass(frozen=True)
class Sharing:
    """How a job shares its node or GPU with other jobs (``modak pack``'s decision), as its job script applies it.

    Every value is modak's own (numbers, core lists it computed, a MIG profile name from its slice table, job
    names the spec constrains): the job script writes them as words."""

    mode: str  # one of SHARING_MODES
    device: str  # cpu or gpu: what it shares
    partners: tuple[str, ...]  # the names of the jobs it shares with
    cpuset: str | None = None  # mode cores: its cores, as a cpuset list (0-3,8)
    mps_percentage: int | None = None  # mode mps: CUDA_MPS_ACTIVE_THREAD_PERCENTAGE
    mig_profile: str | None = None  # mode mig: the slice's profile (3g.40gb)
    mig_index: int = 0  # mode mig: which slice of that profile (0: the first nvidia-smi -L lists)

    def __post_init__(self) -> None:
        if self.mode not in SHARING_MODES or self.device not in ("cpu", "gpu"):
            raise ValueError(f"unknown sharing mode {self.mode!r} or device {self.device!r}")
        if self.device not in SHARING_MODES[self.mode]:
            raise ValueError(f"sharing mode {self.mode} does not share a {self.device}")
        settings = {"cores": self.cpuset, "mps": self.mps_percentage, "mig": self.mig_profile}
        if any((self.mode == mode) != (value is not None) for mode, value in settings.items()):
            raise ValueError(f"sharing mode {self.mode} needs its own setting and no other")
        if self.cpuset is not None and not _CPUSET.fullmatch(self.cpuset):
            raise ValueError(f"not a cpuset list: {self.cpuset!r}")
        if self.mps_percentage is not None and not 1 <= self.mps_percentage <= 100:
            raise ValueError(f"MPS percentage {self.mps_percentage} is not within 1-100")
        if self.mig_profile is not None and not _MIG_PROFILE.fullmatch(self.mig_profile):
            raise ValueError(f"not a MIG profile name: {self.mig_profile!r}")

    @property
    def gpu(self) -> bool:
        return self.device == "gpu"


def cpuset(cores: Iterable[int]) -> str:
    """Core numbers as a cpuset list: ``[0, 1, 2, 5]`` is ``0-2,5``."""
    ranges: list[list[int]] = []
    for core in sorted(set(cores)):
        if ranges and core == ranges[-1][1] + 1:
            ranges[-1][1] = core
        else:
            ranges.append([core, core])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in ranges)
