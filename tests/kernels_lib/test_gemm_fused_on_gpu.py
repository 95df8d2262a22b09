"""The fused GEMM on a Hopper GPU (issue 18): bench/fusion.py's epilogue (bias + GELU + residual + dropout) at
the plain GEMM's config computes what torch does with the same dropout mask. How long it takes against the
plain GEMM is bench/fusion.py's to say (kernels alone, in a CUDA graph), not a timed test's. Skipped without an
NVIDIA driver or below sm_90."""

import pytest

from tessera.runtime import cuda

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(cuda.device_count() == 0, reason="needs an NVIDIA GPU")]

torch = pytest.importorskip("torch")

import fusion_hooks as hooks  # noqa: E402

P = 0.1


@pytest.fixture(autouse=True)
def hopper():
    if cuda.get_device(0).capability < (9, 0):
        pytest.skip("the plan under test is sm_90a's (wgmma, TMA)")


def test_the_fused_epilogue_at_the_plain_config_is_right():
    from tessera.kernels_lib.gemm import CONFIGS, gemm, pin_config

    M = N = K = 4096
    g = torch.Generator().manual_seed(0)
    a, b = (torch.randn(s, generator=g).to(torch.bfloat16).cuda() for s in ((M, K), (K, N)))
    bias, residual = torch.randn(N, generator=g).bfloat16().cuda(), torch.randn(M, N, generator=g).bfloat16().cuda()
    fused = lambda: gemm(a, b, epilogue=hooks.bias_gelu_tanh_residual_dropout,   # noqa: E731
                         epilogue_args=(bias, residual, 1234, P, N))
    pin_config(CONFIGS[0])                  # bench/gemm.py --pin 0's 128 x 128
    try:
        out = fused()
        kept = out != 0
        assert 0.85 < kept.float().mean().item() < 0.95
        reference = torch.nn.functional.gelu(a.float() @ b.float() + bias.float(), approximate="tanh") + residual.float()
        torch.testing.assert_close(out.float()[kept], (reference / (1 - P))[kept], rtol=5e-2, atol=5e-1)
    finally:
        pin_config(None)
