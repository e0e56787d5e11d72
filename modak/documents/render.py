"""What ``modak render --json`` prints, as a typed record (:data:`SCHEMA`)."""

from __future__ import annotations

from typing import Annotated, Literal

from msgspec import Meta

from modak.documents import Record


class RenderDocument(Record, frozen=True):
    schema_version: Literal[1]
    output: Annotated[str, Meta(description="the output folder (a complete build context), as given on the command "
                                            "line")]
    choice: Annotated[str, Meta(description="name of the chosen candidate")]
    image: Annotated[str, Meta(description="the reference `modak build` tags the image with (registry/name:tag)")]
    files: Annotated[list[str], Meta(min_length=5, description=
        "the generated files (absolute paths, sorted): Dockerfile, Singularity.def, entrypoint.sh, job.sh, plan.json; "
        "the copied context (model, modak-lib, ca.crt, ...) is not listed")]


SCHEMA = ("render", "modak render --json (schema_version 1)",
          "What `modak render` wrote. The plan itself is OUTPUT/plan.json (plan.schema.json): the chosen runtime, "
          "parameters and predicted step time are read from there.")
