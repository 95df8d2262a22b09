"""TMA stores -> PTX: the simulator's store kernels (tests/simt/tma_store_kernels.py) lower to
cp.async.bulk.tensor ... bulk_group with its commit and read-wait and assemble for sm_90a; targets without
TMA are refused before LLVM, with the op named."""

import dataclasses
import re
import sys
from pathlib import Path

import pytest

from tessera.backends.nvptx import compile_thread_ir, find_ptxas
from tessera.backends.nvptx.errors import CodegenError
from tessera.ir.target import get_target

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "simt"))
from tma_store_kernels import tile_store  # noqa: E402
from ir_text import kernel  # noqa: E402

HAS_PTXAS = find_ptxas() is not None


@pytest.mark.parametrize("swizzled", [False, True])
def test_tile_store_lowers_to_a_tma_store_its_commit_and_read_wait_and_assembles(swizzled):
    artifacts = compile_thread_ir(kernel(tile_store(swizzled=swizzled)), "sm_90a", assemble=HAS_PTXAS)
    ptx = artifacts.ptx
    # coordinates innermost first: (%row, %col) in the IR is {col, row} in PTX; the source is a shared address
    store = re.search(r"cp\.async\.bulk\.tensor\.2d\.global\.shared::cta\.tile\.bulk_group "
                      r"\[%rd\d+, \{(%r\d+), (%r\d+)\}\], \[(?:%rd?\d+|global_smem)\];", ptx)
    assert store, ptx
    col_param = re.search(r"ld\.param\.(?:u|b)32\s+(%r\d+), \[tma_store_tile_param_3\]", ptx)
    assert col_param and store.group(1) == col_param.group(1)
    commit = ptx.index("cp.async.bulk.commit_group;")
    wait = re.search(r"cp\.async\.bulk\.wait_group\.read\s+0;", ptx)
    assert store.start() < commit < wait.start()
    assert "fence.proxy.async.shared::cta" in ptx
    assert ".extern .shared .align 1024 .b8 global_smem[]" in ptx
    assert "st.global" not in ptx              # the tile reaches global memory only through the TMA store
    if HAS_PTXAS:
        assert artifacts.cubin


def test_the_full_wait_is_cp_async_bulk_wait_group_without_read():
    """`bulk_wait_group` waits for the group's writes too: PTX's cp.async.bulk.wait_group N, no .read."""
    artifacts = compile_thread_ir(kernel(tile_store(wait=False, full_wait=True)), "sm_90a", assemble=HAS_PTXAS)
    ptx = artifacts.ptx
    full = re.search(r"cp\.async\.bulk\.wait_group\s+0;", ptx)
    assert full and ptx.index("cp.async.bulk.commit_group;") < full.start() and ".read" not in ptx
    if HAS_PTXAS:
        assert artifacts.cubin


@pytest.mark.parametrize("target", ["sm_80", dataclasses.replace(get_target("sm_90a"),
                                                                 features=get_target("sm_90a").features - {"tma"})])
def test_targets_without_tma_refuse_the_store_before_llvm(target):
    with pytest.raises(CodegenError, match="needs the Tensor Memory Accelerator \\(sm_90\\+\\)"):
        compile_thread_ir(kernel(tile_store()), target, assemble=False)
