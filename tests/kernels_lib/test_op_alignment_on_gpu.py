"""On an NVIDIA GPU, in strict mode, the ops whose launches `test_op_launches_compile.py` compiles on the CPU run
for sizes that are multiples of 8 but not 16 (K = 4104, N = 1000: the split-K GEMM's CompileError on the H100),
and for unaligned ones (K = 4101 / H = 4100), and match torch. Each case is one launch or a few: seconds."""

import pytest

from tessera.runtime import cuda

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(cuda.device_count() == 0, reason="needs an NVIDIA GPU")]

torch = pytest.importorskip("torch")

BF16 = torch.bfloat16


def close(out, expected, tol=2e-2):
    err = (out.float() - expected.float()).abs().max().item()
    assert err <= tol * expected.float().abs().max().item(), err


@pytest.mark.parametrize("K", [4104, 4101])
def test_fused_gemm(K):
    from tessera.kernels_lib.gemm_fusion import fused_gemm
    a, w = torch.randn(256, K, device="cuda", dtype=BF16), torch.randn(1000, K, device="cuda", dtype=BF16)
    close(fused_gemm(a, w, trans_b=True), a.float() @ w.float().t())


@pytest.mark.parametrize("M", [3, 256])
def test_quant_gemm(M):
    from tessera.kernels_lib import quant, quant_gemm
    w = quant.quantize(torch.randn(1000, 4128), bits=4, group_size=32)
    x = torch.randn(M, 4128, dtype=torch.float16)
    expected = x.float() @ w.dequantize().t()
    close(quant_gemm(x.cuda(), w.to("cuda")).cpu(), expected)


@pytest.mark.parametrize("H", [4104, 4100])
@pytest.mark.parametrize("one_launch", [False, True])
def test_moe_experts(H, one_launch):
    from tessera.kernels_lib.moe import experts, interleave_gate_up, route
    g = torch.Generator().manual_seed(0)
    E, I, T = 8, 1000, 16
    w1, w3 = (torch.randn(E, I, H, generator=g) / H ** 0.5 for _ in range(2))
    w2 = torch.randn(E, H, I, generator=g) / I ** 0.5
    x = torch.randn(T, H, generator=g)
    weights, ids, _, _ = route(torch.randn(T, E, generator=g), 2)
    cuda_ = dict(device="cuda", dtype=BF16)
    out = experts(x.to(**cuda_), interleave_gate_up(w1, w3).to(**cuda_), w2.to(**cuda_), weights.cuda(), ids.cuda(),
                  one_launch=one_launch)
    reference = torch.zeros(T, H)
    for t in range(T):
        for j in range(2):
            e = int(ids[t, j])
            h = torch.nn.functional.silu(w1[e] @ x[t]) * (w3[e] @ x[t])
            reference[t] += weights[t, j] * (w2[e] @ h)
    close(out.cpu(), reference, 5e-2)
