"""`stmatrix` -> PTX: the simulator's stmatrix kernel (tests/simt/stmatrix_kernels.py) lowers to one
stmatrix.sync.aligned.m8n8.x{num}[.trans].shared.b16 with the warp's 32-bit words and assembles for sm_90a;
targets before sm_90 refuse it before LLVM, with the op named."""

import re
import sys
from pathlib import Path

import pytest

from tessera.backends.nvptx import compile_thread_ir, find_ptxas
from tessera.backends.nvptx.errors import CodegenError

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "simt"))
from stmatrix_kernels import matrices  # noqa: E402
from ir_text import kernel  # noqa: E402

HAS_PTXAS = find_ptxas() is not None


@pytest.mark.parametrize("num, trans, dtype", [(4, False, "bf16"), (4, True, "f16"), (2, False, "f16"),
                                               (1, True, "bf16")])
def test_stmatrix_lowers_to_one_stmatrix_instruction_and_assembles(num, trans, dtype):
    artifacts = compile_thread_ir(kernel(matrices(num, trans, dtype)), "sm_90a", assemble=HAS_PTXAS)
    words = ", ".join([r"%r\d+"] * num)
    flavour = r"\.trans" if trans else ""
    found = re.findall(rf"stmatrix\.sync\.aligned\.m8n8\.x{num}{flavour}\.shared\.b16\s+"
                       rf"\[%r(?:d)?\d+\], \{{{words}\}};", artifacts.ptx)
    assert len(found) == 1, artifacts.ptx
    assert "st.shared" not in artifacts.ptx                 # the tile reaches shared memory only through it
    if HAS_PTXAS:
        assert artifacts.cubin


@pytest.mark.parametrize("target", ["sm_80", "sm_89"])
def test_targets_before_sm_90_refuse_stmatrix_before_llvm(target):
    with pytest.raises(CodegenError, match="stmatrix needs sm_90\\+"):
        compile_thread_ir(kernel(matrices()), target, assemble=False)
