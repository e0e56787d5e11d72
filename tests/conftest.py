"""Shared test fixtures."""

import os

import pytest
from hypothesis import HealthCheck, settings

from tests.support.host import TEST_HOST_PROBE

# Hypothesis in the suite: derandomized, the same examples on every run and machine, so that a change cannot fail CI
# on an example found that day (the exploring profile, random and long: benchmarks/tools/fuzz.py).
settings.register_profile("ci", derandomize=True, database=None, deadline=None,
                          suppress_health_check=list(HealthCheck))
settings.load_profile("ci")

# Markers of what a test needs beyond Python and a few seconds (registered in pyproject.toml); each implies
# `integration`, so that `pytest -m "not integration"` is the quick run.
INTEGRATION_MARKERS = ("engine", "slurm", "apptainer", "opera", "netns", "slow")


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
    # Builds choose by prediction (a race of a minute each, and its winner recorded for later tests' plans);
    # tests/test_measured_choice.py measures.
    patch.setenv("MODAK_MEASURE_BUDGET", "0")
    store_probe(TEST_HOST_PROBE)
    yield
    patch.undo()


# The environment variables that steer threads and modak in this process (a library's own settings are its own).
_GUARDED_VARIABLES = ("OMP_", "MKL_", "OPENBLAS_", "TVM_", "MODAK_")


@pytest.fixture(autouse=True)
def _process_left_as_found():
    """Fail a test that leaves the pytest process's CPU affinity or its thread and modak variables changed, and
    restore them. A test that ran ``modak.runtime.load`` in-process once set ``OMP_PROC_BIND``; libgomp then pinned
    the process to one CPU, and every later test saw another host (the probe's cache key names the usable CPUs),
    on one core."""
    def guarded() -> dict[str, str]:
        return {k: v for k, v in os.environ.items() if k.startswith(_GUARDED_VARIABLES)}

    affinity, before = os.sched_getaffinity(0), guarded()
    yield
    after, now = guarded(), os.sched_getaffinity(0)
    changed = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
    for name in after.keys() - before.keys():
        del os.environ[name]
    os.environ.update(before)
    os.sched_setaffinity(0, affinity)
    assert not changed and now == affinity, (f"the test left the process changed: variables {changed}, "
                                             f"CPUs {sorted(affinity)} -> {sorted(now)}")
