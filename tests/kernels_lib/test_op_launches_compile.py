"""Every launch a library op makes compiles for the GPU in strict mode, for shapes the specialization misreads.

Specification: for legal input no op raises at compile time on the GPU. Each
test runs the op on the CPU interpreter with the tiles its GPU path would pick
(patched in below: the CPU plans do not pipeline) and, through
`gpu_compile.compiled_launches`, compiles each launch for sm_80 and sm_90a in
strict mode (and, for the GEMMs and MoE, for gfx942: non-strict). The shapes are the ones that broke the split-K GEMM on the H100:
sizes that are multiples of 8 but not 16 (bf16 rows 16-byte aligned, which
the specialization cannot see, so the op states it: `gemm_alignment.py`),
sizes whose rows are not 16-byte aligned at all (a plain loop, not a refused
pipeline), and strided views. The interpreter's results are checked too, so
the stated facts (`tessera.assume`, which it checks) are true.
"""

from __future__ import annotations

import importlib

import pytest

torch = pytest.importorskip("torch")

from gpu_compile import compiled_launches  # noqa: E402

from tessera.backends.nvptx import find_ptxas  # noqa: E402

pytestmark = pytest.mark.skipif(find_ptxas() is None, reason="ptxas not installed")
BF16 = torch.bfloat16
ALL_TARGETS = ("sm_80", "sm_90a", "gfx942")     # gfx942: compiled non-strict (some loops stay one stage there)
COPIES = {"sm_80": ("cp.async.cg.", "cp.async.ca."), "sm_90a": ("shared::cluster.global",)}   # loads: global -> shared


def close(out, expected, tol=3e-2):
    err = (out.float() - expected.float()).abs().max().item()
    assert err <= tol * max(1.0, expected.float().abs().max().item()), err


def pipelined(seen, kernel: str) -> dict[str, bool]:
    """Per NVIDIA target, whether every compile of `kernel` streams its K loop by asynchronous copies."""
    return {c.target: any(copy in c.ptx for copy in COPIES[c.target]) for c in seen
            if c.kernel == kernel and c.target in COPIES}


# --- plain and split-K GEMM (gemm.py; the interpreter's tiles, which pipeline two stages) ---------------------

@pytest.mark.parametrize("M, N, K, aligned", [(24, 40, 56, True), (24, 40, 37, False), (80, 40, 56, True)])
def test_gemm(M, N, K, aligned):
    """M = 24 takes the split-K path, M = 80 the tiled kernel (`gemm._split_k_plan`)."""
    from tessera.kernels_lib.gemm import gemm
    a, b = torch.randn(M, K).to(BF16), torch.randn(N, K).to(BF16)
    with compiled_launches(ALL_TARGETS) as seen:
        out = gemm(a, b, trans_b=True)
    close(out, a.float() @ b.float().t())
    kernel = "gemm_split_k_kernel" if M <= 64 else "gemm_kernel"
    assert pipelined(seen, kernel) == {"sm_80": aligned, "sm_90a": aligned}


@pytest.mark.parametrize("M, N, K, aligned", [(80, 40, 56, True), (80, 40, 37, False)])
def test_stream_k_gemm(M, N, K, aligned, monkeypatch):
    """$TESSERA_GEMM_STREAM_K=1: 15 tiles of 16 x 16 on the interpreter's 4 "SMs" (`gemm_stream_k.py`)."""
    gemm_module = importlib.import_module("tessera.kernels_lib.gemm")
    monkeypatch.setenv(gemm_module.STREAM_K_ENV, "1")
    gemm_module._stream_k_plan.cache_clear()
    a, b = torch.randn(M, K).to(BF16), torch.randn(N, K).to(BF16)
    with compiled_launches(ALL_TARGETS) as seen:
        out = gemm_module.gemm(a, b, trans_b=True)
    gemm_module._stream_k_plan.cache_clear()
    close(out, a.float() @ b.float().t())
    assert pipelined(seen, "gemm_stream_k_kernel") == {"sm_80": aligned, "sm_90a": aligned}


# --- fused GEMM (gemm_fusion.py: gemm_fused_kernel; CPU_CONFIG pipelines two stages) -------------------------

@pytest.mark.parametrize("M, N, K, trans_a, trans_b, aligned", [
    (24, 40, 56, False, False, True),       # K, N multiples of 8: 16-byte bf16 rows the specialization misses
    (24, 40, 56, False, True, True),        # B an nn.Linear weight [N, K]
    (40, 24, 56, True, False, True),        # A transposed: rows along M = 40
    (24, 40, 37, False, False, False),      # K = 37: 74-byte rows, a plain loop
])
def test_fused_gemm(M, N, K, trans_a, trans_b, aligned):
    from tessera.kernels_lib.gemm_fusion import fused_gemm
    g = torch.Generator().manual_seed(K)
    a = torch.randn((K, M) if trans_a else (M, K), generator=g).to(BF16)
    b = torch.randn((N, K) if trans_b else (K, N), generator=g).to(BF16)
    with compiled_launches(ALL_TARGETS) as seen:
        out = fused_gemm(a, b, trans_a=trans_a, trans_b=trans_b)
    close(out, (a.t() if trans_a else a).float() @ (b.t() if trans_b else b).float())
    assert pipelined(seen, "gemm_fused_kernel") == {"sm_80": aligned, "sm_90a": aligned}


def test_fused_gemm_of_a_strided_view():
    """A is every row of a wider buffer's first K columns (row stride 72: a multiple of 8, not 16)."""
    from tessera.kernels_lib.gemm_fusion import fused_gemm
    buffer, b = torch.randn(24, 72).to(BF16), torch.randn(56, 40).to(BF16)
    with compiled_launches() as seen:
        out = fused_gemm(buffer[:, :56], b)
    close(out, buffer[:, :56].float() @ b.float())
    assert all(pipelined(seen, "gemm_fused_kernel").values())


@pytest.mark.parametrize("N, aligned", [(48, True), (40, False)])
def test_fused_gemm_with_an_int8_prologue_and_gathered_rows(N, aligned):
    """int8 codes of B [K, N] (48-byte rows: aligned; 40-byte rows: a plain loop), dequantized by a prologue; then
    gathered rows of A (pointer loads: a plain loop whatever the shape)."""
    import fusion_hooks as hooks
    from tessera.kernels_lib.gemm_fusion import fused_gemm
    a, codes = torch.randn(24, 56).half(), torch.randint(-127, 128, (56, N), dtype=torch.int8)
    scale, idx = torch.rand(N) / 64, torch.tensor([3, 0, 17, 17, 5, 23, 9], dtype=torch.int32)
    with compiled_launches() as seen:
        out = fused_gemm(a, codes, prologue_b=hooks.dequantize_int8, prologue_b_args=(scale,), out_dtype=torch.float32)
    close(out, a.float() @ (codes.float() * scale).half().float())
    assert pipelined(seen, "gemm_fused_kernel") == {"sm_80": aligned, "sm_90a": aligned}
    b = torch.randn(56, N).half()
    with compiled_launches() as seen:
        out = fused_gemm(a, b, gather_a=idx, out_dtype=torch.float32)
    close(out, a.float()[idx.long()] @ b.float())


# --- quantized GEMM (quant_gemm.py), with the GPU's plan -------------------------------------------------------

@pytest.fixture
def quant_gpu_plan(monkeypatch):
    """Run `quant_gemm` on the CPU with the plan the GPU would take for the call's shape."""
    qg = importlib.import_module("tessera.kernels_lib.quant_gemm")

    def run(x, w, x_scale=None):
        M, K = x.reshape(-1, x.shape[-1]).shape
        monkeypatch.setattr(qg, "CPU_PLAN", qg.plan(M, w.shape[0], K, w.group_size, 132, x_scale is not None))
        return qg.quant_gemm(x, w, x_scale)
    return run


@pytest.mark.parametrize("M, N, K, group, bits, aligned", [
    (24, 40, 384, 128, 4, True),        # N = 40; 3 groups a row
    (3, 40, 160, 32, 3, False),         # decode, K = 160: K split in single-group steps (raised ZeroDivisionError)
    (24, 40, 24, 8, 4, False),          # K = 24: 48-byte x rows, but 12-byte rows of codes: a plain loop
    (24, 40, 40, 8, 8, False),          # K = 40: 80-byte x rows (stated), 40-byte rows of codes
])
def test_quant_gemm(quant_gpu_plan, M, N, K, group, bits, aligned):
    from tessera.kernels_lib import quant
    w = quant.quantize(torch.randn(N, K, generator=torch.Generator().manual_seed(K)), bits=bits, group_size=group)
    x = torch.randn(M, K, dtype=torch.float16)
    with compiled_launches(ALL_TARGETS) as seen:
        y = quant_gpu_plan(x, w)
    close(y, x.float() @ w.dequantize().t(), 2e-3)
    if M > 16:      # decode's plan has one stage
        assert pipelined(seen, "quant_gemm_kernel") == {"sm_80": aligned, "sm_90a": aligned}


def test_w4a8_on_sm_90a(quant_gpu_plan):
    from tessera.kernels_lib import quant
    w = quant.quantize(torch.randn(40, 160), bits=4, group_size=32)
    x8, x_scale = torch.randn(24, 160).to(torch.float8_e4m3fn), torch.rand(24) + 0.5
    with compiled_launches(["sm_90a"]):
        y = quant_gpu_plan(x8, w, x_scale)
    close(y, (x8.float() * x_scale[:, None]) @ w.dequantize().t())


def test_quant_gemm_names_group_sizes_its_tiles_cannot_hold():
    from tessera.kernels_lib import quant
    from tessera.kernels_lib.quant_gemm import quant_gemm
    w = quant.quantize(torch.randn(40, 144), bits=4, group_size=48)
    with pytest.raises(ValueError, match="group_size must be a power of two"):
        quant_gemm(torch.randn(3, 144, dtype=torch.float16), w)


# --- MoE grouped GEMMs (moe/), with the GPU's tiles ---------------------------------------------------------------

MOE_MODULES = ("mlp", "autograd", "fp8_mlp", "quantized_mlp", "quantized_autograd", "persistent")


@pytest.fixture
def moe_gpu_tiles(monkeypatch):
    """`moe.mlp.tiles` answers for CPU tensors what it answers for CUDA ones (the shipped, pipelined plans)."""
    mlp = importlib.import_module("tessera.kernels_lib.moe.mlp")
    real = mlp.tiles

    def gpu(block_m, t, quantized=False, fp8=False):
        return real(block_m, torch.empty(0, dtype=t.dtype, device="meta"), quantized, fp8)
    for name in MOE_MODULES:
        monkeypatch.setattr(importlib.import_module(f"tessera.kernels_lib.moe.{name}"), "tiles", gpu)


def moe_problem(H, I, dtype=BF16):
    from tessera.kernels_lib.moe import interleave_gate_up
    from moe_problem import random_moe
    x, w1, w3, w2, (weights, ids, _, _) = random_moe(5, H, I, 4, 2)
    return x.to(dtype), interleave_gate_up(w1, w3).to(dtype), w2.to(dtype), weights, ids


def moe_reference(x, w13, w2, weights, ids):
    gate, up = w13.float()[:, 0::2], w13.float()[:, 1::2]
    out = torch.zeros(x.shape, dtype=torch.float32)
    for t in range(x.shape[0]):
        for j in range(ids.shape[1]):
            e = int(ids[t, j])
            g, u = gate[e] @ x[t].float(), up[e] @ x[t].float()
            out[t] += weights[t, j] * (w2.float()[e] @ (torch.nn.functional.silu(g) * u))
    return out


@pytest.mark.parametrize("H, I, aligned", [(40, 24, True), (44, 20, False)])
@pytest.mark.parametrize("path", ["decode", "middle", "one_launch"])
def test_moe_experts(moe_gpu_tiles, H, I, aligned, path):
    from tessera.kernels_lib.moe import experts
    x, w13, w2, weights, ids = moe_problem(H, I)
    options = dict(one_launch=True) if path == "one_launch" else dict(block_m=16 if path == "decode" else 64)
    with compiled_launches(ALL_TARGETS) as seen:
        out = experts(x, w13, w2, weights, ids, **options)
    close(out, moe_reference(x, w13, w2, weights, ids))
    kernels = ["moe_layer_kernel"] if path == "one_launch" else ["gate_up_kernel", "down_kernel"]
    for kernel in kernels:
        assert pipelined(seen, kernel) == {"sm_80": aligned, "sm_90a": aligned}, kernel


def test_moe_backward(moe_gpu_tiles):
    from tessera.kernels_lib.moe import experts
    x, w13, w2, weights, ids = moe_problem(40, 24)
    x, w13, w2 = (t.clone().requires_grad_() for t in (x, w13, w2))
    with compiled_launches() as seen:
        experts(x, w13, w2, weights, ids, block_m=64).float().sum().backward()
    assert {"grouped_gemm_kernel", "weight_grad_kernel"} <= {c.kernel for c in seen}


@pytest.mark.parametrize("fmt", ["int4", "fp8"])
def test_moe_quantized_experts(moe_gpu_tiles, fmt):
    from tessera.kernels_lib.moe import experts, quantize_experts
    x, w13, w2, weights, ids = moe_problem(40, 24)
    options = dict(group_size=8) if fmt == "int4" else {}
    q13, q2 = quantize_experts(w13.float(), fmt, **options), quantize_experts(w2.float(), fmt, **options)
    with compiled_launches() as seen:
        out = experts(x, q13, q2, weights, ids, block_m=64)
    assert {"gate_up_quant_kernel", "down_quant_kernel"} <= {c.kernel for c in seen}
    assert torch.isfinite(out).all()


def test_moe_fp8_activations_on_sm_90a(moe_gpu_tiles):
    from tessera.kernels_lib.moe import experts, quantize_experts
    x, w13, w2, weights, ids = moe_problem(40, 24)
    q13, q2 = quantize_experts(w13.float(), "fp8"), quantize_experts(w2.float(), "fp8")
    with compiled_launches(["sm_90a"]) as seen:
        experts(x, q13, q2, weights, ids, fp8_activations=True)
    assert {"gate_up_fp8_kernel", "down_fp8_kernel"} <= {c.kernel for c in seen}


# --- attention (odd sequence lengths, packed QKV strides), with the GPU's plans --------------------------------

@pytest.fixture
def attention_gpu_plans(monkeypatch):
    A = importlib.import_module("tessera.kernels_lib.attention")
    AD = importlib.import_module("tessera.kernels_lib.attention_decode")
    monkeypatch.setattr(A, "CPU_PLAN", A.GPU_PLANS["nvidia"][64])
    monkeypatch.setattr(A, "BWD_CPU_PLAN", A.BWD_GPU_PLANS["sm_90a"][64])
    monkeypatch.setattr(AD, "CPU_DECODE_PLAN", AD.DECODE_PLANS[64])


def test_attention_forward_and_backward(attention_gpu_plans):
    from tessera.kernels_lib import attention
    g = torch.Generator().manual_seed(0)
    qkv = torch.randn(2, 37, 3, 2, 64, generator=g).to(BF16)           # packed: strides of 3 heads' rows
    q, k, v = (qkv[:, :, i].clone().requires_grad_() for i in range(3))
    with compiled_launches() as seen:
        o, _ = attention(qkv[:, 5:, 0], qkv[:, :, 1], qkv[:, :, 2], causal=True)       # Sq = 32, Sk = 37
        attention(q, k, v, deterministic=True)[0].float().sum().backward()
    kernels = {c.kernel for c in seen}
    assert {"attention_fwd_kernel", "attention_bwd_kv_kernel", "attention_bwd_q_kernel"} <= kernels
    assert o.shape == (2, 32, 2, 64) and torch.isfinite(q.grad).all()


def test_attention_forward_persistent_on_sm_90a(attention_gpu_plans, monkeypatch):
    """TESSERA_ATTENTION_PERSISTENT=1 with the warp-specialized plan: the op launches the persistent kernel on
    packed (strided) Q, K, V, Sq = 32 queries over 37 keys, and it compiles strict for sm_90a."""
    from tessera.kernels_lib import attention
    A = importlib.import_module("tessera.kernels_lib.attention")
    monkeypatch.setattr(A, "CPU_PLAN", A.WS_GPU_PLANS[64])
    monkeypatch.setenv("TESSERA_ATTENTION_PERSISTENT", "1")
    qkv = torch.randn(2, 37, 3, 2, 64, generator=torch.Generator().manual_seed(0)).to(BF16)
    with compiled_launches(["sm_90a"]) as seen:
        o, lse = attention(qkv[:, 5:, 0], qkv[:, :, 1], qkv[:, :, 2], causal=True)
    assert {c.kernel for c in seen} == {"attention_fwd_persistent_kernel"}
    assert all(c.compiled.metadata["num_threads"] == 384 for c in seen)
    from attention_reference import attention as reference
    close(o, reference(qkv[:, 5:, 0], qkv[:, :, 1], qkv[:, :, 2], True)[0])


def test_attention_backward_in_the_overlap_order(attention_gpu_plans, monkeypatch):
    """TESSERA_ATTENTION_BWD_OVERLAP=1: the op launches both backward kernels with OVERLAP, as compiled."""
    from tessera.kernels_lib import attention
    monkeypatch.setenv("TESSERA_ATTENTION_BWD_OVERLAP", "1")
    q, k, v = (torch.randn(1, 37, 2, 64, generator=torch.Generator().manual_seed(i)).to(BF16).requires_grad_()
               for i in range(3))
    with compiled_launches(["sm_90a"]) as seen:
        attention(q, k, v, causal=True, deterministic=True)[0].float().sum().backward()
    backward = [c for c in seen if c.kernel.startswith("attention_bwd_") and c.kernel != "attention_bwd_delta_kernel"]
    assert {c.kernel for c in backward} == {"attention_bwd_kv_kernel", "attention_bwd_q_kernel"}
    assert all(c.constexprs["OVERLAP"] and "wgmma_wait {pending = 1}" in c.compiled.stages["thread_ir"]
               for c in backward)
    assert torch.isfinite(q.grad).all()


def test_attention_decode_and_varlen(attention_gpu_plans):
    from tessera.kernels_lib import attention_decode, attention_varlen
    kc, vc = torch.randn(16, 16, 1, 64).to(BF16), torch.randn(16, 16, 1, 64).to(BF16)
    table = torch.arange(16, dtype=torch.int32).reshape(2, 8)
    q = torch.randn(37 + 21, 2, 64).to(BF16)
    cu = torch.tensor([0, 37, 58], dtype=torch.int32)
    # Both read their blocks' bounds from memory, so on sm_90a they load K and V by cp.async, not TMA: a shortfall
    # both kernels accept (`attention_fwd.CACHE_BOUNDS_SHORTFALL`), so both compile strict, as a user's
    # $TESSERA_STRICT launch does.
    with compiled_launches() as decode:
        attention_decode(torch.randn(2, 1, 2, 64).to(BF16), kc, vc, table, torch.tensor([37, 101], dtype=torch.int32))
    with compiled_launches() as varlen:
        attention_varlen(q, q, q, cu, cu, 37, 37)
    assert "attention_decode_kernel" in {c.kernel for c in decode}
    assert "attention_fwd_kernel" in {c.kernel for c in varlen}


def test_attention_fp8_on_sm_90a(attention_gpu_plans):
    from tessera.kernels_lib import attention
    q = torch.randn(2, 37, 2, 64).to(torch.float8_e4m3fn)
    one = torch.tensor(1.0)
    with compiled_launches(["sm_90a"]):
        o, _ = attention(q, q, q, q_descale=one, k_descale=one, v_descale=one)
    assert torch.isfinite(o.float()).all()
