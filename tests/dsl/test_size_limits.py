"""Tiles too large for any GPU block are a CompileError at their line, before the interpreter or
the compiler allocates anything for them (issue 21: they used to reach numpy's MemoryError, or the OOM killer)."""

import numpy as np
import pytest

import tessera
from tessera.dsl.operators import MAX_TILE_ELEMENTS


@tessera.kernel
def wide_range(x_ptr, N: tessera.constexpr):
    offs = tessera.arange(0, N)
    tessera.store(x_ptr + offs, offs, mask=offs < 4)


@tessera.kernel
def square_zeros(x_ptr, N: tessera.constexpr):
    z = tessera.zeros((N, N), tessera.f32)
    tessera.store(x_ptr + tessera.arange(0, 4), tessera.sum(tessera.sum(z, axis=1), axis=0) + tessera.zeros((4,), tessera.f32))


@pytest.mark.parametrize("kernel, n, line", [(wide_range, 2**31, "tessera.arange(0, N)"),
                                             (square_zeros, 2**20, "tessera.zeros((N, N), tessera.f32)")])
@pytest.mark.parametrize("how", ["interpret", "compile"])
def test_an_oversized_tile_is_refused_at_its_line(kernel, n, line, how):
    x = np.zeros(4, np.float32 if kernel is not wide_range else np.int32)
    with pytest.raises(tessera.CompileError) as info:
        if how == "interpret":
            kernel[(1,)](x, N=n)
        else:
            kernel.compile(signature="*f32" if kernel is not wide_range else "*i32", target="sm_80", N=n)
    message = str(info.value)
    assert line in message and f"more than tessera's limit of {MAX_TILE_ELEMENTS:,}" in message
    assert "Split the work" in message


def test_the_largest_allowed_tile_still_runs():
    x = np.zeros(4, np.int32)
    wide_range[(1,)](x, N=MAX_TILE_ELEMENTS)
    np.testing.assert_array_equal(x, np.arange(4))
