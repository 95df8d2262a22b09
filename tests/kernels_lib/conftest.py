"""The library's kernels are compiled in strict mode: a `tessera.pipeline` of a shipped kernel that gets less
than it asks for (fewer stages, no async copies, no TMA, no warp specialization) fails its test instead of
warning. A test that means to see the shortfall passes `strict=False`."""

import pytest


@pytest.fixture(autouse=True)
def strict_pipelines(monkeypatch):
    monkeypatch.setenv("TESSERA_STRICT", "1")
