"""Suite-wide fixtures and the `gpu` marker's skip rule."""

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def pytest_collection_modifyitems(config, items):
    """Tests marked `gpu` skip cleanly on machines without an NVIDIA driver, and those also marked `amdgpu`
    on machines without ROCm's runtime (both checked without initializing either)."""
    from tessera.runtime import cuda, hip

    skip_nvidia = pytest.mark.skip(reason="needs an NVIDIA GPU and its driver")
    skip_amd = pytest.mark.skip(reason="needs an AMD GPU and ROCm (libamdhip64.so)")
    for item in items:
        if "amdgpu" in item.keywords:
            if not hip.driver_available():
                item.add_marker(skip_amd)
        elif "gpu" in item.keywords and not cuda.driver_available():
            item.add_marker(skip_nvidia)


@pytest.fixture(autouse=True, scope="session")
def children_import_this_checkout():
    """Python child processes that tests start (scripts that `import tessera`) import the tessera under test,
    not whatever copy is installed, or none."""
    mp = pytest.MonkeyPatch()
    mp.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    yield
    mp.undo()


@pytest.fixture(autouse=True, scope="session")
def private_binary_cache(tmp_path_factory):
    """Tests never read or write the user's ~/.cache/tessera."""
    mp = pytest.MonkeyPatch()
    mp.setenv("TESSERA_CACHE_DIR", str(tmp_path_factory.mktemp("tessera-cache")))
    yield
    mp.undo()
