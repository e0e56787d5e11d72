"""The typed, immutable Target specification (``kind: Target``): where jobs run, as a platform engineer describes it.

As in :mod:`modak.spec.models`, every string that later lands in a build file or script is constrained here to a
safe alphabet or escaped by the renderer.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Literal

from msgspec import Meta, field

from modak.schedulers import SCHEDULERS
from modak.spec.fields import ImageRef, Name, PositiveFloat, PositiveInt, SchedulerWord, Strict, Text, TimeLimit, Url
from modak.spec.names import EngineName

# A target's scheduler.kind: a registered scheduler (modak.schedulers); a Literal of their names for validation (the
# errors and the JSON Schema's enum list them), a string for static type checkers.
if TYPE_CHECKING:
    SchedulerKind = str
else:
    SchedulerKind = Literal[SCHEDULERS.names()]
Allocation = Literal["exclusive", "shared"]  # a target's scheduler.allocation: are a job's cores its own?
Interconnect = Literal["ethernet", "roce", "infiniband", "omnipath", "slingshot", "none"]  # network.interconnect
SifCompression = Literal["gzip", "gzip-fast", "zstd"]  # container.sif_compression (render.ir.MKSQUASHFS_ARGS)


class CpuPeaks(Strict, frozen=True, kw_only=True):
    """Measured CPU ceilings for the whole node (e.g. from `modak probe`)."""

    fp32_gflops: Annotated[PositiveFloat | None, Meta(description=
        "fp32 GEMM peak of the node, GFLOP/s (`modak probe`: its best over thread counts); default: "
        "recipes/hardware/cpus.yaml's operations per cycle per core x frequency_ghz x cores.")] = None
    bf16_gflops: Annotated[PositiveFloat | None, Meta(description=
        "bf16 GEMM peak of the node, GFLOP/s (`modak probe`, where it measures one); default: "
        "recipes/hardware/cpus.yaml's, only on a CPU with bf16 instructions.")] = None
    fp16_gflops: Annotated[PositiveFloat | None, Meta(description=
        "fp16 peak of the node, GFLOP/s; default: recipes/hardware/cpus.yaml's, only on a CPU with fp16 "
        "instructions.")] = None
    int8_gops: Annotated[PositiveFloat | None, Meta(description=
        "int8 GEMM peak of the node, GOP/s (`modak probe`, where it measures one); default: "
        "recipes/hardware/cpus.yaml's int8, else 4x its fp32 with dot-product instructions, 2x with AVX2 "
        "alone.")] = None
    memory_bandwidth_gbs: Annotated[PositiveFloat | None, Meta(description=
        "Stream triad of the whole node, GB/s (`modak probe`: its best over thread counts); default: "
        "memory.bandwidth_gbs, else recipes/hardware/cpus.yaml's per socket x cpu.sockets.")] = None
    core_memory_bandwidth_gbs: Annotated[PositiveFloat | None, Meta(description=
        "Stream triad of one core alone (`modak probe`'s one-thread triad): the bandwidth a job given part of "
        "a node (scheduler.cores_per_job) draws per core, up to the node's.")] = None


class Cpu(Strict, frozen=True, kw_only=True):
    microarchitecture: Annotated[str, Meta(description=
        "archspec microarchitecture name, e.g. zen4, icelake, neoverse_v1.")]
    sockets: Annotated[PositiveInt, Meta(description=
        "CPU sockets per node; the catalog's memory bandwidth (recipes/hardware/cpus.yaml) is per socket.")] = 1
    cores_per_socket: Annotated[PositiveInt, Meta(description=
        "Physical cores per socket: a node's sockets x cores_per_socket cores scale the catalog's compute peaks "
        "and are the default and the upper bound of scheduler.cores_per_job.")]
    threads_per_core: Annotated[PositiveInt, Meta(description=
        "Hardware threads per core (2 with SMT/Hyper-Threading), as `modak probe` finds them.")] = 1
    frequency_ghz: Annotated[PositiveFloat | None, Meta(description=
        "Sustained all-core clock; catalog default if absent.")] = None
    peaks: Annotated[CpuPeaks, Meta(description=
        "Measured ceilings of the whole node (`modak probe` writes them); each one given replaces the value "
        "derived from recipes/hardware/cpus.yaml.")] = CpuPeaks()


class Memory(Strict, frozen=True, kw_only=True):
    size_gb: Annotated[PositiveFloat, Meta(description=
        "Main memory of one node, GB: CPU candidates whose parameters (and training state) need more than 90% of "
        "it are left out.")]
    bandwidth_gbs: Annotated[PositiveFloat | None, Meta(description="Node memory bandwidth (stream triad).")] = None


class GpuPeaks(Strict, frozen=True, kw_only=True):
    fp32_tflops: Annotated[PositiveFloat | None, Meta(description=
        "fp32 peak of one GPU, TFLOP/s (`modak probe`: a GEMM); default: recipes/hardware/gpus.yaml's for "
        "gpus.model.")] = None
    tf32_tflops: Annotated[PositiveFloat | None, Meta(description=
        "TF32 tensor-core peak of one GPU, TFLOP/s (`modak probe`: a GEMM); default: recipes/hardware/gpus.yaml's "
        "for gpus.model.")] = None
    bf16_tflops: Annotated[PositiveFloat | None, Meta(description=
        "bf16 peak of one GPU, TFLOP/s (`modak probe`: a GEMM); default: recipes/hardware/gpus.yaml's for "
        "gpus.model.")] = None
    fp16_tflops: Annotated[PositiveFloat | None, Meta(description=
        "fp16 peak of one GPU, TFLOP/s (`modak probe`: a GEMM); default: recipes/hardware/gpus.yaml's for "
        "gpus.model.")] = None
    int8_tops: Annotated[PositiveFloat | None, Meta(description=
        "int8 peak of one GPU, TOP/s; default: recipes/hardware/gpus.yaml's for gpus.model.")] = None
    memory_bandwidth_gbs: Annotated[PositiveFloat | None, Meta(description=
        "Memory bandwidth of one GPU, GB/s (`modak probe`: a stream triad); default: recipes/hardware/gpus.yaml's "
        "for gpus.model.")] = None
    h2d_pinned_gbs: Annotated[PositiveFloat | None, Meta(
        description="Host-to-GPU copy bandwidth from pinned host memory, GB/s (modak probe on a GPU).")] = None
    h2d_pageable_gbs: Annotated[PositiveFloat | None, Meta(
        description="Host-to-GPU copy bandwidth from pageable host memory, GB/s (modak probe on a GPU).")] = None
    d2h_pinned_gbs: Annotated[PositiveFloat | None, Meta(
        description="GPU-to-host copy bandwidth into pinned host memory, GB/s (modak probe on a GPU).")] = None
    d2h_pageable_gbs: Annotated[PositiveFloat | None, Meta(
        description="GPU-to-host copy bandwidth into pageable host memory, GB/s (modak probe on a GPU).")] = None


class Gpus(Strict, frozen=True, kw_only=True):
    model: Annotated[str, Meta(description="GPU model; peaks come from recipes/hardware/gpus.yaml unless given.")]
    count: Annotated[PositiveInt, Meta(description=
        "GPUs per node: a GPU candidate's job script and self-test get all of them, and data-parallel scaling "
        "runs one worker on each.")] = 1
    memory_gb: Annotated[PositiveFloat | None, Meta(description=
        "Memory of one GPU, GB (default: recipes/hardware/gpus.yaml's; needed for a model not there): GPU "
        "candidates whose parameters (and training state) need more than 90% of it are left out.")] = None
    peaks: Annotated[GpuPeaks, Meta(description=
        "Ceilings of one GPU; each one given replaces recipes/hardware/gpus.yaml's (a model not there needs "
        "fp32_tflops and memory_bandwidth_gbs).")] = GpuPeaks()


class Network(Strict, frozen=True, kw_only=True):
    """How the nodes are connected; the scaling model's alpha and beta (recipes/hardware/interconnects.yaml
    gives the defaults per interconnect)."""

    interconnect: Annotated[Interconnect, Meta(description=
        "ethernet (TCP), roce (RDMA over Converged Ethernet), infiniband, omnipath, slingshot, or none "
        "(the nodes are not connected: jobs scale within one node).")] = "ethernet"
    bandwidth_gbps: Annotated[PositiveFloat | None, Meta(description=
        "Each node's network bandwidth per direction, Gbit/s (a 200 Gbit/s HDR port: 200).")] = None
    latency_us: Annotated[PositiveFloat | None, Meta(description=
        "Latency of one step of a collective across the network, microseconds (default: NCCL's tuning "
        "constant, 14).")] = None
    efficiency: Annotated[Annotated[float, Meta(gt=0, le=1)] | None, Meta(description=
        "The share of bandwidth_gbps a collective's data moves at (nccl-tests' all_reduce busbw / line rate; "
        "default: 0.54 for ethernet, TCP sockets; 1 for the RDMA networks).")] = None


class Scheduler(Strict, frozen=True, kw_only=True):
    kind: Annotated[SchedulerKind, Meta(description=
        "What takes the job script: slurm (sbatch), pbs (qsub) or none (bash on the machine modak runs on, in the "
        "background).")] = "none"
    allocation: Annotated[Allocation, Meta(description=
        "exclusive: a job's cores are its own (Slurm/PBS core binding, --exclusive, Kubernetes' static "
        "CPU manager); shared: other work runs on them (oversubscribed nodes, a CPU quota without "
        "pinning, workstations). Parameters such as wait_policy keep only the value that can win on "
        "it.")] = "exclusive"
    cores_per_job: Annotated[PositiveInt | None, Meta(description=
        "Cores of a node one job gets (Slurm --cpus-per-task, PBS ncpus, a cpuset), when jobs get part of a "
        "node; default: all of its cores. Compute ceilings scale with the share, memory bandwidth with the "
        "cores at cpu.peaks.core_memory_bandwidth_gbs each, up to the node's (see modak.hardware.ceilings).")] = None
    co_runners: Annotated[int, Meta(ge=0, description=
        "CPU-bound processes (one busy thread each) that run on the job's cores beside it, time-sliced by the "
        "operating system: `modak whatif` predicts the job's step with the sharing model of `modak pack`. Needs "
        "allocation: shared.")] = 0
    partition: Annotated[SchedulerWord | None, Meta(description=
        "Partition (Slurm --partition) or queue (PBS -q) the job script asks for; `modak tune --dispatch` "
        "submits its job arrays there too.")] = None
    account: Annotated[SchedulerWord | None, Meta(description=
        "Account the job is charged to (Slurm --account, PBS -A).")] = None
    qos: Annotated[SchedulerWord | None, Meta(description=
        "Quality of service the job script asks for (Slurm --qos; PBS job scripts do not use it).")] = None
    time_limit: Annotated[TimeLimit, Meta(description=
        "Wall-clock limit of the job, in Slurm's syntax (M:S, H:M:S, D-H:M or D-H:M:S; default one hour); PBS "
        "job scripts get it as walltime H:MM:SS.")] = "01:00:00"

    def __post_init__(self) -> None:
        if self.co_runners and self.allocation != "shared":
            raise ValueError("co_runners needs allocation: shared (exclusive cores run nothing else)")


class Container(Strict, frozen=True, kw_only=True):
    engine: Annotated[EngineName, Meta(description=
        "docker, podman or apptainer: the engine that builds and tests the image and that the job script runs it "
        "with (`modak build --engine` overrides it for the build).")] = "podman"
    registry: Annotated[ImageRef | None, Meta(description="Registry/namespace images are pushed to.")] = None
    base_images: Annotated[dict[Name, ImageRef], Meta(description=
        "Site mirrors for the logical base images of recipes (e.g. debian, cuda).")] = field(default_factory=dict)
    templates: Annotated[Text | None, Meta(description=
        "Folder of site templates, relative to the target file: a template there replaces modak's of the same "
        "relative path (e.g. dockerfile/Dockerfile.j2) and can extend it as modak/<path>.")] = None
    sif_compression: Annotated[SifCompression, Meta(description=
        "How a SIF file's squashfs is compressed (Apptainer builds and `modak build --sif`): gzip, Apptainer's "
        "default, which every site can mount; gzip-fast, gzip level 1, which every site can mount, squashed several "
        "times faster into a somewhat larger file; zstd, level 3, squashed more than ten times faster into a file "
        "about as small as gzip's, which the nodes that run it must be able to read: Linux 4.14 or later for kernel "
        "mounts, a squashfuse built with zstd for unprivileged ones. Other than gzip needs Apptainer 1.4 or later "
        "(build --mksquashfs-args).")] = "gzip"


class PythonPackages(Strict, frozen=True, kw_only=True):
    index_url: Annotated[Url | None, Meta(description=
        "The package index pip installs from while building (pip --index-url; e.g. a site mirror of PyPI); "
        "default: pip's, PyPI.")] = None
    extra_index_urls: Annotated[list[Url], Meta(description=
        "More package indexes pip searches while building (pip --extra-index-url), beside those runtime recipes "
        "name (see recipe_indexes).")] = field(default_factory=list)
    wheelhouse: Annotated[Text | None, Meta(description="Folder of wheels, relative to the target file.")] = None
    ca_bundle: Annotated[Text | None, Meta(description=
        "CA bundle for TLS-intercepting proxies, used only while building.")] = None
    recipe_indexes: Annotated[bool, Meta(description=
        "Use the extra indexes runtime recipes name (e.g. PyTorch's CPU wheel index); false on sites that "
        "cannot reach them (serve those wheels from index_url or the wheelhouse).")] = True


class Cost(Strict, frozen=True, kw_only=True):
    """What running on the target costs: `modak whatif` prices each target's time to solution with it."""

    per_node_hour: Annotated[float, Meta(ge=0, description=
        "Price of one node for one hour; a job given part of a node (scheduler.cores_per_job) pays its share of the "
        "cores.")]
    currency: Annotated[str, Meta(pattern=r"^[A-Z]{3}$", description=
        "ISO 4217 code of the price's currency; targets compared by cost must use the same.")] = "EUR"


class Target(Strict, frozen=True, kw_only=True):
    """A platform engineer's description of where jobs run."""

    apiVersion: Annotated[Literal["modak/v1"], Meta(description="The spec's version: modak/v1, the only one.")]
    kind: Annotated[Literal["Target"], Meta(description="Target: this document is a target spec.")]
    name: Annotated[Name, Meta(description=
        "The target's name (letters, digits, . _ -; at most 63 characters): the images' io.modak.target label, "
        "and the machine that `modak bench` and `modak tune` store measurements under.")]
    nodes: Annotated[PositiveInt, Meta(description=
        "Nodes of the target: a plan runs on one, and data-parallel scaling (job scaling) spreads a training job "
        "over at most this many.")] = 1
    cpu: Annotated[Cpu, Meta(description=
        "The nodes' CPU. In a target file, 'cpu: local' takes this section (and memory, unless given) from the "
        "cached `modak probe` of the machine modak runs on.")]
    memory: Annotated[Memory, Meta(description="Main memory of each node.")]
    gpus: Annotated[Gpus | None, Meta(description=
        "The GPUs of each node; without it, the target has none and only CPU candidates are planned.")] = None
    network: Annotated[Network, Meta(description=
        "How the nodes are connected, for the data-parallel scaling model.")] = Network()
    scheduler: Annotated[Scheduler, Meta(description=
        "What runs the job script, with the share of a node and the directives it asks for.")] = Scheduler()
    container: Annotated[Container, Meta(description=
        "How images are built and run: the engine, registry, base image mirrors and site templates.")] = Container()
    python: Annotated[PythonPackages, Meta(description=
        "Where pip gets packages while building: indexes, a wheelhouse and a CA bundle.")] = PythonPackages()
    cost: Annotated[Cost | None, Meta(description="Price of the target's nodes (optional): `modak whatif` adds cost "
                                                "and the Pareto front of time against cost.")] = None
