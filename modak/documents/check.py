"""``modak check``'s documents as typed records: the verdict (``--json``, :data:`SCHEMA`) and the baseline file
``--update`` writes (:data:`BASELINE_SCHEMA`), both around a :class:`Snapshot` of one plan's choice."""

from __future__ import annotations

from typing import Annotated, Any, Final, Literal

from msgspec import Meta

from modak.documents import Record, Seconds

BASELINE_KIND: Final = "modak-check-baseline"


class Snapshot(Record, frozen=True):
    """What a check compares: one job's choice and its predicted (and maybe measured) step time."""

    job: str
    target: str
    choice: str
    runtime: str
    device: Literal["cpu", "gpu"]
    precision: str
    parameters: dict[str, Any]
    predictor: str
    predicted_step_seconds: Seconds
    predicted_objective_seconds: Seconds
    measured_step_seconds: Seconds | None
    measured_candidate: str | None


class ComparisonRow(Record, frozen=True):
    metric: Literal["predicted_step_seconds", "measured_step_seconds"]
    baseline: float | None
    current: float | None
    change: Annotated[float | None, Meta(description="current / baseline - 1 (0.12: 12% slower)")]
    limit: Annotated[float | None, Meta(description="baseline * (1 + threshold)")]
    status: Literal["ok", "regressed", "improved", "not compared"]


class CheckDocument(Record, frozen=True):
    schema_version: Literal[1]
    verdict: Annotated[Literal["pass", "regression", "updated"], Meta(description=
        "updated: there was no baseline (or one of another job or target) before --update wrote one")]
    message: Annotated[str, Meta(description="the one-line verdict (also on stderr)")]
    threshold: Annotated[float, Meta(ge=0)]
    baseline_file: str
    updated: Annotated[bool, Meta(description="--update wrote the current state to baseline_file")]
    choice_changed: bool
    baseline: Snapshot | None
    current: Snapshot
    comparisons: Annotated[list[ComparisonRow], Meta(description=
        "empty when there was no baseline; else predicted_step_seconds then measured_step_seconds")]
    notes: list[str]


class BaselineDocument(Snapshot, frozen=True):
    """The current snapshot, and what kind of file it is and when it was written."""

    schema_version: Literal[1]
    kind: Literal["modak-check-baseline"]
    written_at: Annotated[str, Meta(description="ISO 8601 UTC")]


SCHEMA = ("check", "modak check --json (schema_version 1)",
          "The verdict of a regression check against a baseline; exit code 9 when verdict is regression (and "
          "--update was not given).")
BASELINE_SCHEMA = ("check-baseline", "modak check --update baseline file (schema_version 1)",
                   "What `modak check --update` writes to --baseline FILE: the current snapshot of check.schema.json "
                   "plus kind and written_at.")
