"""Shared test fixtures."""

import pytest
from hypothesis import HealthCheck, settings

from modak.hardware.probe import ProbeResult

# Hypothesis in the suite: derandomized, the same examples on every run and machine, so that a change cannot fail CI
# on an example found that day (the exploring profile, random and long: benchmarks/tools/fuzz.py).
settings.register_profile("ci", derandomize=True, database=None, deadline=None,
                          suppress_health_check=list(HealthCheck))
settings.load_profile("ci")

# What the tests take as this host's probe (`cpu: local` in the example targets): the shipped data's machine
# (perfmodels/targets/ci-epyc-2c-b.yaml: 2 AVX-512/bf16 cores), so plans do not depend on the CPU the tests run
# on. tests/test_local.py runs the real probe into its own cache.
TEST_HOST_PROBE = ProbeResult(
    microarchitecture="x86_64_v4", sockets=1, cores_per_socket=2, threads_per_core=1, memory_gb=23.5,
    caches_kib={"L1d": 48, "L2": 1024, "L3": 32768}, gemm_gflops={"fp32": {1: 225.8, 2: 451.6}, "bf16": {2: 836.6}},
    gemm_kernels={"fp32": {"onnxruntime": {1: 225.8, 2: 451.6}}, "bf16": {"openvino": {2: 836.6}}},
    triad_gbs={1: 30.0, 2: 40.9}, triad_spread={1: 0.0, 2: 0.0}, theoretical_fp32_gflops=None, frequency_ghz=None,
    frequency_source="unknown", host="test-host")

# Markers of what a test needs beyond Python and a few seconds (registered in pyproject.toml); each implies
# `integration`, so that `pytest -m "not integration"` is the quick run.
INTEGRATION_MARKERS = ("engine", "slurm", "opera", "netns", "slow")


@pytest.hookimpl(tryfirst=True)  # before `-m` selects
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test that carries one of INTEGRATION_MARKERS `integration` as well."""
    for item in items:
        if any(item.get_closest_marker(name) for name in INTEGRATION_MARKERS):
            item.add_marker(pytest.mark.integration)


@pytest.fixture(autouse=True, scope="session")
def _modak_cache(tmp_path_factory: pytest.TempPathFactory):
    """One throw-away cache (exported zoo models, this host's probe, ...) and perf store for the whole session,
    never the user's."""
    from modak.hardware.local import store_probe

    patch = pytest.MonkeyPatch()
    patch.setenv("MODAK_CACHE", str(tmp_path_factory.mktemp("modak-cache")))
    # Plans learn from the shipped perfmodels/ only, never from the local store of whoever runs the tests.
    patch.setenv("MODAK_STORE", str(tmp_path_factory.mktemp("modak-store") / "perf.sqlite"))
    store_probe(TEST_HOST_PROBE)
    yield
    patch.undo()
