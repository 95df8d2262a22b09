"""Re-reading a tile in registers: reshape / permute chains that layout assignment proves move no data.

A tile loaded as (threads, L) -- row t in thread t, in register order -- and
re-read through `reshape(digits) -> permute(order) -> reshape(...)` has, as
layout assignment derives it through those shape ops, the layout whose
thread and register digits are those digits. When that is the mma.sync B
operand layout the dot wants, the dot takes the registers as loaded: no
conversion is recorded, no shared memory is allocated for the operand, and
the SIMT simulator computes what the interpreter computes. (This is how the
quantized GEMM reads fragment-order weights: `kernels_lib/quant_fragment.py`.)
"""

from __future__ import annotations

import numpy as np

import tessera
from tessera.backends.interp import run_function
from tessera.backends.simt import run_threads
from tessera.ir.layouts import local, mma_m16n8k16_b, spatial
from tessera.ir.target import get_target
from tessera.passes.layout_assignment import assign_layouts, pinned_layouts
from tessera.passes.lower_to_threads import lower_to_threads
from tessera.passes.mma import mma_plan
from tessera.passes.shared_memory import allocate_shared_memory

SM80 = get_target("sm_80")
BK, BN, WARPS = 32, 32, 4
THREADS, L = WARPS * 32, BK * BN // (WARPS * 32)
B = local(BK // 16, BN // 8 // WARPS) * spatial(1, WARPS) * mma_m16n8k16_b()      # (BK, BN)
LOADED = spatial(THREADS, 1) * local(1, L)
DIGITS = tuple(B.sizes[e] for e in B.spatial_modes) + tuple(B.sizes[e] for e in B.local_modes)
_POSITION = {e: i for i, e in enumerate(B.spatial_modes + B.local_modes)}
ORDER = tuple(_POSITION[e] for e in B.dim_mode_ids[0] + B.dim_mode_ids[1])       # k's digits, then n's


@tessera.kernel
def reread_dot(a_ptr, b_ptr, out_ptr, LAYOUT: tessera.constexpr, DIGITS: tessera.constexpr,
               ORDER: tessera.constexpr):
    a = tessera.view(a_ptr, (16, BK)).block((16, BK), (0, 0)).load()
    stored = tessera.view(b_ptr, (THREADS, L)).block((THREADS, L), (0, 0)).load(layout=LAYOUT)
    b = tessera.reshape(tessera.permute(tessera.reshape(stored, DIGITS), ORDER), (BK, BN))
    tessera.view(out_ptr, (16, BN)).block((16, BN), (0, 0)).store(tessera.dot(a, b))


def _stored(b: np.ndarray) -> np.ndarray:
    """b (BK, BN) as (threads, L): row t is what thread t holds of B, in register order."""
    t, i = np.meshgrid(np.arange(THREADS), np.arange(L), indexing="ij")
    k, n = B.map(t, i)
    return b[k, n]


def test_the_chain_derives_the_b_fragment_layout():
    assert LOADED.reshape(DIGITS).permute(list(ORDER)).reshape((BK, BN)) == B


def test_the_dot_takes_the_loaded_registers_as_they_are():
    rng = np.random.default_rng(0)
    a = rng.standard_normal((16, BK)).astype(np.float16)
    b = rng.standard_normal((BK, BN)).astype(np.float16)
    args = [a, _stored(b), np.zeros((16, BN), np.float32)]
    fn = reread_dot.specialize(*args, LAYOUT=LOADED, DIGITS=DIGITS, ORDER=ORDER).module.functions[0]
    assignment = assign_layouts(fn, SM80, WARPS, overrides=pinned_layouts(fn))
    dot = next(op for op in fn.walk() if op.name == "dot")
    assert mma_plan(dot, SM80, WARPS).b == B == assignment.layout(dot.operands[1])
    assert (dot, 1) not in assignment.conversions
    expected = [x.copy() for x in args]
    run_function(fn, expected, (1,))
    np.testing.assert_allclose(expected[2], a.astype(np.float32) @ b.astype(np.float32), rtol=1e-5, atol=1e-4)
    threads = lower_to_threads(fn, assignment, SM80, WARPS).functions[0]
    buffers = [op.attrs["bytes"] for op in threads.walk() if op.name == "shared_alloc"]
    assert BK * BN * 2 not in buffers and sum(buffers) <= 16 * BK * 2        # A's operand exchange at most
    allocate_shared_memory(threads)
    got = [x.copy() for x in args]
    run_threads(threads, got, (1,))
    np.testing.assert_allclose(got[2], expected[2], rtol=1e-5, atol=1e-5)     # the mma's own summation order


def test_another_pinned_load_layout_needs_a_conversion():
    """The control: the same chain from a load whose rows are split over two threads is not B's layout."""
    other = spatial(THREADS // 2, 2) * local(2, L // 2)
    args = [np.zeros((16, BK), np.float16), np.zeros((THREADS, L), np.float16), np.zeros((16, BN), np.float32)]
    fn = reread_dot.specialize(*args, LAYOUT=other, DIGITS=DIGITS, ORDER=ORDER).module.functions[0]
    assignment = assign_layouts(fn, SM80, WARPS, overrides=pinned_layouts(fn))
    dot = next(op for op in fn.walk() if op.name == "dot")
    assert assignment.conversions.get((dot, 1)) == B
