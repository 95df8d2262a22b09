"""Every op on every supported dtype compiles for sm_80 and sm_90a without LLVM aborting.

This is what lets `compile_thread_ir` run LLVM in-process by default: the
validator admits only these dtypes and ops, and here each combination goes
through instruction selection (and ptxas, where installed). The kernels are
compiled in child processes, one per target, so that an LLVM abort fails
this test, naming the dtype, instead of killing pytest.
"""

import op_matrix

SETUP = "from tessera.backends.nvptx import compile_thread_ir, find_libdevice"


def test_every_op_on_every_dtype_compiles_for_sm_80_and_sm_90a():
    found = op_matrix.problems(SETUP, "libdevice=find_libdevice() is not None", ("sm_80", "sm_90a"))
    assert not found, "\n".join(found)
