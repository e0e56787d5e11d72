"""The plan's document (``modak plan --json``, ``plan.json``) as typed records: what :meth:`modak.plan.Plan.to_dict`
builds, and what ``modak/schemas/plan.schema.json`` is generated from (:data:`SCHEMA`)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from msgspec import Meta

from modak.documents import Count, Positive, Record, Seconds
from modak.documents.analysis import Shapes


class Objective(Record, frozen=True):
    metric: Literal["throughput", "latency", "time_to_solution"]
    steps: Annotated[Positive | None, Meta(description=
        "compile/tune time is amortized over these steps; null: not counted")]


class Workload(Record, frozen=True):
    model: str
    batch_size: Positive
    parameters: Annotated[Count, Meta(description="model parameters (count)")]
    flops_per_step: Annotated[float, Meta(ge=0)]
    bytes_per_step: Annotated[float, Meta(ge=0)]
    arithmetic_intensity: Annotated[float, Meta(ge=0, description="FLOP per byte")]
    nodes: Annotated[Count, Meta(description="operators in the ONNX graph")]
    shapes: Shapes | None = None


class Accuracy(Record, frozen=True):
    """int8: the accuracy gate's figure for the candidate's quantized model (it passed)."""

    method: Annotated[str, Meta(description="the recipe's quantization value (static, dynamic, nncf)")]
    metric: Literal["top1_agreement", "relative_error"]
    value: Annotated[float, Meta(ge=0, description="top-1 agreement with fp32, or relative error")]
    drop: Annotated[float, Meta(description="1 - agreement, or the relative error")]
    max_drop: Annotated[float, Meta(ge=0, description="the job's accuracy.max_drop (or its default)")]
    passed: bool
    samples: Annotated[str, Meta(description="what the figure was measured on, e.g. 64 random samples")]
    random_samples: Annotated[bool, Meta(description="seeded random inputs (the job gives no calibration.data)")]
    quantized_model: Annotated[str, Meta(description=
        "cache key of the quantized ONNX file (MODAK_CACHE/quantized/KEY/model.onnx)")]


class Candidate(Record, frozen=True):
    rank: Positive
    name: Annotated[str, Meta(description="runtime/device/precision key=value ...")]
    runtime: Annotated[str, Meta(description="a runtime recipe's name (recipes/runtimes/*.yaml)")]
    device: Literal["cpu", "gpu"]
    precision: Literal["fp32", "tf32", "bf16", "fp16", "int8"]
    parameters: Annotated[dict[str, str | int | float | bool], Meta(description=
        "the runtime's tuned parameters, as the recipe names them")]
    threads: Annotated[Positive | None, Meta(description=
        "threads the policy resolves to on this target; null on GPUs")]
    predictor: Annotated[str, Meta(description="roofline, learned, ...")]
    step_seconds: Annotated[Seconds, Meta(description="predicted steady-state seconds per step")]
    interval_seconds: Annotated[list[Seconds], Meta(min_length=2, max_length=2, description=
        "the prediction's interval: fastest and slowest plausible step")]
    compile_seconds: Seconds
    objective_seconds: Annotated[Seconds, Meta(description=
        "step_seconds plus compile_seconds / objective.steps: what the ranking uses")]
    throughput_per_second: Annotated[float, Meta(ge=0, description="samples per second at the objective time")]
    bound: Literal["compute", "memory", "overhead"]
    roofline: Annotated[dict[str, float], Meta(description=
        "the predictor's terms (seconds, ceilings, FLOPs and bytes; at least compute_s, memory_s and overhead_s); "
        "the learned predictor adds roofline_bound_s and utilization, and it and the kernel predictor "
        "new_machine_spread, same_kind_spread and new_model_spread (the SDs in log step time its interval was "
        "widened by, in quadrature: on a target it has no rows of and whose kind (CPU microarchitecture or GPU "
        "model, and cores) it knows none of; on another probe of a kind it knows; for a model graph it has no rows "
        "of on a target or kind it knows)")]
    accuracy: Annotated[Accuracy | None, Meta(description=
        "int8: the accuracy gate's figure for the candidate's quantized model (it passed); null otherwise")]
    failed_check: Annotated[str | None, Meta(description=
        "its output failed the reference check on this target (it is never chosen): why; null otherwise")]
    regime: Annotated[Literal["launch", "transfer", "compute", "memory"] | None, Meta(description=
        "GPU candidates only (the GPU model, predictor gpu-terms): the term that bounds the step: the host's kernel "
        "launches (launch_s), its host copies (transfer_s), or the device's compute or memory traffic; absent on "
        "CPU candidates")] = None


class Pruned(Record, frozen=True):
    runtime: Annotated[str, Meta(description="runtime, runtime/device or a candidate name")]
    reason: str


class Tuned(Record, frozen=True):
    """The winner ``modak tune`` (or ``modak build`` before it chose) measured for this workload on this target."""

    candidate: str
    step_seconds: Seconds
    interval_seconds: Annotated[list[float], Meta(min_length=2, max_length=2)]
    confident: Annotated[bool, Meta(description="every other finalist was confidently slower")]
    trials: Positive
    measured_at: str


class BatchRow(Record, frozen=True):
    batch_size: Positive
    candidate: Annotated[str | None, Meta(description=
        "the plan's choice at this batch; null when no candidate was within the job's constraints")]
    objective_seconds: Annotated[Seconds | None, Meta(description=
        "the choice's predicted seconds per step (compile amortized as ranked)")]
    samples_per_second: Annotated[Annotated[float, Meta(ge=0)] | None, Meta(description=
        "batch_size / objective_seconds: what the choice among batches maximizes")]
    memory_gb: Annotated[Annotated[float, Meta(ge=0)] | None, Meta(description=
        "the most one step may hold: parameters and every operator's output (an upper bound)")]
    excluded: Annotated[str | None, Meta(description=
        "the limits that excluded the batch (constraints.max_latency_ms, memory); null: within them")]


class DataParallel(Record, frozen=True):
    """A training job with scaling: the data-parallel layout the plan decided (modak scale's choice), which job.sh
    runs."""

    workers: Annotated[Positive, Meta(description="processes in all: one per GPU, one per node for a CPU job")]
    nodes: Positive
    workers_per_node: Positive
    efficiency: Annotated[float, Meta(description="predicted parallel efficiency (weak scaling)")]
    step_seconds: Annotated[float, Meta(description="predicted step time with that many workers")]
    min_efficiency: Annotated[float, Meta(description="the job's scaling.min_efficiency")]
    summary: Annotated[str, Meta(description="one line, job.sh's Scaling comment")]


class ModelSource(Record, frozen=True):
    """The user's own model (model.pytorch, model.exported): where it came from and what the analysis read."""

    source: Annotated[str, Meta(description="module:factory, or 'program FILE' (a torch.export program)")]
    exporter: Annotated[Literal["dynamo", "torchscript"] | None, Meta(description=
        "the ONNX exporter that made the graph; null: none could (the ONNX runtimes are pruned, FLOPs come from "
        "torch.utils.flop_counter)")]
    export_failures: Annotated[list[str], Meta(description=
        "why each exporter tried before (or instead of) it failed")]
    call: Annotated[Literal["keyword", "positional"], Meta(description=
        "how the model is called: by keyword where every input name is a parameter of its forward, else "
        "positionally in the order of model.input_shape")]
    outputs: Annotated[list[str], Meta(description=
        "the tensors of its outputs by name, in the graph's order: 'output' (one tensor), 'output_0', ... (a "
        "tuple), a mapping's or ModelOutput's keys")]
    dropped_outputs: Annotated[list[str], Meta(description=
        "what it returns that is not a tensor, left out of the export and of the served outputs (a decoder's "
        "key/value cache): name (type)")]
    digests: Annotated[dict[str, str], Meta(description=
        "sha256 of the module (or package), the weights, the factory's kwargs (JSON) or the program")]
    torch: Annotated[str, Meta(description="the PyTorch version that loaded and exported it")]
    export_seconds: Annotated[float, Meta(ge=0, description=
        "what loading and exporting it took on its first plan (later plans read the cache)")]


class Processing(Record, frozen=True):
    """A job with pre-processing (model.tokenizer, model.image_processor, model.preprocess): what it and the
    post-processing (model.postprocess) cost for one batch, measured on the machine that planned (in a child
    process, on sample items: two texts, two PNG images or the job's example) and cached; not part of the
    predicted step."""

    kind: Literal["tokenizer", "image_processor", "function"]
    items: Annotated[Positive, Meta(description="the batch the figures are for (workload.batch_size)")]
    preprocess_seconds: Annotated[Seconds, Meta(description=
        "median seconds to turn the batch's raw items into the model's inputs")]
    postprocess_seconds: Annotated[Seconds | None, Meta(description=
        "median seconds of model.postprocess on the batch's outputs; null without one")]
    measured_on: Literal["this machine"]


class PlanDocument(Record, frozen=True):
    schema_version: Literal[1]
    job: Annotated[str, Meta(description="the job's name")]
    target: Annotated[str, Meta(description="the target's name")]
    task: Literal["training", "inference"]
    objective: Objective
    workload: Workload
    candidates: Annotated[list[Candidate], Meta(min_length=1, description=
        "every candidate that can run, best first (rank 1 is the choice)")]
    pruned: list[Pruned]
    choice: Annotated[str, Meta(description="name of the chosen candidate (candidates[0].name)")]
    chosen_by: Annotated[Literal["measured", "predicted"], Meta(description=
        "measured: a race on the target chose (`modak tune`, or `modak build` before it chose; see tuned); else "
        "predicted")]
    tuned: Annotated[Tuned | None, Meta(description=
        "the winner `modak tune` measured for this workload on this target, when the plan chose it; else null")]
    worth_tuning: Annotated[list[str], Meta(description=
        "candidates `modak tune` would race: the predicted top 3, those whose predicted spread (the trees' "
        "10th-90th percentile step times, or the interval without trees) overlaps the leader's, and stock")]
    deployment: Annotated[dict[str, Any], Meta(description=
        "the choice as the image and `modak bench` run it (runtime, device, precision, task, params, env, "
        "batch_size, input_shapes; the zoo architecture, the user's model, loss and pre- and post-processing "
        "where the job has them)")]
    batches: Annotated[list[BatchRow], Meta(description=
        "model.batch_size auto: every batch size the plan tried, smallest first (the chosen one is "
        "workload.batch_size); empty when the job gives a number")]
    reasons: Annotated[list[str], Meta(min_length=1)]
    model_source: ModelSource | None = None
    data_parallel: DataParallel | None = None
    processing: Processing | None = None


SCHEMA = ("plan", "modak plan --json (schema_version 1)",
          "Ranked candidate deployments of one job on one target, the choice and the reasons. Also the plan.json "
          "that `modak render` and `modak build` write. New optional keys may appear within schema_version 1; a "
          "removed or retyped key bumps it.")
