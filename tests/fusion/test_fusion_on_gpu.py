"""Fusion on a real GPU (skipped without an NVIDIA driver): the GEMM with a fused epilogue and prologue, attention
with a score_mod, and captured chains whose fused functions are compiled and launched by `FusedKernel`, each
against torch on the same tensors."""

import pytest

from tessera.runtime import cuda

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(cuda.device_count() == 0, reason="needs an NVIDIA GPU")]

torch = pytest.importorskip("torch")

import tessera  # noqa: E402
from tessera.kernels_lib import attention, gemm  # noqa: E402

import fusion_kernels as k  # noqa: E402


def test_gemm_epilogue_and_prologue_on_the_gpu():
    a = torch.randn(1000, 272, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(272, 520, device="cuda", dtype=torch.bfloat16)
    bias, residual = torch.randn(520, device="cuda"), torch.randn(1000, 520, device="cuda")
    out = gemm(a, b, epilogue=k.bias_gelu_residual, epilogue_args=(bias, residual), out_dtype=torch.float32)
    expected = torch.nn.functional.gelu(a.float() @ b.float() + bias) + residual
    torch.testing.assert_close(out, expected, rtol=2e-2, atol=2e-1)
    codes = torch.randint(-127, 128, (272, 520), dtype=torch.int8, device="cuda")
    scale = torch.rand(520, device="cuda") / 64
    x = a.half()
    out = gemm(x, codes, prologue_b=k.dequantize_int8, prologue_b_args=(scale,), out_dtype=torch.float32)
    torch.testing.assert_close(out, x.float() @ (codes.float() * scale).half().float(), rtol=2e-2, atol=2e-1)


def test_attention_score_mod_on_the_gpu():
    q, kk, v = (torch.randn(2, 256, 4, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    o, _ = attention(q, kk, v, causal=True, score_mod=k.softcap, score_mod_args=(30.0,))
    expected, _ = attention(q, kk, v, causal=True, softcap=30.0)
    torch.testing.assert_close(o.float(), expected.float(), rtol=2e-2, atol=2e-2)


def test_a_captured_softmax_and_eight_independent_kernels_on_the_gpu():
    M, N, BM, BN = 1000, 200, 16, 256
    x, y = torch.randn(M, N, device="cuda"), torch.empty(M, N, device="cuda")
    grid = (tessera.cdiv(M, BM),)
    with tessera.fusion() as f:
        m, e, s = torch.empty(M, device="cuda"), torch.empty(M, N, device="cuda"), torch.empty(M, device="cuda")
        k.row_max[grid](x, m, M, N, BM=BM, BN=BN)
        k.exp_minus[grid](x, m, e, M, N, BM=BM, BN=BN)
        k.row_sum[grid](e, s, M, N, BM=BM, BN=BN)
        k.divide_rows[grid](e, s, y, M, N, BM=BM, BN=BN)
        del m, e, s
    assert len(f.ran) == 1
    torch.testing.assert_close(y, torch.softmax(x, 1), rtol=1e-5, atol=1e-6)
    xs = [torch.randn(5000 + 333 * i, device="cuda") for i in range(8)]
    ys = [torch.empty_like(t) for t in xs]
    with tessera.fusion() as f:
        for t, u in zip(xs, ys):
            k.unary[(tessera.cdiv(t.numel(), 1024),)](t, u, t.numel(), OP="sigmoid", BLOCK=1024)
    assert len(f.ran) == 1
    for t, u in zip(xs, ys):
        torch.testing.assert_close(u, torch.sigmoid(t), rtol=1e-5, atol=1e-6)


def test_a_captured_gemm_takes_its_elementwise_consumer_as_its_epilogue_on_the_gpu():
    M, N, K = 1000, 520, 256
    a, b = (torch.randn(*s, device="cuda", dtype=torch.bfloat16) for s in ((M, K), (K, N)))
    bias, out = torch.randn(N, device="cuda"), torch.empty(M, N, device="cuda")
    with tessera.fusion() as f:
        c = gemm(a, b)
        k.bias_gelu[(tessera.cdiv(M * N, 1024),)](c, bias, out, M * N, N, BLOCK=1024)
        del c
    assert f.ran == ["gemm_kernel+bias_gelu"], f.report()
    assert "gemm_kernel: autotuned; launched with the" in f.report()
    expected = torch.nn.functional.gelu((a.float() @ b.float()).bfloat16().float() + bias, approximate="tanh")
    torch.testing.assert_close(out, expected, rtol=2e-2, atol=2e-2)
    f.replay()                                  # the fused launch again, its binary from memory
    torch.testing.assert_close(out, expected, rtol=2e-2, atol=2e-2)
