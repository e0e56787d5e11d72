"""How reproducible is the probe's fp32 GEMM ceiling? One sequential pass vs interleaved rounds, side by side.

`modak probe` takes the fp32 ceiling of a thread count as the best rate over kernels (PyTorch, ONNX Runtime,
OpenVINO) and sizes. On a VM whose vCPUs slow down for seconds at a time, timing each kernel and size once, one
after the other (0.4 s each: the probe until 2026-11-26), can put the fast kernels in a slow period; interleaved
rounds (``GEMM_ROUNDS`` x ``GEMM_ROUND_SECONDS`` each, the shipped probe) spread every kernel over the whole probe.
This script alternates the two ``--repeats`` times (old, new, old, new, ...) and prints each probe's fp32 ceiling
per thread count and, per method, the median, the range and max/min.

    flock -x /tmp/modak-quiet.lock python -m benchmarks.data.probe_stability --repeats 6
"""

from __future__ import annotations

import argparse
import os
import statistics

from modak.hardware import probe

SEQUENTIAL = {"rounds": 1, "round_seconds": 0.4}  # the probe until 2026-11-26 (which asked for 5 runs, not 2)
INTERLEAVED = {"rounds": probe.GEMM_ROUNDS, "round_seconds": probe.GEMM_ROUND_SECONDS}


def ceiling(settings: dict[str, float], threads: int) -> float:
    """The fp32 GEMM ceiling at ``threads`` threads, best over kernels and sizes, timed as ``settings`` say."""
    import torch

    torch.set_num_threads(threads)
    return max(probe.gemm_rates(["fp32"], threads, probe.GEMM_SIZES, **settings).values())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=6)
    args = parser.parse_args()
    counts = sorted({1, len(os.sched_getaffinity(0))})
    methods: dict[str, dict] = {"sequential (old)": SEQUENTIAL, "interleaved (shipped)": INTERLEAVED}
    results: dict[str, dict[int, list[float]]] = {m: {t: [] for t in counts} for m in methods}
    for repeat in range(args.repeats):
        for method, settings in methods.items():
            for threads in counts:
                results[method][threads].append(ceiling(settings, threads))
            print(f"{repeat + 1}: {method}: " + ", ".join(
                f"{t} thread(s) {results[method][t][-1]:.1f}" for t in counts), flush=True)
    print("\nfp32 GEMM ceiling, GFLOP/s: median [min, max], max/min")
    for method in methods:
        for threads, values in results[method].items():
            print(f"  {method:22s} {threads} thread(s): {statistics.median(values):6.1f} "
                  f"[{min(values):.1f}, {max(values):.1f}], {max(values) / min(values):.2f}")


if __name__ == "__main__":
    main()
