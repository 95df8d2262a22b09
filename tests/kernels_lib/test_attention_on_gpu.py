"""The attention ops on a real GPU, every shipped plan launched: the forward and backward against torch SDPA (math
backend, float32), decode over a paged cache (pages of 16 to 256 tokens, GQA, several splits, the unified max in
range and far out of it) against attention over the gathered cache in float64. Skipped without an NVIDIA
driver."""

import math

import pytest

from tessera.runtime import cuda

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(cuda.device_count() == 0, reason="needs an NVIDIA GPU")]

torch = pytest.importorskip("torch")

from tessera.kernels_lib import attention, attention_decode  # noqa: E402

from attention_reference import attention as reference  # noqa: E402
from test_attention_decode import expected as decode_expected  # noqa: E402


@pytest.fixture(autouse=True)
def not_strict(monkeypatch):
    """The launches compile as a user's do, not in the library tests' strict mode: on Hopper the attention
    kernels take cp.async where TMA would need each (batch, head)'s base as a kernel argument, a shortfall
    test_attention_compile.py accepts by name (and fails on any other)."""
    monkeypatch.delenv("TESSERA_STRICT", raising=False)


def randn(*shape, dtype=torch.bfloat16, grad=False):
    return torch.randn(*shape, device="cuda", dtype=dtype).requires_grad_(grad)


@pytest.mark.parametrize("D", [64, 128, 256])
@pytest.mark.parametrize("causal", [False, True])
def test_forward_matches_sdpa(D, causal):
    """Odd lengths (a partial last block), Sq != Sk (bottom-right causal), GQA 2:1."""
    q, k, v = randn(2, 200, 4, D), randn(2, 333, 2, D), randn(2, 333, 2, D)
    out, lse = attention(q, k, v, causal=causal)
    expected, expected_lse = reference(q.cpu(), k.cpu(), v.cpu(), causal)
    torch.testing.assert_close(out.cpu().double(), expected, rtol=2e-2, atol=2e-2)
    finite = ~torch.isinf(expected_lse)
    torch.testing.assert_close(lse.cpu().double()[finite], expected_lse[finite], rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
def test_warp_specialized_forward_matches_sdpa(D, causal, monkeypatch):
    """TESSERA_ATTENTION_WS=1 on Hopper: the warp-specialized plan (a producer warpgroup, 384 threads) gives
    the same answers on the same problem as test_forward_matches_sdpa."""
    from tessera.kernels_lib.attention import WS_ENV, WS_GPU_PLANS, gpu_plan
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("the warp-specialized plans are sm_90a's")
    monkeypatch.setenv(WS_ENV, "1")
    assert gpu_plan(D, True) == WS_GPU_PLANS[D]
    test_forward_matches_sdpa(D, causal)


@pytest.mark.parametrize("ws, pingpong", [("0", "0"), ("1", "0"), ("1", "1")])
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
def test_overlapped_forward_matches_sdpa(D, causal, ws, pingpong, monkeypatch):
    """TESSERA_ATTENTION_OVERLAP=1 on Hopper: FlashAttention-3's loop order (S of block n and P V of block n - 1
    issued together, the softmax under P V: one wgmma group left in flight), on both plans, gives the same
    answers as test_forward_matches_sdpa; a row block with a single key block (no loop iteration) included.
    TESSERA_ATTENTION_PINGPONG=1 on the warp-specialized plan: its two consumer warpgroups take turns at named
    barriers 3 and 4 (a hang here is a turn that never comes)."""
    from tessera.kernels_lib.attention import OVERLAP_ENV, PINGPONG_ENV, WS_ENV, gpu_plan
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("the overlapped order is for sm_90a's asynchronous wgmma")
    monkeypatch.setenv(WS_ENV, ws)
    monkeypatch.setenv(OVERLAP_ENV, "1")
    monkeypatch.setenv(PINGPONG_ENV, pingpong)
    assert gpu_plan(D, ws == "1", True, pingpong == "1").overlap
    assert gpu_plan(D, ws == "1", True, pingpong == "1").pingpong is (pingpong == "1")
    test_forward_matches_sdpa(D, causal)
    q, k, v = randn(1, 64, 2, D), randn(1, 50, 2, D), randn(1, 50, 2, D)
    out, _ = attention(q, k, v, causal=causal)
    expected, _ = reference(q.cpu(), k.cpu(), v.cpu(), causal)
    torch.testing.assert_close(out.cpu().double(), expected, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("D", [64, 128, 256])
@pytest.mark.parametrize("deterministic", [False, True])
def test_backward_matches_float64_gradients(D, deterministic):
    from tessera.kernels_lib.attention import BWD_GPU_PLANS
    from tessera.kernels_lib.targets import plan_target
    if torch.version.hip:       # (ROCm reports MI300's capability as (9, 4): ask the target)
        arch = plan_target()
    else:
        arch = "sm_90a" if torch.cuda.get_device_capability()[0] == 9 else "sm_80"
    if D not in BWD_GPU_PLANS[arch]:
        pytest.skip(f"no backward plan for head dim {D} on {arch}")
    q, k, v = randn(1, 130, 4, D, grad=True), randn(1, 150, 2, D, grad=True), randn(1, 150, 2, D, grad=True)
    grad = randn(1, 130, 4, D)
    out, _ = attention(q, k, v, causal=True, deterministic=deterministic)
    got = torch.autograd.grad(out, (q, k, v), grad)
    leaves = [x.detach().cpu().double().requires_grad_() for x in (q, k, v)]
    expected = torch.autograd.grad(reference(*leaves, True)[0], leaves, grad.cpu().double())
    for g, e in zip(got, expected):
        torch.testing.assert_close(g.cpu().double(), e, rtol=3e-2, atol=3e-2)


@pytest.mark.parametrize("D", [64, 128, 256])
@pytest.mark.parametrize("deterministic", [False, True])
def test_overlapped_backward_matches_float64_gradients(D, deterministic, monkeypatch):
    """TESSERA_ATTENTION_BWD_OVERLAP=1 on Hopper: the backward kernels with S and dP issued together and dP
    (dK/dV kernel: and dV) left in flight at depth-1 waits (`attention_bwd.py` OVERLAP) give the gradients of
    test_backward_matches_float64_gradients; the deterministic mode gives the same dQ, dK, dV twice."""
    from tessera.kernels_lib.attention import BWD_OVERLAP_ENV, bwd_gpu_plan
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("the overlap order is for sm_90a's asynchronous wgmma")
    assert bwd_gpu_plan(D, torch.device("cuda"), True).overlap
    monkeypatch.setenv(BWD_OVERLAP_ENV, "1")
    test_backward_matches_float64_gradients(D, deterministic)
    if deterministic:
        q, k, v = randn(1, 300, 4, D, grad=True), randn(1, 300, 2, D, grad=True), randn(1, 300, 2, D, grad=True)
        out, _ = attention(q, k, v, causal=True, deterministic=True)
        grad = randn(1, 300, 4, D)
        first = torch.autograd.grad(out, (q, k, v), grad, retain_graph=True)
        second = torch.autograd.grad(out, (q, k, v), grad)
        assert all(torch.equal(a, b) for a, b in zip(first, second))


def paged_case(seqlens, Sq, H, H_kv, D, page):
    """(q, k_cache, v_cache, block_table, cache_seqlens) on the GPU, pages scattered over the cache."""
    per_sequence = max(math.ceil(s / page) for s in seqlens) + 1
    pages = len(seqlens) * per_sequence + 3
    k_cache, v_cache = randn(pages, page, H_kv, D), randn(pages, page, H_kv, D)
    table = torch.randperm(pages, device="cuda")[:len(seqlens) * per_sequence].reshape(len(seqlens), -1).int()
    return randn(len(seqlens), Sq, H, D), k_cache, v_cache, table, torch.tensor(seqlens, device="cuda").int()


DECODE_CASES = {        # seqlens, Sq, H, H_kv, D, page, options
    "d128-page64-gqa4-auto-splits": ([4000, 1, 0, 777], 1, 32, 8, 128, 64, {}),
    "d128-page16-unified-max": ([2500, 33], 1, 16, 4, 128, 16, {"unified_max": 3.0, "num_splits": 5}),
    "d128-unified-max-far-off": ([2500, 33], 1, 16, 4, 128, 16, {"unified_max": -40.0}),
    "d64-page256-mqa-4-new-tokens": ([1000, 300], 4, 8, 1, 64, 256, {"num_splits": 3}),
    "d64-unified-max-window": ([1000, 300], 2, 8, 2, 64, 32, {"unified_max": 3.0, "window": 100}),
    "d256-page32": ([600, 64], 1, 8, 8, 256, 32, {"softcap": 30.0}),
}


@pytest.mark.parametrize("name", list(DECODE_CASES))
def test_decode_matches_float64_attention_over_the_gathered_cache(name):
    seqlens, Sq, H, H_kv, D, page, options = DECODE_CASES[name]
    tensors = paged_case(seqlens, Sq, H, H_kv, D, page)
    out, lse = attention_decode(*tensors, **options)
    window = options.get("window", -1)
    expected, expected_lse = decode_expected(*(t.cpu() for t in tensors), True, (window, window),
                                             options.get("softcap", 0.0))
    torch.testing.assert_close(out.cpu().double(), expected, rtol=2e-2, atol=2e-2)
    assert torch.equal(torch.isinf(lse.cpu()), torch.isinf(expected_lse))
    finite = ~torch.isinf(expected_lse)
    torch.testing.assert_close(lse.cpu().double()[finite], expected_lse[finite], rtol=1e-3, atol=1e-3)


def test_decode_launches_under_a_users_strict_mode(monkeypatch, tmp_path):
    """TESSERA_STRICT=1 set by a user: decode's own accepted shortfall (cp.async where TMA cannot read the block
    table's pages on sm_90a) stays a warning, so the op compiles (a fresh cache: no binary to reuse) and is
    right. (Varlen's launch still raises there: its kernel accepts nothing yet.)"""
    monkeypatch.setenv("TESSERA_STRICT", "1")
    monkeypatch.setenv("TESSERA_CACHE_DIR", str(tmp_path))
    tensors = paged_case([333, 70], 1, 6, 3, 64, 128)       # a shape no other test launches: compiled here
    out, _ = attention_decode(*tensors, num_splits=3)
    expected, _ = decode_expected(*(t.cpu() for t in tensors))
    torch.testing.assert_close(out.cpu().double(), expected, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("name", ["d128-page64-gqa4-auto-splits", "d64-page256-mqa-4-new-tokens",
                                  "d64-unified-max-window"])
def test_decode_merges_in_the_split_launch_to_the_two_launch_paths_bits(name, monkeypatch):
    """The merge in the split launch (last program of each row group, acquire-release counter) against the
    combine kernel: the same bits on the GPU, under a user's strict mode, twice in a row (the counters are
    reset by the merging programs, not by a launch) and in a CUDA graph replayed twice. What the next GPU run
    should show: all equal, counters 0."""
    import importlib
    module = importlib.import_module("tessera.kernels_lib.attention_decode")
    seqlens, Sq, H, H_kv, D, page, options = DECODE_CASES[name]
    options = {**options, "num_splits": 7}
    tensors = paged_case(seqlens, Sq, H, H_kv, D, page)
    monkeypatch.setenv("TESSERA_STRICT", "1")
    monkeypatch.setenv("TESSERA_DECODE_SEPARATE_COMBINE", "1")
    out, lse = attention_decode(*tensors, **options)
    monkeypatch.setenv("TESSERA_DECODE_SEPARATE_COMBINE", "0")
    for _ in range(2):
        got, got_lse = attention_decode(*tensors, **options)
        assert torch.equal(got, out) and torch.equal(got_lse, lse)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured, _ = attention_decode(*tensors, **options)
    for _ in range(2):
        captured.zero_()
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(captured, out)
    assert module._COUNTERS and not any(c.any() for c in module._COUNTERS.values())


@pytest.mark.parametrize("D", [64, 128, 256])
@pytest.mark.parametrize("causal", [False, True])
def test_fp8_forward_matches_float64_attention_of_the_dequantized_inputs(D, causal):
    """e4m3 q, k, v with per-tensor descales on sm_89+ (tolerance: test_attention_fp8.py); sm_80 refuses."""
    from test_attention_fp8 import check_fp8
    g = torch.Generator().manual_seed(D)
    real = [torch.randn(2, S, h, D, generator=g) * amax for S, h, amax in ((200, 4, 3.0), (333, 2, 5.0), (333, 2, 1.0))]
    descales = [x.abs().max() / 448 for x in real]
    q, k, v = ((x / d).to(torch.float8_e4m3fn).cuda() for x, d in zip(real, descales))
    call = lambda: attention(q, k, v, causal=causal, q_descale=descales[0].cuda(), k_descale=descales[1].cuda(),  # noqa
                             v_descale=descales[2].cuda())
    if torch.cuda.get_device_capability() < (8, 9):
        with pytest.raises(ValueError, match="no fp8 tensor cores"):
            call()
        return
    out, lse = call()
    check_fp8(out.cpu(), lse.cpu(), q.cpu(), k.cpu(), v.cpu(), *descales, causal=causal)
