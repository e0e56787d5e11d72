"""What ``modak scale --json`` prints, as typed records (:data:`SCHEMA`): the data-parallel (weak scaling)
prediction of a training job for 1..N workers, the alpha-beta model behind it and the worker count chosen."""

from __future__ import annotations

from typing import Annotated, Literal

from msgspec import Meta

from modak.documents import Count, Positive, Record

Share = Annotated[float, Meta(ge=0, le=1)]


class Link(Record, frozen=True):
    kind: Annotated[str, Meta(description=
        "nvlink, pcie3/4/5 (intra-node); ethernet, roce, infiniband, omnipath, slingshot (network)")]
    bandwidth_gbs: Annotated[float, Meta(gt=0, description=
        "beta: GB/s per direction, of one GPU (intra-node) or one node (network)")]
    latency_us: Annotated[float, Meta(gt=0, description="alpha: microseconds per step of a collective")]
    source: Annotated[str, Meta(description="where the two numbers come from, in words (catalog, target, fit)")]


class Model(Record, frozen=True):
    compute_seconds: float
    backward_seconds: float
    gradient_bytes: Annotated[Count, Meta(description="S: bytes all-reduced per step")]
    bucket_bytes: Positive
    allreduce_calls: Positive
    overlap: Annotated[Share, Meta(description="share of the all-reduce that can hide behind the backward pass")]
    workers_per_node: Positive
    max_nodes: Positive
    base_latency_us: float
    algorithms: list[Literal["ring", "tree"]]
    intra_node: Link | None
    network: Link | None


class Point(Record, frozen=True):
    workers: Positive
    nodes: Positive
    workers_per_node: Positive
    step_seconds: Annotated[float, Meta(gt=0, description="predicted seconds per step with this many workers")]
    compute_seconds: Annotated[float, Meta(description=
        "one worker's compute per step (the same for every row: weak scaling)")]
    allreduce_seconds: Annotated[float, Meta(ge=0, description="the gradient all-reduce of one step, hidden or not")]
    exposed_comm_seconds: Annotated[float, Meta(ge=0, description=
        "the part of it the step waits for (not hidden behind the backward pass)")]
    comm_share: Annotated[Share, Meta(description="exposed_comm_seconds / step_seconds")]
    algorithm: Annotated[Literal["ring", "tree"] | None, Meta(description=
        "the faster all-reduce algorithm; null for one worker")]
    samples_per_second: Annotated[float, Meta(description="workers x batch_size / step_seconds")]
    efficiency: Annotated[float, Meta(gt=0, le=1, description=
        "step_seconds of one worker / step_seconds of this row")]


class Chosen(Record, frozen=True):
    """The largest worker count whose efficiency is at least min_efficiency (what a job with `scaling` requests)."""

    workers: Positive
    nodes: Positive
    workers_per_node: Positive
    efficiency: float


class FitPoint(Record, frozen=True):
    workers: Positive
    measured_seconds: float
    predicted_seconds: float
    error: Annotated[float, Meta(description="predicted / measured - 1")]


class Fit(Record, frozen=True):
    """The model fitted to measured points."""

    fitted: Annotated[list[str], Meta(description=
        "parameters set from the measured points (compute_seconds, network_bandwidth, overlap, ...)")]
    defaults: Annotated[list[str], Meta(description="parameters left at their defaults")]
    points: list[FitPoint]
    notes: list[str]


class ScaleDocument(Record, frozen=True):
    schema_version: Literal[1]
    job: str
    target: str
    candidate: Annotated[str, Meta(description="the plan's choice, whose predicted step is one worker's compute")]
    batch_size: Annotated[Positive, Meta(description="samples per step of one worker")]
    scaling: Literal["weak"]
    min_efficiency: Annotated[float, Meta(gt=0, le=1)]
    max_workers: Annotated[Positive | None, Meta(description=
        "the most workers asked for (scaling.max_workers or --max-workers); null: all the target has")]
    gradient_dtype: Literal["fp32", "bf16", "fp16"]
    model: Model
    points: Annotated[list[Point], Meta(min_length=1)]
    chosen: Chosen
    fit: Annotated[Fit | None, Meta(description="null without measured points")]
    reasons: list[str]


SCHEMA = ("scale", "modak scale --json (schema_version 1)",
          "Data-parallel training on 1..N workers (weak scaling: every worker keeps the job's batch): the predicted "
          "table, the worker count chosen for the job's min_efficiency, the model's parameters and, with measured "
          "points, the fit.")
