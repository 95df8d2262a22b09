"""Lowering tile IR to thread IR: the IR it emits, and that it computes what the tile IR computes.

Two kinds of specification:

* structure: IR text of small lowered kernels (vector widths, shuffles,
  barriers, masks for replicated layouts, shared-memory offsets);
* correctness: real kernels (the tutorials and a table of small kernels
  covering every op family) are lowered for 1, 2 and 4 warps, run on the
  SIMT simulator, and compared with the tile interpreter. Outputs must be
  bit-for-bit equal, except where floating-point operations are regrouped:
  float sum/prod reductions (the lowering folds each thread's registers
  first, then lanes, then warps, where the interpreter uses a pairwise
  tree) and dot (rounded at every step of k instead of once); those are
  compared with a tolerance (`FLOAT_REDUCTION`, `DOT`).
"""

from __future__ import annotations

import itertools
import runpy
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tessera
from pass_kernels import BLOCK, generated_case, programs, traced
from tessera.backends.interp import run_function, run_program
from tessera.ir.printer import print_module
from tessera.ir.target import get_target
from tessera.ir.types import RegsType, TileType
from tessera.ir.verifier import verify_module
from tessera.passes.errors import LoweringError
from tessera.passes.layout_assignment import assign_layouts
from tessera.passes.lower_to_threads import lower_to_threads
from tessera.passes.thread_passes import lower

simt = pytest.importorskip("tessera.backends.simt")

TUTORIALS = Path(__file__).resolve().parents[2] / "tutorials"
FLOAT_REDUCTION = dict(rtol=1e-5, atol=1e-6)   # f32 sums regrouped
DOT = dict(rtol=4e-3, atol=4e-3)               # f16 results of f32 dots rounded per k


def _tutorial(file: str, name: str):
    return runpy.run_path(str(TUTORIALS / file))[name]


# ---------------------------------------------------------------------------
# Kernels


@tessera.kernel
def float_ops(x_ptr, y_ptr, out_ptr, n, BLOCK: tessera.constexpr):
    offs = tessera.program_id(0) * BLOCK + tessera.arange(0, BLOCK)
    mask = offs < n
    x = tessera.load(x_ptr + offs, mask=mask, other=1.0)
    y = tessera.load(y_ptr + offs, mask=mask, other=2.0)
    a = tessera.abs(x) + 0.5
    results = [x + y, x - y, x * y, x / y, x % y, tessera.minimum(x, y), tessera.maximum(x, y), -x,
               tessera.abs(x), tessera.exp(x), tessera.exp2(x), tessera.log(a), tessera.log2(a),
               tessera.sqrt(a), tessera.rsqrt(a), tessera.sin(x), tessera.cos(x), tessera.tanh(x),
               tessera.erf(x), tessera.sigmoid(x), tessera.floor(x * 3.0), tessera.ceil(x * 3.0),
               tessera.where(x < y, x, y), (x >= y).to(tessera.f32), x.to(tessera.f16).to(tessera.f32),
               x.to(tessera.bf16).to(tessera.f32), (x * 100.0).to(tessera.i32).to(tessera.f32)]
    for i in tessera.static_range(len(results)):
        tessera.store(out_ptr + i * n + offs, results[i], mask=mask)


@tessera.kernel
def int_ops(x_ptr, y_ptr, out_ptr, n, BLOCK: tessera.constexpr):
    offs = tessera.program_id(0) * BLOCK + tessera.arange(0, BLOCK)
    mask = offs < n
    x = tessera.load(x_ptr + offs, mask=mask, other=1)
    y = tessera.load(y_ptr + offs, mask=mask, other=3)
    p, q = x > 0, y > 0
    results = [x + y, x - y, x * y, x // y, x % y, x & y, x | y, x ^ y, x << (y & 7), x >> (y & 7), ~x, -x,
               tessera.abs(x), tessera.minimum(x, y), tessera.maximum(x, y), tessera.where(x < y, x, y),
               (p & q).to(tessera.i32), (p | q).to(tessera.i32), (p ^ q).to(tessera.i32),
               x.to(tessera.i8).to(tessera.i32), x.to(tessera.u16).to(tessera.i32),
               x.to(tessera.f32).to(tessera.i32), tessera.cast(x.to(tessera.f32), tessera.i32, bitcast=True)]
    for i in tessera.static_range(len(results)):
        tessera.store(out_ptr + i * n + offs, results[i], mask=mask)


@tessera.func
def _first_nonzero(a, b):
    return tessera.where(a != 0, a, b)


@tessera.kernel
def reduce_2d(x_ptr, out_ptr, M: tessera.constexpr, N: tessera.constexpr, AXIS: tessera.constexpr,
              KIND: tessera.constexpr):
    rows = tessera.arange(0, M)[:, None]
    cols = tessera.arange(0, N)[None, :]
    x = tessera.load(x_ptr + rows * N + cols)
    if KIND == "sum":
        r = tessera.sum(x, axis=AXIS, keep_dims=True)
    elif KIND == "max":
        r = tessera.max(x, axis=AXIS, keep_dims=True)
    elif KIND == "min":
        r = tessera.min(x, axis=AXIS, keep_dims=True)
    elif KIND == "argmax":
        r = tessera.argmax(x, axis=AXIS, keep_dims=True)
    elif KIND == "argmin":
        r = tessera.argmin(x, axis=AXIS, keep_dims=True)
    else:
        r = tessera.reduce(x, AXIS, _first_nonzero, keep_dims=True)
    tessera.store(out_ptr + rows * N + cols, x * 0 + r)


@tessera.kernel
def reduce_all(x_ptr, out_ptr, M: tessera.constexpr, N: tessera.constexpr):
    rows = tessera.arange(0, M)[:, None]
    cols = tessera.arange(0, N)[None, :]
    x = tessera.load(x_ptr + rows * N + cols)
    tessera.store(out_ptr, tessera.max(x))
    tessera.store(out_ptr + 1, tessera.argmax(tessera.reshape(x, (M * N,)), axis=0))


@tessera.kernel
def outer(x_ptr, y_ptr, out_ptr, M: tessera.constexpr, N: tessera.constexpr):
    x = tessera.load(x_ptr + tessera.arange(0, M))
    y = tessera.load(y_ptr + tessera.arange(0, N))
    rows = tessera.arange(0, M)[:, None]
    cols = tessera.arange(0, N)[None, :]
    tessera.store(out_ptr + rows * N + cols, x[:, None] * 10.0 + y[None, :])


@tessera.kernel
def shapes(x_ptr, out_ptr, M: tessera.constexpr, N: tessera.constexpr):
    rows = tessera.arange(0, M)[:, None]
    cols = tessera.arange(0, N)[None, :]
    x = tessera.load(x_ptr + rows * N + cols)
    t = tessera.trans(x)                                    # (N, M)
    tessera.store(out_ptr + cols * M + rows, tessera.trans(t) + 1.0)
    flat = tessera.reshape(x, (M * N,))
    tessera.store(out_ptr + M * N + tessera.arange(0, M * N), flat * 2.0)
    folded = tessera.reshape(x, (N, M))
    tessera.store(out_ptr + 2 * M * N + tessera.arange(0, N)[:, None] * M + tessera.arange(0, M)[None, :],
                  folded * 3.0)
    tessera.store(out_ptr + 3 * M * N + rows * N + cols, tessera.broadcast_to(tessera.expand_dims(
        tessera.arange(0, N), 0), (M, N)).to(tessera.f32))


@tessera.kernel
def view_copy(x_ptr, out_ptr, M, N, BM: tessera.constexpr, BN: tessera.constexpr):
    i, j = tessera.program_id(0), tessera.program_id(1)
    x = tessera.view(x_ptr, (M, N))
    out = tessera.view(out_ptr, (N, M))                   # the transpose
    block = x.block((BM, BN), (i, j)).load(fill=-1.0)
    out.block((BN, BM), (j, i)).store(tessera.trans(block) + 0.5)


@tessera.kernel
def view_strided(x_ptr, out_ptr, M, N, BM: tessera.constexpr, BN: tessera.constexpr):
    i = tessera.program_id(0)
    x = tessera.view(x_ptr, (M, N), (1, M))               # column-major
    out = tessera.view(out_ptr, (M, N))
    out.block((BM, BN), (i, 0)).store(x.block((BM, BN), (i, 0)).load(fill=7.0) * 2.0)


@tessera.kernel
def loops(x_ptr, out_ptr, n, steps, BLOCK: tessera.constexpr):
    offs = tessera.arange(0, BLOCK)
    ptrs = x_ptr + offs                                   # a carried tile of pointers
    acc = tessera.zeros((BLOCK,), tessera.i32)
    for i in range(steps):
        v = tessera.load(ptrs, mask=offs + i * BLOCK < n, other=0)
        if i % 2 == 0:
            acc = acc + v
        else:
            acc = acc - v * 2
        ptrs = ptrs + BLOCK
    k = 0
    while k < steps:
        acc = acc ^ (offs + k)
        k += 1
    tessera.store(out_ptr + offs, acc)


@tessera.kernel
def atomics(x_ptr, acc_ptr, old_ptr, max_ptr, counter_ptr, ticket_ptr, flag_ptr, BLOCK: tessera.constexpr):
    pid = tessera.program_id(0)
    offs = tessera.arange(0, BLOCK)
    x = tessera.load(x_ptr + pid * BLOCK + offs)
    old = tessera.atomic_add(acc_ptr + offs, x)                  # every program hits the same elements
    tessera.store(old_ptr + pid * BLOCK + offs, old)
    tessera.atomic_max(max_ptr + offs % 4, x)                    # duplicates within the tile
    ticket = tessera.atomic_add(counter_ptr, 1)                  # one per program
    tessera.store(ticket_ptr + pid, ticket)
    tessera.atomic_cas(flag_ptr + offs, offs * 0, offs * 0 + pid + 1)


ATOMICS_ORDER_DEPENDENT = (2, 5, 6)     # `atomics`' old_ptr, ticket_ptr, flag_ptr


@tessera.kernel
def scans(x_ptr, out_ptr, M: tessera.constexpr, N: tessera.constexpr):
    rows = tessera.arange(0, M)[:, None]
    cols = tessera.arange(0, N)[None, :]
    x = tessera.load(x_ptr + rows * N + cols)
    tessera.store(out_ptr + rows * N + cols, tessera.cumsum(x, axis=1))
    tessera.store(out_ptr + M * N + rows * N + cols, tessera.cumsum(x, axis=0, reverse=True))
    tessera.store(out_ptr + 2 * M * N + rows * N + cols, tessera.scan(x, 1, _first_nonzero))


@tessera.kernel
def bool_and_narrow(x_ptr, b_ptr, out_ptr, M: tessera.constexpr, N: tessera.constexpr):
    rows = tessera.arange(0, M)[:, None]
    cols = tessera.arange(0, N)[None, :]
    x = tessera.load(x_ptr + rows * N + cols)                  # i8
    b = tessera.load(b_ptr + rows * N + cols)                  # bool
    tessera.store(out_ptr + tessera.arange(0, M), tessera.max(b, axis=1).to(tessera.i32))      # any
    tessera.store(out_ptr + M + tessera.arange(0, N), tessera.min(b, axis=0).to(tessera.i32))  # all
    tessera.store(out_ptr + M + N + tessera.arange(0, N), tessera.sum(x, axis=0))              # i8 sums in i32
    tessera.store(x_ptr + rows * N + cols, (x * 3 + 1).to(tessera.i8))


@tessera.kernel
def int_dot(a_ptr, b_ptr, c_ptr, M: tessera.constexpr, N: tessera.constexpr, K: tessera.constexpr):
    a = tessera.view(a_ptr, (M, K)).block((M, K)).load()
    b = tessera.view(b_ptr, (K, N)).block((K, N)).load()
    tessera.view(c_ptr, (M, N)).block((M, N)).store(tessera.dot(a, b))


# ---------------------------------------------------------------------------
# The table


@dataclass
class Case:
    kernel: object
    make_args: Callable[[np.random.Generator], list]
    constexprs: dict
    grid: tuple[int, ...]
    tolerance: dict = field(default_factory=dict)   # empty: bit for bit
    # arguments whose values depend on the order the programs run in (old values of atomics, tickets, CAS
    # winners): on a GPU any order is right; the interpreter and the simulator run programs in one order
    order_dependent: tuple[int, ...] = ()


def _f32(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


def _i32(rng, *shape, lo=-50, hi=50):
    return rng.integers(lo, hi, shape).astype(np.int32)


def _nonzero_i32(rng, *shape):
    x = _i32(rng, *shape)
    return np.where(x == 0, 7, x).astype(np.int32)


def _with_ties(rng, *shape):
    """Small integers as floats (ties for arg reductions), some NaNs."""
    x = rng.integers(-3, 4, shape).astype(np.float32)
    x[rng.random(shape) < 0.05] = np.nan
    return x


CASES: dict[str, Case] = {
    "vector_add_edge": Case(_tutorial("01-vector-add.py", "add"),
                            lambda r: [_f32(r, 300), _f32(r, 300), np.zeros(300, np.float32), 300],
                            {"BLOCK": 128}, (3,)),
    "vector_add_small_block": Case(_tutorial("01-vector-add.py", "add"),
                                   lambda r: [_f32(r, 40), _f32(r, 40), np.zeros(40, np.float32), 40],
                                   {"BLOCK": 16}, (3,)),
    "softmax": Case(_tutorial("02-fused-softmax.py", "softmax"),
                    lambda r: [_f32(r, 6, 50), np.zeros((6, 50), np.float32), 6, 50], {"BLOCK": 64}, (6,),
                    FLOAT_REDUCTION),
    "softmax_wide": Case(_tutorial("02-fused-softmax.py", "softmax"),
                         lambda r: [_f32(r, 3, 512), np.zeros((3, 512), np.float32), 3, 512], {"BLOCK": 512},
                         (3,), FLOAT_REDUCTION),
    "matmul": Case(_tutorial("03-matmul.py", "matmul"),
                   lambda r: [_f32(r, 20, 40).astype(np.float16), _f32(r, 40, 24).astype(np.float16),
                              np.zeros((20, 24), np.float16), 20, 24, 40], {"BM": 16, "BN": 16, "BK": 16},
                   (2, 2), DOT),
    "vector_add_f16_wide": Case(_tutorial("01-vector-add.py", "add"),
                                lambda r: [_f32(r, 2048).astype(np.float16), _f32(r, 2048).astype(np.float16),
                                           np.zeros(2048, np.float16), 2048], {"BLOCK": 1024}, (2,)),
    "bool_and_narrow": Case(bool_and_narrow, lambda r: [_i32(r, 16 * 32).astype(np.int8), r.random(16 * 32) < 0.9,
                                                        np.zeros(16 + 2 * 32, np.int32)], {"M": 16, "N": 32}, (1,)),
    "float_ops": Case(float_ops, lambda r: [_f32(r, 70), _f32(r, 70) + 3.0, np.zeros(27 * 70, np.float32), 70],
                      {"BLOCK": 32}, (3,)),
    "int_ops": Case(int_ops, lambda r: [_i32(r, 70), _nonzero_i32(r, 70), np.zeros(23 * 70, np.int32), 70],
                    {"BLOCK": 64}, (2,)),
    "outer": Case(outer, lambda r: [_f32(r, 16), _f32(r, 32), np.zeros(16 * 32, np.float32)],
                  {"M": 16, "N": 32}, (1,)),
    "shapes": Case(shapes, lambda r: [_f32(r, 8 * 16), np.zeros(4 * 8 * 16, np.float32)], {"M": 8, "N": 16}, (1,)),
    "view_edges": Case(view_copy, lambda r: [_f32(r, 37, 21), np.zeros((21, 37), np.float32), 37, 21],
                       {"BM": 16, "BN": 8}, (3, 3)),
    "view_aligned": Case(view_copy, lambda r: [_f32(r, 32, 64), np.zeros((64, 32), np.float32), 32, 64],
                         {"BM": 16, "BN": 32}, (2, 2)),
    "view_column_major": Case(view_strided, lambda r: [_f32(r, 30 * 12), np.zeros((30, 12), np.float32), 30, 12],
                              {"BM": 16, "BN": 16}, (2,)),
    "loops": Case(loops, lambda r: [_i32(r, 100), np.zeros(32, np.int32), 100, 4], {"BLOCK": 32}, (1,)),
    "atomics_replicated": Case(atomics, lambda r: [_i32(r, 3 * 16), np.zeros(16, np.int32), np.zeros(3 * 16, np.int32),
                                                   np.full(4, -100, np.int32), np.zeros(1, np.int32),
                                                   np.zeros(3, np.int32), np.zeros(16, np.int32)],
                               {"BLOCK": 16}, (3,), order_dependent=ATOMICS_ORDER_DEPENDENT),
    "atomics_wide": Case(atomics, lambda r: [_i32(r, 2 * 256), np.zeros(256, np.int32), np.zeros(2 * 256, np.int32),
                                             np.full(4, -100, np.int32), np.zeros(1, np.int32), np.zeros(2, np.int32),
                                             np.zeros(256, np.int32)], {"BLOCK": 256}, (2,),
                         order_dependent=ATOMICS_ORDER_DEPENDENT),
    "scans": Case(scans, lambda r: [_i32(r, 8 * 16, lo=-2, hi=3), np.zeros(3 * 8 * 16, np.int32)],
                  {"M": 8, "N": 16}, (1,)),
    "scans_float": Case(scans, lambda r: [_f32(r, 4 * 32), np.zeros(3 * 4 * 32, np.float32)],
                        {"M": 4, "N": 32}, (1,)),
    "int_dot": Case(int_dot, lambda r: [_i32(r, 16, 32).astype(np.int8), _i32(r, 32, 16).astype(np.int8),
                                        np.zeros((16, 16), np.int32)], {"M": 16, "N": 16, "K": 32}, (1,)),
    "reduce_all": Case(reduce_all, lambda r: [_with_ties(r, 16, 32), np.zeros(2, np.float32)],
                       {"M": 16, "N": 32}, (1,)),
}

# Reductions along each axis of 2-D tiles of several shapes: (8, 32) keeps
# a reduced dim in one warp, (16, 64) and (2, 256) need shared memory across
# warps along one axis, (4, 4) is smaller than the block (replicated).
for _shape in [(8, 32), (16, 64), (2, 256), (4, 4)]:
    for _axis in (0, 1):
        for _kind in ("sum", "max", "min", "argmax", "argmin", "custom"):
            M, N = _shape
            _floats = _kind in ("sum",)
            CASES[f"reduce_{_kind}_{M}x{N}_axis{_axis}"] = Case(
                reduce_2d,
                (lambda M, N, kind: lambda r: [
                    _f32(r, M * N) if kind == "sum" else _with_ties(r, M * N) if kind.startswith("arg")
                    else _i32(r, M * N, lo=-1, hi=2),
                    np.zeros(M * N, np.int32 if kind.startswith("arg") or kind in ("custom", "max", "min")
                             else np.float32)])(M, N, _kind),
                {"M": M, "N": N, "AXIS": _axis, "KIND": _kind}, (1,), FLOAT_REDUCTION if _floats else {})
    # integer sums are exact in any order
    CASES[f"reduce_isum_{_shape[0]}x{_shape[1]}"] = Case(
        reduce_2d, (lambda M, N: lambda r: [_i32(r, M * N), np.zeros(M * N, np.int32)])(*_shape),
        {"M": _shape[0], "N": _shape[1], "AXIS": 0, "KIND": "sum"}, (1,))


def run_case(case: Case, num_warps: int, seed: int = 0, target: str = "sm_80"):
    """Interpret the tile IR, lower and simulate the thread IR; assert the outputs agree."""
    expected = case.make_args(np.random.default_rng(seed))
    module = case.kernel.specialize(*expected, **case.constexprs).module
    run_function(module.functions[0], expected, case.grid)
    lowered = lower(module, target, num_warps)
    actual = case.make_args(np.random.default_rng(seed))
    simt.run_threads(lowered.functions[0], actual, case.grid)
    for want, got in zip(expected, actual):
        if not isinstance(want, np.ndarray):
            continue
        if case.tolerance:
            np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), **case.tolerance)
        else:
            assert got.tobytes() == want.tobytes(), f"mismatch:\n{got}\nexpected\n{want}"
    return lowered


@pytest.mark.parametrize("num_warps", [1, 2, 4])
@pytest.mark.parametrize("name", sorted(CASES))
def test_lowered_kernel_matches_the_tile_interpreter(name, num_warps):
    run_case(CASES[name], num_warps)


def test_amd_warps_of_64():
    for name in ("softmax", "reduce_argmax_16x64_axis0", "atomics_replicated", "matmul"):
        run_case(CASES[name], 2, target="gfx942")


def test_the_pass_test_kernels_lower_too():
    """The kernels the tile passes are tested on (runtime if/for/while, custom combines, ...)."""
    from pass_kernels import CASES as PASS_CASES
    for name, case in PASS_CASES.items():
        expected = case.make_args(np.random.default_rng(1))
        module = traced(case, seed=1)
        run_function(module.functions[0], expected, case.grid)
        actual = case.make_args(np.random.default_rng(1))
        simt.run_threads(lower(module, "sm_80", 2).functions[0], actual, case.grid)
        for want, got in zip(expected, actual):
            if isinstance(want, np.ndarray):
                np.testing.assert_allclose(got, want, **FLOAT_REDUCTION, err_msg=name)


# ---------------------------------------------------------------------------
# Structure


def _lowered_text(kernel, args, num_warps=4, **constexprs) -> str:
    module = kernel.specialize(*args, **constexprs).module
    return print_module(lower(module, "sm_80", num_warps))


def _ops(text: str, name: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if f" {name} " in f" {line.strip()} " or
            line.strip().startswith(f"{name} ")]


ADD = _tutorial("01-vector-add.py", "add")


def test_aligned_f32_loads_and_stores_get_vector_4():
    x = np.zeros(1024, np.float32)
    text = _lowered_text(ADD, [x, x, x, 1024], BLOCK=512)    # n divisible by 16: masks constant in fours
    loads, stores = _ops(text, "load"), _ops(text, "store")
    assert len(loads) == 2 and all("{vector = 4} : regs<4xf32>" in line for line in loads), loads
    assert len(stores) == 1 and "{vector = 4}" in stores[0]
    assert "num_threads = 128" in text and "warp_size = 32" in text and 'target = "sm_80"' in text


def test_aligned_f16_accesses_move_16_bytes():
    x = np.zeros(2048, np.float16)
    text = _lowered_text(ADD, [x, x, x, 2048], BLOCK=1024)
    assert all("{vector = 8} : regs<8xf16>" in line for line in _ops(text, "load"))


def test_unaligned_mask_or_pointer_gives_scalar_accesses():
    x = np.zeros(1024, np.float32)
    text = _lowered_text(ADD, [x, x, x, 1001], BLOCK=512)    # n odd: the mask may change at any lane
    assert all("vector" not in line for line in _ops(text, "load") + _ops(text, "store"))


@tessera.kernel
def shifted_copy(x_ptr, out_ptr, BLOCK: tessera.constexpr):
    offs = tessera.arange(0, BLOCK)
    tessera.store(out_ptr + offs, tessera.load(x_ptr + offs + 1))


def test_misaligned_pointer_gets_no_vector():
    x = np.zeros(1024, np.float32)
    text = _lowered_text(shifted_copy, [x, x], BLOCK=512)
    (load,) = _ops(text, "load")
    assert "vector" not in load
    (store,) = _ops(text, "store")
    assert "{vector = 4}" in store


def test_reductions_use_butterfly_shuffles_and_a_barrier_across_warps():
    x = np.zeros((4, 512), np.float32)
    text = _lowered_text(_tutorial("02-fused-softmax.py", "softmax"), [x, x, 4, 512], num_warps=4, BLOCK=512)
    shuffles = _ops(text, "shuffle")
    assert shuffles and all('{mode = "bfly"}' in line for line in shuffles)
    assert len(shuffles) == 2 * 5              # max and sum, five butterfly steps over 32 lanes each
    assert len(_ops(text, "barrier")) == 4     # around each cross-warp exchange
    assert "shared_bytes = " in text and "offset = -1" not in text


def test_one_warp_reduction_needs_no_shared_memory():
    x = np.zeros((4, 512), np.float32)
    text = _lowered_text(_tutorial("02-fused-softmax.py", "softmax"), [x, x, 4, 512], num_warps=1, BLOCK=512)
    assert not _ops(text, "barrier") and not _ops(text, "shared_alloc")
    assert "shared_bytes = 0" in text


def test_replicated_stores_and_atomics_are_masked_to_one_replica():
    x = np.zeros(16, np.int32)
    module = atomics.specialize(x, x, x, x, x, x, x, BLOCK=16).module
    fn = module.functions[0]
    assignment = assign_layouts(fn, get_target("sm_80"), 4)
    old = next(op for op in fn.walk() if op.name == "atomic_rmw").result
    assert assignment.layout(old).replication == 8               # 16 elements over 128 threads
    lowered = lower(module, "sm_80", 4).functions[0]
    rmws = [op for op in lowered.walk() if op.name == "atomic_rmw"]
    assert len(rmws) == 3 and all(len(op.operands) == 3 for op in rmws)   # every atomic has a mask
    cas = next(op for op in lowered.walk() if op.name == "atomic_cas")
    assert cas.parent.parent.name == "if"          # atomic_cas has no mask operand: it runs under an `if`
    assert [op for op in lowered.walk() if op.name == "barrier"]           # old values reach the replicas


def test_print_and_assert_are_kept_in_debug_builds_and_dropped_with_a_note_otherwise():
    @tessera.kernel
    def debug(x_ptr, BLOCK: tessera.constexpr):
        x = tessera.load(x_ptr + tessera.arange(0, BLOCK))
        tessera.device_print("x", x)
        tessera.device_assert(x >= 0, "negative")

    x = np.zeros(32, np.float32)
    plain = lower(debug.specialize(x, BLOCK=32).module, "sm_80", 1).functions[0]
    assert not [op for op in plain.walk() if op.name in ("print", "assert")]
    assert sum("dropped" in note for note in plain.attrs["lowering_notes"]) == 2
    fn = lower(debug.specialize(x, BLOCK=32).module, "sm_80", 1, debug=True).functions[0]
    asserts = [op for op in fn.walk() if op.name == "assert"]
    assert len(asserts) == 1 and isinstance(asserts[0].operands[0].type, RegsType)
    assert len([op for op in fn.walk() if op.name == "print"]) == 1
    simt.run_threads(fn, [x], (1,))
    with pytest.raises(tessera.InterpreterError, match="negative"):
        simt.run_threads(fn, [x - 1], (1,))


def test_thread_ir_holds_no_tiles_and_round_trips():
    from tessera.ir.parser import parse_module
    for name in ("softmax", "matmul", "loops", "atomics_replicated", "scans"):
        case = CASES[name]
        args = case.make_args(np.random.default_rng(0))
        lowered = lower(case.kernel.specialize(*args, **case.constexprs).module, "sm_80", 2)
        verify_module(lowered)
        fn = lowered.functions[0]
        for op in fn.walk():
            assert not any(isinstance(v.type, TileType) for v in (*op.operands, *op.results)), op.name
        text = print_module(lowered)
        assert print_module(parse_module(text)) == text


def test_mismatched_configuration_is_a_lowering_error():
    x = np.zeros(64, np.float32)
    fn = ADD.specialize(x, x, x, 64, BLOCK=64).module.functions[0]
    assignment = assign_layouts(fn, get_target("sm_80"), 2)
    with pytest.raises(LoweringError, match="warps of 32 threads"):
        lower_to_threads(fn, assignment, get_target("gfx942"))
    with pytest.raises(LoweringError, match="assigned for 2 warps"):
        lower_to_threads(fn, assignment, get_target("sm_80"), num_warps=4)
    with pytest.raises(LoweringError, match="power of two"):
        lower(fn, "sm_80", 3)


# ---------------------------------------------------------------------------
# Random kernels (the frontend's generator: for / if / while, early exits, where, casts)


@settings(max_examples=12, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(program=programs(), n=st.integers(1, BLOCK), seed=st.integers(0, 2**16), num_warps=st.sampled_from([1, 2, 4]))
def test_random_kernels_lower_to_the_same_results(program, n, seed, num_warps):
    case = generated_case(program, n, seed)
    expected = case.make_args(np.random.default_rng(seed))
    module = traced(case, seed)
    run_function(module.functions[0], expected, case.grid)
    actual = case.make_args(np.random.default_rng(seed))
    simt.run_threads(lower(module, "sm_80", num_warps).functions[0], actual, case.grid)
    for want, got in zip(expected, actual):
        if isinstance(want, np.ndarray) and want.dtype.kind == "f":      # they may sum floats
            np.testing.assert_allclose(got, want, equal_nan=True, **FLOAT_REDUCTION)
        elif isinstance(want, np.ndarray):
            assert want.tobytes() == got.tobytes()


# ---------------------------------------------------------------------------
# Results that depend on the order of programs (checked on a GPU by test_ops_on_gpu)

def orders_agree(case, module, got: np.ndarray, index: int) -> np.ndarray:
    """Where `got` (argument `index`, order-dependent) equals what the interpreter computes with the programs
    run in *some* order: each element may come from a different order, as atomics on distinct addresses
    serialize independently on a GPU."""
    fn = module.functions[0]
    agree = np.zeros(got.shape, bool)
    for order in itertools.permutations(range(int(np.prod(case.grid)))):
        args = case.make_args(np.random.default_rng(0))
        for program in order:
            run_program(fn, args, np.unravel_index(program, case.grid[::-1])[::-1], grid=case.grid)
        agree |= got == args[index]
    return agree


def test_every_program_order_covers_the_sequential_run_and_nothing_else():
    case = CASES["atomics_wide"]
    args = case.make_args(np.random.default_rng(0))
    module = case.kernel.specialize(*args, **case.constexprs).module
    run_function(module.functions[0], args, case.grid)
    for index in case.order_dependent:
        assert orders_agree(case, module, args[index], index).all()
        assert not orders_agree(case, module, args[index] + 1000, index).any()
