"""The SIMT simulator's `mfma`: one matrix product per 64-lane wave, on the MFMA fragments.

Specification:

* each wave gathers A (m x k), B (k x n) and C (m x n) from its lanes'
  registers by `mfma_layouts.mfma_fragments(m, n, k)` (checked against AMD's
  tables in tests/ir/test_mfma.py), computes D = A @ B + C, and every lane
  gets its D registers in C's places; waves are independent;
* products of f16/bf16 are exact in f32 and added in k order with one f32
  rounding each: exact for values whose sums are exact, and within a few
  ulps times k of the exact product otherwise;
* every lane of a wave must execute it together, and only on 64-lane waves.
"""

from __future__ import annotations

import numpy as np
import pytest

import tessera
from tessera.backends.interp import InterpreterError, Memory
from tessera.backends.simt import run_threads
from tessera.ir.mfma_layouts import MFMA_SHAPES, mfma_fragments
from tessera.ir.parser import parse_module


def load_regs(name: str, ptr: str, count: int, dtype: str) -> list[str]:
    """IR lines that load `count` consecutive elements per thread (thread t: elements count*t ..) into %name."""
    consts = [f"  %{name}_o{i} = constant {{value = {i}}} : i32" for i in range(count)]
    return consts + [
        f"  %{name}_n = constant {{value = {count}}} : i32",
        f"  %{name}_base = mul %tid, %{name}_n : i32",
        f"  %{name}_offs = pack {', '.join(f'%{name}_o{i}' for i in range(count))} : regs<{count}xi32>",
        f"  %{name}_sb = splat %{name}_base : regs<{count}xi32>",
        f"  %{name}_idx = add %{name}_sb, %{name}_offs : regs<{count}xi32>",
        f"  %{name}_ps = splat %{ptr} : regs<{count}xptr<{dtype}>>",
        f"  %{name}_p = addptr %{name}_ps, %{name}_idx : regs<{count}xptr<{dtype}>>",
        f"  %{name} = load %{name}_p : regs<{count}x{dtype}>",
    ]


def mfma_kernel(m: int, n: int, k: int, dtype: str, num_threads: int, warp_size: int = 64) -> str:
    """Every thread loads its A, B, C registers (m*k/64 = 4, or 8 for gfx950's double-K forms, then m*n/64
    consecutive elements), runs one mfma and stores D where C came from."""
    c, ab = m * n // 64, m * k // 64
    lines = [f"func @k(%a: ptr<{dtype}>, %b: ptr<{dtype}>, %c: ptr<f32>, %d: ptr<f32>) attributes "
             f"{{num_threads = {num_threads}, warp_size = {warp_size}}} {{",
             "  %tid = thread_id : i32"]
    lines += load_regs("ra", "a", ab, dtype) + load_regs("rb", "b", ab, dtype) + load_regs("rc", "c", c, "f32")
    lines += [f"  %rd = mfma %ra, %rb, %rc {{k = {k}, m = {m}, n = {n}}} : regs<{c}xf32>",
              f"  %dp = splat %d : regs<{c}xptr<f32>>",
              f"  %dq = addptr %dp, %rc_idx : regs<{c}xptr<f32>>",
              "  store %dq, %rd", "  return", "}"]
    return "\n".join(lines) + "\n"


def per_lane(matrices: np.ndarray, layout) -> np.ndarray:
    """(waves, rows, cols) -> (waves * 64, registers): what each lane holds under `layout`."""
    rows, cols = layout.table().transpose(2, 0, 1)
    return matrices[:, rows, cols].reshape(-1, layout.local_size)


def from_lanes(registers: np.ndarray, layout, waves: int) -> np.ndarray:
    rows, cols = layout.table().transpose(2, 0, 1)
    out = np.zeros((waves, *layout.shape), registers.dtype)
    out[:, rows, cols] = registers.reshape(waves, 64, -1)
    return out


def to_bf16_bits(x: np.ndarray) -> np.ndarray:
    """float32 values that bf16 holds exactly -> their bf16 bit patterns."""
    bits = x.astype(np.float32).view(np.uint32)
    assert not (bits & 0xFFFF).any()
    return (bits >> 16).astype(np.uint16)


def run_mfma(m, n, k, dtype, A, B, C):
    """Run one mfma per wave on A (waves, m, k), B (waves, k, n), C (waves, m, n); D (waves, m, n)."""
    waves = A.shape[0]
    fa, fb, fc = mfma_fragments(m, n, k)
    a, b, c = per_lane(A, fa), per_lane(B, fb), per_lane(C, fc).astype(np.float32)
    if dtype == "bf16":
        a, b = (Memory(np.ascontiguousarray(to_bf16_bits(x)), tessera.bf16) for x in (a, b))
    else:
        a, b = a.astype(np.float16), b.astype(np.float16)
    d = np.zeros_like(c)
    fn = parse_module(mfma_kernel(m, n, k, dtype, 64 * waves)).functions[0]
    run_threads(fn, [a, b, c.ravel(), d.ravel()], (1,))
    return from_lanes(d, fc, waves)


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
@pytest.mark.parametrize("m,n,k", MFMA_SHAPES)
def test_each_wave_computes_its_own_product_exactly_when_the_sums_are_exact(m, n, k, dtype):
    rng = np.random.default_rng(m + k)
    waves = 2
    A = rng.integers(-8, 8, (waves, m, k)) / 4      # quarters: products and their sums are exact in f32
    B = rng.integers(-8, 8, (waves, k, n)) / 4
    C = rng.integers(-64, 64, (waves, m, n)) / 8
    np.testing.assert_array_equal(run_mfma(m, n, k, dtype, A, B, C), A @ B + C)


@pytest.mark.parametrize("m,n,k", MFMA_SHAPES)
def test_rounding_is_per_k_step_in_f32(m, n, k):
    rng = np.random.default_rng(7)
    A = rng.standard_normal((1, m, k)).astype(np.float16).astype(np.float64)
    B = rng.standard_normal((1, k, n)).astype(np.float16).astype(np.float64)
    C = rng.standard_normal((1, m, n)).astype(np.float32).astype(np.float64)
    exact = A @ B + C
    expected = C.astype(np.float32)         # the documented order: C, then + A[:, kk] * B[kk, :] for kk < k
    for kk in range(k):
        expected = expected + (A[:, :, kk, None] * B[:, None, kk, :]).astype(np.float32)
    got = run_mfma(m, n, k, "f16", A, B, C)
    np.testing.assert_array_equal(got, expected)
    np.testing.assert_allclose(got, exact, rtol=1e-5, atol=1e-5)


MFMA_IN_A_BRANCH = """\
func @k(%out: ptr<f32>) attributes {num_threads = 128, warp_size = WARP} {
  %tid = thread_id : i32
  %limit = constant {value = LIMIT} : i32
  %go = cmp %tid, %limit {pred = "lt"} : bool
  %a = constant {value = 1.0} : regs<4xf16>
  %b = constant {value = 0.5} : regs<4xf16>
  %c = constant {value = 1.0} : regs<4xf32>
  %d = if %go : regs<4xf32> {
    %m = mfma %a, %b, %c {k = 16, m = 16, n = 16} : regs<4xf32>
    yield %m
  } {
    yield %c
  }
  %x = extract %d {index = 3} : f32
  %p = addptr %out, %tid : ptr<f32>
  store %p, %x
  return
}
"""


def branch_program(limit: int, warp: int = 64):
    return parse_module(MFMA_IN_A_BRANCH.replace("LIMIT", str(limit)).replace("WARP", str(warp))).functions[0]


def test_mfma_runs_per_whole_wave_and_rejects_a_partial_one():
    out = np.zeros(128, np.float32)
    run_threads(branch_program(64), [out], (1,))
    np.testing.assert_array_equal(out, [1.0 + 16 * 0.5] * 64 + [1.0] * 64)     # wave 0 only: 1 + 16 halves
    with pytest.raises(InterpreterError, match=r"mfma in divergent code: only 32 of the 64 lanes of warp 0"):
        run_threads(branch_program(32), [out], (1,))


def test_mfma_needs_64_lane_waves():
    with pytest.raises(InterpreterError, match=r"mfma needs 64-lane warps, but this block's warps have 32 lanes"):
        run_threads(branch_program(128, warp=32), [np.zeros(128, np.float32)], (1,))
