"""The probe the tests and the fuzzer take as this host's."""

from __future__ import annotations

from modak.hardware.probe import ProbeResult

# What the tests take as this host's probe (`cpu: local` in the example targets): the shipped data's machine
# (perfmodels/targets/ci-epyc-2c-b.yaml: 2 AVX-512/bf16 cores), so plans do not depend on the CPU the tests run
# on. tests/test_local.py runs the real probe into its own cache.
TEST_HOST_PROBE = ProbeResult(
    microarchitecture="x86_64_v4", sockets=1, cores_per_socket=2, threads_per_core=1, memory_gb=23.5,
    caches_kib={"L1d": 48, "L2": 1024, "L3": 32768}, gemm_gflops={"fp32": {1: 225.8, 2: 451.6}, "bf16": {2: 836.6}},
    gemm_kernels={"fp32": {"onnxruntime": {1: 225.8, 2: 451.6}}, "bf16": {"openvino": {2: 836.6}}},
    triad_gbs={1: 30.0, 2: 40.9}, triad_spread={1: 0.0, 2: 0.0}, theoretical_fp32_gflops=None, frequency_ghz=None,
    frequency_source="unknown", host="test-host")
