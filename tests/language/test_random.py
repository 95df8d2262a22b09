"""Random numbers: `tessera.rand`, `randn`, `randint`, `randint4x` (Philox4x32-10) and `umulhi`.

The specification: for a seed and integer offsets, `randint4x` gives the
four Philox4x32-10 words of key (seed's low, high 32 bits) and counter
(offset's low, high 32 bits, 0, 0) -- Triton's stream, bit for bit -- checked
against a numpy Philox (`philox_reference.py`) that reproduces the Random123
known answers. `rand` maps the first word to [0, 1) as Triton does, bit for
bit; `randn` is Box-Muller on two words (within f32 math accuracy). The same
kernels run unchanged in the SIMT simulator on sm_80, sm_90a and gfx942 and
assemble (ptxas) and link (ld.lld). `umulhi` is the high half of the
unsigned double-width product.
"""

from __future__ import annotations

import inspect

import numpy as np
import pytest

import tessera

import philox_reference as ref
from everywhere import run_everywhere

KNOWN_ANSWERS = [   # Random123's kat_vectors: philox4x32 10, counter[4] key[2] -> output[4]
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
     (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
]


@pytest.mark.parametrize("counter, key, expected", KNOWN_ANSWERS)
def test_the_numpy_reference_is_philox4x32_10(counter, key, expected):
    assert [int(w) for w in ref.philox4x32(counter, key)] == list(expected)


@tessera.kernel
def draw_words(out_ptr, offsets_ptr, seed, BLOCK: tessera.constexpr):
    i = tessera.arange(0, BLOCK)
    offsets = tessera.load(offsets_ptr + i)
    a, b, c, d = tessera.randint4x(seed, offsets)
    tessera.store(out_ptr + i, a)
    tessera.store(out_ptr + BLOCK + i, b)
    tessera.store(out_ptr + 2 * BLOCK + i, c)
    tessera.store(out_ptr + 3 * BLOCK + i, d)


OFFSETS = {
    "i32": np.array([0, 1, 2, -1, 2**31 - 1, -2**31, 12345, 7] * 4, np.int32),
    "u32": np.array([0, 1, 0xFFFFFFFF, 0x80000000, 99, 3, 4, 5] * 4, np.uint32),
    "i64": np.array([0, 2**32, 2**32 + 5, -1, 2**40 + 3, -2**33, 1, 2] * 4, np.int64),
}


@pytest.mark.parametrize("seed", [0, 1, -1, 0x123456789ABCDEF, 2**64 - 5])
@pytest.mark.parametrize("offsets", sorted(OFFSETS))
def test_randint4x_is_philox_of_the_seed_and_the_offset(offsets, seed):
    values = OFFSETS[offsets]
    out = np.zeros(4 * values.size, np.uint32)
    draw_words[(1,)](out, values, seed, BLOCK=values.size)
    assert out.reshape(4, -1).tolist() == [w.tolist() for w in ref.randint4x(seed, values)]


@tessera.kernel
def draw_with_traced_seed(out_ptr, seed, BLOCK: tessera.constexpr):
    i = tessera.program_id(0) * BLOCK + tessera.arange(0, BLOCK)
    tessera.store(out_ptr + i, tessera.randint(seed, i))


@pytest.mark.parametrize("seed", [7, -3, 2**40 + 11])
def test_a_seed_passed_at_run_time_is_the_same_key_as_a_python_seed(seed):
    out = np.zeros(256, np.uint32)
    draw_with_traced_seed[(2,)](out, seed, BLOCK=128)
    assert out.tolist() == ref.randint4x(seed, np.arange(256, dtype=np.int32))[0].tolist()


@tessera.kernel
def dropout(x_ptr, out_ptr, n, p, seed, BLOCK: tessera.constexpr):
    offsets = tessera.program_id(0) * BLOCK + tessera.arange(0, BLOCK)
    mask = offsets < n
    x = tessera.load(x_ptr + offsets, mask=mask)
    keep = tessera.rand(seed, offsets) > p
    tessera.store(out_ptr + offsets, tessera.where(keep, x / (1 - p), 0.0), mask=mask)


def dropout_args():
    x = np.linspace(-1, 1, 1000, dtype=np.float32)
    return [x, np.zeros_like(x), 1000, 0.25, 2024]


def test_dropout_keeps_exactly_the_lanes_whose_uniform_exceeds_p_everywhere():
    x, out, n, p, seed = run_everywhere(dropout, dropout_args, (4,), BLOCK=256)
    uniform = ref.uniform(ref.randint4x(seed, np.arange(n, dtype=np.int32))[0])
    expected = np.where(uniform > np.float32(p), x / np.float32(1 - p), np.float32(0))
    assert out.tobytes() == expected.astype(np.float32).tobytes()
    assert 0.70 < (out != 0).mean() < 0.80


@tessera.kernel
def distributions(out_ptr, seed, BLOCK: tessera.constexpr):
    i = tessera.arange(0, BLOCK)
    tessera.store(out_ptr + i, tessera.rand(seed, i))
    tessera.store(out_ptr + BLOCK + i, tessera.randn(seed, i))
    u1, u2, u3, u4 = tessera.rand4x(seed, i)
    tessera.store(out_ptr + 2 * BLOCK + i, u3)
    n1, n2, n3, n4 = tessera.randn4x(seed, i)
    tessera.store(out_ptr + 3 * BLOCK + i, n4)


def test_uniforms_are_tritons_bit_for_bit_and_normals_are_box_muller():
    block, seed = 4096, 31337
    out = np.zeros(4 * block, np.float32)
    distributions[(1,)](out, seed, BLOCK=block)
    words = ref.randint4x(seed, np.arange(block, dtype=np.int32))
    rand, randn, rand_word3, randn_word4 = out.reshape(4, block)
    assert rand.tobytes() == ref.uniform(words[0]).tobytes()
    assert rand_word3.tobytes() == ref.uniform(words[2]).tobytes()
    assert 0 <= rand.min() and rand.max() < 1
    np.testing.assert_allclose(randn, ref.normal(ref.uniform(words[0]), ref.uniform(words[1])), rtol=1e-5, atol=1e-5)
    u3, u4 = ref.uniform(words[2]), ref.uniform(words[3])
    sine = np.sqrt(-2.0 * np.log(np.maximum(np.float32(1e-7), u3).astype(np.float64))) * np.sin(2 * np.pi * u4)
    np.testing.assert_allclose(randn_word4, sine, rtol=1e-5, atol=1e-5)
    assert abs(randn.mean()) < 0.05 and abs(randn.std() - 1) < 0.05


def test_the_uniform_map_never_reaches_one():
    extremes = np.array([0x7FFFFFFF, 0x80000000, 0, 0xFFFFFFFF], np.uint32)
    u = ref.uniform(extremes)
    assert u.max() < 1.0 and u.min() == 0.0


def test_normals_match_the_simulator_and_compile_for_every_target():
    run_everywhere(distributions, lambda: [np.zeros(4 * 128, np.float32), 5], (1,), BLOCK=128)


# -- umulhi ---------------------------------------------------------------------------------------------------


@tessera.kernel
def high_products(a_ptr, b_ptr, out_ptr, BLOCK: tessera.constexpr):
    i = tessera.arange(0, BLOCK)
    tessera.store(out_ptr + i, tessera.umulhi(tessera.load(a_ptr + i), tessera.load(b_ptr + i)))


def high_product_reference(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    bits = a.dtype.itemsize * 8
    modulus = 2 ** bits
    high = [((int(x) % modulus) * (int(y) % modulus)) >> bits for x, y in zip(a.tolist(), b.tolist())]
    return np.array(high, dtype=f"u{a.dtype.itemsize}").view(a.dtype)


@pytest.mark.parametrize("dtype", [np.int32, np.uint32, np.int64, np.uint64])
def test_umulhi_is_the_high_half_of_the_unsigned_product_everywhere(dtype):
    info = np.iinfo(dtype)
    rng = np.random.default_rng(3)
    edges_a = np.array([info.min, info.max, info.max, 0], dtype)
    edges_b = np.array([info.max, info.max, info.min, 5], dtype)
    a, b = (np.concatenate([edges, rng.integers(info.min, info.max, 124, dtype=dtype, endpoint=True)])
            for edges in (edges_a, edges_b))
    _, _, out = run_everywhere(high_products, lambda: [a.copy(), b.copy(), np.zeros_like(a)], (1,), BLOCK=128)
    assert out.tobytes() == high_product_reference(a, b).tobytes()


# -- mistakes ------------------------------------------------------------------------------------------------


@tessera.kernel
def float_offsets(out_ptr, BLOCK: tessera.constexpr):
    i = tessera.arange(0, BLOCK)
    tessera.store(out_ptr + i, tessera.rand(0, i.to(tessera.f32)))


@tessera.kernel
def tile_seed(out_ptr, BLOCK: tessera.constexpr):
    i = tessera.arange(0, BLOCK)
    tessera.store(out_ptr + i, tessera.rand(i, i))


@tessera.kernel
def umulhi_of_floats(out_ptr, BLOCK: tessera.constexpr):
    i = tessera.arange(0, BLOCK)
    tessera.store(out_ptr + i, tessera.umulhi(i.to(tessera.f32), 3))


@pytest.mark.parametrize("kernel, fragment", [
    (float_offsets, "offset of a random number must be an integer"),
    (tile_seed, "seed of a random number must be an integer scalar"),
    (umulhi_of_floats, "umulhi needs integers"),
])
def test_mistakes_are_compile_errors_at_the_line(kernel, fragment):
    with pytest.raises(tessera.TypeMismatchError) as info:
        kernel.specialize(np.zeros(16, np.float32), BLOCK=16)
    lines, first = inspect.getsourcelines(kernel.fn)
    assert info.value.line == first + len(lines) - 1
    assert fragment in info.value.message
