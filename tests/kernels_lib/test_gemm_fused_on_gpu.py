"""The fused GEMM on a Hopper GPU (issue 18): bench/fusion.py's epilogue (bias + GELU + residual + dropout) at
the plain GEMM's config computes what torch does with the same dropout mask, and costs little more than the
plain GEMM: kernels alone (one CUDA graph each), the fused kernel within 1.35x of the plain library GEMM at
4096^3 (it was 3.3x: 0.79 ms against 0.24 ms on an H100). Skipped without an NVIDIA driver or below sm_90."""

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


def graph_ms(fn, calls=10, replays=5):
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    graph.replay()
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / calls)
    return sorted(times)[len(times) // 2]


def test_the_fused_epilogue_at_the_plain_config_is_right_and_costs_little_more_than_the_plain_gemm():
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
        fused_ms, plain_ms = graph_ms(fused), graph_ms(lambda: gemm(a, b))
    finally:
        pin_config(None)
    assert fused_ms < 1.35 * plain_ms, (fused_ms, plain_ms)
