"""Suite-wide fixtures."""

import pytest


@pytest.fixture(autouse=True, scope="session")
def private_binary_cache(tmp_path_factory):
    """Tests never read or write the user's ~/.cache/tessera."""
    mp = pytest.MonkeyPatch()
    mp.setenv("TESSERA_CACHE_DIR", str(tmp_path_factory.mktemp("tessera-cache")))
    yield
    mp.undo()
