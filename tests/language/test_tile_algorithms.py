"""Tile algorithms: sort, topk (values and indices), gather, join, split, interleave, histogram.

The specification is numpy's: `sort` is a stable sort along an axis with NaN
last (descending: NaN first, as torch), `topk` the k largest with their
indices (ties: the lower index first), `gather` is `np.take_along_axis`,
`join`/`split` stack and unstack along a new last axis of 2, `interleave`
alternates two tiles' lanes, `histogram` is `np.bincount` over the bins.
They run unchanged in the interpreter, the SIMT simulator on every target,
and compile for each.
"""

from __future__ import annotations

import numpy as np
import pytest

import tessera

from everywhere import run_everywhere

R, N, K = 4, 16, 4


@tessera.kernel
def algorithms(x_ptr, idx_ptr, up_ptr, down_ptr, values_ptr, indices_ptr, gathered_ptr, joined_ptr, mixed_ptr,
               counts_ptr, R: tessera.constexpr, N: tessera.constexpr, K: tessera.constexpr):
    r = tessera.arange(0, R)[:, None]
    c = tessera.arange(0, N)[None, :]
    x = tessera.load(x_ptr + r * N + c)
    idx = tessera.load(idx_ptr + r * N + c)
    tessera.store(up_ptr + r * N + c, tessera.sort(x, axis=1))
    tessera.store(down_ptr + r * N + c, tessera.sort(x, axis=0, descending=True))
    values, indices = tessera.topk(x, K, axis=1)
    tessera.store(values_ptr + r * K + tessera.arange(0, K)[None, :], values)
    tessera.store(indices_ptr + r * K + tessera.arange(0, K)[None, :], indices)
    tessera.store(gathered_ptr + r * N + c, tessera.gather(x, idx, axis=1))
    first, second = tessera.split(tessera.join(x, -x))
    tessera.store(joined_ptr + r * N + c, first * 10 + second)
    row = tessera.arange(0, N)
    tessera.store(mixed_ptr + tessera.arange(0, 2 * N), tessera.interleave(row, row + 100))
    flat = tessera.reshape(idx, (R * N,))
    tessera.store(counts_ptr + tessera.arange(0, 8), tessera.histogram(flat, 8, mask=flat != 3))


def inputs() -> list:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((R, N)).astype(np.float32)
    x[0, 3] = np.nan          # NaN sorts last
    x[1, :4] = 1.0            # ties keep their order
    x[2, 5], x[2, 6] = -0.0, 0.0
    idx = rng.integers(0, N, (R, N)).astype(np.int32)
    idx[3, 0] = 7
    outs = [np.zeros((R, N), np.float32), np.zeros((R, N), np.float32), np.zeros((R, K), np.float32),
            np.zeros((R, K), np.int32), np.zeros((R, N), np.float32), np.zeros((R, N), np.float32),
            np.zeros(2 * N, np.int32), np.zeros(8, np.int32)]
    return [x, idx, *outs]


@pytest.fixture(scope="module")
def results():
    return run_everywhere(algorithms, inputs, (1,), R=R, N=N, K=K)


def descending_key(x: np.ndarray) -> np.ndarray:
    return -np.where(np.isnan(x), np.inf, x)


def test_sort_is_numpys_stable_sort_with_nan_last(results):
    x, _, up, *_ = results
    np.testing.assert_array_equal(up, np.sort(x, axis=1, kind="stable"))
    assert np.signbit(up[2][np.flatnonzero(up[2] == 0)]).tolist() == [True, False]    # -0.0 before 0.0: stable


def test_a_descending_sort_along_axis_0_puts_nan_first(results):
    x, _, _, down, *_ = results
    order = np.argsort(descending_key(x), axis=0, kind="stable")
    np.testing.assert_array_equal(down, np.take_along_axis(x, order, axis=0))


def test_topk_gives_the_largest_values_and_their_indices(results):
    x, _, _, _, values, indices, *_ = results
    order = np.argsort(descending_key(x), axis=1, kind="stable")[:, :K]
    assert indices.tolist() == order.tolist()
    np.testing.assert_array_equal(values, np.take_along_axis(x, order, axis=1))


def test_gather_is_take_along_axis(results):
    x, idx, *_, gathered, _, _, _ = results
    np.testing.assert_array_equal(gathered, np.take_along_axis(x, idx, axis=1))


def test_join_split_and_interleave(results):
    x, *_, joined, mixed, _ = results
    np.testing.assert_array_equal(joined, x * 10 - x)
    assert mixed.tolist() == [v for i in range(N) for v in (i, i + 100)]


def test_histogram_counts_the_unmasked_values_in_range(results):
    idx, counts = results[1], results[-1]
    flat = idx.reshape(-1)
    expected = np.bincount(flat[(flat != 3) & (flat < 8)], minlength=8)[:8]
    assert counts.tolist() == expected.tolist()


@tessera.kernel
def sort_big(x_ptr, N: tessera.constexpr):
    offs = tessera.arange(0, N)
    tessera.store(x_ptr + offs, tessera.sort(tessera.load(x_ptr + offs)))


@tessera.kernel
def topk_three(x_ptr):
    offs = tessera.arange(0, 16)
    tessera.topk(tessera.load(x_ptr + offs), 3)


@tessera.kernel
def split_odd(x_ptr):
    offs = tessera.arange(0, 16)
    tessera.split(tessera.load(x_ptr + offs))


@pytest.mark.parametrize("kernel, constexprs, fragment", [
    (sort_big, {"N": 512}, "more than the 32768 Tessera holds for one: split the tile"),
    (topk_three, {}, "k must be a power of two"),
    (split_odd, {}, "last axis has size 2"),
])
def test_what_cannot_be_done_is_a_compile_error_saying_why(kernel, constexprs, fragment):
    with pytest.raises(tessera.CompileError) as info:
        kernel.specialize(np.zeros(512, np.float32), **constexprs)
    assert fragment in info.value.message


@pytest.mark.parametrize("target, nan_bits", [("sm_80", 0x7FFFFFFF), ("sm_90a", 0x7FFFFFFF), ("gfx942", 0x7FC00000)])
def test_the_simulator_computes_a_nan_as_the_target_does(target, nan_bits):
    """`joined` at (0, 3) is 10 * NaN + -NaN. An H100 returned its canonical NaN 0x7FFFFFFF there (GPU run 7),
    where numpy keeps the operand's 0x7FC00000, so a bit-for-bit comparison with the interpreter failed on the
    GPU while the simulator, which then computed numpy's bits, agreed. The simulator now gives NVIDIA's NaN on
    NVIDIA targets (AMD keeps the payload, as the interpreter does), and comparisons let NaN match NaN
    (`tessera.testing.assert_same_bits`), on the simulator as on the GPU."""
    from tessera.backends.simt import run_threads
    from tessera.ir.parser import parse_module
    from tessera.testing import assert_same_bits

    expected = inputs()
    algorithms[(1,)](*expected, R=R, N=N, K=K)
    joined = expected[7]
    assert np.isnan(joined[0, 3]) and joined[0, 3:4].view(np.uint32)[0] == 0x7FC00000
    compiled = algorithms.compile(*inputs(), target=target, num_warps=4, R=R, N=N, K=K)
    actual = inputs()
    run_threads(parse_module(compiled.stages["thread_ir"]).functions[0], actual, (1,))
    assert actual[7][0, 3:4].view(np.uint32)[0] == nan_bits
    for index, (want, got) in enumerate(zip(expected, actual)):
        assert_same_bits(got, want, name=f"argument {index}")
