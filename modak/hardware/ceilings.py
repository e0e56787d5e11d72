"""Hardware ceilings of a target: measured peaks where the target gives them, catalog data otherwise."""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cache
from typing import Any

from modak.errors import did_you_mean
from modak.spec.document import SpecDocument
from modak.spec.loader import read_catalog
from modak.spec.models import Precision
from modak.spec.target import Target

# ISA features that give a CPU native support for a reduced precision (archspec feature names), with the default
# operations per cycle relative to fp32 when the hardware catalog gives none.
_CPU_PRECISION_FEATURES = {
    Precision.bf16: {"avx512_bf16", "amx_bf16", "bf16"},
    Precision.fp16: {"avx512_fp16", "amx_fp16", "asimdhp"},
    Precision.int8: {"avx512_vnni", "avx_vnni", "amx_int8", "i8mm", "asimddp"},
}
_CPU_PRECISION_FACTOR = {Precision.bf16: 2, Precision.fp16: 2, Precision.int8: 4}
# Without dot-product instructions, x86 int8 still runs as u8 x s8 multiply-adds into 16 bits (vpmaddubsw, AVX2 and
# AVX-512BW: what ONNX Runtime's and oneDNN's int8 kernels use there): about twice fp32's operations per cycle.
_INT8_WITHOUT_DOT_PRODUCT = "avx2"
_INT8_WITHOUT_DOT_PRODUCT_FACTOR = 2
# Tensor-float-32 is a GPU tensor-core mode; on a CPU it is plain fp32.
_GPU_PEAK_KEYS = {Precision.fp32: "fp32", Precision.tf32: "tf32", Precision.bf16: "bf16",
                  Precision.fp16: "fp16", Precision.int8: "int8"}


# Pageable host copies against pinned ones where the probe did not measure both (a pageable copy goes through a
# pinned staging buffer of the driver's: about half the pinned rate on PCIe hosts; the probe replaces it).
PAGEABLE_SHARE = 0.5
DEFAULT_HOST_LINK = "pcie4"  # a GPU whose catalog entry names no host_link (as interconnects.yaml's default)


@cache
def interconnects() -> dict[str, Any]:
    """``recipes/hardware/interconnects.yaml``: the links' default alphas and betas (and PCIe's bandwidths)."""
    return read_catalog("hardware/interconnects.yaml")


@dataclass(frozen=True)
class HostLink:
    """GB/s of host <-> GPU copies, each direction, from pinned and from pageable host memory; ``measured``: the
    target's probed figures (else the catalog's PCIe generation)."""

    h2d_pinned_gbs: float
    h2d_pageable_gbs: float
    d2h_pinned_gbs: float
    d2h_pageable_gbs: float
    measured: bool = False

    @classmethod
    def of_link(cls, link: str) -> HostLink:
        """An x16 link of PCIe generation ``link`` (interconnects.yaml's per-direction bandwidth), pageable copies at
        :data:`PAGEABLE_SHARE`."""
        gbs = float(interconnects()["intra_node"][link]["bandwidth_gbs"])
        return cls(gbs, gbs * PAGEABLE_SHARE, gbs, gbs * PAGEABLE_SHARE)

    @classmethod
    def of_catalog(cls, model: str | None) -> HostLink:
        """The catalog GPU ``model``'s host link (its entry's ``host_link``; an unknown GPU's
        :data:`DEFAULT_HOST_LINK`)."""
        return cls.of_link(gpu_entry(model)[1].get("host_link", DEFAULT_HOST_LINK))

    @classmethod
    def unknown(cls) -> HostLink:
        return cls.of_link(DEFAULT_HOST_LINK)


@dataclass(frozen=True)
class Ceilings:
    """Peak compute (GFLOP/s per precision) and memory bandwidth of one device (a CPU node or one GPU).

    ``measured`` says whether the numbers come from measurements (the target's peaks) or the catalog.
    """

    kind: str  # "cpu" or "gpu"
    name: str
    peak_gflops: dict[Precision, float]
    bandwidth_gbs: float
    memory_gb: float
    measured: bool
    core_bandwidth_gbs: float | None = None  # CPU: one core's stream triad, when measured
    host_link: HostLink | None = None  # GPU: its copies to and from the host

    def supports(self, precision: Precision) -> bool:
        """Whether the device runs ``precision`` natively."""
        return precision in self.peak_gflops


@dataclass(frozen=True)
class TargetCeilings:
    """Everything the predictor needs to know about a target's hardware."""

    microarchitecture: str
    features: frozenset[str]
    cores: int  # physical cores per node
    hardware_threads: int
    cpu: Ceilings
    gpu: Ceilings | None
    gpu_count: int
    cuda_capability: str | None

    def compiler_flags(self, gcc: str) -> str:
        """-march/-mtune flags of gcc version ``gcc`` for the target's microarchitecture (never the build host's);
        empty when that gcc does not know it."""
        import archspec.cpu

        try:
            return archspec.cpu.TARGETS[self.microarchitecture].optimization_flags("gcc", gcc)
        except archspec.cpu.UnsupportedMicroarchitecture:
            return ""


@cache
def _catalog(name: str) -> dict[str, Any]:
    return read_catalog(f"hardware/{name}")


def gpu_catalog() -> dict[str, dict[str, Any]]:
    """The GPU catalog, keyed by canonical model name."""
    return _catalog("gpus.yaml")


def target_ceilings(target: Target, doc: SpecDocument) -> TargetCeilings:
    """Resolve the target's ceilings; unknown hardware names are input errors located in ``doc``."""
    import archspec.cpu

    arch_name = target.cpu.microarchitecture
    if arch_name not in archspec.cpu.TARGETS:
        hint = did_you_mean(arch_name, archspec.cpu.TARGETS, cutoff=0.6, list_known=False)
        raise doc.error(("cpu", "microarchitecture"), f"unknown archspec microarchitecture '{arch_name}'{hint}")
    arch = archspec.cpu.TARGETS[arch_name]
    features = frozenset(arch.features)
    node_cores = target.cpu.sockets * target.cpu.cores_per_socket
    cores = target.scheduler.cores_per_job or node_cores
    if cores > node_cores:
        raise doc.error(("scheduler", "cores_per_job"),
                        f"{cores} cores per job, but a node has {node_cores} "
                        f"({target.cpu.sockets} socket(s) x {target.cpu.cores_per_socket})")
    cpu = core_share(_cpu_ceilings(target, arch, features, node_cores), cores, node_cores)
    gpu, capability = (_gpu_ceilings(target, doc) if target.gpus else (None, None))
    return TargetCeilings(
        microarchitecture=arch_name, features=features, cores=cores,
        hardware_threads=cores * target.cpu.threads_per_core, cpu=cpu, gpu=gpu,
        gpu_count=target.gpus.count if target.gpus else 0, cuda_capability=capability)


def bandwidth_share(cores: float, node_cores: int) -> float:
    """The share of a node's memory bandwidth ``cores`` of its ``node_cores`` draw when running alone: a few cores
    already saturate much of it, so the share grows linearly to all of it at half the node's cores."""
    return min(1.0, cores / max(1.0, node_cores / 2))


def core_share(node: Ceilings, cores: int, node_cores: int) -> Ceilings:
    """The CPU ceilings of ``cores`` of a node's ``node_cores`` (``scheduler.cores_per_job``): compute peaks scale
    with the cores; bandwidth is one core's measured triad times the cores, up to the node's (one core of a
    2-vCPU EPYC draws 62-77% of both cores' triad), or :func:`bandwidth_share` of the node's where unmeasured;
    the memory size stays the node's."""
    if cores == node_cores:
        return node
    share = cores / node_cores
    bandwidth = (min(node.bandwidth_gbs, cores * node.core_bandwidth_gbs) if node.core_bandwidth_gbs
                 else node.bandwidth_gbs * bandwidth_share(cores, node_cores))
    return replace(node, peak_gflops={p: g * share for p, g in node.peak_gflops.items()}, bandwidth_gbs=bandwidth)


def cpu_catalog_entry(arch: Any) -> dict[str, Any]:
    """The hardware catalog's entry for an archspec microarchitecture (or its nearest known ancestor)."""
    table = _catalog("cpus.yaml")
    for candidate in [arch, *arch.ancestors]:
        if candidate.name in table:
            return table[candidate.name]
    return table[arch.family.name]


def _cpu_ceilings(target: Target, arch: Any, features: frozenset[str], cores: int) -> Ceilings:
    entry = cpu_catalog_entry(arch)
    frequency = target.cpu.frequency_ghz or entry["frequency_ghz"]
    peaks = target.cpu.peaks
    measured = {Precision.fp32: peaks.fp32_gflops, Precision.bf16: peaks.bf16_gflops,
                Precision.fp16: peaks.fp16_gflops, Precision.int8: peaks.int8_gops}
    peak: dict[Precision, float] = {}
    for precision in (Precision.fp32, Precision.bf16, Precision.fp16, Precision.int8):
        if precision is Precision.fp32:
            factor: float | None = 1
        elif features & _CPU_PRECISION_FEATURES[precision]:
            factor = _CPU_PRECISION_FACTOR[precision]
        elif precision is Precision.int8 and _INT8_WITHOUT_DOT_PRODUCT in features:
            factor = _INT8_WITHOUT_DOT_PRODUCT_FACTOR
        else:
            factor = None
        given = measured[precision]
        if given:
            peak[precision] = float(given)
        elif factor is not None:
            peak[precision] = entry.get(precision.value, entry["fp32"] * factor) * frequency * cores
    bandwidth = (peaks.memory_bandwidth_gbs or target.memory.bandwidth_gbs
                 or entry["bandwidth_gbs_per_socket"] * target.cpu.sockets)
    return Ceilings(kind="cpu", name=arch.name, peak_gflops=peak, bandwidth_gbs=float(bandwidth),
                    memory_gb=target.memory.size_gb,
                    measured=bool(peaks.fp32_gflops and (peaks.memory_bandwidth_gbs or target.memory.bandwidth_gbs)),
                    core_bandwidth_gbs=peaks.core_memory_bandwidth_gbs)


def gpu_entry(model: str | None) -> tuple[str | None, dict[str, Any]]:
    """The catalog name and entry of GPU ``model`` (its name or an alias, in any case); (None, {}) where the catalog
    does not know it."""
    catalog = gpu_catalog()
    aliases = {alias.lower(): name for name, entry in catalog.items() for alias in [name, *entry.get("aliases", [])]}
    canonical = aliases.get((model or "").lower())
    return canonical, catalog.get(canonical, {}) if canonical else {}


def _gpu_ceilings(target: Target, doc: SpecDocument) -> tuple[Ceilings, str | None]:
    assert target.gpus is not None
    gpus = target.gpus
    catalog = gpu_catalog()
    canonical, entry = gpu_entry(gpus.model)
    given = gpus.peaks
    if not entry and not (given.fp32_tflops and given.memory_bandwidth_gbs):
        known = [*catalog, *(a for e in catalog.values() for a in e.get("aliases", []))]
        raise doc.error(("gpus", "model"), f"GPU model '{gpus.model}' is not in the catalog and no peaks are given"
                        f"{did_you_mean(gpus.model, known)}")
    peak: dict[Precision, float] = {}
    for precision, key in _GPU_PEAK_KEYS.items():
        value = getattr(given, f"{key}_tops" if key == "int8" else f"{key}_tflops") or entry.get(key)
        if value:
            peak[precision] = float(value) * 1000.0
    bandwidth = given.memory_bandwidth_gbs or entry["memory_bandwidth_gbs"]
    memory = gpus.memory_gb or entry.get("memory_gb")
    if memory is None:
        raise doc.error(("gpus", "memory_gb"), "GPU memory is unknown for this model; give memory_gb")
    probed = [v for v in (given.h2d_pinned_gbs, given.h2d_pageable_gbs, given.d2h_pinned_gbs, given.d2h_pageable_gbs)
              if v is not None]
    link = (HostLink(probed[0], probed[1], probed[2], probed[3], measured=True) if len(probed) == 4
            else HostLink.of_link(entry.get("host_link", DEFAULT_HOST_LINK)))
    return (Ceilings(kind="gpu", name=canonical or gpus.model, peak_gflops=peak, bandwidth_gbs=float(bandwidth),
                     memory_gb=float(memory), measured=bool(given.fp32_tflops and given.memory_bandwidth_gbs),
                     host_link=link),
            entry.get("cuda_capability"))
