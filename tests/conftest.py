"""Shared test fixtures."""

import pytest


@pytest.fixture(autouse=True, scope="session")
def _modak_cache(tmp_path_factory: pytest.TempPathFactory):
    """One throw-away cache (exported zoo models, ...) for the whole session, never the user's."""
    patch = pytest.MonkeyPatch()
    patch.setenv("MODAK_CACHE", str(tmp_path_factory.mktemp("modak-cache")))
    yield
    patch.undo()
