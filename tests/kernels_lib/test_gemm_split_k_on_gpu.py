"""The split-K paths of tessera::gemm on a real GPU (gemm_split_k.py): decode shapes (M <= 64, B row-major and
as an nn.Linear weight) and a few-tiles shape, deterministic and atomic, against a float32 product; the
deterministic path gives the same bits on every run. Skipped without an NVIDIA driver."""

import pytest

from tessera.runtime import cuda
from tessera.testing import assert_close

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(cuda.device_count() == 0, reason="needs an NVIDIA GPU")]

torch = pytest.importorskip("torch")
from tessera.kernels_lib.gemm import ATOMIC_SPLIT_K_ENV, _gpu_of, _num_sms, _split_k_plan, gemm  # noqa: E402

# (16 / 32, 4096, 4096): the unsplit 32-column strips of the 16- and 32-row tiles; (16, 1000, 4104): a split one
SHAPES = [(1, 4096, 4096), (16, 4096, 4096), (32, 4096, 4096), (16, 1000, 4104), (64, 4096, 14336), (37, 272, 1008),
          (128, 1024, 4096)]


@pytest.mark.parametrize("atomic", [False, True], ids=["deterministic", "atomic"])
@pytest.mark.parametrize("weight", [False, True], ids=["b-row-major", "b-weight"])
@pytest.mark.parametrize("M,N,K", SHAPES)
def test_split_k_matches_a_float32_product(M, N, K, weight, atomic, monkeypatch):
    if atomic:
        monkeypatch.setenv(ATOMIC_SPLIT_K_ENV, "1")
    g = torch.Generator().manual_seed(M)
    a = torch.randn((M, K), generator=g).to(torch.bfloat16).cuda()
    b = torch.randn((N, K) if weight else (K, N), generator=g).to(torch.bfloat16).cuda()
    bias = torch.randn(N, generator=g).cuda()
    plan = _split_k_plan(M, N, K, 2, _num_sms(0), False, *_gpu_of(a.device))     # (as the op plans on this GPU)
    assert plan is not None, "these shapes take a split-K plan"
    out = gemm(a, b, bias, activation="gelu", trans_b=weight)
    b_kn = b.float().t() if weight else b.float()
    pre = a.float() @ b_kn + bias
    expected = torch.nn.functional.gelu(pre, approximate="tanh")
    assert_close(out.float(), expected, rtol=2e-2, atol=2e-1, matmul=(a.float(), b_kn, plan.BK))
    if not atomic:
        assert torch.equal(gemm(a, b, bias, activation="gelu", trans_b=weight), out)     # the same bits
