"""dot operands global -> shared (swizzled) -> registers with ldmatrix.

Specification:

* `ldmatrix {num, trans}` on the SIMT simulator is the PTX instruction:
  lane 8j + r gives the address of row r of matrix j; lane l receives
  elements (l // 4, 2 * (l % 4) + {0, 1}) of matrix j in registers 2j, 2j + 1,
  transposed with .trans -- the `layouts.ldmatrix()` registers;
* a tensor-core dot whose A / B must move into their fragments stores them
  into XOR-swizzled shared memory and reads them back with ldmatrix (A plain,
  B .trans), and still computes what the tile interpreter computes (the
  simulator also checks the shared-memory accesses for races);
* the swizzled layout serves the ldmatrix row reads without bank conflicts
  (the plain row-major one does not);
* tutorial 03's matmul uses it, and the PTX holds
  `ldmatrix.sync.aligned.m8n8.x4` and assembles without spills.
"""

from __future__ import annotations

import runpy
from pathlib import Path

import numpy as np
import pytest

import tessera
from tessera.backends.interp import run_function
from tessera.backends.simt import run_threads
from tessera.backends.nvptx import compile_thread_ir, find_ptxas
from tessera.ir.layouts import ldmatrix
from tessera.ir.parser import parse_module
from tessera.ir.printer import print_module
from tessera.ir.smem_layouts import SmemLayout, Swizzle, bank_conflicts, row_major, swizzle_bytes
from tessera.ir.target import get_target
from tessera.passes.lowering.mma_operands import ldmatrix_plan, ldmatrix_rows, row_conflicts, swizzled_row_major
from tessera.passes.mma import mma_plan
from tessera.passes.thread_passes import lower
from test_mma_dot import dot_args, dot_module

TUTORIALS = Path(__file__).resolve().parents[2] / "tutorials"
F32_ACC = dict(rtol=1e-5, atol=1e-5)

# -- the thread op -------------------------------------------------------------------

LDMATRIX = """\
func @k(%src: ptr<f32>, %rows: ptr<i32>, %out: ptr<f32>) attributes {num_threads = 32, shared_bytes = 512} {
  %tid = thread_id : i32
  %eight = constant {value = 8} : i32
  %smem = shared_alloc {bytes = 512, offset = 0} : ptr<DTYPE, shared>
  %first = mul %tid, %eight : i32
  %lanes = constant {value = [0, 1, 2, 3, 4, 5, 6, 7]} : regs<8xi32>
  %base = splat %first : regs<8xi32>
  %idx = add %base, %lanes : regs<8xi32>
  %srcs = splat %src : regs<8xptr<f32>>
  %from = addptr %srcs, %idx : regs<8xptr<f32>>
  %x = load %from : regs<8xf32>
  %h = cast %x : regs<8xDTYPE>
  %smems = splat %smem : regs<8xptr<DTYPE, shared>>
  %to = addptr %smems, %idx : regs<8xptr<DTYPE, shared>>
  store %to, %h
  barrier
  %rp = addptr %rows, %tid : ptr<i32>
  %row = load %rp : i32
  %off = mul %row, %eight : i32
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


def ldmatrix_kernel(num: int, trans: bool, dtype: str):
    regs = 2 * num
    text = (LDMATRIX.replace("ORDER", str(list(range(regs)))).replace("NUM", str(num))
            .replace("TRANS", "true" if trans else "false").replace("REGS", str(regs)).replace("DTYPE", dtype))
    return parse_module(text).functions[0]


def reference(memory: np.ndarray, rows: np.ndarray, num: int, trans: bool) -> np.ndarray:
    """PTX ISA ldmatrix: out[l, 2j + e] from matrix j, whose row r is at the address lane 8j + r gives."""
    out = np.zeros((32, 2 * num), np.float32)
    for j in range(num):
        matrix = memory.reshape(32, 8)[rows[8 * j:8 * j + 8]]
        for lane in range(32):
            for e in range(2):
                r, c = lane // 4, 2 * (lane % 4) + e
                out[lane, 2 * j + e] = matrix[c, r] if trans else matrix[r, c]
    return out


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
@pytest.mark.parametrize("trans", [False, True])
@pytest.mark.parametrize("num", [1, 2, 4])
def test_ldmatrix_on_the_simt_simulator_is_the_ptx_instruction(num, trans, dtype):
    fn = ldmatrix_kernel(num, trans, dtype)
    rng = np.random.default_rng(num + 2 * trans)
    memory = rng.permutation(256).astype(np.float32)           # exact in f16 and bf16, all distinct
    rows = rng.permutation(32).astype(np.int32)                 # any row of the 32 for each lane
    out = np.zeros(32 * 2 * num, np.float32)
    run_threads(fn, [memory, rows, out], (1,))
    np.testing.assert_array_equal(out.reshape(32, 2 * num), reference(memory, rows, num, trans))


@pytest.mark.parametrize("trans", [False, True])
def test_ldmatrix_registers_are_the_ldmatrix_layout(trans):
    # Lanes 8j..8j+7 point at rows 8j.. of a (32, 8) stack: register i of lane l is stack[ldmatrix().map(l, i)].
    fn = ldmatrix_kernel(4, trans, "f16")
    memory = np.arange(256, dtype=np.float32)
    out = np.zeros(32 * 8, np.float32)
    run_threads(fn, [memory, np.arange(32, dtype=np.int32), out], (1,))
    layout, stack = ldmatrix(4, trans), memory.reshape(32, 8)
    for lane in range(32):
        for i in range(8):
            assert out[lane * 8 + i] == stack[layout.map(lane, i)]


LDMATRIX_MISALIGNED = """\
func @k() attributes {num_threads = 32, shared_bytes = 512} {
  %tid = thread_id : i32
  %smem = shared_alloc {bytes = 512, offset = 0} : ptr<f16, shared>
  %addr = addptr %smem, %tid : ptr<f16, shared>
  %v = ldmatrix %addr {num = 4, trans = false} : regs<8xf16>
  return
}
"""


def test_ldmatrix_rejects_a_row_that_is_not_16_byte_aligned():
    from tessera.backends.interp import InterpreterError
    with pytest.raises(InterpreterError, match="not 16-byte aligned"):
        run_threads(parse_module(LDMATRIX_MISALIGNED).functions[0], [], (1,))

# -- the mma operand path ------------------------------------------------------------------
# (the dot kernel and its arguments are the tensor-core tests' own: test_mma_dot.py)


def ldmatrix_ops(fn):
    return [op for op in fn.walk() if op.name == "ldmatrix"]


def operand_shared_loads(fn, dtype):
    """Scalar / vector loads of A or B elements from shared memory (the generic conversion)."""
    return [op for op in fn.walk() if op.name == "load" and op.operands[0].type.element.address_space == "shared"
            and op.operands[0].type.element.pointee == dtype]


@pytest.mark.parametrize("dtype", [tessera.f16, tessera.bf16], ids=str)
@pytest.mark.parametrize("shape, num_warps", [((64, 64, 32), 4), ((16, 8, 16), 1), ((16, 128, 64), 4)], ids=str)
def test_mma_dot_reads_its_operands_with_ldmatrix_and_matches_the_tile_interpreter(shape, num_warps, dtype):
    m, n, k = shape
    module = dot_module(m, n, k, dtype)
    expected, actual = dot_args(m, n, k), dot_args(m, n, k)
    run_function(module.functions[0], expected, (1,))
    fn = lower(module, "sm_80", num_warps=num_warps).functions[0]
    ops = ldmatrix_ops(fn)
    assert any(not op.attrs["trans"] for op in ops) and any(op.attrs["trans"] for op in ops)   # A plain, B .trans
    assert not operand_shared_loads(fn, dtype)     # no generic conversion of A or B left
    run_threads(fn, actual, (1,))                  # checks shared-memory races too
    np.testing.assert_allclose(actual[2], expected[2], **F32_ACC)


@pytest.mark.parametrize("shape", [(64, 64, 32), (16, 64, 128), (16, 128, 64)], ids=str)
@pytest.mark.parametrize("operand", ["a", "b"])
def test_the_swizzled_buffer_serves_the_ldmatrix_rows_without_bank_conflicts(operand, shape):
    """Rows of up to 128 bytes and rows of 256 (decode's q.k^T over head dim 128 and its P v: before the row-keyed
    swizzle those read 8-way conflicted, every ldmatrix phase's eight rows on the same banks)."""
    fn = dot_module(*shape).functions[0]
    dot = next(op for op in fn.walk() if op.name == "dot")
    plan = mma_plan(dot, get_target("sm_80"), 4)
    want, trans = (plan.a, False) if operand == "a" else (plan.b, True)
    rows = ldmatrix_rows(want, trans)
    assert rows is not None and rows.nums == (4,) * (want.local_size // 8)
    shape = want.shape
    swizzled = swizzled_row_major(*shape, rows.starts, row_keyed=True)
    assert swizzled.swizzle is not None and swizzled.is_bijective
    for g in range(len(rows.nums)):            # each warp-wide ldmatrix: 8 contiguous f16 per lane
        access = rows.starts[:32, g, None, :] + np.stack([np.zeros(8, int), np.arange(8)], -1)[None]
        assert bank_conflicts(swizzled, access, 2) == 1
    assert row_conflicts(row_major(*shape), rows.starts) > 1     # what the swizzle avoids


def test_a_b_whose_owners_hold_runs_along_k_is_kept_n_by_k_in_wide_conflict_free_rows():
    """A B (K x N) held in runs along K (a dequantized weight block, W[N, K].T) is stored N x K in 16-byte
    vectors and read with the plain ldmatrix; its 256-byte rows (K = 128 bf16) take the row-keyed swizzle,
    since every standard 32/64/128-byte swizzle leaves the eight rows of an ldmatrix matrix conflicting (and
    plain rows: 8-way). Without `row_keyed` (a slot TMA may fill) the plan keeps the TMA swizzles."""
    fn = dot_module(16, 64, 128, tessera.bf16).functions[0]
    dot = next(op for op in fn.walk() if op.name == "dot")
    want = mma_plan(dot, get_target("sm_90a"), 4).b.permute((1, 0))          # the N x K buffer's fragment
    plan = ldmatrix_plan(want, False, 32, 2, row_keyed=True)
    assert plan.smem.swizzle == Swizzle(3, 3, 4) and plan.smem.is_bijective
    assert row_conflicts(plan.smem, plan.rows.starts) == 1
    assert row_conflicts(row_major(64, 128), plan.rows.starts) == 8
    for n in (128, 64, 32):
        standard = SmemLayout((64, 128), (128, 1), swizzle_bytes(n, 2))
        assert row_conflicts(standard, plan.rows.starts) > 1
    assert ldmatrix_plan(want, False, 32, 2).smem.swizzle is None


def test_a_dot_of_a_k_contiguous_b_stores_it_transposed_and_matches_the_interpreter():
    """W [N, K] loaded, scaled (so not a pipelined load) and transposed into the dot: the SIMT simulator
    agrees with the tile interpreter, and B reaches shared memory in vector stores as long as its owners' runs
    along K (4 elements: the 16-byte float32 loads), read without .trans (main stored it element by element)."""
    args = [np.random.default_rng(3).standard_normal((16, 128)).astype(np.float32),
            np.random.default_rng(4).standard_normal((64, 128)).astype(np.float32), np.zeros((16, 64), np.float32)]
    module = scaled_bt_kernel.specialize(*args).module
    expected, actual = [a.copy() for a in args], [a.copy() for a in args]
    run_function(module.functions[0], expected, (1,))
    fn = lower(module, "sm_90a", num_warps=4).functions[0]
    bf16_stores = [op for op in fn.walk() if op.name == "store" and op.operands[0].type.element.address_space ==
                   "shared" and op.operands[0].type.element.pointee == tessera.bf16]
    b_store = next(op for op in bf16_stores if op.operands[1].type.count == 64 * 128 // 128)
    assert b_store.attrs.get("vector") == 4
    assert not any(op.attrs["trans"] for op in ldmatrix_ops(fn))
    run_threads(fn, actual, (1,))
    np.testing.assert_allclose(actual[2], expected[2], rtol=2e-2, atol=2e-2)


@tessera.kernel
def scaled_bt_kernel(a_ptr, w_ptr, c_ptr):
    a = tessera.view(a_ptr, (16, 128)).block((16, 128), (0, 0)).load().to(tessera.bf16)
    w = tessera.view(w_ptr, (64, 128)).block((64, 128), (0, 0)).load().to(tessera.bf16) * 0.5
    tessera.view(c_ptr, (16, 64)).block((16, 64), (0, 0)).store(tessera.dot(a, w.T))


def test_tutorial_matmul_thread_ir_uses_ldmatrix():
    matmul = runpy.run_path(str(TUTORIALS / "03-matmul.py"))["matmul"]
    m, n, k = 128, 128, 64
    args = [np.zeros((m, k), np.float16), np.zeros((k, n), np.float16), np.zeros((m, n), np.float16), m, n, k]
    module = matmul.specialize(*args, BM=64, BN=64, BK=32).module
    text = print_module(lower(module, "sm_80", num_warps=4))
    assert "ldmatrix" in text and "trans = true" in text


@pytest.mark.skipif(find_ptxas() is None, reason="ptxas not found (PATH, CUDA_HOME, nvidia-cuda-nvcc wheel)")
@pytest.mark.parametrize("target", ["sm_80", "sm_90a"])
@pytest.mark.parametrize("dtype", [tessera.f16, tessera.bf16], ids=str)
def test_ldmatrix_ptx_assembles_without_spills(target, dtype):
    m = 64 if target == "sm_80" else 32     # on sm_90a a 64-row dot runs on wgmma (test_wgmma_dot.py)
    fn = lower(dot_module(m, 64, 32, dtype), target, num_warps=4).functions[0]
    artifacts = compile_thread_ir(fn, target, isolate=False)
    ldmatrix_lines = [line for line in artifacts.ptx.splitlines() if "ldmatrix.sync.aligned.m8n8.x4" in line]
    assert ldmatrix_lines and any(".trans" in line for line in ldmatrix_lines)
    assert artifacts.ptxas_info["spill_stores"] == artifacts.ptxas_info["spill_loads"] == 0
