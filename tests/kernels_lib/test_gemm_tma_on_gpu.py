"""The library GEMM on a Hopper GPU (sm_90a): its K loop fills the ring slots with TMA loads from A's and B's
by-value tensor maps, its epilogue stores C's block through a third map (`passes/schedule/tma_store.py`), the
launcher builds exactly those maps, and the product matches torch's -- edges of M, N and K not multiples of
the blocks (zero-filled boxes, clipped stores), either operand transposed. Skipped without an NVIDIA driver or
on GPUs older than sm_90."""

import pytest

from tessera.runtime import cuda
from tessera.testing import assert_close

from tma_maps import launcher_map_uses

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(cuda.device_count() == 0, reason="needs an NVIDIA GPU")]

torch = pytest.importorskip("torch")


@pytest.fixture(autouse=True)
def hopper():
    if cuda.get_device(0).capability < (9, 0):
        pytest.skip("TMA needs sm_90+")


# every row length (K, N, and M for a transposed A) a multiple of 16 elements, what the specialization proves,
# so A's, B's and C's maps all qualify; no size a multiple of a block
@pytest.mark.parametrize("M,N,K", [(208, 144, 336), (1008, 272, 1008)])
@pytest.mark.parametrize("trans_a,trans_b", [(False, False), (False, True), (True, False)])
def test_library_gemm_with_tma_matches_torch(M, N, K, trans_a, trans_b):
    from tessera.kernels_lib.gemm import gemm, gemm_kernel, gemm_kernel_fast

    g = torch.Generator().manual_seed(0)
    a = torch.randn((K, M) if trans_a else (M, K), generator=g).to(torch.bfloat16).cuda()
    b = torch.randn((N, K) if trans_b else (K, N), generator=g).to(torch.bfloat16).cuda()
    out = gemm(a, b, trans_a=trans_a, trans_b=trans_b)
    expected = (a.float().t() if trans_a else a.float()) @ (b.float().t() if trans_b else b.float())
    assert_close(out.float(), expected, rtol=2e-2, atol=2e-1, matmul=(a.float().t() if trans_a else a.float(),
                                                                   b.float().t() if trans_b else b.float(), 64))
    # The op ran gemm_kernel_fast (a bf16 output) or gemm_kernel; a launcher is kept per specialization and
    # config. Each one's maps are exactly those its code uses: the operands it loads by TMA, and C's when its
    # epilogue stores by TMA. Here A, B and C all qualify (rows multiples of 16 elements, blocks >= 4 KB), so
    # some launcher -- this call's -- loads A and B and stores C through maps, and nothing else.
    uses = [launcher_map_uses(launcher) for kernel in (gemm_kernel, gemm_kernel_fast)
            for launcher in kernel.kernel.launchers.values()]
    assert {"load": ["a_ptr", "b_ptr"], "store": ["c_ptr"]} in uses, uses



@pytest.mark.parametrize("M, maps", [
    # 200 is not a multiple of 16, but A^T's rows of 400 bytes start 16-byte aligned: the op states it
    # (`gemm_alignment.py`), so A's slots are filled by TMA as B's are
    (200, {"load": ["a_ptr", "b_ptr"], "store": ["c_ptr"]}),
    # rows of 404 bytes: no copy engine fills A's slots, so the op asks for no pipeline (plain K loop; C is
    # still stored through its map) instead of a CompileError in strict mode
    (202, {"load": [], "store": ["c_ptr"]}),
])
def test_a_transposed_a_whose_rows_are_not_multiples_of_16_elements_stays_right(M, maps):
    """A [K, M], transposed: the loads the launcher's maps serve follow from where A's rows start."""
    from tessera.kernels_lib.gemm import gemm, gemm_kernel, gemm_kernel_fast

    g = torch.Generator().manual_seed(0)
    a = torch.randn((336, M), generator=g).to(torch.bfloat16).cuda()
    b = torch.randn((336, 144), generator=g).to(torch.bfloat16).cuda()
    out = gemm(a, b, trans_a=True)
    assert_close(out.float(), a.float().t() @ b.float(), rtol=2e-2, atol=2e-1, matmul=(a.float().t(), b.float(), 64))
    uses = [launcher_map_uses(launcher) for kernel in (gemm_kernel, gemm_kernel_fast)
            for launcher in kernel.kernel.launchers.values()]
    assert maps in uses, uses


@pytest.mark.parametrize("M,N,K", [(208, 144, 336), (1008, 272, 1008)])
def test_a_float32_c_stored_by_register_pairs_and_tma_matches_torch(M, N, K):
    """out_dtype=float32: C goes from the accumulator's registers by st.shared.v2 into a 128B-swizzled tile
    and out by one TMA store per 32 columns (`passes/schedule/pair_store.py`), clipped at ragged edges; the
    launcher builds C's map (an f32 box of 32 columns)."""
    from tessera.kernels_lib.gemm import gemm, gemm_kernel, gemm_kernel_fast

    g = torch.Generator().manual_seed(1)
    a = torch.randn((M, K), generator=g).to(torch.bfloat16).cuda()
    b = torch.randn((K, N), generator=g).to(torch.bfloat16).cuda()
    out = gemm(a, b, out_dtype=torch.float32)
    assert out.dtype == torch.float32
    assert_close(out, a.float() @ b.float(), rtol=1e-3, atol=1e-2, matmul=(a.float(), b.float(), 64))
    uses = [launcher_map_uses(launcher) for kernel in (gemm_kernel, gemm_kernel_fast)
            for launcher in kernel.kernel.launchers.values()]
    assert {"load": ["a_ptr", "b_ptr"], "store": ["c_ptr"]} in uses, uses
