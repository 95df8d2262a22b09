"""wgmma to PTX: the hand-built warpgroup kernel (`wgmma_programs.py`, also run by the SIMT simulator in
`tests/simt/test_simt_wgmma.py`) compiles for sm_90a to wgmma.mma_async / fence / commit / wait, assembles
with ptxas without spilling, and is rejected before LLVM for targets without wgmma."""

import re

import pytest
from wgmma_programs import wgmma_kernel

from tessera.backends.nvptx import compile_thread_ir, find_ptxas
from tessera.backends.nvptx.errors import CodegenError
from tessera.backends.nvptx.warpgroup import wgmma_asm
from tessera.ir.parser import parse_module
from tessera.ir.verifier import verify_module


def kernel(n, **kw):
    module = parse_module(wgmma_kernel(n, **kw))
    verify_module(module)
    return module.functions[0]


@pytest.mark.parametrize("n", [64, 128])
def test_wgmma_kernel_compiles_for_sm_90a_and_assembles_without_spills(n):
    artifacts = compile_thread_ir(kernel(n), "sm_90a", assemble=find_ptxas() is not None)
    ptx = artifacts.ptx
    mma = re.findall(rf"wgmma\.mma_async\.sync\.aligned\.m64n{n}k16\.f32\.bf16\.bf16 \{{([^}}]*)\}}", ptx)
    assert len(mma) == 4                                   # K = 64: four chained k16 steps
    assert all(len(d.split(",")) == n // 2 for d in mma)   # N/2 f32 accumulator registers each
    assert "wgmma.fence.sync.aligned;" in ptx and "wgmma.commit_group.sync.aligned;" in ptx
    assert re.search(r"wgmma\.wait_group\.sync\.aligned\s+0;", ptx)
    assert "fence.proxy.async.shared::cta;" in ptx
    assert ".extern .func" not in ptx
    assert ".extern .shared .align 1024 .b8 global_smem[]" in ptx   # the swizzle pattern's period
    if find_ptxas() is not None:
        assert artifacts.cubin
        info = artifacts.ptxas_info
        assert info["spill_stores"] == 0 and info["spill_loads"] == 0, info["log"]


def test_f16_and_n256_compile_for_sm_90a():
    ptx = compile_thread_ir(kernel(256, k=32, dtype="f16"), "sm_90a", assemble=find_ptxas() is not None).ptx
    assert "wgmma.mma_async.sync.aligned.m64n256k16.f32.f16.f16" in ptx


@pytest.mark.parametrize("target", ["sm_80", "sm_90"])
def test_targets_without_wgmma_reject_the_kernel_before_llvm(target):
    with pytest.raises(CodegenError, match=rf"{target} lacks.*compile for sm_90a"):
        compile_thread_ir(kernel(64), target)


def test_inline_asm_operands():
    asm = wgmma_asm(8, "bf16", False, True)
    assert "wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16 {$0, $1, $2, $3}, $4, $5, p, 1, 1, 0, 1;" in asm
    assert "setp.ne.b32 p, $6, 0;" in asm


def test_inline_asm_operands_with_a_in_registers():
    """A's 8 elements as 4 words in place of its descriptor; imm-trans-b alone after the scales."""
    asm = wgmma_asm(8, "bf16", False, True, a_in_registers=True)
    assert ("wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16 {$0, $1, $2, $3}, {$4, $5, $6, $7}, $8, p, 1, 1, 1;"
            in asm)
    assert "setp.ne.b32 p, $9, 0;" in asm


def test_a_fresh_accumulator_is_scale_d_0_not_zero_registers():
    """The chain's first wgmma accumulates into zeros: it computes D = A*B (scale-d 0, its accumulator inputs
    undefined) rather than reading zero registers, which LLVM makes one register that ptxas may tie to another
    group's accumulator in flight (and then injects a wait between independent groups:
    docs/perf/attention-backward-h100.md); the chained steps accumulate (scale-d 1)."""
    llvm_ir = compile_thread_ir(kernel(64), "sm_90a", assemble=False).llvm_ir
    calls = re.findall(r'asm sideeffect "\{.*?wgmma\.mma_async.*?"\((.*?)\)\s*\n', llvm_ir, re.S)
    assert len(calls) == 4
    first, *chained = [[arg.strip() for arg in call.split(",")] for call in calls]
    assert first[2] == "i32 0" and set(first[3:]) == {"float undef"}, first[:4]
    assert all(args[2] == "i32 1" and "float undef" not in args for args in chained)
