"""Shared test fixtures."""

import pytest


@pytest.fixture(autouse=True, scope="session")
def _modak_cache(tmp_path_factory: pytest.TempPathFactory):
    """One throw-away cache (exported zoo models, ...) and perf store for the whole session, never the user's."""
    patch = pytest.MonkeyPatch()
    patch.setenv("MODAK_CACHE", str(tmp_path_factory.mktemp("modak-cache")))
    # Plans learn from the shipped perfmodels/ only, never from the local store of whoever runs the tests.
    patch.setenv("MODAK_STORE", str(tmp_path_factory.mktemp("modak-store") / "perf.sqlite"))
    yield
    patch.undo()
