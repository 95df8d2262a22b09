"""tessera.testing: a wrong GPU result is described by where it is wrong and which known pattern explains it."""

import numpy as np
import pytest

from tessera.testing import assert_close, diagnose


def matrix(rows=64, cols=48, seed=0):
    return np.random.default_rng(seed).standard_normal((rows, cols)).astype(np.float32)


def test_close_arrays_pass_and_equal_infinities_and_expected_nans_count_as_equal():
    x = matrix()
    x[0, 0], x[1, 1] = np.inf, np.nan
    assert_close(x + 1e-7, x, rtol=1e-5, atol=1e-6)


def test_a_shape_mismatch_is_reported_first():
    with pytest.raises(AssertionError, match=r"shape \(2, 3\) where \(3, 2\) was expected"):
        assert_close(np.zeros((2, 3)), np.zeros((3, 2)))


def test_wrong_rows_and_columns_are_named_as_ranges():
    want = matrix()
    got = want.copy()
    got[16:32, 8:10] = 0.0
    with pytest.raises(AssertionError) as info:
        assert_close(got, want, rtol=1e-5, atol=1e-6)
    text = str(info.value)
    assert "32 of 3072 elements wrong" in text
    assert "wrong rows: 16-31" in text and "wrong columns: 8-9" in text
    assert "wrong elements that are 0: 32" in text


def test_one_lane_of_every_warp_is_a_periodic_pattern():
    want = np.random.default_rng(1).standard_normal(256).astype(np.float32)
    got = want.copy()
    got[5::32] += 1.0
    text = diagnose(got, want)
    assert "wrong indices: 5, 37, 69" in text
    assert "every column i with i % 32 in 5 is wrong, no other" in text


def test_a_transposed_output_is_recognised():
    want = matrix(32, 32)
    assert "the output is the reference transposed" in diagnose(want.T.copy(), want)


def test_a_tile_shifted_by_one_block_is_recognised():
    want = matrix(64, 16)
    got = want.copy()
    got[16:32] = want[32:48]               # the second row tile holds the third
    assert "16 rows hold the reference's row +16 from them" in diagnose(got, want)


def test_permuted_columns_are_recognised():
    want = matrix(8, 8)
    got = want[:, [1, 0, 2, 3, 4, 5, 7, 6]]
    assert "columns permuted (4 moved; got<-want: 0<-1, 1<-0, 6<-7, 7<-6)" in diagnose(got, want)


def test_a_skipped_and_a_doubled_k_step_of_a_matrix_product_are_found():
    rng = np.random.default_rng(2)
    a, b = rng.standard_normal((32, 128)), rng.standard_normal((128, 24))
    want = a @ b
    got = want - a[:, 32:64] @ b[32:64] + a[:, 96:] @ b[96:]       # step 1 lost, step 3 added again (stale slot)
    text = diagnose(got, want, rtol=1e-5, atol=1e-6, matmul=(a, b, 32))
    assert "K-steps of 32: skipped [1], counted twice [3]" in text


def test_an_error_unrelated_to_k_steps_says_so():
    rng = np.random.default_rng(3)
    a, b = rng.standard_normal((32, 64)), rng.standard_normal((64, 24))
    want = a @ b
    got = want + rng.standard_normal(want.shape)
    assert "not a combination of per-step products" in diagnose(got, want, matmul=(a, b, 32))


def test_torch_tensors_are_accepted():
    torch = pytest.importorskip("torch")
    want = torch.randn(16, 16, dtype=torch.bfloat16)
    with pytest.raises(AssertionError, match="wrong rows: 3"):
        assert_close(torch.cat([want[:3], want[3:4] + 1, want[4:]]), want, rtol=1e-2, atol=1e-2)


def test_same_bits_lets_any_nan_match_any_nan_and_nothing_else_differ():
    from tessera.testing import assert_same_bits

    x = np.array([1.0, np.nan, -0.0, 2.0], np.float32)
    gpu = x.copy()
    gpu[1:2].view(np.uint32)[0] = 0x7FFFFFFF           # NVIDIA's canonical NaN where numpy gave 0x7FC00000
    assert_same_bits(gpu, x)
    negative_nan = x.copy()
    negative_nan[1:2].view(np.uint32)[0] = 0xFFC00000  # x86's 0 / 0
    assert_same_bits(negative_nan, x)
    zero = x.copy()
    zero[2] = 0.0
    with pytest.raises(AssertionError, match=r"out: 1 of 4 elements differ; the first at \(2,\): 0\.0 \(0x00000000\) "
                                             r"where -0\.0 \(0x80000000\) was expected"):
        assert_same_bits(zero, x, name="out")
    not_nan = x.copy()
    not_nan[1] = 3.0
    with pytest.raises(AssertionError, match=r"first at \(1,\)"):
        assert_same_bits(not_nan, x)
    with pytest.raises(AssertionError, match="int32"):
        assert_same_bits(x.view(np.int32), x)
    assert_same_bits(np.array([[7, -1]], np.int8), np.array([[7, -1]], np.int8))
