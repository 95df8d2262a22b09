"""On a machine with an NVIDIA GPU: atomics at "cta" and "sys" scope (inline PTX where LLVM would drop the scope,
tessera/backends/nvptx/scoped_atomics.py, including the 8- and 16-bit bitwise ones widened to their word) compute
what the CPU interpreter computes. Joined to tier 1 of the GPU session by the `gpu` mark."""

from __future__ import annotations

import numpy as np
import pytest

import tessera

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")

LANES = 64


@tessera.kernel
def every_rmw(p, v, old, SCOPE: tessera.constexpr):
    """xor into p[0:64] (keeping the old values), or into p[64:128], and into p[128:192], add into p[192:256]."""
    offs = tessera.arange(0, 64)
    x = tessera.load(v + offs)
    tessera.store(old + offs, tessera.atomic_xor(p + offs, x, scope=SCOPE))
    tessera.atomic_or(p + offs + 64, x, scope=SCOPE)
    tessera.atomic_and(p + offs + 128, x, scope=SCOPE)
    tessera.atomic_add(p + offs + 192, x, scope=SCOPE)


def _args(dtype):
    rng = np.random.default_rng(7)
    info = np.iinfo(dtype)
    p = rng.integers(info.min, info.max, 4 * LANES, dtype=dtype, endpoint=True)
    v = rng.integers(info.min, info.max, LANES, dtype=dtype, endpoint=True)
    return [p, v, np.zeros(LANES, dtype)]


@pytest.mark.parametrize("scope, grid", [("cta", 1), ("sys", 3)])
@pytest.mark.parametrize("dtype", [np.int8, np.uint16, np.int32, np.uint64])
def test_scoped_atomics_on_the_gpu_match_the_interpreter(dtype, scope, grid):
    """Neighbouring 8- and 16-bit lanes share a word, so a widened and/or/xor that touched its neighbours' bits
    would show here; with 3 programs at "sys" scope every update must land (the old values are program
    order's, so only one program's are compared)."""
    expected = _args(dtype)
    every_rmw[(grid,)](*expected, SCOPE=scope)
    device = [torch.from_numpy(a.copy()).cuda() for a in _args(dtype)]
    every_rmw[(grid,)](*device, SCOPE=scope)
    torch.cuda.synchronize()
    np.testing.assert_array_equal(device[0].cpu().numpy(), expected[0])
    if grid == 1:
        np.testing.assert_array_equal(device[2].cpu().numpy(), expected[2])
