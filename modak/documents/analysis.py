"""The model's analysis as typed records: ``modak analyze --json`` (:data:`SCHEMA`), and where its nodes' shapes
came from, which the plan's workload says too."""

from __future__ import annotations

from typing import Annotated, Literal

from msgspec import Meta

from modak.documents import Count, Positive, Record

NonNegative = Annotated[float, Meta(ge=0)]


class ShapeSources(Record, frozen=True):
    """Nodes per source: onnx (ONNX shape inference), symbolic (ONNX Runtime's symbolic shape inference), run (one
    run of the graph in ONNX Runtime at the batch), guessed (no source: priced at guessed shapes)."""

    onnx: Count
    symbolic: Count
    run: Count
    guessed: Count


class Shapes(Record, frozen=True):
    """Where each node's shapes came from (the least sure source of its tensors') and the nodes priced at guessed
    shapes; present only where ONNX shape inference left some node's shapes unknown."""

    sources: ShapeSources
    unknown: Annotated[list[str], Meta(description="the nodes priced at guessed shapes (counted as guessed)")]


class OpType(Record, frozen=True):
    """One ONNX operator type's forward count, FLOPs and bytes."""

    count: Positive
    flops: NonNegative
    bytes: NonNegative


class AnalysisDocument(Record, frozen=True):
    schema_version: Literal[1]
    model: str
    task: Literal["inference", "training"]
    batch_size: Positive
    parameters: Annotated[Count, Meta(description="the model's parameter count")]
    flops: Annotated[NonNegative, Meta(description="FLOPs per step")]
    bytes: Annotated[NonNegative, Meta(description="bytes moved per step")]
    forward_flops: NonNegative
    forward_bytes: NonNegative
    arithmetic_intensity: Annotated[NonNegative, Meta(description="flops / bytes (FLOP/B)")]
    op_types: Annotated[dict[str, OpType], Meta(description="per ONNX operator type: forward count, FLOPs and bytes")]
    shapes: Shapes | None = None


SCHEMA = ("analyze", "modak analyze --json (schema_version 1)",
          "The job's model analysed at its batch size: totals per step and the operators grouped by type, most FLOPs "
          "first. FLOPs and bytes of a training step include the backward pass and the optimizer; forward_* are the "
          "forward pass alone.")
