"""tessera.kernels_lib.moe with frozen quantized experts: gradients in x and the routing weights (QLoRA-style).

Specification:

* `experts` with int4 (symmetric, with zeros) or fp8 (per-channel, block) w13 and w2 differentiates in x and the
  routing weights as float64 torch autograd does through the dequantized weights, for SiLU and GELU, top-1 and
  top-2, experts with no tokens (interpreter, float32);
* `moe_grouped_gemm_quant` is A @ W^T and A @ W of the dequantized weight, on the interpreter, and lowered for
  sm_80 (mma.sync, cp.async) and sm_90a (wgmma, TMA) computes on the SIMT simulator what the interpreter computes; both orientations of every
  quantized plan compile without register spills for sm_80, sm_90a and gfx942 (at its target's plan);
* asking for a gradient of the codes or scales is an error naming the fix, through `experts` and through the
  op; fp8 activations (W8A8) stay inference only, with the fix named;
* a quantized `MoELayer` passes gradients to its router and input;
* opcheck passes for both ops.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from amd_spills import amd_spills
from moe_problem import random_moe
import tessera
from tessera.backends.interp.storage import Memory
from tessera.backends.simt import run_threads
from tessera.kernels_lib.moe import MoELayer, align, experts, quantize_experts
from tessera.kernels_lib.moe import plan as plans
from tessera.kernels_lib.moe.common import kernel_arg
from tessera.kernels_lib.moe.quantized import interleave
from tessera.kernels_lib.targets import lds_bytes
from tessera.kernels_lib.moe.quantized_autograd import experts_quant_op, grouped_gemm_quant, \
    grouped_gemm_quant_kernel
from tessera.passes.thread_passes import lower

FORMATS = {
    "int4-sym-g32": dict(format="int4", group_size=32),
    "int4-zeros-g16": dict(format="int4", group_size=16, symmetric=False),
    "fp8-channel": dict(format="fp8", scales="channel"),
    "fp8-block16": dict(format="fp8", scales="block", block=16),
}


def _problem(T, H, I, E, K, options, seed=0, empty=()):
    x, w1, w3, w2, (weights, ids, counts, chunk_counts) = random_moe(T, H, I, E, K, seed, empty)
    q1, q3, q2 = (quantize_experts(w, **options) for w in (w1, w3, w2))
    return x, interleave(q1, q3), q2, weights, ids, counts, chunk_counts


def _reference(x, w13, w2, weights, ids, activation):
    """sum_j weights[t, j] * w2[e] @ (act(gate) * up), gate/up rows interleaved in w13, in torch (autograd)."""
    act = torch.nn.functional.silu if activation == "silu" else \
        (lambda g: torch.nn.functional.gelu(g, approximate="tanh"))
    out = torch.zeros(x.shape[0], w2.shape[1], dtype=x.dtype)
    for t in range(x.shape[0]):
        for j in range(ids.shape[1]):
            e = int(ids[t, j])
            h = w13[e] @ x[t]
            out[t] = out[t] + weights[t, j] * (w2[e] @ (act(h[0::2]) * h[1::2]))
    return out


@pytest.mark.parametrize("name, H, I, K, activation, atomic", [
    ("int4-sym-g32", 32, 64, 2, "silu", False),
    ("int4-zeros-g16", 48, 32, 1, "gelu", True),
    ("fp8-channel", 40, 24, 2, "gelu", False),        # sizes no tile divides: rows past an expert's N, K
    ("fp8-block16", 32, 48, 2, "silu", True),
])
def test_gradients_in_x_and_the_routing_weights_match_float64(name, H, I, K, activation, atomic):
    T, E = 7, 4
    x, q13, q2, weights, ids, counts, chunk_counts = _problem(T, H, I, E, K, FORMATS[name], seed=K, empty=(2,))
    grad = torch.randn(T, H, generator=torch.Generator().manual_seed(5))
    ours = [t.clone().requires_grad_() for t in (x, weights)]
    out = experts(ours[0], q13, q2, ours[1], ids, activation=activation, atomic=atomic, counts=counts,
                  chunk_counts=chunk_counts)
    out.backward(grad)
    theirs = [t.clone().double().requires_grad_() for t in (x, weights)]
    expected = _reference(theirs[0], q13.dequantize().double(), q2.dequantize().double(), theirs[1], ids, activation)
    expected.backward(grad.double())
    np.testing.assert_allclose(out.detach().double().numpy(), expected.detach().numpy(), rtol=1e-4, atol=1e-5)
    for label, a, b in zip(("x", "weights"), ours, theirs):
        np.testing.assert_allclose(a.grad.double().numpy(), b.grad.numpy(), rtol=1e-4, atol=1e-5, err_msg=label)
        assert b.grad.abs().max() > 0


@pytest.mark.parametrize("name", list(FORMATS))
@pytest.mark.parametrize("trans_b", [True, False])
def test_grouped_gemm_quant_is_the_dequantized_product(name, trans_b):
    E, N, Kw, T, K, BM = 3, 48, 32, 9, 2, 16
    q = quantize_experts(torch.randn(E, N, Kw, generator=torch.Generator().manual_seed(1)), **FORMATS[name])
    ids = torch.randint(0, E - 1, (T, K), generator=torch.Generator().manual_seed(2)).int()     # expert 2: none
    sorted_ids, block_expert, offsets = align(ids, E, BM)
    a = torch.randn(sorted_ids.shape[0], Kw if trans_b else N, generator=torch.Generator().manual_seed(3))
    c = grouped_gemm_quant(a, q.qweight.view(torch.uint8), q.scales, q.zeros, block_expert, offsets, BM, trans_b,
                           q.format, q.group_size)
    w = q.dequantize().double()
    for b, e in enumerate(block_expert.tolist()):
        rows = slice(b * BM, min((b + 1) * BM, c.shape[0]))      # the last block may be short
        want = torch.zeros(c[rows].shape, dtype=torch.float64) if e < 0 else \
            a[rows].double() @ (w[e].T if trans_b else w[e])
        np.testing.assert_allclose(c[rows].double().numpy(), want.numpy(), rtol=1e-5, atol=1e-5)


def _memory(a):
    if isinstance(a, np.ndarray):
        return a.copy()
    return Memory(a.array.copy(), a.dtype) if hasattr(a, "array") else a


@pytest.mark.parametrize("target, BM, name, expect_ops", [
    ("sm_80", 16, "int4-zeros-g16", {"unpack_bits", "mma", "async_copy"}),
    ("sm_80", 16, "fp8-block16", {"mma", "async_copy"}),
    ("sm_90a", 64, "int4-sym-g32", {"unpack_bits", "wgmma", "mbarrier_wait"}),     # both orientations: wgmma
])
@pytest.mark.parametrize("trans_b", [True, False])
def test_grouped_gemm_quant_on_the_simt_simulator(target, BM, name, expect_ops, trans_b):
    E, N, Kw = 2, 32, 32
    q = quantize_experts(torch.randn(E, N, Kw, generator=torch.Generator().manual_seed(4)), **FORMATS[name])
    ids = torch.tensor([[0, 1], [1, 0], [0, 1]], dtype=torch.int32)
    sorted_ids, block_expert, offsets = (t.numpy() for t in align(ids, E, BM))
    rows = sorted_ids.shape[0]
    a = np.random.default_rng(0).standard_normal((rows, Kw if trans_b else N)).astype(np.float16)
    out_cols = N if trans_b else Kw
    codes = kernel_arg(q.qweight.view(torch.uint8), tessera.u4 if q.format == "int4" else tessera.f8e4m3)
    args = [a, codes, kernel_arg(q.scales), kernel_arg(q.zeros if q.zeros is not None else q.scales),
            np.zeros((rows, out_cols), np.float32), block_expert, offsets, rows, out_cols, a.shape[1], E, E * N, Kw,
            q.scales.shape[2]]
    constexprs = dict(TRANS_B=trans_b, FORMAT=q.format, G=q.group_size, ZEROS=q.zeros is not None, BM=BM, BN=16,
                      BK=16, STAGES=2)
    grid = (rows // BM, out_cols // 16, 1)
    fn = lower(grouped_gemm_quant_kernel.specialize(*args, **constexprs).module, target).functions[0]
    assert expect_ops <= {op.name for op in fn.walk()}
    expected = [a.copy() if isinstance(a, np.ndarray) else a for a in args]
    grouped_gemm_quant_kernel[grid](*expected, **constexprs)
    got = [_memory(a) for a in args]
    run_threads(fn, got, grid)
    np.testing.assert_allclose(got[4], expected[4], rtol=2e-3, atol=2e-3)
    assert np.abs(expected[4]).max() > 0


@pytest.mark.parametrize("target", ["sm_80", "sm_90a", "gfx942"])
@pytest.mark.parametrize("regime", list(plans.QUANTIZED))
def test_the_backward_gemms_compile_without_spills(target, regime):
    """At the target's quantized plan (`plan.gpu_plans`; down's tiles, as `quantized_autograd` launches them),
    strict: pipelined, gfx942's within its 64 KiB."""
    amd = target.startswith("gfx")
    p = plans.gpu_plans(target if amd else "nvidia", "quantized")[regime]
    t = p.down
    for fmt in ("int4", "fp8"):
        w, s = ("*u4:16", "*bf16:16") if fmt == "int4" else ("*f8e4m3:16", "*f32:16")
        signature = f"*bf16:16,{w},{s},{s},*f32:16,*i32:16,*i32:16,i32:16,i32:16,i32:16,i32,i32:16,i32:16,i32"
        for trans_b in (True, False):
            compiled = grouped_gemm_quant_kernel.compile(
                signature=signature, target=target, strict=True, TRANS_B=trans_b, FORMAT=fmt, G=128,
                ZEROS=fmt == "int4", BM=p.BM, BN=t.BN, BK=t.BK, STAGES=t.stages, num_warps=t.num_warps)
            spills = amd_spills(compiled.metadata) if amd else compiled.metadata["spill_stores"]
            assert not spills, f"{fmt} trans_b={trans_b} spills on {target} ({regime}): {compiled.metadata}"
            if amd:
                assert compiled.metadata["shared_bytes"] <= lds_bytes(target)


def test_asking_for_the_quantized_weights_gradient_names_the_fix():
    x, q13, q2, weights, ids, _, _ = _problem(5, 32, 16, 4, 2, FORMATS["fp8-channel"])
    q13.scales.requires_grad_()
    with pytest.raises(ValueError, match=r"quantized experts are frozen.*requires_grad_\(False\)"):
        experts(x, q13, q2, weights, ids)
    sorted_ids, block_expert, offsets = align(ids, 4, 16)
    out = experts_quant_op(x.requires_grad_(), q13.qweight.view(torch.uint8), q13.scales, None, "fp8",
                           q13.group_size, q2.qweight.view(torch.uint8), q2.scales, None, "fp8", q2.group_size,
                           weights, sorted_ids, block_expert, offsets, 16, "silu", False)
    with pytest.raises(ValueError, match="tessera::moe_experts_quant: the codes, scales and zeros"):
        out.sum().backward()


def test_fp8_activations_stay_inference_only():
    layer = MoELayer(128, 64, 4, 2).quantize_experts("fp8", fp8_activations=True)
    with pytest.raises(ValueError, match=r"fp8_activations=False"):
        layer(torch.randn(3, 128, requires_grad=True))


def test_a_quantized_layer_trains_its_router_and_input():
    torch.manual_seed(0)
    layer = MoELayer(32, 16, 4, 2).quantize_experts("int4", group_size=16)
    x = torch.randn(6, 32, requires_grad=True)
    layer(x).square().sum().backward()
    assert x.grad.abs().max() > 0 and layer.gate.weight.grad.abs().max() > 0


def test_opcheck():
    x, q13, q2, weights, ids, counts, chunk_counts = _problem(5, 32, 16, 4, 2, FORMATS["int4-zeros-g16"])
    sorted_ids, block_expert, offsets = align(ids, 4, 16, counts, chunk_counts)
    a = torch.randn(sorted_ids.shape[0], 32)
    for trans_b in (True, False):
        torch.library.opcheck(grouped_gemm_quant, (a, q13.qweight, q13.scales, q13.zeros, block_expert, offsets, 16,
                                                   trans_b, "int4", 16))
    args = (x.requires_grad_(), q13.qweight, q13.scales, q13.zeros, "int4", 16, q2.qweight, q2.scales, q2.zeros,
            "int4", 16, weights.requires_grad_(), sorted_ids, block_expert, offsets, 16, "silu", False)
    torch.library.opcheck(experts_quant_op, args)


# -- on a GPU --------------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("tokens", [3, 100, 700])                 # the decode, middle and prefill plans
@pytest.mark.parametrize("options", [dict(format="int4", group_size=128, symmetric=False),
                                     dict(format="fp8", scales="block")], ids=["int4-zeros-g128", "fp8-block128"])
def test_on_the_gpu_the_backward_matches_float32_autograd(options, tokens):
    H, I, E, K = 512, 384, 8, 2
    x, q13, q2, weights, ids, _, _ = _problem(tokens, H, I, E, K, options, seed=tokens)
    grad = torch.randn(tokens, H, generator=torch.Generator().manual_seed(7))
    ours = [x.cuda().bfloat16().requires_grad_(), weights.cuda().requires_grad_()]
    experts(ours[0], q13.to("cuda"), q2.to("cuda"), ours[1], ids.cuda()).backward(grad.cuda().bfloat16())
    theirs = [x.bfloat16().float().requires_grad_(), weights.clone().requires_grad_()]
    w13, w2 = q13.dequantize().bfloat16().float(), q2.dequantize().bfloat16().float()
    x13 = theirs[0][:, None, None, :] @ w13[ids.long()].transpose(-1, -2)          # [T, K, 1, 2I]: all at once
    act = torch.nn.functional.silu(x13[..., 0::2]) * x13[..., 1::2]
    y = (act @ w2[ids.long()].transpose(-1, -2)).squeeze(2)                          # [T, K, H]
    (theirs[1][..., None] * y).sum(1).backward(grad)
    for label, a, b in zip(("x", "weights"), ours, theirs):
        error = (a.grad.float().cpu() - b.grad).abs().max()
        assert error <= 3e-2 * b.grad.abs().max(), f"{label}: {error} against {b.grad.abs().max()}"
