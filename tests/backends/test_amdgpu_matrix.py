"""Every op on every supported dtype compiles for gfx90a, gfx942 and gfx950 without LLVM aborting.

The AMDGPU validator admits only these dtypes and ops (and the math
`amdgpu.math.math_support` allows), so each combination goes through
instruction selection here, in one child process per target: an LLVM abort
fails this test naming the dtype instead of killing pytest.
"""

import op_matrix

SETUP = """
from tessera.backends.amdgpu import compile_thread_ir
from tessera.backends.amdgpu.math import math_support
"""


def test_every_op_on_every_dtype_compiles_for_every_amd_target():
    found = op_matrix.problems(SETUP, "math_support=math_support, warp_size=64", ("gfx90a", "gfx942", "gfx950"))
    assert not found, "\n".join(found)
