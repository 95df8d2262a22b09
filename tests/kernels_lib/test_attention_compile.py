"""The attention kernels as GPU code: every shipped plan compiles without register spills (ptxas for sm_80 and
sm_90a, LLVM's AMDGPU backend for gfx942), on the instructions meant, and the lowered per-thread code computes on
the SIMT simulator what numpy computes."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import tessera  # noqa: E402
from tessera.backends.nvptx import find_ptxas  # noqa: E402
from tessera.kernels_lib.attention import GPU_PLANS  # noqa: E402
from tessera.kernels_lib.attention_fwd import LOG2E, attention_fwd_kernel  # noqa: E402

from attention_reference import attention as reference  # noqa: E402

needs_ptxas = pytest.mark.skipif(find_ptxas() is None, reason="ptxas not installed")

# q, k, v, o, lse, cu_q, cu_k, Sq, Sk, H, H_KV, qk_scale, softcap, left, right, 4 x (b, s, h, d) strides, lse's
FORWARD_SIGNATURE = ",".join(["*{t}:16"] * 4 + ["*f32:16", "*i32:16", "*i32:16"] + ["i32"] * 4 + ["f32", "f32"]
                             + ["i32", "i32"] + ["i32:16", "i32:16", "i32:16", "i32:1"] * 4 + ["i32", "i32"])
VARIANTS = {    # the plain kernel, and the one with every option compiled in (the most registers)
    "plain": dict(HAS_LEFT=False, HAS_RIGHT=False, SOFTCAP=False, VARLEN=False),
    "window-softcap-varlen": dict(HAS_LEFT=True, HAS_RIGHT=True, SOFTCAP=True, VARLEN=True),
}


def compile_forward(target, D, plan, variant, dtype="bf16"):
    return attention_fwd_kernel.compile(signature=FORWARD_SIGNATURE.format(t=dtype), target=target,
                                        num_warps=plan.num_warps, D=D, BM=plan.BM, BN=plan.BN, STAGES=plan.stages,
                                        **VARIANTS[variant])


@needs_ptxas
@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("D", sorted(GPU_PLANS["nvidia"]))
@pytest.mark.parametrize("target", ["sm_80", "sm_90a"])
def test_every_nvidia_plan_compiles_without_spills(target, D, variant):
    """sm_80: both products on mma.sync, K and V streamed by cp.async; sm_90a: both on wgmma (Q staged in
    shared memory once, before the key loop)."""
    plan = GPU_PLANS["nvidia"][D]
    compiled = compile_forward(target, D, plan, variant)
    metadata, ptx = compiled.metadata, compiled.stages["ptx"]
    assert metadata["spill_stores"] == metadata["spill_loads"] == 0, f"{metadata['registers']} registers"
    assert "cp.async.cg.shared.global" in ptx
    if target == "sm_90a":
        assert re.search(rf"wgmma\.mma_async\.sync\.aligned\.m64n{plan.BN}k16", ptx), "S = Q K^T on wgmma"
        assert re.search(rf"wgmma\.mma_async\.sync\.aligned\.m64n{D}k16", ptx), "O += P V on wgmma"
        assert "mma.sync" not in ptx
    else:
        assert "mma.sync.aligned.m16n8k16" in ptx and "wgmma" not in ptx


@pytest.mark.parametrize("D", sorted(GPU_PLANS["amd"]))
def test_every_amd_plan_compiles_on_mfma_without_vector_spills(D):
    plan = GPU_PLANS["amd"][D]
    compiled = compile_forward("gfx942", D, plan, "window-softcap-varlen")
    assert re.search(r"\bv_mfma_f32_32x32x8\w*bf16", compiled.stages["amdgcn"])
    assert compiled.metadata["vgpr_spill_count"] == 0


def forward_on_the_simulator(target, num_warps, BM, causal=True, seed=0):
    """The forward kernel lowered for `target` on the SIMT simulator, 1 x 70 queries x 50 keys, GQA 2:1:
    (O, LSE) and the float64 reference's."""
    from tessera.backends.simt import run_threads
    from tessera.passes.thread_passes import lower
    B, Sq, Sk, H, H_kv, D, BN = 1, 70, 50, 2, 1, 32, 32
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, S, h, D, generator=g).half() for S, h in ((Sq, H), (Sk, H_kv), (Sk, H_kv)))
    o, lse = torch.zeros_like(q), torch.zeros(B, H, Sq)
    unused = np.zeros(1, np.int32)
    strides = [s for x in (q, k, v, o) for s in x.stride()]
    args = [q.numpy(), k.numpy(), v.numpy(), o.numpy(), lse.numpy(), unused, unused, Sq, Sk, H, H_kv,
            LOG2E / math.sqrt(D), 0.0, 0, 0, *strides, *lse.stride()[:2]]
    options = dict(D=D, BM=BM, BN=BN, HAS_LEFT=False, HAS_RIGHT=causal, SOFTCAP=False, VARLEN=False, STAGES=2)
    module = attention_fwd_kernel.specialize(*args, **options).module
    run_threads(lower(module, target, num_warps).functions[0], args, (tessera.cdiv(Sq, BM), B * H))
    return o, lse, *reference(q, k, v, causal)


@pytest.mark.parametrize("target, num_warps, BM", [("sm_80", 4, 64), ("sm_90a", 4, 64), ("gfx942", 2, 64)])
def test_forward_on_the_simt_simulator_matches_float64_attention(target, num_warps, BM):
    """Two row blocks (the second partly past the end); causal with Sq > Sk, so the first 20 rows see no key
    (O = 0, LSE = +inf); the diagonal blocks and the keys' tail masked; two query heads per key head."""
    o, lse, expected_o, expected_lse = forward_on_the_simulator(target, num_warps, BM)
    torch.testing.assert_close(o.double(), expected_o, rtol=2e-3, atol=2e-3)
    assert torch.isinf(lse[:, :, :20]).all()
    torch.testing.assert_close(lse.double(), expected_lse, rtol=1e-4, atol=1e-4)
