"""`tessera.fusion()` on the CPU interpreter: recorded launches run fused where the pass allows, with results equal
to the unfused sequence's, and `report()` says what was fused and why the rest was not."""

import pytest

torch = pytest.importorskip("torch")

import tessera  # noqa: E402

import fusion_kernels as k  # noqa: E402

M, N, BM, BN = 37, 24, 16, 32
GRID = (tessera.cdiv(M, BM),)


def softmax(x, y):
    m, e, s = torch.empty(M), torch.empty(M, N), torch.empty(M)
    k.row_max[GRID](x, m, M, N, BM=BM, BN=BN)
    k.exp_minus[GRID](x, m, e, M, N, BM=BM, BN=BN)
    k.row_sum[GRID](e, s, M, N, BM=BM, BN=BN)
    k.divide_rows[GRID](e, s, y, M, N, BM=BM, BN=BN)


def test_a_softmax_of_four_kernels_becomes_one_with_no_intermediate_stored():
    x = torch.randn(M, N)
    expected, y = torch.empty(M, N), torch.empty(M, N)
    softmax(x, expected)
    with tessera.fusion() as f:
        softmax(x, y)
    assert torch.equal(y, expected)
    torch.testing.assert_close(y, torch.softmax(x, dim=1))
    report = f.report()
    assert report.splitlines()[0] == "tessera.fusion: 4 launches recorded, 1 run: row_max+exp_minus+row_sum+divide_rows"
    assert "vertical row_max -> exp_minus: fused (forwarded buf1; dropped the store of buf1)" in report
    assert "vertical row_max+exp_minus+row_sum -> divide_rows: fused (forwarded buf2, buf3; dropped the store of " \
           "buf2, buf3)" in report


def test_a_layer_norm_and_an_elementwise_chain_fuse_and_match_the_unfused_run():
    x, w = torch.randn(M, N), torch.randn(N)

    def run(y):
        mu, var = torch.empty(M), torch.empty(M)
        k.row_mean[GRID](x, mu, M, N, BM=BM, BN=BN)
        k.row_variance[GRID](x, mu, var, M, N, BM=BM, BN=BN)
        k.normalize[GRID](x, mu, var, w, y, M, N, 1e-5, BM=BM, BN=BN)

    expected, y = torch.empty(M, N), torch.empty(M, N)
    run(expected)
    with tessera.fusion() as f:
        run(y)
    assert torch.equal(y, expected) and f.ran == ["row_mean+row_variance+normalize"]
    torch.testing.assert_close(y, torch.nn.functional.layer_norm(x, (N,), eps=1e-5) * w, rtol=1e-4, atol=1e-4)


def test_intermediates_the_caller_keeps_are_still_stored():
    x, out = torch.randn(100), torch.empty(100)
    with tessera.fusion() as f:
        t = torch.empty(100)
        k.scale[(4,)](x, t, 100, 2.0, BLOCK=32)
        k.unary[(4,)](t, out, 100, OP="relu", BLOCK=32)
    assert "dropped" not in f.report() and torch.equal(t, 2 * x) and torch.equal(out, torch.relu(2 * x))


def test_a_torch_read_inside_the_block_runs_what_was_recorded_first():
    x, out = torch.randn(100), torch.empty(100)
    with tessera.fusion() as f:
        t = torch.empty(100)
        k.scale[(4,)](x, t, 100, 2.0, BLOCK=32)
        doubled = t * 2
        k.unary[(4,)](t, out, 100, OP="relu", BLOCK=32)
    assert torch.equal(doubled, 4 * x) and f.ran == ["scale", "unary"]
    assert "ran what was recorded before torch's mul.Tensor" in f.report()


def test_a_consumer_reading_a_neighbours_elements_runs_separately_with_the_reason():
    x, t, out = torch.randn(64), torch.empty(64), torch.empty(64)
    with tessera.fusion() as f:
        k.scale[(2,)](x, t, 64, 3.0, BLOCK=32)
        k.shifted_copy[(2,)](t, out, 64, BLOCK=32)
    assert f.ran == ["scale", "shifted_copy"]
    assert "vertical scale -> shifted_copy: not fused (the consumer reads buf1 at lanes not proven equal" in f.report()
    assert torch.equal(out[:-1], 3.0 * x[1:])


def test_eight_independent_launches_run_as_one_with_program_ids_partitioned():
    xs = [torch.randn(40 + 8 * i) for i in range(8)]
    ys = [torch.empty_like(x) for x in xs]
    with tessera.fusion() as f:
        for x, y in zip(xs, ys):
            k.unary[(tessera.cdiv(x.numel(), 32),)](x, y, x.numel(), OP="tanh", BLOCK=32)
    assert len(f.ran) == 1 and "horizontal unary | unary | unary" in f.report()
    for x, y in zip(xs, ys):
        assert torch.equal(y, torch.tanh(x)) or torch.allclose(y, torch.tanh(x), atol=1e-6)


def test_a_library_gemm_takes_an_elementwise_consumer_as_its_epilogue():
    from tessera.kernels_lib import gemm
    a, b, bias = torch.randn(33, 20), torch.randn(20, 24), torch.randn(24)
    expected, out = torch.empty(33, 24), torch.empty(33, 24)
    k.bias_gelu[(tessera.cdiv(33 * 24, 64),)](gemm(a, b), bias, expected, 33 * 24, 24, BLOCK=64)
    with tessera.fusion() as f:
        c = gemm(a, b)
        k.bias_gelu[(tessera.cdiv(33 * 24, 64),)](c, bias, out, 33 * 24, 24, BLOCK=64)
        del c
    # 33 rows: the op's small-M path (gemm_split_k.py), one K split here, so C is stored by its main kernel
    assert f.ran == ["gemm_split_k_kernel+bias_gelu"]
    assert ("lane map gemm_split_k_kernel -> bias_gelu: fused (bias_gelu re-indexed onto gemm_split_k_kernel's "
            "output tile)") in f.report()
    torch.testing.assert_close(out, expected, rtol=1e-6, atol=1e-6)


def test_q_k_and_v_projections_run_as_one_launch():
    from tessera.kernels_lib import gemm
    x, weights = torch.randn(20, 32), [torch.randn(32, 16) for _ in range(3)]
    with tessera.fusion() as f:
        q, k_, v = (gemm(x, w) for w in weights)
    # 20 rows: the small-M path, one program per 16-column strip each
    assert f.ran == ["gemm_split_k_kernel+gemm_split_k_kernel+gemm_split_k_kernel"]
    assert ("horizontal gemm_split_k_kernel | gemm_split_k_kernel | gemm_split_k_kernel: fused (3 launches -> 1, "
            "grid 3)") in f.report()
    for out, w in zip((q, k_, v), weights):
        torch.testing.assert_close(out, x @ w, rtol=1e-5, atol=1e-5)
