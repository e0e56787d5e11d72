"""What ``modak whatif --json`` prints (and its report reads), as typed records (:data:`SCHEMA`)."""

from __future__ import annotations

from typing import Annotated, Literal

from msgspec import Meta

from modak.documents import Count, Positive, Record

Interval = Annotated[list[float], Meta(min_length=2, max_length=2, description="[low, high]: the predictor's interval")]


class WhatIfObjective(Record, frozen=True):
    metric: Literal["throughput", "latency", "time_to_solution"]


class Basis(Record, frozen=True):
    """What time and cost are for: the whole run (kind run, count = objective.steps, compile/tune time included)
    or, without objective.steps, count samples (throughput) or steps (latency)."""

    kind: Literal["run", "samples", "steps"]
    count: Positive


class TargetOutcome(Record, frozen=True):
    rank: Positive
    target: Annotated[str, Meta(description="the target's name")]
    file: Annotated[str, Meta(description="the target file as given")]
    candidate: Annotated[str, Meta(description="the plan's choice on this target")]
    device: Literal["cpu", "gpu"]
    threads: int | None
    cores: Annotated[int, Meta(description="cores the job gets (scheduler.cores_per_job, else the node's)")]
    co_runners: Count
    sharing_slowdown: Annotated[float, Meta(ge=1, description=
        "the co-runners' slowdown (modak pack's time-slicing model), applied to the step; 1 without co-runners")]
    batch_size: int
    predictor: str
    step_seconds: float
    step_interval_seconds: Interval
    compile_seconds: float
    samples_per_second: Annotated[float, Meta(description=
        "batch over the objective's seconds per step (compile amortized over objective.steps)")]
    time_seconds: Annotated[float, Meta(description="time for the basis")]
    time_interval_seconds: Interval
    cost: Annotated[float | None, Meta(description=
        "cost.per_node_hour x the node share (cores / node cores) x time in hours; null: no price")]
    cost_interval: Interval | None
    currency: str | None
    priced: bool
    pareto: Annotated[bool | None, Meta(description=
        "on the front of time against cost; null: unpriced, outside it")]


class WhatIfDocument(Record, frozen=True):
    schema_version: Literal[1]
    job: str
    objective: WhatIfObjective
    basis: Basis
    targets: Annotated[list[TargetOutcome], Meta(min_length=1, description=
        "best first (rank 1): by samples per second (throughput), step time (latency) or time to solution; ties by "
        "cost, priced first")]
    pareto_front: Annotated[list[str], Meta(description="the front's targets, fastest first")]
    notes: list[str]


SCHEMA = ("whatif", "modak whatif --json (schema_version 1)",
          "The job planned on each target: the plan's best candidate, its predicted step and time with intervals, "
          "cost where the target states a price, ranked by the job's objective, and the Pareto front of time against "
          "cost.")
