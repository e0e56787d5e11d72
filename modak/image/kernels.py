"""Kernels: what a runtime actually executes for a step, as the runtime itself reports it.

One vocabulary for the operator-level performance model (#40), shared by the image (profiled launches: a runtime
module's ``profile``) and the host (the graph a runtime would run at plan time, the perf store's kernel rows, the
per-kernel predictors). A :class:`Kernel` is identified by what the runtime calls it (``kind``) and the ONNX nodes
it covers; a :class:`KernelTime` adds the time one profiled step spent in it; a :class:`Profile` is one profiled
launch, beside (never mixed with) the timed launches of the same candidate.

Only the standard library here: this module is copied into images.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

# The op classes: of an ONNX node (the analysis's op table, recipes/hardware/op_classes.yaml) and of a kernel
# (the class of the costliest node it covers; ``other`` where it covers none and its name says no class).
OP_CLASSES = ("conv", "matmul", "recurrent", "elementwise", "normalization", "pooling", "softmax", "reduction",
              "embedding", "data_movement", "other")


@dataclass(frozen=True)
class Kernel:
    """One kernel of a runtime's execution of a graph.

    ``kind``: the runtime's own name for it (OpenVINO's exec type ``brgconv_avx512``, ONNX Runtime's op type
    ``FusedConv``, an aten op ``aten::convolution``, an Inductor kernel ``triton_poi_fused_add_relu_0``, a TVM fused
    primitive ``tvmgen_default_fused_nn_conv2d_add_nn_relu``). ``op``: its op class (:data:`OP_CLASSES`), from the
    costliest ONNX node it covers. ``nodes``: the ONNX node names it covers, in graph order (empty where the runtime
    does not say). ``shapes``: its input shapes, the batch included. ``attributes``: what changes its cost besides
    shapes (kernel size, strides, groups, dilations, layout), as sorted JSON. ``flops``/``bytes``: per call, from the
    covered nodes' analysis (bytes at fp32; the predictors scale them by precision).
    """

    kind: str
    op: str
    nodes: tuple[str, ...] = ()
    shapes: tuple[tuple[int, ...], ...] = ()
    attributes: str = "{}"
    flops: float = 0.0
    bytes: float = 0.0

    def key(self) -> tuple[str, tuple[tuple[int, ...], ...], str]:
        """What makes two kernels cost the same on one runtime, machine, threads and precision."""
        return self.kind, self.shapes, self.attributes


@dataclass(frozen=True)
class KernelTime:
    """The time one step spends in a kernel: ``seconds`` summed over its ``calls`` in that step."""

    kernel: Kernel
    seconds: float
    calls: int = 1


@dataclass(frozen=True)
class Profile:
    """One profiled launch of a candidate: per-kernel times of one step (the median over ``steps`` profiled steps)
    and the profiled step's wall time. ``source``: what reported it (``onnxruntime-profiler``, ``openvino-counters``,
    ``torch-profiler``, ``tvm-debug-executor``). ``unmapped_seconds``: time the runtime reported in events that
    map to no ONNX node (copies, allocator, the runtime's own bookkeeping), kept so the reconciliation sees it."""

    source: str
    steps: int
    step_seconds: float
    kernels: tuple[KernelTime, ...]
    unmapped_seconds: float = 0.0
    notes: tuple[str, ...] = field(default=())

    def kernel_seconds(self) -> float:
        return sum(k.seconds for k in self.kernels)

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Profile:
        data: dict[str, Any] = json.loads(text)
        kernels = tuple(KernelTime(kernel=_kernel(k["kernel"]), seconds=float(k["seconds"]), calls=int(k["calls"]))
                        for k in data["kernels"])
        return cls(source=data["source"], steps=int(data["steps"]), step_seconds=float(data["step_seconds"]),
                   kernels=kernels, unmapped_seconds=float(data.get("unmapped_seconds", 0.0)),
                   notes=tuple(data.get("notes", ())))


def _kernel(data: dict[str, Any]) -> Kernel:
    return Kernel(kind=str(data["kind"]), op=str(data["op"]), nodes=tuple(data.get("nodes", ())),
                  shapes=tuple(tuple(int(d) for d in s) for s in data.get("shapes", ())),
                  attributes=str(data.get("attributes", "{}")), flops=float(data.get("flops", 0.0)),
                  bytes=float(data.get("bytes", 0.0)))
