"""gfx950's LDS transpose read (`lds_read_tr`, ds_read_b64_tr_b16) and the MFMA operands that use it.

Specification:

* the op, on the SIMT simulator: in each group of 16 lanes, lane 16h + s
  addresses a row of 4 16-bit elements (row s // 4, columns 4 (s % 4) .. + 3
  of a 4 x 16 tile) and lane 16h + d receives column d of the tile (register
  e = element d % 4 of the row lane 16h + 4e + d // 4 addressed): the CDNA4
  ISA's "each lane holds 4 consecutive M or N values" after the read, the
  mapping composable_kernel / Mojo's `ds_read_tr16_b64_row` rely on;
* the AMDGPU backend emits `llvm.amdgcn.ds.read.tr16.b64` ->
  ds_read_b64_tr_b16 on gfx950 and refuses the op on gfx942 (no "lds.read.tr")
  with the reason, before LLVM;
* `transpose_read_starts` accepts an MFMA B fragment read from an MN-major
  (row-major [K, N]) slot and refuses a K-major one (plain 16-byte loads
  already read that);
* a 16-bit MFMA accumulator that becomes the next MFMA's A operand
  (attention's P) is stored column-major, 8 bytes a lane, its rows grouped by
  4 so that the stores and the transpose reads are both conflict-free
  (`plan_lds_transpose_read`), cheaper in the bank model than the row-major
  buffer's 2-byte stores and 16-byte loads.
The library GEMM with B row-major and attention's P @ V on gfx950 use it
(checked against the tile interpreter in test_mfma_dot.py and
test_attention_compile.py, and in the K loop's AMDGCN in test_gemm.py).
"""

from __future__ import annotations

import numpy as np
import pytest

from tessera.backends.amdgpu import CodegenError, compile_thread_ir
from tessera.backends.simt import run_threads
from tessera.ir.layouts import local, replicated, spatial
from tessera.ir.mfma_layouts import mfma_fragments
from tessera.ir.parser import parse_module
from tessera.passes.lowering.mfma_operands import plan_lds, plan_lds_transpose_read, transpose_read_starts

LDS_READ_TR = """\
func @k(%src: ptr<f32>, %rows: ptr<i32>, %out: ptr<f32>) attributes {num_threads = 64, warp_size = 64, \
shared_bytes = 512} {
  %tid = thread_id : i32
  %four = constant {value = 4} : i32
  %smem = shared_alloc {bytes = 512, offset = 0} : ptr<f16, shared>
  %first = mul %tid, %four : i32
  %c0 = constant {value = 0} : i32
  %c1 = constant {value = 1} : i32
  %c2 = constant {value = 2} : i32
  %c3 = constant {value = 3} : i32
  %lanes = pack %c0, %c1, %c2, %c3 : regs<4xi32>
  %base = splat %first : regs<4xi32>
  %idx = add %base, %lanes : regs<4xi32>
  %srcs = splat %src : regs<4xptr<f32>>
  %from = addptr %srcs, %idx : regs<4xptr<f32>>
  %x = load %from : regs<4xf32>
  %h = cast %x : regs<4xf16>
  %smems = splat %smem : regs<4xptr<f16, shared>>
  %to = addptr %smems, %idx : regs<4xptr<f16, shared>>
  store %to, %h
  barrier
  %rp = addptr %rows, %tid : ptr<i32>
  %row = load %rp : i32
  %off = mul %row, %four : i32
  %addr = addptr %smem, %off : ptr<f16, shared>
  %v = lds_read_tr %addr : regs<4xf16>
  %w = cast %v : regs<4xf32>
  %outs = splat %out : regs<4xptr<f32>>
  %op = addptr %outs, %idx : regs<4xptr<f32>>
  store %op, %w
  return
}
"""


@pytest.fixture(scope="module")
def kernel():
    return parse_module(LDS_READ_TR).functions[0]


def test_lane_d_of_each_16_lane_group_receives_column_d_of_its_4x16_tile(kernel):
    rng = np.random.default_rng(0)
    memory = rng.integers(0, 1000, 256).astype(np.float32)      # 64 rows of 4, exact in f16
    rows = rng.permutation(64).astype(np.int32)                 # lane t addresses row rows[t]
    out = np.zeros(256, np.float32)
    run_threads(kernel, [memory, rows, out], (1,))
    expected = np.zeros((64, 4), np.float32)
    for h in range(4):
        tile = memory.reshape(64, 4)[rows[16 * h:16 * h + 16]].reshape(4, 16)    # lane 16h + s: row s//4
        expected[16 * h:16 * h + 16] = tile.T                                    # lane 16h + d: column d
    np.testing.assert_array_equal(out.reshape(64, 4), expected)


def test_the_backend_emits_ds_read_b64_tr_b16_on_gfx950_and_refuses_it_on_gfx942(kernel):
    artifacts = compile_thread_ir(kernel, "gfx950", link=False)
    assert '@"llvm.amdgcn.ds.read.tr16.b64.v4i16"' in artifacts.llvm_ir
    assert "ds_read_b64_tr_b16" in artifacts.assembly
    with pytest.raises(CodegenError, match=r"lds_read_tr \(ds_read_b64_tr_b16\) is a gfx950 \(\"lds.read.tr\"\) "
                                           r"instruction that gfx942 lacks"):
        compile_thread_ir(kernel, "gfx942", link=False)


@pytest.mark.parametrize("shape", [(16, 16, 32), (32, 32, 16)], ids=str)
def test_an_mn_major_b_fragment_is_read_transposed_and_a_k_major_one_is_not(shape):
    m, n, k = shape
    b = local(2, 1) * replicated(2) * mfma_fragments(m, n, k)[1]      # 2 k-steps, 2 waves sharing B
    rows, cols = b.shape
    terms, consts = transpose_read_starts(b, (cols, 1))              # B row-major [K, N]: N contiguous
    assert len(consts) == b.local_size // 4                            # one read per 4 registers
    assert transpose_read_starts(b, (1, rows)) is None                 # K contiguous: plain loads read it


def test_attentions_p_is_written_8_bytes_a_lane_and_read_back_transposed_without_bank_conflicts():
    """gfx950's forward at BM = 128, BN = 64, 4 waves: S's accumulator (lane: 4 consecutive rows of one key column)
    to P @ V's A fragment (lane: 8 consecutive keys of one row). Row-major, every element is a 2-byte store."""
    _, _, acc = mfma_fragments(32, 32, 16)
    a, _, _ = mfma_fragments(32, 32, 16)
    src, want = local(1, 2) * spatial(4, 1) * acc, local(1, 4) * spatial(4, 1) * a       # both (128, 64)
    banks, max_bits, warp = 64, 128, 64
    plan = plan_lds_transpose_read(src, want, banks, max_bits, warp)
    assert (plan.transpose_read, plan.order, plan.store_vector) == (True, (1, 0), 4)    # keys x rows, 4 rows a write
    assert (plan.split, plan.pad, plan.group_pad) == (4, 32, 4)
    # conflict-free both ways: 8 stores and 8 reads of 8 bytes a lane, 2 phases each, 4 waves
    assert plan.cycles == (8 + 8) * 2 * 4
    row_major = plan_lds(src, want, 16, banks, max_bits, warp)
    assert (row_major.store_vector, row_major.cycles) == (1, 192)
    smem = plan.storage(src.shape)
    offsets = (plan.view(src).table() * np.asarray(smem.strides)).sum(-1)
    assert len(np.unique(offsets)) == offsets.size              # every element its own address


@pytest.mark.gpu
@pytest.mark.amdgpu
def test_on_a_gfx950_gpu_the_gemm_with_b_row_major_matches_torch():
    """What the CPU cannot settle: the lane mapping of ds_read_b64_tr_b16 as the hardware does it (the simulator
    implements the documented one). The library GEMM with B row-major reads B by transpose reads on gfx950; a
    wrong mapping permutes k or n inside every fragment, far outside bf16 rounding."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available() or getattr(torch.version, "hip", None) is None:
        pytest.skip("needs a ROCm build of torch with an AMD GPU")
    from tessera.kernels_lib.gemm import gemm
    from tessera.kernels_lib.targets import device_arch
    if device_arch() != "gfx950":
        pytest.skip(f"needs gfx950 (MI350 / MI355), this GPU is {device_arch()}")
    g = torch.Generator(device="cuda").manual_seed(0)
    a = torch.randn(512, 384, device="cuda", dtype=torch.bfloat16, generator=g)
    b = torch.randn(384, 256, device="cuda", dtype=torch.bfloat16, generator=g)     # row-major [K, N]
    torch.testing.assert_close(gemm(a, b).float(), a.float() @ b.float(), rtol=2e-2, atol=2e-1)


@pytest.mark.gpu
@pytest.mark.amdgpu
@pytest.mark.parametrize("D", [64, 128])
def test_on_a_gfx950_gpu_the_attention_forward_with_p_read_transposed_matches_float64(D):
    """What the CPU cannot settle for P: the grouped keys-major buffer and the transpose reads as the hardware
    does them. A wrong lane mapping permutes keys inside each P fragment, far outside bf16 rounding. (Timing:
    bench/attention.py --part forward before and after this change on one MI355 should show the forward no
    slower; the key loop has 24 fewer LDS writes and ~35 fewer instructions.)"""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available() or getattr(torch.version, "hip", None) is None:
        pytest.skip("needs a ROCm build of torch with an AMD GPU")
    from tessera.kernels_lib import attention
    from tessera.kernels_lib.targets import device_arch
    if device_arch() != "gfx950":
        pytest.skip(f"needs gfx950 (MI350 / MI355), this GPU is {device_arch()}")
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "kernels_lib"))
    from attention_reference import attention as reference
    q, k, v = (torch.randn(2, n, h, D, device="cuda", dtype=torch.bfloat16) for n, h in ((200, 4), (333, 2), (333, 2)))
    out, lse = attention(q, k, v, causal=True)
    expected, expected_lse = reference(q.cpu(), k.cpu(), v.cpu(), True)
    torch.testing.assert_close(out.cpu().double(), expected, rtol=2e-2, atol=2e-2)
    finite = ~torch.isinf(expected_lse)
    torch.testing.assert_close(lse.cpu().double()[finite], expected_lse[finite], rtol=1e-3, atol=1e-3)
