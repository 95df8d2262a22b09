"""The fp8 attention forward as GPU code: every shipped fp8 plan (tessera/kernels_lib/attention_fp8.py) assembles
without spills on sm_89, sm_90a and gfx950, multiplying both products on e4m3 tensor cores (gfx950: OCP fp8 MFMA),
and the lowered per-thread code computes on the SIMT simulator what float64 attention of the dequantized inputs
computes."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest

ml_dtypes = pytest.importorskip("ml_dtypes")

torch = pytest.importorskip("torch")

from tessera.backends.nvptx import find_ptxas  # noqa: E402
from tessera.kernels_lib.attention_fp8 import FP8_GPU_PLANS, keys_contiguous  # noqa: E402
from tessera.kernels_lib.attention_fwd import LOG2E, attention_fwd_kernel  # noqa: E402

from amd_spills import amd_spills  # noqa: E402
from sass_checks import assert_wgmma_descriptors_built  # noqa: E402
from test_attention_compile import FORWARD_SIGNATURE  # noqa: E402
from test_attention_fp8 import check_fp8, quantized  # noqa: E402

needs_ptxas = pytest.mark.skipif(find_ptxas() is None, reason="ptxas not installed")


def fp8_signature():
    """FORWARD_SIGNATURE with e4m3 q, k, v (V's keys contiguous: `keys_contiguous`), bf16 O and hook slots."""
    parts = FORWARD_SIGNATURE.format(t="bf16").split(",")
    parts[0:3] = ["*f8e4m3:16"] * 3
    parts[23:27] = ["i32:16", "i32:1", "i32:16", "i32:16"]      # V's (batch, seq, head, dim) strides
    parts[-1] = "i32:16"                                         # V's length, rounded up to 16 keys
    return ",".join(parts)


VARIANTS = {    # the fp8 op is batched only (no varlen)
    "plain": dict(HAS_LEFT=False, HAS_RIGHT=False, SOFTCAP=False, VARLEN=False),
    "window-softcap": dict(HAS_LEFT=True, HAS_RIGHT=True, SOFTCAP=True, VARLEN=False),
}


def compile_fp8(target, D, plan, variant):
    return attention_fwd_kernel.compile(target=target, strict=True, signature=fp8_signature(),
                                        num_warps=plan.num_warps, D=D, BM=plan.BM, BN=plan.BN, STAGES=plan.stages,
                                        FP8=True, **VARIANTS[variant])


@needs_ptxas
@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("target, D", [(t, D) for t in FP8_GPU_PLANS if t.startswith("sm_")
                                       for D in sorted(FP8_GPU_PLANS[t])])
def test_every_fp8_plan_compiles_without_spills_on_e4m3_tensor_cores(target, D, variant):
    """sm_89: both products on mma.sync m16n8k32 .e4m3, K and V streamed by cp.async; sm_90a: both on wgmma
    k32 .e4m3 (P through shared memory), K and V streamed by TMA (V's map over its keys-contiguous buffer)."""
    plan = FP8_GPU_PLANS[target][D]
    compiled = compile_fp8(target, D, plan, variant)
    metadata, ptx = compiled.metadata, compiled.stages["ptx"]
    assert metadata["spill_stores"] == metadata["spill_loads"] == 0, f"{metadata['registers']} registers"
    if target == "sm_89":
        assert "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32" in ptx and "cp.async.cg" in ptx
        assert "m16n8k16" not in ptx and "wgmma" not in ptx and "cp.async.bulk.tensor" not in ptx
        return
    slabs = plan.BM // 64 // (plan.num_warps // 4)         # 64-row slabs per warpgroup
    wgmmas = re.findall(r"wgmma\.mma_async\.sync\.aligned\.(\S+) \{[^}]*\}, (%rd\d+|\{[^}]*\})", ptx)
    shapes = sorted(shape for shape, _ in wgmmas)
    assert shapes == sorted([f"m64n{plan.BN}k32.f32.e4m3.e4m3"] * (D // 32 * slabs)
                            + [f"m64n{D}k32.f32.e4m3.e4m3"] * (plan.BN // 32 * slabs)), shapes
    # P goes through shared memory: Tessera's wgmma takes A from registers for f16/bf16 only (fp8's k32 fragment
    # differs from the accumulator's and needs FA3's byte permutes)
    assert all(a.startswith("%rd") for _, a in wgmmas)
    assert "mma.sync" not in ptx and "cp.async.bulk.tensor.4d" in ptx and "cp.async.cg" not in ptx
    # Q's block by one TMA load into wgmma's tile, O by a TMA store (`tma_operand.py`, `tma_store.py`)
    assert [r["pointer"] for r in metadata["tensor_maps"]] == ["q_ptr", "k_ptr", "v_ptr", "o_ptr"]
    assert_wgmma_descriptors_built(compiled)


# the head dims with the most registers (D = 64's plan takes 306: bench/amd_registers.py --only fp8)
@pytest.mark.parametrize("D", [128, 256])
def test_every_fp8_plan_compiles_for_gfx950_on_ocp_fp8_mfma_without_spills(D):
    """gfx950: both products on its OCP fp8 MFMA, each wave owning BM / 32 / waves of the 32-row blocks (the
    chained dots split rows only; waves beyond BM / 32 replicate) and issuing D / k per 32x32 block of S and
    BN / k per block of O, k = 64 (v_mfma_f32_32x32x64_f8f6f4) where the reduced dim allows, else 16
    (v_mfma_f32_32x32x16_fp8_fp8: P V at BN = 32); K and V streamed into LDS rings by direct-to-LDS loads
    (strict: no stage dropped); no spills of either kind. The plain variant: it took more registers than the
    window-softcap one at every head dim (306 / 359 / 416 VGPRs at 64 / 128 / 256 against 202 / 246 / 310)."""
    plan = FP8_GPU_PLANS["gfx950"][D]
    compiled = compile_fp8("gfx950", D, plan, "plain")
    asm = compiled.stages["amdgcn"]
    mfmas = re.findall(r"\bv_mfma_\w+", asm)
    form = {64: "v_mfma_f32_32x32x64_f8f6f4", 16: "v_mfma_f32_32x32x16_fp8_fp8"}
    k = {reduced: 64 if reduced % 64 == 0 else 16 for reduced in (D, plan.BN)}
    row_blocks = plan.BM // 32 // min(plan.num_warps, plan.BM // 32)
    assert sorted(mfmas) == sorted([form[k[D]]] * (row_blocks * plan.BN // 32 * D // k[D])
                                   + [form[k[plan.BN]]] * (row_blocks * D // 32 * plan.BN // k[plan.BN]))
    assert "global_load_lds_dwordx4" in asm
    assert amd_spills(compiled.metadata) == {}


@pytest.mark.filterwarnings("ignore::tessera.PipelineWarning")      # V by cp.async on sm_90a: see compile_fp8
@pytest.mark.parametrize("target, num_warps, BM, BN", [("sm_90a", 4, 64, 32), ("sm_89", 4, 64, 32),
                                                       ("gfx950", 4, 64, 64)])
def test_fp8_forward_on_the_simt_simulator_matches_float64_attention(target, num_warps, BM, BN):
    """1 x 70 queries x 50 keys, 2 query heads on 1 KV head, causal (Sq > Sk: the first 20 rows see no key), with
    descales far from 1; tolerance as in test_attention_fp8.py. V is the op's keys-contiguous copy (50 keys
    padded to 64 with zeros); on sm_90a K and V come by TMA, on gfx950 by direct-to-LDS loads."""
    from tessera.backends.simt import run_threads
    from tessera.passes.thread_passes import lower
    B, Sq, Sk, H, H_kv, D = 1, 70, 50, 2, 1, 32
    (q, dq), (k, dk), (v, dv) = (quantized(B, S, h, D, amax, seed) for S, h, amax, seed in
                                 ((Sq, H, 4.0, 11), (Sk, H_kv, 6.0, 12), (Sk, H_kv, 2.0, 13)))
    vt = keys_contiguous(v)
    o, lse = torch.zeros(B, Sq, H, D, dtype=torch.bfloat16), torch.zeros(B, H, Sq)
    descales = torch.stack([dq, dk, dv]).float()
    unused = np.zeros(1, np.int32)
    strides = [s for x in (q, k, vt, o) for s in x.stride()]
    fp8 = lambda x: x.view(torch.uint8).numpy().view(ml_dtypes.float8_e4m3fn)   # noqa: E731
    o_bits = o.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    args = [fp8(q), fp8(k), fp8(vt.permute(0, 2, 3, 1)), o_bits, lse.numpy(), unused, unused, Sq, Sk, H, H_kv,
            LOG2E / math.sqrt(D), 0.0, 0, 0, *strides, *lse.stride()[:2],
            o_bits, o_bits, 0.0, 0.0, o_bits, 0, 0, 0, 0, 0.0, descales.numpy(), vt.shape[1]]
    options = dict(D=D, BM=BM, BN=BN, HAS_LEFT=False, HAS_RIGHT=True, SOFTCAP=False, VARLEN=False, STAGES=2,
                   FP8=True)
    module = attention_fwd_kernel.specialize(*args, **options).module
    fn = lower(module, target, num_warps).functions[0]
    dots = [op for op in fn.walk() if op.name in ("wgmma", "mma", "mfma")]
    if target == "gfx950":      # S = Q K^T over D = 32 on the k16 fp8 MFMA, P V over BN = 64 keys on f8f6f4's k64
        assert {(op.attrs["k"], op.operands[0].type.element.dtype.name) for op in dots} == {(16, "f8e4m3"),
                                                                                           (64, "f8e4m3")}
        assert any(op.name == "async_copy" for op in fn.walk())     # K and V rings filled by global_load_lds
    else:
        assert dots and all(op.attrs["k"] == 32 for op in dots), "both products on fp8 tensor cores (k = 32)"
    tma_loads = [op for op in fn.walk() if op.name == "tma_load"]
    # K and V: the prologue's fill and the loop's; Q's block, one box
    assert len(tma_loads) == (5 if target == "sm_90a" else 0)
    storage = {np.dtype(ml_dtypes.float8_e4m3fn): np.uint8, np.dtype(ml_dtypes.bfloat16): np.uint16}
    bits = [a.view(storage[a.dtype]) if getattr(a, "dtype", None) in storage else a
            for a in args]                                             # the simulator's memory holds bit patterns
    run_threads(fn, bits, (-(-Sq // BM), B * H))
    assert torch.isinf(lse[:, :, :20]).all()
    check_fp8(o, lse, q, k, v, dq, dk, dv, causal=True)
