"""What ``modak pack --json`` prints (and ``--render DIR`` writes as pack.json), as typed records (:data:`SCHEMA`)."""

from __future__ import annotations

from typing import Annotated, Literal

from msgspec import Meta

from modak.documents import Record


class SharingModel(Record, frozen=True):
    """The sharing model's constants (modak/advise/contention.py) and the packing's (modak/advise/pack.py,
    modak/plan.py)."""

    oversubscription_cost: float
    spin_penalty: float
    min_gain: float
    memory_share: float


class JobAlone(Record, frozen=True):
    name: Annotated[str, Meta(description="the job's name, numbered (-1, -2) when names repeat")]
    file: str
    device: Literal["cpu", "gpu"]
    candidate: Annotated[str, Meta(description="its plan's choice alone on the target")]
    threads: int | None
    batch_size: int
    step_seconds: Annotated[float, Meta(description="predicted step alone")]
    memory_gb: Annotated[float, Meta(description="the most its step may hold")]
    max_slowdown: float | None
    max_latency_ms: float | None


class Placement(Record, frozen=True):
    job: str
    share: str
    candidate: Annotated[str | None, Meta(description="its plan's choice on the share")]
    threads: int | None
    step_seconds: float | None
    alone_step_seconds: float
    slowdown: float | None
    max_slowdown: float | None
    within_limits: bool
    over: list[str]
    cpuset: str | None
    mps_percentage: int | None
    mig_profile: str | None
    mig_index: int | None


class Arrangement(Record, frozen=True):
    mode: Literal["cores", "time-slicing", "mps", "mig"]
    device: Literal["cpu", "gpu"]
    gain: Annotated[float, Meta(description=
        "aggregate throughput over running the jobs one after another: the sum of alone step / shared step")]
    feasible: bool
    refused: Annotated[list[str], Meta(description=
        "why not: a job's limit, memory, a job that cannot run on its share")]
    memory_gb: float
    memory_capacity_gb: float
    placements: list[Placement]


class Group(Record, frozen=True):
    jobs: list[str]
    shared: bool
    reason: Annotated[str, Meta(description="why this arrangement, or why the jobs run apart")]
    arrangement: Arrangement | None
    options: list[Arrangement]


class PackDocument(Record, frozen=True):
    schema_version: Literal[1]
    target: str
    target_file: str
    model: SharingModel
    jobs: Annotated[list[JobAlone], Meta(min_length=2)]
    groups: list[Group]
    notes: list[str]


SCHEMA = ("pack", "modak pack --json (schema_version 1)",
          "Co-location advice: the jobs alone on the target, the groups that share a node's cores or a GPU (or run "
          "apart, with why), each job's predicted slowdown, and every arrangement evaluated. Also written as "
          "DIR/pack.json by --render DIR.")
