"""Measure this machine's ceilings, as the Empirical Roofline Toolkit does, and describe it as a Target.

GEMM GFLOP/s per precision and thread count as the best of several kernels and sizes (PyTorch's, ONNX Runtime's
MLAS and OpenVINO's oneDNN GEMMs: one library's GEMM may miss the vector units another uses, e.g. PyTorch's at
half the AVX-512 rate of the runtimes' on the machine of the shipped data), each timed in interleaved rounds (a
VM's vCPUs slow down for seconds at a time: timed one after another, a kernel could fall in such a period
whole; perfmodels/README.md, "The probe's GEMM ceiling"), checked against the theoretical peak
(clock x FLOPs per cycle of the microarchitecture x cores); a stream triad repeated, with its spread; cache sizes
from sysfs; the archspec microarchitecture (:func:`host_microarchitecture`); GPU peaks when CUDA is present.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from modak.image.runtimes.base import adapters

GEMM_SIZES = (512, 1024, 2048)
QUICK_GEMM_SIZES = (256, 512)
# The measurement method's version: a probe cached by an older method (`cpu: local`) is measured again. 2: GEMM in
# interleaved rounds (2026-11-26; the single pass of method 1 moved by 1.4x between probes of one VM). 3: a guest's
# microarchitecture named past the flags its hypervisor hides (2026-11-27: method 2 called a Zen 4 guest x86_64_v4).
METHOD = 3
GEMM_ROUNDS = 4  # interleaved rounds over every kernel and size of a thread count
GEMM_ROUND_SECONDS = 0.2  # timing budget of one kernel and size in one round
TRIAD_ELEMENTS = 1 << 25  # 128 MiB per fp32 array: far beyond any last-level cache
TRIAD_REPEATS = 5
ABOVE_THEORY = 1.05  # a measured GEMM this far above the theoretical peak means the clock or the catalog is wrong
BELOW_THEORY = 0.5  # ... this far below it means no kernel reached the vector units' rate
# CPU flags a hypervisor may hide from its guests without changing what the cores compute (the L1D cache flush,
# memory protection keys), which archspec requires of a microarchitecture: a KVM guest's Zen 4 lacks both.
HYPERVISOR_HIDDEN_FLAGS = frozenset({"flush_l1d", "pku"})


@dataclass(frozen=True)
class ProbeResult:
    """What the probe measured; GEMM and triad figures are keyed by thread count."""

    microarchitecture: str
    sockets: int
    cores_per_socket: int
    threads_per_core: int
    memory_gb: float
    caches_kib: dict[str, int]
    gemm_gflops: dict[str, dict[int, float]]  # precision -> threads -> best GFLOP/s over kernels and sizes
    gemm_kernels: dict[str, dict[str, dict[int, float]]]  # precision -> kernel -> threads -> best over sizes
    triad_gbs: dict[int, float]  # threads -> median GB/s over TRIAD_REPEATS
    triad_spread: dict[int, float]  # threads -> (max - min) / median of those repeats
    theoretical_fp32_gflops: float | None  # cores x clock x FLOPs per cycle (recipes/hardware/cpus.yaml)
    frequency_ghz: float | None
    frequency_source: str
    warnings: tuple[str, ...] = ()
    # which other processes ran on this process's CPUs while it measured (modak.runtime.measure.contention_reasons):
    # its ceilings are then low; empty: it ran alone
    contention: tuple[str, ...] = ()
    gpu: dict[str, Any] | None = None
    seconds: float = 0.0
    host: str = field(default_factory=platform.node)

    def to_json(self) -> str:
        """The result as JSON (thread counts become string keys)."""
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> ProbeResult:
        """Inverse of :meth:`to_json`."""
        data = json.loads(text)

        def by_threads(values: dict[str, float]) -> dict[int, float]:
            return {int(t): float(v) for t, v in values.items()}

        return cls(**{**data, "gemm_gflops": {p: by_threads(v) for p, v in data["gemm_gflops"].items()},
                      "gemm_kernels": {p: {k: by_threads(v) for k, v in kernels.items()}
                                       for p, kernels in data["gemm_kernels"].items()},
                      "triad_gbs": by_threads(data["triad_gbs"]), "triad_spread": by_threads(data["triad_spread"]),
                      "warnings": tuple(data["warnings"]), "contention": tuple(data.get("contention", ()))})


def probe(thread_counts: list[int] | None = None, quick: bool = False) -> ProbeResult:
    """Run the measurements (about 40 s on a 2-core machine; ``quick`` shrinks the problem sizes)."""
    import torch

    from modak.runtime.measure import CpuWatch, contention_reasons

    start = time.perf_counter()
    sockets, cores_per_socket, threads_per_core = _topology()
    cores = sockets * cores_per_socket
    counts = sorted(set(thread_counts or _default_thread_counts(cores)))
    sizes = QUICK_GEMM_SIZES if quick else GEMM_SIZES
    elements = TRIAD_ELEMENTS // 4 if quick else TRIAD_ELEMENTS  # 32 MiB arrays still exceed the caches
    precisions = ["fp32", *(["bf16"] if native_bf16() else []), "int8"]
    kernels: dict[str, dict[str, dict[int, float]]] = {p: {} for p in precisions}
    triad: dict[int, float] = {}
    spread: dict[int, float] = {}
    saved = torch.get_num_threads()
    try:
        with CpuWatch() as watch:
            for threads in counts:
                torch.set_num_threads(threads)
                for (precision, kernel), rate in gemm_rates(precisions, threads, sizes).items():
                    kernels[precision].setdefault(kernel, {})[threads] = rate
                runs = [_triad_gbs(torch, elements, "cpu") for _ in range(TRIAD_REPEATS)]
                triad[threads] = statistics.median(runs)
                spread[threads] = (max(runs) - min(runs)) / triad[threads]
    finally:
        torch.set_num_threads(saved)
    gemm = {p: {t: max(by_kernel[t] for by_kernel in kernels[p].values() if t in by_kernel) for t in counts}
            for p in precisions if kernels[p]}
    arch = host_microarchitecture()
    frequency, source = _frequency_ghz()
    theoretical = _theoretical_fp32(arch, frequency, cores)
    return ProbeResult(
        microarchitecture=arch.name, sockets=sockets, cores_per_socket=cores_per_socket,
        threads_per_core=threads_per_core, memory_gb=_memory_gb(), caches_kib=_caches_kib(), gemm_gflops=gemm,
        gemm_kernels=kernels, triad_gbs=triad, triad_spread=spread, theoretical_fp32_gflops=theoretical,
        frequency_ghz=frequency, frequency_source=source,
        warnings=_warnings(max(gemm["fp32"].values()), theoretical, frequency, source),
        # Other processes only: steal time is the VM's own weather (0.1 CPUs is common on the CI VMs), which the
        # interleaved rounds already take the best of, and which probing again would not stop.
        contention=tuple(contention_reasons({**watch.report(), "steal_cores": None})), gpu=_probe_gpu(torch, quick),
        seconds=time.perf_counter() - start)


def to_target(result: ProbeResult, name: str) -> dict[str, Any]:
    """A Target document (plain data) for the measured machine; ceilings at the most threads measured."""
    return {"apiVersion": "modak/v1", "kind": "Target", "name": name, **target_sections(result)}


def target_sections(result: ProbeResult) -> dict[str, Any]:
    """The ``cpu``, ``memory`` (and ``gpus``) sections of a Target for the measured machine."""
    top = max(result.triad_gbs)
    peaks: dict[str, float] = {"fp32_gflops": round(max(result.gemm_gflops["fp32"].values()), 1),
                               "memory_bandwidth_gbs": round(max(result.triad_gbs.values()), 1)}
    if 1 in result.triad_gbs and top > 1:
        peaks["core_memory_bandwidth_gbs"] = round(result.triad_gbs[1], 1)
    if "bf16" in result.gemm_gflops:
        peaks["bf16_gflops"] = round(max(result.gemm_gflops["bf16"].values()), 1)
    if result.gemm_gflops.get("int8"):
        peaks["int8_gops"] = round(max(result.gemm_gflops["int8"].values()), 1)
    sections: dict[str, Any] = {
        "cpu": {"microarchitecture": result.microarchitecture, "sockets": result.sockets,
                "cores_per_socket": result.cores_per_socket, "threads_per_core": result.threads_per_core,
                "peaks": peaks},
        "memory": {"size_gb": round(result.memory_gb, 1), "bandwidth_gbs": round(result.triad_gbs[top], 1)},
    }
    if result.gpu:
        sections["gpus"] = {"model": result.gpu["model"], "count": result.gpu["count"],
                            "memory_gb": result.gpu["memory_gb"], "peaks": result.gpu["peaks"]}
    return sections


def probe_comment(result: ProbeResult) -> str:
    """A YAML comment block recording the raw measurements behind the Target's peaks."""
    lines = [f"Written by `modak probe` on {result.host} in {result.seconds:.0f} s.",
             f"caches (KiB): {result.caches_kib}"]
    for precision, by_threads in result.gemm_gflops.items():
        lines.append(f"GEMM {precision} {'GOP/s' if precision == 'int8' else 'GFLOP/s'} by threads (best kernel): "
                     + ", ".join(f"{t}: {v:.1f}" for t, v in sorted(by_threads.items())))
        for kernel, rates in sorted(result.gemm_kernels[precision].items()):
            lines.append(f"  {kernel}: " + ", ".join(f"{t}: {v:.1f}" for t, v in sorted(rates.items())))
    if result.theoretical_fp32_gflops:
        lines.append(f"theoretical fp32 peak: {result.theoretical_fp32_gflops:.1f} GFLOP/s at "
                     f"{result.frequency_ghz:.2f} GHz ({result.frequency_source})")
    lines.append(f"stream triad GB/s by threads (median of {TRIAD_REPEATS}, spread): " + ", ".join(
        f"{t}: {v:.1f} ({result.triad_spread[t]:.0%})" for t, v in sorted(result.triad_gbs.items())))
    lines += [f"warning: {w}" for w in (*result.warnings, *contention_warning(result))]
    return "".join(f"# {line}\n" for line in lines)


def contention_warning(result: ProbeResult) -> tuple[str, ...]:
    """What to tell the user when the probe did not run alone (empty when it did)."""
    if not result.contention:
        return ()
    return (f"the probe did not run alone ({'; '.join(result.contention)}): its ceilings may be too low, and every "
            "prediction scales with them; probe again on a quiet machine (this result is not cached)",)


def _warnings(best_fp32: float, theoretical: float | None, frequency: float | None, source: str) -> tuple[str, ...]:
    if not theoretical or not frequency:
        return ()
    if best_fp32 > ABOVE_THEORY * theoretical:
        return (f"the best fp32 GEMM ({best_fp32:.1f} GFLOP/s) is above the theoretical peak at {frequency:.2f} GHz "
                f"({source}): the cores run at about {frequency * best_fp32 / theoretical:.2f} GHz (turbo), or the "
                "catalog's FLOPs per cycle for this microarchitecture are too low",)
    if best_fp32 < BELOW_THEORY * theoretical:
        return (f"the best fp32 GEMM ({best_fp32:.1f} GFLOP/s) is below half the theoretical peak "
                f"({theoretical:.1f} at {frequency:.2f} GHz): were other processes running?",)
    return ()


def _theoretical_fp32(arch: Any, frequency: float | None, cores: int) -> float | None:
    from modak.hardware.ceilings import cpu_catalog_entry

    return cores * frequency * cpu_catalog_entry(arch)["fp32"] if frequency else None


def _frequency_ghz() -> tuple[float | None, str]:
    """The CPU's maximum clock from cpufreq, else the clock /proc/cpuinfo reports, with where it came from."""
    try:
        return int(Path("/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq").read_text()) / 1e6, "cpufreq maximum"
    except (OSError, ValueError):
        pass
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("cpu MHz"):
            return float(line.split(":", 1)[1]) / 1e3, "/proc/cpuinfo, the nominal clock in a VM"
    return None, "unknown"


def gemm_rates(precisions: list[str], threads: int, sizes: tuple[int, ...], rounds: int = GEMM_ROUNDS,
               round_seconds: float = GEMM_ROUND_SECONDS) -> dict[tuple[str, str], float]:
    """GFLOP/s (GOP/s for int8) of each available GEMM kernel per precision at ``threads`` threads (PyTorch's set
    to them), the best over ``sizes`` and over ``rounds`` rounds that time every kernel and size in turn for
    ``round_seconds`` (at least 2 runs).
    int8 is ONNX Runtime's MatMulInteger (uint8 x int8 -> int32, the kernel its quantized models run)."""
    calls: dict[tuple[str, str, int], Callable[[], Any]] = {}
    for precision in precisions:
        for kernel, runtime in adapters().items():
            if precision not in runtime.gemm_precisions:
                continue
            try:
                calls.update({(precision, kernel, n): runtime.gemm(n, threads, precision) for n in sizes})
            except ImportError:
                continue  # that runtime is not installed here
    best = dict.fromkeys(calls, float("inf"))
    for _ in range(rounds):
        for key, call in calls.items():
            best[key] = min(best[key], _best_time(call, min_runs=2, budget_s=round_seconds))
    rates: dict[tuple[str, str], float] = {}
    for (precision, kernel, n), seconds in best.items():
        rates[(precision, kernel)] = max(rates.get((precision, kernel), 0.0), 2.0 * n**3 / seconds / 1e9)
    return rates


def _default_thread_counts(cores: int) -> list[int]:
    counts = {1, cores}
    power = 2
    while power < cores:
        counts.add(power)
        power *= 2
    return sorted(counts)


def _gpu_gemm_gflops(torch: Any, n: int, dtype: Any) -> float:
    a = torch.randn(n, n, dtype=dtype, device="cuda")
    b = torch.randn(n, n, dtype=dtype, device="cuda")
    c = torch.empty(n, n, dtype=dtype, device="cuda")
    return 2.0 * n**3 / _best_time(lambda: torch.matmul(a, b, out=c), torch.cuda.synchronize) / 1e9


def _triad_gbs(torch: Any, n: int, device: str) -> float:
    """Stream triad ``a = b + 3 c`` over fp32 arrays of ``n`` elements: 3 x 4 x n bytes per run, best run."""
    a = torch.empty(n, dtype=torch.float32, device=device)
    b = torch.rand(n, dtype=torch.float32, device=device)
    c = torch.rand(n, dtype=torch.float32, device=device)
    sync = torch.cuda.synchronize if device == "cuda" else None
    return 3 * 4 * n / _best_time(lambda: torch.add(b, c, alpha=3.0, out=a), sync, budget_s=0.5) / 1e9


def _best_time(fn: Callable[[], Any], sync: Callable[[], None] | None = None, min_runs: int = 5,
               budget_s: float = 0.4) -> float:
    """Best time of at least ``min_runs`` runs after a warm-up, within about ``budget_s``."""
    sync = sync or (lambda: None)
    fn()
    sync()
    best, runs, deadline = float("inf"), 0, time.perf_counter() + budget_s
    while runs < min_runs or time.perf_counter() < deadline:
        t0 = time.perf_counter()
        fn()
        sync()
        best = min(best, time.perf_counter() - t0)
        runs += 1
        if runs >= 200:
            break
    return best


def host_microarchitecture() -> Any:
    """archspec's microarchitecture of this host; where archspec names only a generic level (``x86_64_v4``), the
    most specific microarchitecture of the host's vendor whose features the host has but for
    :data:`HYPERVISOR_HIDDEN_FLAGS` (a KVM guest's Zen 4), else that level."""
    import archspec.cpu
    from archspec.cpu.detect import detected_info

    host = archspec.cpu.host()
    if host.vendor != "generic":
        return host
    info = detected_info()
    fits = [t for t in archspec.cpu.TARGETS.values()
            if t.vendor == info.vendor and t.family == host.family
            and not t.features - info.features - HYPERVISOR_HIDDEN_FLAGS]
    return max(fits, key=lambda t: (len(t.ancestors), t.name), default=host)


def native_bf16() -> bool:
    """Whether this CPU has native bf16 instructions (its feature flags)."""
    return bool(_cpu_flags() & {"avx512_bf16", "amx_bf16", "bf16"})


def _cpu_flags() -> set[str]:
    """The kernel's CPU feature flags (archspec's best-matching microarchitecture may list fewer)."""
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith(("flags", "Features")):
            return set(line.split(":", 1)[1].split())
    return set()


def _topology() -> tuple[int, int, int]:
    """(sockets, physical cores per socket, hardware threads per core) of the CPUs this process may use."""
    cpus = sorted(os.sched_getaffinity(0))
    cores: dict[tuple[str, str], int] = {}
    for cpu in cpus:
        topo = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology")
        try:
            key = ((topo / "physical_package_id").read_text().strip(), (topo / "core_id").read_text().strip())
        except OSError:
            key = ("0", str(cpu))
        cores[key] = cores.get(key, 0) + 1
    sockets = len({socket for socket, _ in cores}) or 1
    return sockets, max(1, len(cores) // sockets), max(cores.values()) if cores else 1


def _memory_gb() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) / 1024**2
    return 0.0


def _caches_kib() -> dict[str, int]:
    caches: dict[str, int] = {}
    for index in sorted(Path("/sys/devices/system/cpu/cpu0/cache").glob("index*")):
        try:
            level = (index / "level").read_text().strip()
            kind = (index / "type").read_text().strip()
            size = (index / "size").read_text().strip()
        except OSError:
            continue
        name = f"L{level}" + ("d" if kind == "Data" else "i" if kind == "Instruction" else "")
        caches[name] = _kib(size)
    return caches


def _kib(size: str) -> int:
    """A sysfs cache size ("48K", "32M" or bytes) in KiB."""
    units = {"K": 1, "M": 1024, "G": 1024**2}
    return int(size[:-1]) * units[size[-1]] if size[-1] in units else int(size) // 1024


def _probe_gpu(torch: Any, quick: bool) -> dict[str, Any] | None:
    if not torch.cuda.is_available():
        return None
    props = torch.cuda.get_device_properties(0)
    n = 2048 if quick else 8192
    peaks: dict[str, float | None] = {"fp32_tflops": None, "tf32_tflops": None, "bf16_tflops": None,
                                      "fp16_tflops": None}
    torch.backends.cuda.matmul.allow_tf32 = False
    peaks["fp32_tflops"] = round(_gpu_gemm_gflops(torch, n, torch.float32) / 1e3, 1)
    torch.backends.cuda.matmul.allow_tf32 = True
    peaks["tf32_tflops"] = round(_gpu_gemm_gflops(torch, n, torch.float32) / 1e3, 1)
    peaks["bf16_tflops"] = round(_gpu_gemm_gflops(torch, n, torch.bfloat16) / 1e3, 1)
    peaks["fp16_tflops"] = round(_gpu_gemm_gflops(torch, n, torch.float16) / 1e3, 1)
    peaks["memory_bandwidth_gbs"] = round(_triad_gbs(torch, 1 << 28, "cuda"), 1)
    from modak.image.runtimes.pytorch import HOST_COPY_BYTES, host_copy_gbs

    peaks.update(host_copy_gbs(HOST_COPY_BYTES // 8 if quick else HOST_COPY_BYTES))  # the host link (#68)
    return {"model": props.name.replace(" ", "-"), "count": torch.cuda.device_count(),
            "memory_gb": round(props.total_memory / 1e9, 1), "peaks": peaks}
