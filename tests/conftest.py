"""Suite-wide fixtures and the `gpu` marker's skip rule."""

import pytest


def pytest_collection_modifyitems(config, items):
    """Tests marked `gpu` skip cleanly on machines without an NVIDIA driver (checked without touching CUDA)."""
    from tessera.runtime.cuda import driver_available

    if driver_available():
        return
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU and its driver")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True, scope="session")
def private_binary_cache(tmp_path_factory):
    """Tests never read or write the user's ~/.cache/tessera."""
    mp = pytest.MonkeyPatch()
    mp.setenv("TESSERA_CACHE_DIR", str(tmp_path_factory.mktemp("tessera-cache")))
    yield
    mp.undo()
