"""Shared test fixtures."""

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
    store_probe(TEST_HOST_PROBE)
    yield
    patch.undo()
