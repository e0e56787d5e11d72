"""Measure this machine's ceilings, as the Empirical Roofline Toolkit does, and describe it as a Target.

GEMM GFLOP/s per precision and thread count (PyTorch's oneDNN/MKL kernels), stream-triad bandwidth,
cache sizes from sysfs, the archspec microarchitecture, and GPU peaks when CUDA is present.
"""

from __future__ import annotations

import os
import platform
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

GEMM_SIZE = 2048
TRIAD_ELEMENTS = 1 << 25  # 128 MiB per fp32 array: far beyond any last-level cache


@dataclass(frozen=True)
class ProbeResult:
    """What the probe measured."""

    microarchitecture: str
    sockets: int
    cores_per_socket: int
    threads_per_core: int
    memory_gb: float
    caches_kib: dict[str, int]
    gemm_gflops: dict[str, dict[int, float]]  # precision -> threads -> GFLOP/s
    triad_gbs: dict[int, float]  # threads -> GB/s
    gpu: dict[str, Any] | None = None
    seconds: float = 0.0
    host: str = field(default_factory=platform.node)


def probe(thread_counts: list[int] | None = None, quick: bool = False) -> ProbeResult:
    """Run the measurements (about 10-30 s on a small machine; ``quick`` shrinks the problem sizes)."""
    import archspec.cpu
    import torch

    start = time.perf_counter()
    sockets, cores_per_socket, threads_per_core = _topology()
    cores = sockets * cores_per_socket
    counts = sorted(set(thread_counts or _default_thread_counts(cores)))
    size = 512 if quick else GEMM_SIZE
    elements = TRIAD_ELEMENTS // 4 if quick else TRIAD_ELEMENTS  # 32 MiB arrays still exceed the caches
    precisions = {"fp32": torch.float32}
    if _cpu_flags() & {"avx512_bf16", "amx_bf16", "bf16"}:
        precisions["bf16"] = torch.bfloat16
    gemm: dict[str, dict[int, float]] = {name: {} for name in precisions}
    triad: dict[int, float] = {}
    saved = torch.get_num_threads()
    try:
        for threads in counts:
            torch.set_num_threads(threads)
            for name, dtype in precisions.items():
                gemm[name][threads] = _gemm_gflops(torch, size, dtype, "cpu")
            triad[threads] = _triad_gbs(torch, elements, "cpu")
    finally:
        torch.set_num_threads(saved)
    return ProbeResult(
        microarchitecture=archspec.cpu.host().name, sockets=sockets, cores_per_socket=cores_per_socket,
        threads_per_core=threads_per_core, memory_gb=_memory_gb(), caches_kib=_caches_kib(),
        gemm_gflops=gemm, triad_gbs=triad, gpu=_probe_gpu(torch, quick), seconds=time.perf_counter() - start)


def to_target(result: ProbeResult, name: str) -> dict[str, Any]:
    """A Target document (plain data) for the measured machine; ceilings at the most threads measured."""
    top = max(result.triad_gbs)
    peaks: dict[str, float] = {"fp32_gflops": round(max(result.gemm_gflops["fp32"].values()), 1),
                               "memory_bandwidth_gbs": round(max(result.triad_gbs.values()), 1)}
    if "bf16" in result.gemm_gflops:
        peaks["bf16_gflops"] = round(max(result.gemm_gflops["bf16"].values()), 1)
    target: dict[str, Any] = {
        "apiVersion": "modak/v1", "kind": "Target", "name": name,
        "cpu": {"microarchitecture": result.microarchitecture, "sockets": result.sockets,
                "cores_per_socket": result.cores_per_socket, "threads_per_core": result.threads_per_core,
                "peaks": peaks},
        "memory": {"size_gb": round(result.memory_gb, 1), "bandwidth_gbs": round(result.triad_gbs[top], 1)},
    }
    if result.gpu:
        target["gpus"] = {"model": result.gpu["model"], "count": result.gpu["count"],
                          "memory_gb": result.gpu["memory_gb"], "peaks": result.gpu["peaks"]}
    return target


def probe_comment(result: ProbeResult) -> str:
    """A YAML comment block recording the raw measurements behind the Target's peaks."""
    lines = [f"Written by `modak probe` on {result.host} in {result.seconds:.0f} s.",
             f"caches (KiB): {result.caches_kib}"]
    for precision, by_threads in result.gemm_gflops.items():
        lines.append(f"GEMM {precision} GFLOP/s by threads: "
                     + ", ".join(f"{t}: {v:.1f}" for t, v in sorted(by_threads.items())))
    lines.append("stream triad GB/s by threads: " + ", ".join(f"{t}: {v:.1f}" for t, v in sorted(result.triad_gbs.items())))
    return "".join(f"# {line}\n" for line in lines)


def _default_thread_counts(cores: int) -> list[int]:
    counts = {1, cores}
    power = 2
    while power < cores:
        counts.add(power)
        power *= 2
    return sorted(counts)


def _gemm_gflops(torch: Any, n: int, dtype: Any, device: str) -> float:
    a = torch.randn(n, n, dtype=dtype, device=device)
    b = torch.randn(n, n, dtype=dtype, device=device)
    c = torch.empty(n, n, dtype=dtype, device=device)
    best = _best_time(lambda: torch.matmul(a, b, out=c), torch, device)
    return 2.0 * n**3 / best / 1e9


def _triad_gbs(torch: Any, n: int, device: str) -> float:
    a = torch.empty(n, dtype=torch.float32, device=device)
    b = torch.rand(n, dtype=torch.float32, device=device)
    c = torch.rand(n, dtype=torch.float32, device=device)
    best = _best_time(lambda: torch.add(b, c, alpha=3.0, out=a), torch, device)
    return 3 * 4 * n / best / 1e9


def _best_time(fn: Any, torch: Any, device: str, min_runs: int = 5, budget_s: float = 1.5) -> float:
    """Best time of at least ``min_runs`` runs after a warm-up, within about ``budget_s``."""
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
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
    peaks = {"fp32_tflops": None, "tf32_tflops": None, "bf16_tflops": None, "fp16_tflops": None}
    torch.backends.cuda.matmul.allow_tf32 = False
    peaks["fp32_tflops"] = round(_gemm_gflops(torch, n, torch.float32, "cuda") / 1e3, 1)
    torch.backends.cuda.matmul.allow_tf32 = True
    peaks["tf32_tflops"] = round(_gemm_gflops(torch, n, torch.float32, "cuda") / 1e3, 1)
    peaks["bf16_tflops"] = round(_gemm_gflops(torch, n, torch.bfloat16, "cuda") / 1e3, 1)
    peaks["fp16_tflops"] = round(_gemm_gflops(torch, n, torch.float16, "cuda") / 1e3, 1)
    peaks["memory_bandwidth_gbs"] = round(_triad_gbs(torch, 1 << 28, "cuda"), 1)
    return {"model": props.name.replace(" ", "-"), "count": torch.cuda.device_count(),
            "memory_gb": round(props.total_memory / 1e9, 1), "peaks": peaks}
