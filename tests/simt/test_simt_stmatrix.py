"""`stmatrix` on the SIMT simulator: the PTX ISA's fragment placement (ldmatrix backwards), x1 / x2 / x4, plain
and .trans, f16 and bf16; a row address off 16 bytes is reported with the lane that gave it."""

import numpy as np
import pytest

from tessera.backends.interp import InterpreterError
from tessera.backends.simt import run_threads

from ir_text import kernel
from stmatrix_kernels import expected, matrices

from tessera.ir import dtypes as dt


@pytest.mark.parametrize("num", [1, 2, 4])
@pytest.mark.parametrize("trans", [False, True])
@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_stmatrix_places_each_lanes_registers_where_the_ptx_isa_says(num, trans, dtype):
    inp = np.arange(64 * num, dtype=np.float16) + 1         # every element distinct and exact in 16 bits
    if dtype == "bf16":
        inp = dt.bf16.encode(inp.astype(np.float32))          # (bit patterns: what bf16 arrays hold)
    out = np.zeros((8 * num, 8), inp.dtype)
    run_threads(kernel(matrices(num, trans, dtype)), [inp, out], grid=1)
    np.testing.assert_array_equal(out, expected(inp, num, trans))


def test_a_row_address_off_16_bytes_is_reported():
    with pytest.raises(InterpreterError, match="stmatrix row address of lane 0 of warp 0 .* not 16-byte aligned"):
        run_threads(kernel(matrices(misaligned=True)), [np.zeros(256, np.float16), np.zeros((32, 8), np.float16)],
                    grid=1)
