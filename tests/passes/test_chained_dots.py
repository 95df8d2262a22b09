"""Chains of dots (attention's S = Q K^T, P = f(S), O = P V) and the loop-invariant operand of a dot in a loop.

Specification:

* `mma.chained` says whether a dot's A operand is computed lane by lane
  from another dot's result (through elementwise ops, shape ops other than
  transposes and `if` results), or its result feeds another dot's A operand
  that way; chained
  dots split their warps along M only, so each warp holds whole rows: a row
  reduction of the scores stays in the warp and P's accumulator registers
  are already the next dot's A fragment (no shared memory between the two
  products; the lowered code runs on the SIMT simulator as the interpreter
  runs it);
* a tensor-core operand computed before the loop its dot is in (and used
  only there) is moved into the form its instruction reads once, before the
  loop, rather than in every iteration: an mma.sync operand of at most
  `RESIDENT_OPERAND_REGISTERS` registers per thread is loaded straight into
  its fragment and stays there; a larger one is stored into swizzled shared
  memory and read with ldmatrix in each iteration; a wgmma operand is
  stored into its shared tile;
* on sm_90a P reaches the second wgmma in registers (wgmma's register-A
  form: the accumulator's registers are the A fragment's, so no value moves
  and nothing is stored), for one or two slabs per warpgroup and one or two
  warpgroups; an A operand in another layout (a plain load's) is still stored
  into its shared tile; the PTX has `wgmma.mma_async` with a braced register
  A and assembles without spills.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

import tessera
from tessera.backends.interp import run_function
from tessera.backends.simt import run_threads
from tessera.ir.target import get_target
from tessera.passes.layout_assignment import assign_layouts
from tessera.passes.mma import RESIDENT_OPERAND_REGISTERS, chained, mma_plan
from tessera.passes.thread_passes import lower


@tessera.kernel
def two_dots(q_ptr, k_ptr, v_ptr, o_ptr, M: tessera.constexpr, N: tessera.constexpr, D: tessera.constexpr,
             STEPS: tessera.constexpr, MASKED: tessera.constexpr):
    """o = sum over STEPS blocks j of exp2(q k_j^T - rowmax) v_j: the shape of an attention loop."""
    q = tessera.view(q_ptr, (M, D)).block((M, D), (0, 0)).load()
    kT = tessera.view(k_ptr, (D, N * STEPS), (1, D))
    v = tessera.view(v_ptr, (N * STEPS, D))
    acc = tessera.zeros((M, D), tessera.f32)
    for j in range(STEPS):
        s = tessera.dot(q, kT.block((D, N), (0, j)).load())
        if MASKED and j == 0:
            s = tessera.where(tessera.arange(0, N)[None, :] < 3, s, -float("inf"))
        p = tessera.exp2(s - tessera.max(s, axis=1)[:, None])
        acc = tessera.dot(p.to(tessera.f16), v.block((N, D), (j, 0)).load(), acc)
    tessera.view(o_ptr, (M, D)).block((M, D), (0, 0)).store(acc)


@tessera.kernel
def transposed_chain(q_ptr, k_ptr, o_ptr, M: tessera.constexpr, D: tessera.constexpr):
    """o = (q k^T)^T k: the second dot's A operand is a transpose, which moves lanes between threads anyway."""
    q = tessera.view(q_ptr, (M, D)).block((M, D), (0, 0)).load()
    k = tessera.view(k_ptr, (M, D)).block((M, D), (0, 0)).load()
    s = tessera.dot(q, tessera.trans(k))
    tessera.view(o_ptr, (M, D)).block((M, D), (0, 0)).store(tessera.dot(tessera.trans(s).to(tessera.f16), k))


def args(M, N, D, steps, seed=0):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((M, D)).astype(np.float16)
    k = rng.standard_normal((N * steps, D)).astype(np.float16)
    v = rng.standard_normal((N * steps, D)).astype(np.float16)
    return [q, k, v, np.zeros((M, D), np.float32)]


def module(M=64, N=32, D=32, steps=2, masked=True):
    return two_dots.specialize(*args(M, N, D, steps), M=M, N=N, D=D, STEPS=steps, MASKED=masked).module


def dots(fn):
    return [op for op in fn.walk() if op.name == "dot"]


@pytest.mark.parametrize("masked", [False, True], ids=["plain", "through-an-if"])
def test_both_dots_of_the_chain_are_chained_and_split_along_m_only(masked):
    first, second = dots(module(masked=masked).functions[0])
    assert chained(first) and chained(second)
    for dot in (first, second):
        plan = mma_plan(dot, get_target("sm_80"), num_warps=4)
        assert (plan.wm, plan.rm) == (4, 1), "each warp owns 16 whole rows"


def test_a_transpose_breaks_the_chain():
    zeros = np.zeros((64, 64), np.float16)
    fn = transposed_chain.specialize(zeros, zeros, np.zeros((64, 64), np.float32), M=64, D=64).module.functions[0]
    assert not any(chained(dot) for dot in dots(fn))


def test_an_unchained_dot_of_the_same_shape_splits_both_ways():
    from test_mma_dot import dot_module
    (dot,) = dots(dot_module(64, 64, 32).functions[0])
    assert not chained(dot)
    plan = mma_plan(dot, get_target("sm_80"), num_warps=4)
    assert (plan.wm, plan.rm * plan.wm) == (2, 4)


def test_nothing_moves_through_shared_memory_between_the_two_products_on_sm_80():
    fn = lower(module(), "sm_80", num_warps=4).functions[0]
    loop = next(op for op in fn.walk() if op.name == "for")
    in_loop = [op.name for op in loop.walk()]
    # K and V reach their fragments through shared memory and ldmatrix (the plain `range` loop is pipelined on
    # its own, so they arrive by cp.async); P, the row maxima and Q are not stored at all
    assert loop.attrs.get("stages") == 3 and in_loop.count("async_copy") == 2
    assert in_loop.count("ldmatrix") > 0 and in_loop.count("store") == 0, in_loop.count("store")


def test_the_loop_invariant_operand_is_loaded_straight_into_its_fragment():
    fn = module().functions[0]
    first, _ = dots(fn)
    assignment = assign_layouts(fn, get_target("sm_80"), num_warps=4)
    plan = mma_plan(first, get_target("sm_80"), num_warps=4)
    assert assignment.layout(first.operands[0]) == plan.a and (first, 0) not in assignment.conversions


def test_a_large_loop_invariant_operand_stays_in_shared_memory_and_is_read_in_every_iteration():
    m = module(N=16, D=256)                     # q's fragment: 16 x 256 f16 per warp, 64 registers per thread
    first, _ = dots(m.functions[0])
    plan = mma_plan(first, get_target("sm_80"), num_warps=4)
    assert plan.a.local_size // 2 > RESIDENT_OPERAND_REGISTERS
    assert assign_layouts(m.functions[0], get_target("sm_80"), num_warps=4).layout(first.operands[0]) != plan.a
    fn = lower(m, "sm_80", num_warps=4).functions[0]
    loop = next(op for op in fn.walk() if op.name == "for")
    before = fn.body.ops[:fn.body.ops.index(loop)]
    assert sum(op.name == "store" for op in before) == 1                    # q, swizzled, once
    assert sum(op.name == "ldmatrix" for op in loop.walk()) > 0
    expected, actual = args(64, 16, 256, 2), args(64, 16, 256, 2)
    run_function(m.functions[0], expected, (1,))
    run_threads(fn, actual, (1,))
    np.testing.assert_allclose(actual[3], expected[3], rtol=2e-3, atol=2e-3)


def test_a_loop_invariant_wgmma_operand_is_placed_once_before_the_loop():
    """q reaches its K-major tile by one TMA load before the loop (`schedule/tma_operand.py`), waited for once
    there, not through registers and a store."""
    fn = lower(module(), "sm_90a", num_warps=4).functions[0]
    loop = next(op for op in fn.walk() if op.name == "for")
    before = [o.name for op in fn.body.ops[:fn.body.ops.index(loop)] for o in op.walk()]
    assert "store" not in before and before.count("mbarrier_wait") == 1
    assert sum(op.name == "wgmma" for op in loop.walk()) == 2 * 2           # two K slices of 16 per product


@pytest.mark.parametrize("target, num_warps", [("sm_80", 4), ("sm_90a", 4), ("gfx942", 2)])
def test_the_chain_on_the_simt_simulator_matches_the_tile_interpreter(target, num_warps):
    m = module()
    expected, actual = args(64, 32, 32, 2), args(64, 32, 32, 2)
    run_function(m.functions[0], expected, (1,))
    run_threads(lower(m, target, num_warps=num_warps).functions[0], actual, (1,))
    np.testing.assert_allclose(actual[3], expected[3], rtol=2e-3, atol=2e-3)


def wgmmas(fn):
    loop = next(op for op in fn.walk() if op.name == "for")
    return loop, [op for op in loop.walk() if op.name == "wgmma"]


def test_on_sm_90a_p_feeds_the_second_wgmma_from_registers():
    fn = lower(module(), "sm_90a", num_warps=4).functions[0]
    loop, ops = wgmmas(fn)
    a_types = [str(op.operands[0].type) for op in ops]
    assert a_types == ["i64", "i64", "regs<8xf16>", "regs<8xf16>"]     # S from shared Q; then P, two K slices
    assert "trans_a" not in ops[2].attrs
    # K and V reach their tiles by TMA (the plain `range` loop is pipelined on its own); P is not stored, nor
    # moved between threads
    in_loop = [op.name for op in loop.walk()]
    assert in_loop.count("store") == 0 and in_loop.count("tma_load") == 2


def test_a_plain_loads_register_a_operand_is_still_stored_into_its_tile():
    from test_mma_dot import dot_module
    fn = lower(dot_module(64, 64, 32), "sm_90a", num_warps=4).functions[0]
    assert all(str(op.operands[0].type) == "i64" for op in fn.walk() if op.name == "wgmma")


@pytest.mark.parametrize("M, num_warps", [(64, 4), (128, 4), (128, 8)], ids=["one-slab", "two-slabs", "two-groups"])
def test_register_a_chain_on_the_simt_simulator_matches_the_tile_interpreter(M, num_warps):
    """Two 64-row slabs per warpgroup (registers (rm * RK + rk) * 8 + i), or one slab each for two warpgroups."""
    m = module(M=M)
    fn = lower(m, "sm_90a", num_warps=num_warps).functions[0]
    assert any(str(op.operands[0].type).startswith("regs") for op in fn.walk() if op.name == "wgmma")
    expected, actual = args(M, 32, 32, 2), args(M, 32, 32, 2)
    run_function(m.functions[0], expected, (1,))
    run_threads(fn, actual, (1,))
    np.testing.assert_allclose(actual[3], expected[3], rtol=2e-3, atol=2e-3)


def test_register_a_wgmma_in_ptx_assembles_without_spills():
    from tessera.backends.nvptx import find_ptxas
    compiled = two_dots.compile(*args(64, 32, 32, 2), target="sm_90a", M=64, N=32, D=32, STEPS=2, MASKED=True)
    ptx = compiled.stages["ptx"]
    register_a = re.findall(r"wgmma\.mma_async\.sync\.aligned\.m64n32k16\.f32\.f16\.f16 \{[^}]*\}, "
                            r"\{%r\d+, %r\d+, %r\d+, %r\d+\}, %rd\d+, p, 1, 1, 1;", ptx)
    # P V: two K slices of 16, A in four 32-bit registers; V, row-major in its (automatically pipelined) ring
    # slot, is an MN-major B that wgmma reads through its transpose bit (the last 1)
    assert len(register_a) == 2
    if find_ptxas() is not None:
        assert compiled.metadata["spill_stores"] == compiled.metadata["spill_loads"] == 0
