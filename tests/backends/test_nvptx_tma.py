"""mbarriers and TMA loads -> PTX: the simulator's kernels (tests/interp/tma_kernels.py) assemble for sm_90a,
every sm_90 intrinsic of the table assembles, and targets without TMA/mbarriers are refused before LLVM."""

import dataclasses
import re
import sys
from pathlib import Path

import pytest
from llvmlite import ir

from tessera.backends.nvptx import compile_thread_ir, find_ptxas
from tessera.backends.nvptx import intrinsics as nv
from tessera.backends.nvptx.compile import _run_llvm_isolated
from tessera.backends.nvptx.errors import CodegenError
from tessera.backends.llvm.types import I32
from tessera.backends.nvptx.ptxas import assemble
from tessera.ir.target import get_target

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "simt"))
from tma_kernels import ring, tile_copy  # noqa: E402
from ir_text import kernel  # noqa: E402

HAS_PTXAS = find_ptxas() is not None


@pytest.mark.parametrize("swizzled", [False, True])
def test_tile_copy_kernel_lowers_to_tma_and_mbarrier_ptx_and_assembles_for_sm_90a(swizzled):
    artifacts = compile_thread_ir(kernel(tile_copy(swizzled=swizzled)), "sm_90a", assemble=HAS_PTXAS)
    ptx = artifacts.ptx
    assert "mbarrier.init.shared.b64" in ptx
    assert "fence.mbarrier_init.release.cluster" in ptx
    assert "mbarrier.arrive.expect_tx.shared.b64" in ptx
    # coordinates innermost first: (%row, %col) in the IR is {col, row} in PTX
    load = re.search(r"cp\.async\.bulk\.tensor\.2d\.shared::cluster\.global\.tile\.mbarrier::complete_tx::bytes "
                     r"\[%rd\d+\], \[%rd\d+, \{(%r\d+), (%r\d+)\}\]", ptx)
    assert load
    col_param = re.search(r"ld\.param\.(?:u|b)32\s+(%r\d+), \[tma_tile_param_3\]", ptx)
    assert col_param and load.group(1) == col_param.group(1)
    # the wait is a try_wait loop: a branch back to the try_wait while it returns false
    assert re.search(r"mbarrier\.try_wait\.parity\.shared\.b64\s+%p\d+", ptx)
    assert ".extern .shared .align 1024 .b8 global_smem[]" in ptx
    if HAS_PTXAS:
        assert artifacts.cubin


def test_ring_kernel_assembles_for_sm_90a():
    artifacts = compile_thread_ir(kernel(ring(4)), "sm_90a", assemble=HAS_PTXAS)
    assert artifacts.ptx.count("cp.async.bulk.tensor.2d") == 3     # two in the prologue, one refill in the loop
    if HAS_PTXAS:
        assert artifacts.cubin


@pytest.mark.parametrize("missing, op", [("tma", "a tensormap parameter"), ("mbarrier", "mbarrier_init")])
def test_targets_without_the_feature_are_refused_before_llvm(missing, op):
    sm90 = get_target("sm_90a")
    without = dataclasses.replace(sm90, features=sm90.features - {missing})
    with pytest.raises(CodegenError, match=f"{op} needs .*which sm_90a lacks"):
        compile_thread_ir(kernel(tile_copy()), without, assemble=False)


def test_sm_80_refuses_tensor_map_parameters():
    with pytest.raises(CodegenError, match="a tensormap parameter needs the Tensor Memory Accelerator \\(sm_90\\+\\), "
                                            "which sm_80 lacks"):
        compile_thread_ir(kernel(tile_copy()), "sm_80", assemble=False)


def test_every_sm90_table_entry_compiles_and_assembles_for_sm_90a():
    module = ir.Module("sm90")
    module.triple = "nvptx64-nvidia-cuda"
    smem_type = ir.ArrayType(ir.IntType(8), 0)
    smem = ir.GlobalVariable(module, smem_type, "smem", addrspace=3)
    smem.linkage = "external"
    smem.align = 1024
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [ir.PointerType(addrspace=1), I32]), "sm90")
    fn.calling_convention = "ptx_kernel"
    out, value = fn.args
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    bar = b.gep(smem, [ir.Constant(I32, 0), ir.Constant(I32, 65536)], source_etype=smem_type)
    for name in nv.SM90_FIXED:
        callee = nv.declare(module, name)
        args = []
        for t in callee.function_type.args:
            if isinstance(t, ir.PointerType) and t.addrspace == 3:
                args.append(bar)
            elif isinstance(t, ir.PointerType):
                args.append(b.addrspacecast(smem, t) if t.addrspace == 7 else b.addrspacecast(out, t))
            elif t == I32:
                args.append(value)
            else:
                args.append(ir.Constant(t, 0))
        if name.startswith("llvm.nvvm.cp.async.bulk.tensor.g2s"):
            args[-1] = ir.Constant(I32, 0)   # cta_group is an immediate
        if name in ("llvm.nvvm.cp.async.bulk.wait.group.read", "llvm.nvvm.cp.async.bulk.wait.group"):
            args[0] = ir.Constant(I32, 1)    # the group count is an immediate
        result = b.call(callee, args)
        if isinstance(result.type, ir.PointerType):     # mapa: a shared::cluster address
            b.store(b.ptrtoint(result, ir.IntType(64)), out)
        elif not isinstance(result.type, ir.VoidType):
            b.store(b.zext(result, ir.IntType(64)) if result.type != ir.IntType(64) else result, out)
    b.ret_void()
    request = {"llvm_ir": str(module), "kernel": "sm90", "triple": "nvptx64-nvidia-cuda", "cpu": "sm_90a",
               "features": "+ptx80"}
    ptx = _run_llvm_isolated(request)["assembly"]      # a child process: an abort fails the test, not pytest
    assert ".extern .func" not in ptx and "llvm." not in ptx
    for rank in range(1, 6):
        assert f"cp.async.bulk.tensor.{rank}d.shared::cluster.global.tile.mbarrier::complete_tx::bytes" in ptx
        assert f"cp.async.bulk.tensor.{rank}d.global.shared::cta.tile.bulk_group" in ptx
    assert "cp.async.bulk.commit_group;" in ptx
    assert re.search(r"cp\.async\.bulk\.wait_group\.read\s+1;", ptx)
    if HAS_PTXAS:
        cubin, _ = assemble(ptx, "sm_90a", find_ptxas())
        assert cubin


@pytest.mark.parametrize("target", ["sm_90", "sm_90a"])
def test_tensor_map_is_a_grid_constant_parameter_read_in_place(target):
    """A `tensormap` parameter is the 128-byte CUtensorMap by value, 64-byte aligned, and the TMA
    instruction reads it where it is: no copy to local memory (what a byval parameter without the
    "nvvm.grid_constant" mark would get)."""
    artifacts = compile_thread_ir(kernel(tile_copy()), target, assemble=HAS_PTXAS)
    assert 'ptr byval([128 x i8]) align 64 "nvvm.grid_constant" %"tm"' in artifacts.llvm_ir
    ptx = artifacts.ptx
    assert ".param .align 64 .b8 tma_tile_param_0[128]" in ptx
    assert "__local_depot" not in ptx and "st.local" not in ptx
    assert re.search(r"mov\.b64\s+(%rd\d+), tma_tile_param_0;", ptx)
    assert re.search(r"cvta\.param\.u64", ptx)
    if HAS_PTXAS:
        assert artifacts.cubin
