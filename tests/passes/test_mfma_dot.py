"""dot on AMD matrix cores: MFMA 32x32x8 / 16x16x16 for f16/bf16 inputs with an f32 accumulator.

Specification:

* the plan picks the target's instruction: mma.sync m16n8k16 on NVIDIA,
  MFMA on targets with "mfma" (32x32x8 when M and N are multiples of 32,
  else 16x16x16); anything neither can tile (f32 inputs, shapes that do not
  divide) keeps the FMA lowering;
* one warp-tiling algorithm serves both: the layouts are the mma.sync
  formulas with the MFMA fragments in place of the mma.sync ones;
* A and B reach their fragments through LDS in a padded layout picked by
  counting bank conflicts (`mfma_operands.plan_lds`), never worse than
  plain row-major, with the bank count from the target;
* lowered for gfx942 (64-lane waves), dot kernels, the tutorial matmul with
  masked edges and the library GEMM (also for gfx950, on its double-K
  forms) compute on the SIMT simulator what the
  tile interpreter computes (to f32 rounding: each MFMA adds its products
  in f32, in k order).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import tessera
from tessera.backends.interp import Memory, run_function
from tessera.backends.simt import run_threads
from tessera.ir.layouts import local, replicated, spatial
from tessera.ir.mfma_layouts import mfma_32x32x8_a, mfma_32x32x8_b, mfma_32x32x8_c
from tessera.ir.smem_layouts import bank_conflicts, row_major
from tessera.ir.target import get_target
from tessera.passes.layout_assignment import assign_layouts
from tessera.passes.lowering.layout_math import shared_vector_width
from tessera.passes.lowering.mfma_operands import lds_cycles, plan_lds
from tessera.passes.mma import MFMA_16X16X16, MFMA_32X32X8, MFMA_32X32X16, MMA_M16N8K16, instruction_for, mma_plan
from tessera.passes.thread_passes import lower
from test_mma_dot import F32_ACC, dot_args, dot_module, tutorial_matmul_on

TUTORIALS = Path(__file__).resolve().parents[2] / "tutorials"


def mfma_ops(fn):
    return [op for op in fn.walk() if op.name == "mfma"]


@pytest.mark.parametrize("target,shape,expected", [
    ("gfx942", (64, 64, 32), MFMA_32X32X8),
    ("gfx942", (32, 32, 8), MFMA_32X32X8),
    ("gfx942", (32, 16, 32), MFMA_16X16X16),       # N = 16: no 32x32 fragment fits
    ("gfx942", (16, 16, 16), MFMA_16X16X16),
    ("gfx942", (16, 16, 8), None),                  # K = 8 < 16 and M < 32
    ("gfx942", (16, 8, 16), None),
    ("gfx90a", (128, 64, 64), MFMA_32X32X8),
    ("gfx950", (64, 64, 32), MFMA_32X32X16),       # gfx950's double-K forms: tests/passes/test_mfma_wide.py
    ("sm_80", (64, 64, 32), MMA_M16N8K16),
    ("sm_90a", (16, 8, 16), MMA_M16N8K16),
])
def test_the_target_picks_the_instruction(target, shape, expected):
    assert instruction_for(get_target(target), *shape) == expected


def test_f32_inputs_keep_the_fma_lowering_on_amd():
    fn = dot_module(32, 32, 32, tessera.f32).functions[0]
    dot = next(op for op in fn.walk() if op.name == "dot")
    assert mma_plan(dot, get_target("gfx942"), 4) is None
    lowered = lower(fn, "gfx942", num_warps=1).functions[0]
    assert not mfma_ops(lowered) and any(op.name == "for" for op in lowered.walk())


def test_a_64x64x32_dot_with_4_waves_tiles_the_accumulator_in_32x32_fragments():
    fn = dot_module(64, 64, 32).functions[0]
    assignment = assign_layouts(fn, get_target("gfx942"), num_warps=4)
    dot = next(op for op in fn.walk() if op.name == "dot")
    # 2 x 2 waves, one 32x32 fragment each, walking K in 4 steps of 8.
    assert assignment.layout(dot.result) == spatial(2, 2) * mfma_32x32x8_c()
    assert assignment.operand_layout(dot, 0) == local(1, 4) * spatial(2, 1) * replicated(2) * mfma_32x32x8_a()
    assert assignment.operand_layout(dot, 1) == local(4, 1) * replicated(2) * spatial(1, 2) * mfma_32x32x8_b()
    lowered = lower(fn, "gfx942", num_warps=4).functions[0]
    assert [op.attrs for op in mfma_ops(lowered)] == [{"m": 32, "n": 32, "k": 8}] * 4


@pytest.mark.parametrize("dtype", [tessera.f16, tessera.bf16], ids=str)
@pytest.mark.parametrize("shape", [(32, 32, 32), (64, 64, 32), (16, 16, 16), (16, 64, 32)], ids=str)
@pytest.mark.parametrize("num_warps", [1, 2, 4])
def test_mfma_dot_on_the_simt_simulator_matches_the_tile_interpreter(dtype, shape, num_warps):
    m, n, k = shape
    module = dot_module(m, n, k, dtype)
    expected, actual = dot_args(m, n, k), dot_args(m, n, k)
    run_function(module.functions[0], expected, (1,))
    fn = lower(module, "gfx942", num_warps=num_warps).functions[0]
    dot = next(op for op in module.functions[0].walk() if op.name == "dot")
    plan = mma_plan(dot, get_target("gfx942"), num_warps)
    inst = plan.instruction
    assert inst == (MFMA_32X32X8 if m % 32 == 0 and n % 32 == 0 else MFMA_16X16X16)
    assert plan.rk == k // inst.k and len(mfma_ops(fn)) == plan.rm * plan.rn * plan.rk
    assert fn.attrs["warp_size"] == 64
    run_threads(fn, actual, (1,))
    np.testing.assert_allclose(actual[2], expected[2], **F32_ACC)


@pytest.mark.parametrize("blocks,grid,fragment", [((64, 64, 32), (2, 2), MFMA_32X32X8),
                                                  ((32, 16, 16), (3, 5), MFMA_16X16X16)], ids=str)
def test_tutorial_matmul_with_masked_edges_runs_on_mfma(blocks, grid, fragment):
    fn = tutorial_matmul_on("gfx942", 4, blocks, grid)
    assert {tuple(op.attrs.values()) for op in mfma_ops(fn)} == {(fragment.m, fragment.n, fragment.k)}


def bf16_bits(x: np.ndarray) -> np.ndarray:
    """float32 -> bf16 bit patterns (rounded to nearest even)."""
    bits = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)


@pytest.mark.parametrize("target,dtype,blocks,epilogue", [
    ("gfx942", "f16", (32, 32, 16), False), ("gfx942", "bf16", (32, 32, 16), True),
    ("gfx942", "f16", (16, 16, 16), True),
    ("gfx950", "bf16", (32, 32, 16), True), ("gfx950", "f16", (16, 16, 32), False)], ids=str)  # double-K MFMA
def test_library_gemm_runs_on_mfma(target, dtype, blocks, epilogue):
    gemm = pytest.importorskip("tessera.kernels_lib.gemm")
    M, N, K = 40, 48, 24          # 2 x 2 (or 3 x 3) tiles, partial at the edges; K walks 2 blocks
    bm, bn, bk = blocks
    rng = np.random.default_rng(11)
    a32, b32, bias = (rng.standard_normal(s).astype(np.float32) for s in ((M, K), (K, N), (N,)))

    def args():
        if dtype == "bf16":
            a, b = Memory(bf16_bits(a32), tessera.bf16), Memory(bf16_bits(b32), tessera.bf16)
        else:
            a, b = a32.astype(np.float16), b32.astype(np.float16)
        c = np.zeros((M, N), np.float32)
        return [a, b, bias.copy() if epilogue else c, c, c, c, M, N, K, 0.5, K, 1, N, 1]

    constexprs = dict(HAS_BIAS=epilogue, SCALE_A="none", SCALE_B="none",
                      ACTIVATION="relu" if epilogue else "none", BM=bm, BN=bn, BK=bk, GROUP_M=2, PERSISTENT=False, STAGES=2)
    expected, actual = args(), args()
    traced = [tessera.reinterpret(x.array, x.dtype) if isinstance(x, Memory) else x for x in expected]
    module = gemm.gemm_kernel.kernel.specialize(*traced, **constexprs).module
    grid = (-(-M // bm) * -(-N // bn),)
    run_function(module.functions[0], expected, grid)
    fn = lower(module, target, num_warps=4).functions[0]
    wide = {(32, 32, 16), (16, 16, 32)}
    assert mfma_ops(fn) and all((tuple(op.attrs.values()) in wide) == (target == "gfx950") for op in mfma_ops(fn))
    # B row-major (MN-major) in its ring slots: gfx950 reads it with LDS transpose reads (`test_lds_read_tr.py`)
    assert any(op.name == "lds_read_tr" for op in fn.walk()) == (target == "gfx950")
    run_threads(fn, actual, grid)
    np.testing.assert_allclose(actual[5], expected[5], **F32_ACC)


def fragment_read_conflicts(smem, layout, vector, warp=64):
    table = layout.table()
    return max(bank_conflicts(smem, table[w:w + warp, g:g + vector], 2)
               for g in range(0, layout.local_size, vector) for w in range(0, layout.num_threads, warp))


def test_lds_layout_makes_the_a_fragment_reads_conflict_free():
    target = get_target("gfx942")
    fn = dot_module(64, 64, 32).functions[0]
    assignment = assign_layouts(fn, target, num_warps=4)
    dot = next(op for op in fn.walk() if op.name == "dot")
    src, want = assignment.layout(dot.operands[0]), mma_plan(dot, target, 4).a
    plain = row_major(64, 32)          # lane l reads row l % 32: rows 64 bytes apart share banks
    assert fragment_read_conflicts(plain, want, shared_vector_width(want, plain.strides, 16, 128)) == 8
    plan = plan_lds(src, want, 16, target.shared_memory_banks, target.max_vector_bits, 64)
    smem = plan.storage(want.shape)
    assert (plan.order, plan.pad, plan.load_vector) == ((0, 1), 4, 4)     # row-major, rows padded by 8 bytes
    assert fragment_read_conflicts(smem, want.permute(plan.order), plan.load_vector) == 1


@pytest.mark.parametrize("target", ["gfx90a", "gfx942", "gfx950"])
@pytest.mark.parametrize("shape", [(64, 64, 32), (16, 16, 16), (128, 128, 64)], ids=str)
def test_lds_plan_is_never_worse_than_row_major(target, shape):
    t = get_target(target)
    fn = dot_module(*shape).functions[0]
    assignment = assign_layouts(fn, t, num_warps=4)
    dot = next(op for op in fn.walk() if op.name == "dot")
    plan = mma_plan(dot, t, 4)
    for index, want in ((0, plan.a), (1, plan.b)):
        src = assignment.layout(dot.operands[index])
        chosen = plan_lds(src, want, 16, t.shared_memory_banks, t.max_vector_bits, 64)
        smem = row_major(*src.shape)
        banks, bits = t.shared_memory_banks, t.max_vector_bits
        plain = (lds_cycles(smem, src, shared_vector_width(src, smem.strides, 16, bits), 16, banks, 64, owners_only=True)
                 + lds_cycles(smem, want, shared_vector_width(want, smem.strides, 16, bits), 16, banks, 64))
        assert chosen.cycles <= plain


def test_gfx950_counts_64_banks():
    assert get_target("gfx950").shared_memory_banks == 64
    assert get_target("gfx942").shared_memory_banks == get_target("sm_80").shared_memory_banks == 32
    column = np.stack([np.arange(64), np.zeros(64, int)], axis=-1)      # 64 lanes read one column of f16
    rows_of_64_words = row_major(64, 128)
    assert bank_conflicts(rows_of_64_words, column, 2, banks=32) == 32     # 32 lanes per phase, all in bank 0
    assert bank_conflicts(rows_of_64_words, column, 2, banks=64) == 64     # 64 lanes per phase, all in bank 0
    assert bank_conflicts(row_major(64, 128, pad=2), column, 2, banks=64) == 1
