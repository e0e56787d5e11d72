"""What ``modak build --json`` prints, as typed records (:data:`SCHEMA`)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from msgspec import Meta

from modak.documents import Record


class Engine(Record, frozen=True):
    name: Literal["docker", "podman", "apptainer"]
    endpoint: Annotated[str, Meta(description="socket URL or binary")]


class Image(Record, frozen=True):
    ref: Annotated[str, Meta(description=
        "the image reference (registry/name:runtime-plandigest), or a .sif path for apptainer")]
    id: Annotated[str | None, Meta(description="the engine's image id (sha256:...)")]
    size_bytes: int | None
    labels: Annotated[dict[str, str], Meta(description=
        "OCI and io.modak.* labels (runtime, parameters, predicted step, plan digest, requirements lock)")]


class Choice(Record, frozen=True):
    candidate: str
    runtime: str
    device: Literal["cpu", "gpu"]
    precision: Literal["fp32", "tf32", "bf16", "fp16", "int8"]
    parameters: dict[str, str | int | float | bool]
    chosen_by: Annotated[Literal["measured", "predicted"], Meta(description="as the plan's chosen_by")]


class Lock(Record, frozen=True):
    digest: str
    packages: int | None
    file: str


class Pushed(Record, frozen=True):
    ref: str
    digest: Annotated[str | None, Meta(description="the registry's manifest digest")]


class BuildDocument(Record, frozen=True):
    """The built image, the decision it carries and the artifacts written."""

    schema_version: Literal[1]
    job: str
    target: str
    output: Annotated[str, Meta(description="the build context folder (the render output)")]
    engine: Engine
    image: Image
    choice: Choice
    predicted_step_seconds: Annotated[float, Meta(ge=0)]
    requirements_lock: Lock | None
    tuned_artifacts: Annotated[dict[str, str], Meta(description=
        "image path -> host path of tuning results baked in")]
    smoke_test: Annotated[dict[str, Any] | None, Meta(description=
        "the image's self-test JSON line (status, runtime, threads, step_seconds, ...); null with --no-smoke")]
    pushed: Pushed | None
    oci_archive: str | None
    sif: str | None
    artifacts: Annotated[list[str], Meta(description="files written (sorted)")]
    build_log: str
    seconds: Annotated[dict[str, float], Meta(description="seconds per phase and total")]
    job_id: Annotated[str | None, Meta(description="with --submit: the scheduler's job id")]
    submission: Annotated[dict[str, Any] | None, Meta(description=
        "with --submit: what `modak submit --json` prints, without schema_version")]


SCHEMA = ("build", "modak build --json (schema_version 1)",
          "The built image, the decision it carries and the artifacts written "
          "(modak.build.pipeline.BuildResult.to_dict).")
