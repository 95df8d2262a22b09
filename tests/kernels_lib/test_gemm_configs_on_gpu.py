"""Every shipped library GEMM config, pinned, on a real GPU (the persistent warp-specialized one too): bf16 with
and without warp specialization (Hopper), and fp8 with scales (sm_89+), against a float32 product. The shapes
leave partial tiles along M, N and K, and a wrong product names its wrong rows, columns and K-steps
(tessera.testing). Skipped without an NVIDIA driver."""

import pytest

import tessera
from tessera.runtime import cuda
from tessera.testing import assert_close

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(cuda.device_count() == 0, reason="needs an NVIDIA GPU")]

torch = pytest.importorskip("torch")
from tessera.kernels_lib.gemm import CONFIGS, HOPPER_CONFIGS, gemm, pin_config  # noqa: E402

M, N, K = 1000, 272, 1008          # rows 16-byte aligned (TMA-eligible), no size a multiple of a block


def _variants():
    """(id, config, needs Hopper): each shipped config (the sm_90 family's too: 128 x 256, 256 x 128, and the
    cluster-multicast ones), and each non-persistent one with WS=True."""
    plain = [(f"{'x'.join(str(c.kwargs[k]) for k in ('BM', 'BN', 'BK'))}-s{c.kwargs['STAGES']}"
              f"{'-persistent' if c.kwargs['PERSISTENT'] else ''}{'-ws' if c.kwargs.get('WS') else ''}"
              f"{''.join(f'-{k.lower()}{c.kwargs[k]}' for k in ('CLUSTER_M', 'CLUSTER_N') if c.kwargs.get(k, 1) > 1)}",
              c,
              c in HOPPER_CONFIGS)
             for c in CONFIGS + HOPPER_CONFIGS]
    ws = [(name + "-ws", tessera.Config(dict(c.kwargs, WS=True), num_warps=c.num_warps), True)
          for name, c, _ in plain if not c.kwargs["PERSISTENT"]]
    return plain + ws


VARIANTS = _variants()


@pytest.fixture
def pinned(request):
    _, config, hopper = request.param
    if hopper and cuda.get_device(0).capability < (9, 0):
        pytest.skip("warp specialization and the sm_90 family's tiles need a Hopper GPU")
    pin_config(config)          # both compilations: bfloat16 outputs run the fast-math one
    yield config
    pin_config(None)


@pytest.mark.parametrize("pinned", VARIANTS, ids=[v[0] for v in VARIANTS], indirect=True)
def test_each_config_matches_a_float32_product(pinned):
    g = torch.Generator().manual_seed(1)
    a = torch.randn((M, K), generator=g).to(torch.bfloat16).cuda()
    b = torch.randn((K, N), generator=g).to(torch.bfloat16).cuda()
    out = gemm(a, b)
    assert_close(out.float(), a.float() @ b.float(), rtol=2e-2, atol=2e-1,
                 matmul=(a.float(), b.float(), pinned.kwargs["BK"]))


@pytest.mark.parametrize("pinned", VARIANTS[:1], ids=[VARIANTS[0][0]], indirect=True)
def test_bias_and_activation_epilogue(pinned):
    g = torch.Generator().manual_seed(2)
    a = torch.randn((M, K), generator=g).to(torch.bfloat16).cuda()
    b = torch.randn((K, N), generator=g).to(torch.bfloat16).cuda()
    bias = torch.randn(N, generator=g).cuda()
    out = gemm(a, b, bias, activation="silu")
    pre = a.float() @ b.float() + bias
    assert_close(out.float(), pre * torch.sigmoid(pre), rtol=2e-2, atol=2e-1)


@pytest.mark.parametrize("pinned", VARIANTS[:1], ids=[VARIANTS[0][0]], indirect=True)
def test_fp8_with_per_tensor_and_per_row_scales(pinned):
    if cuda.get_device(0).capability < (8, 9):
        pytest.skip("fp8 needs sm_89+")
    g = torch.Generator().manual_seed(3)
    a = (torch.randn((M, K), generator=g) / 4).to(torch.float8_e4m3fn).cuda()
    b_t = (torch.randn((N, K), generator=g) / 4).to(torch.float8_e4m3fn).cuda()
    scale_a = (torch.rand(M, generator=g) + 0.5).cuda()
    scale_b = torch.tensor(2.0).cuda()
    out = gemm(a, b_t, None, scale_a, scale_b, trans_b=True)
    expected = (a.float() @ b_t.float().t()) * scale_a[:, None] * scale_b
    assert_close(out.float(), expected, rtol=2e-2, atol=2e-1)


PERSISTENT = [v for v in VARIANTS if v[1].kwargs["PERSISTENT"]]


@pytest.mark.parametrize("pinned", PERSISTENT, ids=[v[0] for v in PERSISTENT], indirect=True)
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float32])
def test_the_persistent_config_with_several_tiles_per_program_matches_a_float32_product(pinned, out_dtype):
    """2000 x 4000: 16 x 32 tiles of 128 x 128 (the last row and column ragged), ~4 per SM, so each program's
    C store is read by TMA while its next tile's K loop runs (`passes/schedule/tma_store.py`); bf16 C leaves
    through stmatrix, float32 C through st.shared.v2 register pairs (`pair_store.py`), in column slices
    through two reused slots where the whole f32 tile does not fit beside the rings (the 128 x 256 configs)."""
    g = torch.Generator().manual_seed(4)
    a = torch.randn((2000, 520), generator=g).to(torch.bfloat16).cuda()
    b = torch.randn((520, 4000), generator=g).to(torch.bfloat16).cuda()
    out = gemm(a, b, out_dtype=out_dtype)
    assert_close(out.float(), a.float() @ b.float(), rtol=2e-2, atol=2e-1,
                 matmul=(a.float(), b.float(), pinned.kwargs["BK"]))
