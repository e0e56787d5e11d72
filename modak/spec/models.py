"""The typed, immutable Job specification (``apiVersion: modak/v1``; the Target's is :mod:`modak.spec.target`).

Every string that later lands in a Dockerfile, definition file or script is either constrained here to a
safe alphabet (names, image references, scheduler fields) or escaped by the renderer (free text).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from enum import Enum
from typing import Annotated, Any, Literal

from msgspec import Meta, field

from modak.image.text import TOKEN_FIELDS
from modak.spec.fields import (
    Loss,
    Name,
    PositiveFloat,
    PositiveInt,
    PythonModule,
    PythonName,
    Requirement,
    Strict,
    Text,
    UserFunction,
)

InputDtype = Literal["float32", "float16", "int64", "bool"]  # the element type of a user model's input (input_dtype)
AUTO_BATCH = "auto"  # model.batch_size: the plan chooses it (modak.batching.choose_batch)


class Task(str, Enum):
    training = "training"
    inference = "inference"


class Precision(str, Enum):
    fp32 = "fp32"
    tf32 = "tf32"
    bf16 = "bf16"
    fp16 = "fp16"
    int8 = "int8"


class Metric(str, Enum):
    throughput = "throughput"
    latency = "latency"
    time_to_solution = "time_to_solution"


class Device(str, Enum):
    any = "any"
    cpu = "cpu"
    gpu = "gpu"




class PyTorchModel(Strict, frozen=True, kw_only=True):
    """The user's own ``torch.nn.Module``: a factory in their code, called only in a child process with a time and
    memory limit (:mod:`modak.workload.usercode`)."""

    module: Annotated[PythonModule, Meta(description=
        "A Python file relative to the job file (model.py), or an importable module name (mypkg.models; the job "
        "file's folder is searched first).")]
    factory: Annotated[PythonName, Meta(description="The callable in `module` that returns the torch.nn.Module.")]
    kwargs: Annotated[dict[str, Any], Meta(description=
        "Keyword arguments of the factory (JSON values).")] = field(default_factory=dict)
    weights: Annotated[Text | None, Meta(description=
        "A state_dict file relative to the job file, loaded with torch.load(weights_only=True) and "
        "load_state_dict(strict=True).")] = None

    def __post_init__(self) -> None:
        try:
            json.dumps(self.kwargs, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"kwargs must be JSON values (strings, numbers, booleans, null, lists, mappings): {exc}") \
                from None


class TokenizerSpec(Strict, frozen=True, kw_only=True):
    """The text a served model takes: a Hugging Face tokenizer that turns a request's strings into its token
    inputs (:data:`modak.image.text.TOKEN_FIELDS`), in the image (:mod:`modak.image.text`)."""

    path: Annotated[Text, Meta(description=
        "A local folder with the tokenizer's tokenizer.json (what save_pretrained writes), relative to the job "
        "file; the image carries it.")]
    max_length: Annotated[PositiveInt, Meta(description=
        "The sequence length every text is padded or truncated to: the length of the token inputs in "
        "model.input_shape, which the plan predicts at.")]


class ImageProcessorSpec(Strict, frozen=True, kw_only=True):
    """The images a served model takes: a Hugging Face image processor that turns a request's encoded images into
    its ``pixel_values``, in the image (:mod:`modak.image.vision`)."""

    path: Annotated[Text, Meta(description=
        "A local folder with the processor's preprocessor_config.json (what save_pretrained writes), relative to "
        "the job file; the image carries it.")]


class PreprocessSpec(Strict, frozen=True, kw_only=True):
    """The user's own pre-processing: a function from a request's raw items to the model's inputs
    (:mod:`modak.image.functions`)."""

    function: Annotated[UserFunction, Meta(description=
        "module:function, the module a .py file relative to the job file or a dotted name: it takes a list of "
        "bytes (the items of the BYTES input named data) and returns the model's inputs by name, a row per item.")]
    example: Annotated[Text, Meta(description=
        "A file holding one raw item (relative to the job file): the plan measures the function on it, the image "
        "carries it and its smoke test sends it.")]


class ModelSpec(Strict, frozen=True, kw_only=True):
    """The network: an ONNX file, a zoo architecture, the user's own PyTorch module or a ``torch.export`` program,
    with its input and batch size."""

    onnx: Annotated[Text | None, Meta(description="Path to an ONNX file, relative to the job file.")] = None
    zoo: Annotated[Name | None, Meta(description="Name of a modak zoo architecture (see `modak zoo`).")] = None
    pytorch: Annotated[PyTorchModel | None, Meta(description="The user's own PyTorch module (its factory and weights); "
                                                           "needs input_shape.")] = None
    exported: Annotated[Text | None, Meta(description="A torch.export program (.pt2, torch.export.save), relative to "
                                                    "the job file; needs none of the user's code.")] = None
    input_shape: Annotated[list[PositiveInt] | dict[str, list[PositiveInt]] | None, Meta(description=
        "Per-sample input shape without the batch dimension; a mapping for several inputs.")] = None
    input_dtype: Annotated[InputDtype | dict[str, InputDtype] | None, Meta(description=
        "The user's own model (pytorch, exported): its inputs' element type, float32 (default), float16, int64 "
        "(token ids, embedding rows; give input_high) or bool (masks); a mapping for several inputs.")] = None
    input_high: Annotated[PositiveInt | dict[str, PositiveInt] | None, Meta(description=
        "The user's own model: the exclusive upper bound of its int64 inputs (the vocabulary size, an "
        "embedding table's rows); a mapping for several inputs.")] = None
    tokenizer: Annotated[TokenizerSpec | None, Meta(description=
        "The user's own model: a tokenizer, so that `modak serve` takes text (a BYTES input named text) as well "
        "as token ids.")] = None
    image_processor: Annotated[ImageProcessorSpec | None, Meta(description=
        "The user's own model: an image processor, so that `modak serve` takes encoded images (a BYTES input named "
        "image) as well as pixel_values.")] = None
    preprocess: Annotated[PreprocessSpec | None, Meta(description=
        "The user's own model: your function from raw items (a BYTES input named data) to the model's inputs.")] \
        = None
    postprocess: Annotated[UserFunction | None, Meta(description=
        "The user's own model: module:function that turns the model's outputs (NumPy arrays by name) into the "
        "answer to a request of raw items (arrays of numbers or strings by name, a row per item).")] = None
    batch_size: Annotated[PositiveInt | Literal["auto"], Meta(description=
        "Samples per step, or 'auto' (inference with objective throughput): the plan predicts every power of two "
        "from 1 to 256 and takes the batch with the most samples per second within constraints.max_latency_ms "
        "and the device's memory.")] = 1

    def __post_init__(self) -> None:
        if sum(source is not None for source in (self.onnx, self.zoo, self.pytorch, self.exported)) != 1:
            raise ValueError("give exactly one of 'onnx' (a file), 'zoo' (an architecture name), 'pytorch' (your "
                             "module and factory) or 'exported' (a torch.export .pt2 file)")
        if self.pytorch is not None and self.input_shape is None:
            raise ValueError("a PyTorch model needs input_shape (per sample, without the batch dimension)")
        self._check_processing()
        if self.input_dtype is None and self.input_high is None:
            return
        if self.onnx is not None or self.zoo is not None:
            raise ValueError("input_dtype and input_high describe the user's own model (pytorch, exported): an ONNX "
                             "file and a zoo architecture carry their inputs' types")
        named = [value for value in (self.input_shape, self.input_dtype, self.input_high) if isinstance(value, dict)]
        names = sorted({name for value in named for name in value}) or ["input"]
        unbounded = [name for name, (dtype, high) in self.input_types(names).items() if dtype == "int64" and not high]
        if unbounded:
            raise ValueError("int64 inputs need input_high (their exclusive upper bound, e.g. the vocabulary size): "
                             f"none for {', '.join(unbounded)}")

    def _check_processing(self) -> None:
        steps = [name for name in ("tokenizer", "image_processor", "preprocess") if getattr(self, name) is not None]
        if len(steps) > 1:
            raise ValueError(f"give one pre-processing: {' or '.join(steps)}")
        if (steps or self.postprocess is not None) and self.pytorch is None and self.exported is None:
            raise ValueError(f"{(steps or ['postprocess'])[0]} serves the user's own model (pytorch, exported): give "
                             "its inputs in input_shape")
        if self.postprocess is not None and not steps:
            raise ValueError("postprocess answers requests of raw items: give a pre-processing too (tokenizer, "
                             "image_processor or preprocess)")
        if self.tokenizer is not None:
            self._check_tokenizer(self.tokenizer)
        from modak.image.vision import PIXEL_VALUES

        if self.image_processor is not None and (not isinstance(self.input_shape, dict)
                                                 or set(self.input_shape) != {PIXEL_VALUES}):
            raise ValueError(f"an image processor fills {PIXEL_VALUES} only: input_shape must name it alone (e.g. "
                             f"{{{PIXEL_VALUES}: [3, 224, 224]}})")

    def _check_tokenizer(self, tokenizer: TokenizerSpec) -> None:
        shapes = self.input_shape
        if not isinstance(shapes, dict) or "input_ids" not in shapes:
            raise ValueError("a tokenizer fills input_ids: input_shape must name it (e.g. {input_ids: [128], "
                             "attention_mask: [128]})")
        wrong = [f"{name} {shapes[name]}" for name in TOKEN_FIELDS if name in shapes
                 and shapes[name] != [tokenizer.max_length]]
        if wrong:
            raise ValueError(f"the token inputs are padded to tokenizer.max_length {tokenizer.max_length}, so their "
                             f"input_shape must be [{tokenizer.max_length}]: {', '.join(wrong)}")
        others = sorted(set(shapes) - set(TOKEN_FIELDS))
        if others:
            raise ValueError(f"a tokenizer fills only {', '.join(TOKEN_FIELDS)}; the model also takes "
                             f"{', '.join(others)}")

    def input_types(self, names: Sequence[str]) -> dict[str, tuple[str, int | None]]:
        """Element type and exclusive upper bound (int64 inputs) of each of the user's model's inputs ``names``."""
        return input_types(self.input_dtype, self.input_high, names)


def input_types(dtype: str | Mapping[str, str] | None, high: int | Mapping[str, int] | None,
                names: Sequence[str]) -> dict[str, tuple[str, int | None]]:
    """``model.input_dtype`` and ``model.input_high`` (one value for every input, or a mapping) for each input in
    ``names``: its element type (float32 unless given) and, for int64, its exclusive upper bound."""
    def pick(value: Any, name: str, default: Any) -> Any:
        return value.get(name, default) if isinstance(value, Mapping) else (default if value is None else value)

    types = {name: (pick(dtype, name, "float32"), pick(high, name, None)) for name in names}
    return {name: (kind, bound if kind == "int64" else None) for name, (kind, bound) in types.items()}


class Objective(Strict, frozen=True, kw_only=True):
    """What to optimize. ``time_to_solution`` amortizes compile/tune time over ``steps``."""

    metric: Annotated[Metric, Meta(description=
        "throughput (samples per second), latency (seconds per step) or time_to_solution (the whole run, "
        "compile/tune time included; needs steps): what `modak whatif` ranks targets by; model.batch_size auto "
        "needs throughput.")] = Metric.throughput
    steps: Annotated[PositiveInt | None, Meta(description=
        "Steps (batches) the job runs; needed for time_to_solution.")] = None

    def __post_init__(self) -> None:
        if self.metric is Metric.time_to_solution and self.steps is None:
            raise ValueError("metric 'time_to_solution' needs 'steps' (how many batches the job runs)")


class Constraints(Strict, frozen=True, kw_only=True):
    max_image_size_gb: Annotated[PositiveFloat | None, Meta(description=
        "Largest image size the job accepts, in GB; modak does not check it yet (no plan or build step reads "
        "it).")] = None
    max_compile_seconds: Annotated[Annotated[float, Meta(ge=0)] | None, Meta(description=
        "Largest predicted compile/tune time of a candidate (its runtime's compilation or autotuning before the "
        "first step), in seconds: candidates predicted to take longer are left out.")] = None
    max_latency_ms: Annotated[PositiveFloat | None, Meta(description=
        "Largest predicted time of one step (one batch), in milliseconds: slower candidates are left out; "
        "with model.batch_size auto it bounds the batch.")] = None
    runtimes: Annotated[list[Name] | None, Meta(description="Allowed runtime names (see recipes/runtimes).")] = None
    max_slowdown: Annotated[Annotated[float, Meta(ge=1)] | None, Meta(description=
        "Largest predicted slowdown this job accepts when `modak pack` co-locates it with other jobs (its "
        "step time sharing a node or GPU over its step time alone on the target), e.g. 1.3; without it, any "
        "slowdown that raises the group's throughput is accepted.")] = None


class AccuracyMetric(str, Enum):
    top1_agreement = "top1_agreement"
    relative_error = "relative_error"


class Calibration(Strict, frozen=True, kw_only=True):
    """Sample inputs that int8 quantization calibrates on and the accuracy gate compares int8 with fp32 on."""

    data: Annotated[str | None, Meta(description=
        "Folder of sample inputs, relative to the job file: .npz files holding one array per input name, or "
        ".npy files for a single-input model; an array is one sample (the input's per-sample shape) or a "
        "stack of samples ([n, *shape]); files are read in name order. Without it, modak calibrates and "
        "checks on seeded random inputs.")] = None
    samples: Annotated[PositiveInt, Meta(description=
        "Samples to use (the first ones of the folder, or random ones).")] = 64


class Accuracy(Strict, frozen=True, kw_only=True):
    """How far an int8 candidate's outputs may move from fp32 on the calibration samples."""

    metric: Annotated[AccuracyMetric | None, Meta(description=
        "top1_agreement: the argmax of the first output per sample agrees with fp32 (drop = 1 - agreement); "
        "relative_error: max |int8 - fp32| / max |fp32| over all outputs (drop = the error). Default: "
        "top1_agreement when the first output has several values per sample (a classifier), else "
        "relative_error.")] = None
    max_drop: Annotated[Annotated[float, Meta(ge=0, le=1)] | None, Meta(description=
        "Largest drop allowed; default 0.01 for top1_agreement, 0.1 for relative_error.")] = None


class UserCode(Strict, frozen=True, kw_only=True):
    """The user's own entry point and requirements, added to the image."""

    command: Annotated[list[Text], Meta(description=
        "Command run instead of modak's runner (exec form).")] = field(default_factory=list)
    requirements: Annotated[list[Requirement], Meta(description=
        "pip requirements (a project name with optional PEP 508 version specifiers, no URLs or options), "
        "installed into the image with the runtime's pins and modak's own, from the target's python package "
        "sources.")] = field(default_factory=list)
    files: Annotated[list[Text], Meta(description=
        "Files or folders (relative to the job file) copied to /opt/app.")] = field(default_factory=list)


ContainerPath = Annotated[str, Meta(pattern=r"^/[A-Za-z0-9_./-]*$")]


class DataSpec(Strict, frozen=True, kw_only=True):
    location: Annotated[Text, Meta(description="Host path of the data set, bind-mounted read-only at `mount`.")]
    mount: Annotated[ContainerPath, Meta(description=
        "Absolute path in the container where `location` is mounted; an inference job's default batch run "
        "reads its inputs there (modak run --input).")] = "/data"
    output: Annotated[Text | None, Meta(description=
        "Host folder the job writes its results to (created if missing), bind-mounted read-write at "
        "`output_mount`; an inference job's script then runs batch inference over `mount` into it by default "
        "(modak run).")] = None
    output_mount: Annotated[ContainerPath, Meta(description=
        "Absolute path in the container where `output` is mounted, other than `mount`; an inference job's "
        "default batch run writes its results there (modak run --output).")] = "/output"

    def __post_init__(self) -> None:
        if self.output is not None and self.output_mount.rstrip("/") == self.mount.rstrip("/"):
            raise ValueError(f"output_mount {self.output_mount} is the data set's mount; give the results their own")


class Scaling(Strict, frozen=True, kw_only=True):
    """Data-parallel training across GPUs and nodes (`modak scale`): how many workers the job script requests."""

    min_efficiency: Annotated[float, Meta(gt=0, le=1, description=
        "Smallest parallel efficiency to accept: one worker's step time over the predicted step time with N "
        "workers at the same per-worker batch (weak scaling). The job runs on the largest N that keeps it.")] = 0.8
    max_workers: Annotated[PositiveInt | None, Meta(description=
        "Most workers to consider (GPUs; nodes for a CPU job, one process each); default all the target has "
        "(nodes x gpus.count). Beyond one node, whole nodes only (rounded down).")] = None
    gradient_dtype: Annotated[Literal["fp32", "bf16", "fp16"], Meta(description=
        "What the gradients are all-reduced in. fp32 (default) under autocast, which keeps parameters and "
        "their gradients in fp32 (modak.runtime.torch does); bf16/fp16 when the training script compresses "
        "them (e.g. DDP's bf16_compress_hook) or trains a half model. Halves the bytes each step exchanges.")] = "fp32"
    measured: Annotated[dict[PositiveInt, PositiveFloat], Meta(description=
        "Measured seconds per step by worker count, e.g. {1: 0.210, 2: 0.236} (same "
        "per-worker batch): the model fits its parameters to them, as `modak scale "
        "--measured` does, before choosing the worker count.")] = field(default_factory=dict)


class Job(Strict, frozen=True, kw_only=True):
    """A data scientist's job: what to run and what to optimize."""

    apiVersion: Annotated[Literal["modak/v1"], Meta(description="The spec's version: modak/v1, the only one.")]
    kind: Annotated[Literal["Job"], Meta(description="Job: this document is a job spec.")]
    name: Annotated[Name, Meta(description=
        "The job's name (letters, digits, . _ -; at most 63 characters): the image's repository name, lower-cased, "
        "its title label, and the job script's job name and output file.")]
    target: Annotated[Text | None, Meta(description=
        "Target file, relative to the job file (or use --target); 'local' is the machine modak runs on, from "
        "its cached `modak probe`.")] = None
    task: Annotated[Task, Meta(description=
        "training or inference: what a step is, and which runtimes can run it (the tasks of their recipes).")]
    model: Annotated[ModelSpec, Meta(description="The network to deploy, with its input and batch size.")]
    loss: Annotated[Loss | None, Meta(description=
        "Training only: the loss the step measures: a built-in (cross_entropy on class labels, mse against "
        "targets shaped like the outputs) or `module:function` (a .py file relative to the job file, or an "
        "importable module) called as function(outputs, batch). Default: the mean square of the outputs "
        "(random data, the work of a real step).")] = None
    precision: Annotated[list[Precision], Meta(min_length=1, description=
        "Precisions the candidates may compute in (fp32, tf32, bf16, fp16, int8): each runtime and device is "
        "tried in those it supports on the target; int8 candidates must pass the accuracy "
        "gate.")] = field(default_factory=lambda: [Precision.fp32])
    frameworks: Annotated[Literal["any"] | list[Name], Meta(description=
        "Frameworks whose runtimes may be candidates (the `framework` of recipes/runtimes/*.yaml, e.g. pytorch, "
        "onnxruntime), or any.")] = "any"
    device: Annotated[Device, Meta(description=
        "cpu, gpu, or any (candidates on both, where the target has GPUs): the devices candidates may run "
        "on.")] = Device.any
    objective: Annotated[Objective, Meta(description="What the plan optimizes.")] = Objective()
    constraints: Annotated[Constraints, Meta(description=
        "Limits on the candidates (compile time, step time, runtimes) and on co-location by `modak pack`; a "
        "candidate outside them is left out with its reason.")] = Constraints()
    entrypoint: Annotated[UserCode | None, Meta(description=
        "The user's own command, pip requirements and files, added to the image; without a command, the image "
        "runs modak's runner.")] = None
    data: Annotated[DataSpec | None, Meta(description=
        "The data set (read-only) and results folder (read-write) that the job script mounts into the "
        "container.")] = None
    calibration: Annotated[Calibration, Meta(description=
        "The sample inputs int8 quantization calibrates on and the accuracy gate checks on.")] = Calibration()
    accuracy: Annotated[Accuracy, Meta(description=
        "How far an int8 candidate's outputs may move from fp32's; candidates that move further are left "
        "out.")] = Accuracy()
    scaling: Annotated[Scaling | None, Meta(description=
        "Training only: scale out data-parallel (see `modak scale`); the job script then requests the largest "
        "worker count that keeps min_efficiency, and launches one process per worker with torchrun.")] = None
