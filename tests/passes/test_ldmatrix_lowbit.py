"""ldmatrix for 8-bit and tf32 (f32) elements: the m16n8k32 and m16n8k8 fragments of K-contiguous operands.

Specification:

* `ldmatrix {num}` of 8-bit (i8, u8, e4m3, e5m2) and 32-bit elements on the
  SIMT simulator is the PTX instruction read at that width: lane 8j + r gives
  the address of 16-byte row r of matrix j; lane l receives the 32-bit word
  (l // 4, l % 4) of matrix j, i.e. w = 32 / bits elements
  (l // 4, w * (l % 4) + e), in registers w*j + e (`mma_layouts.ldmatrix_layout`);
  `.trans` is rejected for them (it swaps 16-bit halves);
* element by element, the plain x4 / x2 reads reproduce the mma.sync
  m16n8k32 (8-bit) and m16n8k8 (tf32) A fragments from a row-major (K
  contiguous) buffer and the B fragments from a B^T (K contiguous) buffer,
  with a conflict-free swizzle; a B that is contiguous along N has no
  ldmatrix read (`ldmatrix_rows` says None);
* a non-pipelined tensor-core dot of such operands reads A with ldmatrix and
  still matches the tile interpreter, and its PTX assembles without spills.
"""

from __future__ import annotations

import numpy as np
import pytest

from tessera.backends.interp import run_function

from tessera.backends.simt import run_threads
from tessera.backends.nvptx import compile_thread_ir, find_ptxas
from tessera.ir import dtypes as dt
from tessera.ir.errors import IRError
from tessera.ir.layouts import LayoutError
from tessera.ir.mma_layouts import ldmatrix_layout, mma_fragments
from tessera.ir.parser import parse_module
from tessera.ir.verifier import verify_function
from tessera.passes.lowering.mma_operands import ldmatrix_plan, ldmatrix_rows, row_conflicts
from tessera.passes.thread_passes import lower
from test_mma_dtypes import args as dtype_args, specialize

LDMATRIX = """\
func @k(%src: ptr<f32>, %rows: ptr<i32>, %out: ptr<f32>) attributes {num_threads = 32, shared_bytes = 512} {
  %tid = thread_id : i32
  %per_row = constant {value = ROW} : i32
  %smem = shared_alloc {bytes = 512, offset = 0} : ptr<DTYPE, shared>
  %first = mul %tid, %per_row : i32
  %lanes = constant {value = LANES} : regs<ROWxi32>
  %base = splat %first : regs<ROWxi32>
  %idx = add %base, %lanes : regs<ROWxi32>
  %srcs = splat %src : regs<ROWxptr<f32>>
  %from = addptr %srcs, %idx : regs<ROWxptr<f32>>
  %x = load %from : regs<ROWxf32>
  %h = cast %x : regs<ROWxDTYPE>
  %smems = splat %smem : regs<ROWxptr<DTYPE, shared>>
  %to = addptr %smems, %idx : regs<ROWxptr<DTYPE, shared>>
  store %to, %h
  barrier
  %rp = addptr %rows, %tid : ptr<i32>
  %row = load %rp : i32
  %off = mul %row, %per_row : i32
  %addr = addptr %smem, %off : ptr<DTYPE, shared>
  %v = ldmatrix %addr {num = NUM, trans = TRANS} : regs<REGSxDTYPE>
  %w = cast %v : regs<REGSxf32>
  %n = constant {value = REGS} : i32
  %o = mul %tid, %n : i32
  %outs = splat %out : regs<REGSxptr<f32>>
  %ob = splat %o : regs<REGSxi32>
  %order = constant {value = ORDER} : regs<REGSxi32>
  %oi = add %ob, %order : regs<REGSxi32>
  %op = addptr %outs, %oi : regs<REGSxptr<f32>>
  store %op, %w
  return
}
"""
DTYPES = {"i8": dt.i8, "u8": dt.u8, "f8e4m3": dt.f8e4m3, "f8e5m2": dt.f8e5m2, "f32": dt.f32}


def ldmatrix_kernel(num: int, dtype: str, trans: bool = False):
    row, regs = 128 // DTYPES[dtype].bits, num * 32 // DTYPES[dtype].bits
    text = (LDMATRIX.replace("ORDER", str(list(range(regs)))).replace("LANES", str(list(range(row))))
            .replace("NUM", str(num)).replace("TRANS", "true" if trans else "false").replace("REGS", str(regs))
            .replace("ROW", str(row)).replace("DTYPE", dtype))
    return parse_module(text).functions[0]


def reference(memory: np.ndarray, rows: np.ndarray, num: int, bits: int) -> np.ndarray:
    """PTX ISA ldmatrix, its 16-bit words read as `bits`-bit elements: lane l gets word (l // 4, l % 4) of
    matrix j, whose row r is the 16 bytes at the address lane 8j + r gives."""
    per_word, per_row = 32 // bits, 128 // bits
    out = np.zeros((32, per_word * num), np.float32)
    for j in range(num):
        matrix = memory.reshape(32, per_row)[rows[8 * j:8 * j + 8]]
        for lane in range(32):
            for e in range(per_word):
                out[lane, per_word * j + e] = matrix[lane // 4, per_word * (lane % 4) + e]
    return out


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("num", [1, 2, 4])
def test_ldmatrix_of_8_and_32_bit_elements_is_the_ptx_instruction(num, dtype):
    bits = DTYPES[dtype].bits
    fn = ldmatrix_kernel(num, dtype)
    rng = np.random.default_rng(num)
    values = np.arange(-8, 8) if dtype.startswith("f8") else np.arange(0, 100)   # exact in the dtype
    memory = rng.choice(values, 32 * 128 // bits).astype(np.float32)
    rows = rng.permutation(32).astype(np.int32)
    out = np.zeros(32 * num * 32 // bits, np.float32)
    run_threads(fn, [memory, rows, out], (1,))
    np.testing.assert_array_equal(out.reshape(32, -1), reference(memory, rows, num, bits))


@pytest.mark.parametrize("dtype", ["i8", "f32"])
def test_ldmatrix_registers_are_the_ldmatrix_layout(dtype):
    bits = DTYPES[dtype].bits
    fn = ldmatrix_kernel(4, dtype)
    per_row = 128 // bits
    memory = (np.arange(32 * per_row) % 127).astype(np.float32)
    out = np.zeros(32 * 128 // bits, np.float32)
    run_threads(fn, [memory, np.arange(32, dtype=np.int32), out], (1,))
    layout, stack = ldmatrix_layout(4, False, bits), memory.reshape(32, per_row)
    regs = layout.local_size
    for lane in range(32):
        for i in range(regs):
            assert out[lane * regs + i] == stack[layout.map(lane, i)]


TRANSPOSED = """\
func @k() attributes {num_threads = 32, shared_bytes = 512} {
  %smem = shared_alloc {bytes = 512, offset = 0} : ptr<DTYPE, shared>
  %v = ldmatrix %smem {num = 4, trans = true} : regs<REGSxDTYPE>
  return
}
"""


@pytest.mark.parametrize("dtype", ["i8", "f32"])
def test_ldmatrix_trans_of_non_16_bit_elements_is_rejected(dtype):
    regs = 4 * 32 // DTYPES[dtype].bits
    text = TRANSPOSED.replace("DTYPE", dtype).replace("REGS", str(regs))
    with pytest.raises(IRError, match=r"\.trans transposes 16-bit elements"):
        verify_function(parse_module(text).functions[0])
    with pytest.raises(LayoutError):
        ldmatrix_layout(4, True, DTYPES[dtype].bits)


# -- the mma fragments ------------------------------------------------------------------------

SHAPES = {1: (16, 8, 32), 4: (16, 8, 8)}     # element bytes -> the mma.sync shape of its fragments


@pytest.mark.parametrize("element_bytes", [1, 4], ids=["8-bit-m16n8k32", "tf32-m16n8k8"])
def test_ldmatrix_reproduces_the_k_contiguous_mma_fragments(element_bytes):
    a, b, _ = mma_fragments(*SHAPES[element_bytes])
    for want, nums in ((a, (4,)), (b.permute((1, 0)), (2,))):     # A row-major; B as B^T (n x k) row-major
        rows = ldmatrix_rows(want, False, 32, element_bytes)
        assert rows is not None and rows.nums == nums
        plan = ldmatrix_plan(want, False, 32, element_bytes)
        assert row_conflicts(plan.smem, rows.starts, element_bytes) == 1
        per_word = 4 // element_bytes            # element by element: what each lane gets is the fragment
        table = want.table()
        for lane in range(32):
            for i in range(want.local_size):
                j, e = divmod(i, per_word)
                start = rows.starts[8 * j + lane // 4, 0]
                assert tuple(start + [0, per_word * (lane % 4) + e]) == tuple(table[lane, i])
    # B contiguous along N would need .trans of 8-/32-bit elements: no ldmatrix read
    assert ldmatrix_rows(b, True, 32, element_bytes) is None
    assert ldmatrix_rows(b, False, 32, element_bytes) is None


def test_wider_tiles_of_8_bit_fragments_get_a_conflict_free_swizzle():
    from tessera.ir.target import get_target
    from tessera.passes.mma import mma_plan
    fn = specialize("i8", 64, 64, 64, 64, 64, 64).functions[0]
    dot = next(op for op in fn.walk() if op.name == "dot")
    plan = mma_plan(dot, get_target("sm_80"), 4)
    ld = ldmatrix_plan(plan.a, False, 32, 1)
    assert ld is not None and ld.smem.swizzle is not None and ld.smem.is_bijective
    assert row_conflicts(ld.smem, ld.rows.starts, 1) == 1


# -- non-pipelined dots -------------------------------------------------------------------------

@pytest.mark.parametrize("case, target", [("i8", "sm_80"), ("u8", "sm_80"), ("e4m3", "sm_89"), ("tf32", "sm_80")])
def test_a_non_pipelined_dot_reads_a_with_ldmatrix_and_matches_the_tile_interpreter(case, target):
    m, n, k = 61, 40, 96
    module = specialize(case, m, n, k, 64, 32, 32)
    expected, actual = dtype_args(case, m, n, k), dtype_args(case, m, n, k)
    grid = (2, 2)
    run_function(module.functions[0], expected, grid)
    fn = lower(module, target, num_warps=4).functions[0]
    assert [op for op in fn.walk() if op.name == "ldmatrix"]
    run_threads(fn, actual, grid)
    if case in ("i8", "u8"):
        np.testing.assert_array_equal(actual[2], expected[2])       # integer sums: exact
    else:                                                           # f32 sums in another order
        np.testing.assert_allclose(actual[2], expected[2], rtol=1e-5, atol=1e-4)


@pytest.mark.skipif(find_ptxas() is None, reason="ptxas not found (PATH, CUDA_HOME, nvidia-cuda-nvcc wheel)")
@pytest.mark.parametrize("case, target", [("i8", "sm_80"), ("e5m2", "sm_89"), ("tf32", "sm_80")])
def test_ldmatrix_of_8_and_32_bit_elements_assembles_without_spills(case, target):
    fn = lower(specialize(case, 64, 64, 32, 64, 64, 32), target, num_warps=4).functions[0]
    artifacts = compile_thread_ir(fn, target, isolate=False)
    assert "ldmatrix.sync.aligned.m8n8.x4.shared.b16" in artifacts.ptx
    assert artifacts.ptxas_info["spill_stores"] == artifacts.ptxas_info["spill_loads"] == 0
