"""Typed, immutable Job and Target specifications (``apiVersion: modak/v1``).

Every string that later lands in a Dockerfile, definition file or script is either constrained here to a
safe alphabet (names, image references, scheduler fields) or escaped by the renderer (free text).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from enum import Enum
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, JsonValue, StringConstraints, model_validator

from modak.schedulers import SCHEDULERS
from modak.spec.names import EngineName

# A name that is safe as an image tag, a file name, a Slurm job name and a label value.
Name = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")]
# An OCI image reference (registry/path:tag@digest) without whitespace or shell metacharacters.
ImageRef = Annotated[str, StringConstraints(pattern=r"^[a-z0-9][a-z0-9._\-/:@]*$", max_length=255)]
# Scheduler fields (partition, account, qos) are written into #SBATCH/#PBS directives.
SchedulerWord = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_.-]+$", max_length=64)]
TimeLimit = Annotated[str, StringConstraints(pattern=r"^(\d+-)?\d{1,3}:\d{2}(:\d{2})?$")]
Url = Annotated[str, StringConstraints(pattern=r"^https?://[^\s'\"`$\\]+$")]
# A pip requirement: letters, digits and the operators of PEP 508 version specifiers, no URLs or options.
_REQUIREMENT = r"^[A-Za-z0-9][A-Za-z0-9._\-\[\],]*[ ]*([<>=!~]=?[ ]*[A-Za-z0-9.*+!\-]+[ ]*,?[ ]*)*$"
Requirement = Annotated[str, StringConstraints(pattern=_REQUIREMENT)]


def _no_nul(value: str) -> str:
    if "\x00" in value:
        raise ValueError("cannot contain the NUL character (\\x00): no path or program argument can")
    return value


# Free text that becomes a path or a program argument (it is quoted where written, but NUL cannot be passed on).
Text = Annotated[str, AfterValidator(_no_nul)]
PositiveInt = Annotated[int, Field(gt=0)]
PositiveFloat = Annotated[float, Field(gt=0)]
# A target's scheduler.kind: a registered scheduler (modak.schedulers); a Literal of their names for pydantic (its
# errors and the JSON Schema's enum list them), a string for static type checkers.
if TYPE_CHECKING:
    SchedulerKind = str
else:
    SchedulerKind = Literal[SCHEDULERS.names()]
Allocation = Literal["exclusive", "shared"]  # a target's scheduler.allocation: are a job's cores its own?
InputDtype = Literal["float32", "int64"]  # the element type of a user model's input (model.input_dtype)
AUTO_BATCH = "auto"  # model.batch_size: the plan chooses it (modak.plan.choose_batch)


class Strict(BaseModel):
    """Base: unknown fields are errors, instances are immutable."""

    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)


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


# A Python identifier (a factory or function name) and a module: a .py file relative to the job file, or a dotted
# importable name (mypkg.models).
_IDENTIFIER = r"[A-Za-z_][A-Za-z0-9_]*"
_MODULE = rf"([A-Za-z0-9_./-]+\.py|{_IDENTIFIER}(\.{_IDENTIFIER})*)"
PythonName = Annotated[str, StringConstraints(pattern=rf"^{_IDENTIFIER}$", max_length=128)]
PythonModule = Annotated[str, StringConstraints(pattern=rf"^{_MODULE}$", max_length=255)]
BUILTIN_LOSSES = ("cross_entropy", "mse")  # job.loss built-ins: class labels / targets shaped like the outputs


def _loss(value: str) -> str:
    if value not in BUILTIN_LOSSES and not re.fullmatch(rf"{_MODULE}:{_IDENTIFIER}", value):
        raise ValueError(f"expected a built-in loss ({', '.join(BUILTIN_LOSSES)}) or module:function (model.py:"
                         f"my_loss, mypkg.losses:my_loss), got {value!r}")
    return value


Loss = Annotated[str, StringConstraints(max_length=255), AfterValidator(_loss)]


class PyTorchModel(Strict):
    """The user's own ``torch.nn.Module``: a factory in their code, called only in a child process with a time and
    memory limit (:mod:`modak.workload.usercode`)."""

    module: PythonModule = Field(description="A Python file relative to the job file (model.py), or an importable "
                                             "module name (mypkg.models; the job file's folder is searched first).")
    factory: PythonName = Field(description="The callable in `module` that returns the torch.nn.Module.")
    kwargs: dict[str, JsonValue] = Field(default_factory=dict, description="Keyword arguments of the factory.")
    weights: Text | None = Field(None, description="A state_dict file relative to the job file, loaded with "
                                                   "torch.load(weights_only=True) and load_state_dict(strict=True).")


class ModelSpec(Strict):
    """The network: an ONNX file, a zoo architecture, the user's own PyTorch module or a ``torch.export`` program,
    with its input and batch size."""

    onnx: Text | None = Field(None, description="Path to an ONNX file, relative to the job file.")
    zoo: Name | None = Field(None, description="Name of a modak zoo architecture (see `modak zoo`).")
    pytorch: PyTorchModel | None = Field(None, description="The user's own PyTorch module (its factory and weights); "
                                                           "needs input_shape.")
    exported: Text | None = Field(None, description="A torch.export program (.pt2, torch.export.save), relative to "
                                                    "the job file; needs none of the user's code.")
    input_shape: list[PositiveInt] | dict[str, list[PositiveInt]] | None = Field(
        None, description="Per-sample input shape without the batch dimension; a mapping for several inputs.")
    input_dtype: InputDtype | dict[str, InputDtype] | None = Field(
        None, description="The user's own model (pytorch, exported): its inputs' element type, float32 (default) or "
                          "int64 (token ids, embedding rows); a mapping for several inputs.")
    input_high: PositiveInt | dict[str, PositiveInt] | None = Field(
        None, description="The user's own model: the exclusive upper bound of its int64 inputs (the vocabulary size, "
                          "an embedding table's rows); a mapping for several inputs.")
    batch_size: PositiveInt | Literal["auto"] = Field(
        1, description="Samples per step, or 'auto' (inference with objective throughput): the plan predicts every "
                       "power of two from 1 to 256 and takes the batch with the most samples per second within "
                       "constraints.max_latency_ms and the device's memory.")

    @model_validator(mode="after")
    def _one_source(self) -> ModelSpec:
        if sum(source is not None for source in (self.onnx, self.zoo, self.pytorch, self.exported)) != 1:
            raise ValueError("give exactly one of 'onnx' (a file), 'zoo' (an architecture name), 'pytorch' (your "
                             "module and factory) or 'exported' (a torch.export .pt2 file)")
        if self.pytorch is not None and self.input_shape is None:
            raise ValueError("a PyTorch model needs input_shape (per sample, without the batch dimension)")
        if self.input_dtype is None and self.input_high is None:
            return self
        if self.onnx is not None or self.zoo is not None:
            raise ValueError("input_dtype and input_high describe the user's own model (pytorch, exported): an ONNX "
                             "file and a zoo architecture carry their inputs' types")
        named = [value for value in (self.input_shape, self.input_dtype, self.input_high) if isinstance(value, dict)]
        names = sorted({name for value in named for name in value}) or ["input"]
        unbounded = [name for name, (dtype, high) in self.input_types(names).items() if dtype == "int64" and not high]
        if unbounded:
            raise ValueError("int64 inputs need input_high (their exclusive upper bound, e.g. the vocabulary size): "
                             f"none for {', '.join(unbounded)}")
        return self

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


class Objective(Strict):
    """What to optimize. ``time_to_solution`` amortizes compile/tune time over ``steps``."""

    metric: Metric = Metric.throughput
    steps: PositiveInt | None = Field(None, description="Steps (batches) the job runs; needed for time_to_solution.")

    @model_validator(mode="after")
    def _steps_for_tts(self) -> Objective:
        if self.metric is Metric.time_to_solution and self.steps is None:
            raise ValueError("metric 'time_to_solution' needs 'steps' (how many batches the job runs)")
        return self


class Constraints(Strict):
    max_image_size_gb: PositiveFloat | None = None
    max_compile_seconds: Annotated[float, Field(ge=0)] | None = None
    max_latency_ms: PositiveFloat | None = Field(
        None, description="Largest predicted time of one step (one batch), in milliseconds: slower candidates are "
                          "left out; with model.batch_size auto it bounds the batch.")
    runtimes: list[Name] | None = Field(None, description="Allowed runtime names (see recipes/runtimes).")
    max_slowdown: Annotated[float, Field(ge=1)] | None = Field(
        None, description="Largest predicted slowdown this job accepts when `modak pack` co-locates it with other "
                          "jobs (its step time sharing a node or GPU over its step time alone on the target), e.g. "
                          "1.3; without it, any slowdown that raises the group's throughput is accepted.")


class AccuracyMetric(str, Enum):
    top1_agreement = "top1_agreement"
    relative_error = "relative_error"


class Calibration(Strict):
    """Sample inputs that int8 quantization calibrates on and the accuracy gate compares int8 with fp32 on."""

    data: str | None = Field(
        None, description="Folder of sample inputs, relative to the job file: .npz files holding one array per "
                          "input name, or .npy files for a single-input model; an array is one sample (the "
                          "input's per-sample shape) or a stack of samples ([n, *shape]); files are read in name "
                          "order. Without it, modak calibrates and checks on seeded random inputs.")
    samples: PositiveInt = Field(64, description="Samples to use (the first ones of the folder, or random ones).")


class Accuracy(Strict):
    """How far an int8 candidate's outputs may move from fp32 on the calibration samples."""

    metric: AccuracyMetric | None = Field(
        None, description="top1_agreement: the argmax of the first output per sample agrees with fp32 (drop = 1 - "
                          "agreement); relative_error: max |int8 - fp32| / max |fp32| over all outputs (drop = the "
                          "error). Default: top1_agreement when the first output has several values per sample "
                          "(a classifier), else relative_error.")
    max_drop: Annotated[float, Field(ge=0, le=1)] | None = Field(
        None, description="Largest drop allowed; default 0.01 for top1_agreement, 0.1 for relative_error.")


class UserCode(Strict):
    """The user's own entry point and requirements, added to the image."""

    command: list[Text] = Field(default_factory=list, description="Command run instead of modak's runner (exec form).")
    requirements: list[Requirement] = Field(default_factory=list)
    files: list[Text] = Field(default_factory=list,
                              description="Files or folders (relative to the job file) copied to /opt/app.")


ContainerPath = Annotated[str, StringConstraints(pattern=r"^/[A-Za-z0-9_./-]*$")]


class DataSpec(Strict):
    location: Text = Field(description="Host path of the data set, bind-mounted read-only at `mount`.")
    mount: ContainerPath = "/data"
    output: Text | None = Field(
        None, description="Host folder the job writes its results to (created if missing), bind-mounted read-write "
                          "at `output_mount`; an inference job's script then runs batch inference over `mount` "
                          "into it by default (modak run).")
    output_mount: ContainerPath = "/output"

    @model_validator(mode="after")
    def _distinct_mounts(self) -> DataSpec:
        if self.output is not None and self.output_mount.rstrip("/") == self.mount.rstrip("/"):
            raise ValueError(f"output_mount {self.output_mount} is the data set's mount; give the results their own")
        return self


class Scaling(Strict):
    """Data-parallel training across GPUs and nodes (`modak scale`): how many workers the job script requests."""

    min_efficiency: Annotated[float, Field(gt=0, le=1)] = Field(
        0.8, description="Smallest parallel efficiency to accept: one worker's step time over the predicted step "
                         "time with N workers at the same per-worker batch (weak scaling). The job runs on the "
                         "largest N that keeps it.")
    max_workers: PositiveInt | None = Field(
        None, description="Most workers to consider (GPUs; nodes for a CPU job, one process each); default all "
                          "the target has (nodes x gpus.count). Beyond one node, whole nodes only (rounded down).")
    gradient_dtype: Literal["fp32", "bf16", "fp16"] = Field(
        "fp32", description="What the gradients are all-reduced in. fp32 (default) under autocast, which keeps "
                            "parameters and their gradients in fp32 (modak.runtime.torch does); bf16/fp16 when the "
                            "training script compresses them (e.g. DDP's bf16_compress_hook) or trains a half "
                            "model. Halves the bytes each step exchanges.")
    measured: dict[PositiveInt, PositiveFloat] = Field(
        default_factory=dict, description="Measured seconds per step by worker count, e.g. {1: 0.210, 2: 0.236} "
                                          "(same per-worker batch): the model fits its parameters to them, as "
                                          "`modak scale --measured` does, before choosing the worker count.")


class Job(Strict):
    """A data scientist's job: what to run and what to optimize."""

    apiVersion: Literal["modak/v1"]
    kind: Literal["Job"]
    name: Name
    target: Text | None = Field(None, description="Target file, relative to the job file (or use --target); 'local' "
                                                   "is the machine modak runs on, from its cached `modak probe`.")
    task: Task
    model: ModelSpec
    loss: Loss | None = Field(
        None, description="Training only: the loss the step measures: a built-in (cross_entropy on class labels, "
                          "mse against targets shaped like the outputs) or `module:function` (a .py file relative to "
                          "the job file, or an importable module) called as function(outputs, batch). Default: the "
                          "mean square of the outputs (random data, the work of a real step).")
    precision: list[Precision] = Field(default_factory=lambda: [Precision.fp32], min_length=1)
    frameworks: Literal["any"] | list[Name] = "any"
    device: Device = Device.any
    objective: Objective = Objective()
    constraints: Constraints = Constraints()
    entrypoint: UserCode | None = None
    data: DataSpec | None = None
    calibration: Calibration = Calibration()
    accuracy: Accuracy = Accuracy()
    scaling: Scaling | None = Field(
        None, description="Training only: scale out data-parallel (see `modak scale`); the job script then "
                          "requests the largest worker count that keeps min_efficiency, and launches one process "
                          "per worker with torchrun.")


class CpuPeaks(Strict):
    """Measured CPU ceilings for the whole node (e.g. from `modak probe`)."""

    fp32_gflops: PositiveFloat | None = None
    bf16_gflops: PositiveFloat | None = None
    fp16_gflops: PositiveFloat | None = None
    int8_gops: PositiveFloat | None = None
    memory_bandwidth_gbs: PositiveFloat | None = None
    core_memory_bandwidth_gbs: PositiveFloat | None = Field(
        None, description="Stream triad of one core alone (`modak probe`'s one-thread triad): the bandwidth a job "
                          "given part of a node (scheduler.cores_per_job) draws per core, up to the node's.")


class Cpu(Strict):
    microarchitecture: str = Field(description="archspec microarchitecture name, e.g. zen4, icelake, neoverse_v1.")
    sockets: PositiveInt = 1
    cores_per_socket: PositiveInt
    threads_per_core: PositiveInt = 1
    frequency_ghz: PositiveFloat | None = Field(None,
                                                description="Sustained all-core clock; catalog default if absent.")
    peaks: CpuPeaks = CpuPeaks()


class Memory(Strict):
    size_gb: PositiveFloat
    bandwidth_gbs: PositiveFloat | None = Field(None, description="Node memory bandwidth (stream triad).")


class GpuPeaks(Strict):
    fp32_tflops: PositiveFloat | None = None
    tf32_tflops: PositiveFloat | None = None
    bf16_tflops: PositiveFloat | None = None
    fp16_tflops: PositiveFloat | None = None
    int8_tops: PositiveFloat | None = None
    memory_bandwidth_gbs: PositiveFloat | None = None


class Gpus(Strict):
    model: str = Field(description="GPU model; peaks come from recipes/hardware/gpus.yaml unless given.")
    count: PositiveInt = 1
    memory_gb: PositiveFloat | None = None
    peaks: GpuPeaks = GpuPeaks()


class Network(Strict):
    """How the nodes are connected; the scaling model's alpha and beta (recipes/hardware/interconnects.yaml
    gives the defaults per interconnect)."""

    interconnect: Literal["ethernet", "roce", "infiniband", "omnipath", "slingshot", "none"] = Field(
        "ethernet", description="ethernet (TCP), roce (RDMA over Converged Ethernet), infiniband, omnipath, "
                                "slingshot, or none (the nodes are not connected: jobs scale within one node).")
    bandwidth_gbps: PositiveFloat | None = Field(
        None, description="Each node's network bandwidth per direction, Gbit/s (a 200 Gbit/s HDR port: 200).")
    latency_us: PositiveFloat | None = Field(
        None, description="Latency of one step of a collective across the network, microseconds (default: "
                          "NCCL's tuning constant, 14).")
    efficiency: Annotated[float, Field(gt=0, le=1)] | None = Field(
        None, description="The share of bandwidth_gbps a collective's data moves at (nccl-tests' all_reduce busbw "
                          "/ line rate; default: 0.54 for ethernet, TCP sockets; 1 for the RDMA networks).")


class Scheduler(Strict):
    kind: SchedulerKind = "none"
    allocation: Allocation = Field(
        "exclusive", description="exclusive: a job's cores are its own (Slurm/PBS core binding, --exclusive, "
                                 "Kubernetes' static CPU manager); shared: other work runs on them (oversubscribed "
                                 "nodes, a CPU quota without pinning, workstations). Parameters such as wait_policy "
                                 "keep only the value that can win on it.")
    cores_per_job: PositiveInt | None = Field(
        None, description="Cores of a node one job gets (Slurm --cpus-per-task, PBS ncpus, a cpuset), when jobs get "
                          "part of a node; default: all of its cores. Compute ceilings scale with the share, memory "
                          "bandwidth with the cores at cpu.peaks.core_memory_bandwidth_gbs each, up to the node's "
                          "(see modak.hardware.ceilings).")
    co_runners: Annotated[int, Field(ge=0)] = Field(
        0, description="CPU-bound processes (one busy thread each) that run on the job's cores beside it, time-"
                       "sliced by the operating system: `modak whatif` predicts the job's step with the sharing "
                       "model of `modak pack`. Needs allocation: shared.")
    partition: SchedulerWord | None = None
    account: SchedulerWord | None = None
    qos: SchedulerWord | None = None
    time_limit: TimeLimit = "01:00:00"

    @model_validator(mode="after")
    def _co_runners_share(self) -> Scheduler:
        if self.co_runners and self.allocation != "shared":
            raise ValueError("co_runners needs allocation: shared (exclusive cores run nothing else)")
        return self


class Container(Strict):
    engine: EngineName = "podman"
    registry: ImageRef | None = Field(None, description="Registry/namespace images are pushed to.")
    base_images: dict[Name, ImageRef] = Field(
        default_factory=dict, description="Site mirrors for the logical base images of recipes (e.g. debian, cuda).")
    templates: Text | None = Field(
        None, description="Folder of site templates, relative to the target file: a template there replaces "
                          "modak's of the same relative path (e.g. dockerfile/Dockerfile.j2) and can extend it "
                          "as modak/<path>.")


class PythonPackages(Strict):
    index_url: Url | None = None
    extra_index_urls: list[Url] = Field(default_factory=list)
    wheelhouse: Text | None = Field(None, description="Folder of wheels, relative to the target file.")
    ca_bundle: Text | None = Field(None,
                                   description="CA bundle for TLS-intercepting proxies, used only while building.")
    recipe_indexes: bool = Field(
        True, description="Use the extra indexes runtime recipes name (e.g. PyTorch's CPU wheel index); false on "
                          "sites that cannot reach them (serve those wheels from index_url or the wheelhouse).")


class Cost(Strict):
    """What running on the target costs: `modak whatif` prices each target's time to solution with it."""

    per_node_hour: Annotated[float, Field(ge=0)] = Field(
        description="Price of one node for one hour; a job given part of a node (scheduler.cores_per_job) pays "
                    "its share of the cores.")
    currency: Annotated[str, StringConstraints(pattern=r"^[A-Z]{3}$")] = Field(
        "EUR", description="ISO 4217 code of the price's currency; targets compared by cost must use the same.")


class Target(Strict):
    """A platform engineer's description of where jobs run."""

    apiVersion: Literal["modak/v1"]
    kind: Literal["Target"]
    name: Name
    nodes: PositiveInt = 1
    cpu: Cpu = Field(description="The nodes' CPU. In a target file, 'cpu: local' takes this section (and memory, "
                                  "unless given) from the cached `modak probe` of the machine modak runs on.")
    memory: Memory
    gpus: Gpus | None = None
    network: Network = Network()
    scheduler: Scheduler = Scheduler()
    container: Container = Container()
    python: PythonPackages = PythonPackages()
    cost: Cost | None = Field(None, description="Price of the target's nodes (optional): `modak whatif` adds cost "
                                                "and the Pareto front of time against cost.")
