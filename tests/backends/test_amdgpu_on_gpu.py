"""On an AMD GPU with ROCm and hip-python: a tutorial kernel launched for real matches numpy.

Marked `gpu` (so `pytest -m gpu` selects it) and `amdgpu`: it skips cleanly
without ROCm's runtime, including on NVIDIA-only machines (tests/conftest.py).
"""

import numpy as np
import pytest

from tests.test_tutorials_gpu_code import tutorial_kernel

pytestmark = [pytest.mark.gpu, pytest.mark.amdgpu]


def test_vector_add_runs_on_the_amd_gpu():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available() or getattr(torch.version, "hip", None) is None:
        pytest.skip("needs a ROCm build of torch with an AMD GPU")
    add = tutorial_kernel("01-vector-add.py:add")
    n = 10_000
    x = torch.randn(n, device="cuda")
    y = torch.randn(n, device="cuda")
    out = torch.empty_like(x)
    blocks = -(-n // 1024)
    add[(blocks,)](x, y, out, n, BLOCK=1024)
    torch.cuda.synchronize()
    assert blocks > 1
    np.testing.assert_allclose(out.cpu().numpy(), (x + y).cpu().numpy(), rtol=1e-6)
