"""The stream-K GEMM (gemm_stream_k.py) on a real GPU, forced by $TESSERA_GEMM_STREAM_K=1: shapes whose
persistent grid's last wave is partial against torch.matmul in float32, the same bits on every run (the counters
left at 0 for the next launch, whoever arrived last), with an epilogue and a transposed B. Skipped without an
NVIDIA driver."""

import importlib

import pytest

from tessera.runtime import cuda
from tessera.testing import assert_close

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(cuda.device_count() == 0, reason="needs an NVIDIA GPU")]

torch = pytest.importorskip("torch")
gemm = importlib.import_module("tessera.kernels_lib.gemm")
from tessera.kernels_lib import gemm_stream_k  # noqa: E402

# 3072^2: 576 tiles on 132 SMs (48 stream-K tiles); odd sizes; one tile more than the SMs; K not a multiple of BK
SHAPES = [(3072, 3072, 3072), (1000, 3000, 1030), (128 * 12, 128 * 11 + 1, 4096), (2304, 4096, 200)]


@pytest.fixture
def stream_k(monkeypatch):
    monkeypatch.setenv(gemm.STREAM_K_ENV, "1")
    gemm._stream_k_plan.cache_clear()
    gemm.clear_plans()
    yield
    gemm._stream_k_plan.cache_clear()
    gemm.clear_plans()


@pytest.mark.parametrize("weight", [False, True], ids=["b-row-major", "b-weight"])
@pytest.mark.parametrize("M,N,K", SHAPES)
def test_stream_k_matches_torch_matmul_and_repeats_its_bits(M, N, K, weight, stream_k):
    g = torch.Generator().manual_seed(M + N)
    a = torch.randn((M, K), generator=g).to(torch.bfloat16).cuda()
    b = torch.randn((N, K) if weight else (K, N), generator=g).to(torch.bfloat16).cuda()
    bias = torch.randn(N, generator=g).cuda()
    sms = gemm._num_sms(0)
    plan = gemm._stream_k_plan(M, N, K, 2, sms, False, "1", *gemm._gpu_of(a.device))     # (the op's, on this GPU)
    tiles = -(-M // 128) * -(-N // 128)
    if tiles <= sms or tiles % sms == 0:
        pytest.skip(f"{tiles} tiles on {sms} SMs: no partial last wave")
    assert plan is not None and plan.sk_tiles % sms == tiles % sms
    out = gemm.gemm(a, b, bias, activation="gelu", trans_b=weight)
    b_kn = b.float().t() if weight else b.float()
    expected = torch.nn.functional.gelu(a.float() @ b_kn + bias, approximate="tanh")
    assert_close(out.float(), expected, rtol=2e-2, atol=2e-1, matmul=(a.float(), b_kn, plan.BK))
    for _ in range(3):          # the warm plan, the counters reset by the previous launch
        assert torch.equal(gemm.gemm(a, b, bias, activation="gelu", trans_b=weight), out)
    counters, _ = gemm_stream_k.arrival_counters(a.device, plan.sk_tiles)
    torch.cuda.synchronize()
    assert not counters.any()
