"""Reads before a warp-specialized loop that only its consumers need (`passes/schedule/consumer_prologue.py`).

Specification:

* a block load before `tessera.pipeline(..., warp_specialize=True)` (an accumulator's initial value, a
  loop-invariant dot operand such as attention's Q) is lowered at the top of the consumers' branch, after
  setmaxnreg, never by the producer warpgroup; the loop still warp-specializes (strict mode accepts it), and on
  the SIMT simulator the kernel computes numpy's result (sm_90 with mma.sync consumers, sm_90a with wgmma);
* where the loop cannot be warp-specialized (no TMA: sm_80; or on sm_90 a block TMA cannot fill), the same load
  is lowered just before the loop, and the kernel still computes numpy's result;
* still refused, naming the kernel and the line: a store before the loop (reads are never moved across a
  write), and a value the producer needs (here a loop bound) loaded from memory before the loop.
"""

from __future__ import annotations

import numpy as np
import pytest

import tessera
from tessera.backends.simt import run_threads
from tessera.dsl.compiler import compile_tile_module
from tessera.passes.thread_passes import lower


@tessera.kernel
def init_from_memory_ws(a_ptr, b_ptr, c_ptr, init_ptr, M, N, K, BM: tessera.constexpr, BN: tessera.constexpr,
                        BK: tessera.constexpr):
    """C = INIT + A B, INIT's block loaded before the warp-specialized loop (only the consumers read it)."""
    pid_m, pid_n = tessera.program_id(0), tessera.program_id(1)
    a, b = tessera.view(a_ptr, (M, K)), tessera.view(b_ptr, (K, N))
    acc = tessera.view(init_ptr, (M, N)).block((BM, BN), (pid_m, pid_n)).load()
    for k in tessera.pipeline(0, tessera.cdiv(K, BK), stages=2, warp_specialize=True):
        acc = tessera.dot(a.block((BM, BK), (pid_m, k)).load(), b.block((BK, BN), (k, pid_n)).load(), acc)
    tessera.view(c_ptr, (M, N)).block((BM, BN), (pid_m, pid_n)).store(acc)


@tessera.kernel
def offset_a_ws(a_ptr, b_ptr, c_ptr, init_ptr, M, N, K, a_offset, BM: tessera.constexpr, BN: tessera.constexpr,
                BK: tessera.constexpr):
    """As init_from_memory_ws, but A's view starts at a computed pointer, which TMA cannot fill: refused."""
    pid_m, pid_n = tessera.program_id(0), tessera.program_id(1)
    a, b = tessera.view(a_ptr + a_offset, (M, K)), tessera.view(b_ptr, (K, N))
    acc = tessera.view(init_ptr, (M, N)).block((BM, BN), (pid_m, pid_n)).load()
    for k in tessera.pipeline(0, tessera.cdiv(K, BK), stages=2, warp_specialize=True):
        acc = tessera.dot(a.block((BM, BK), (pid_m, k)).load(), b.block((BK, BN), (k, pid_n)).load(), acc)
    tessera.view(c_ptr, (M, N)).block((BM, BN), (pid_m, pid_n)).store(acc)


@tessera.kernel
def store_first_ws(a_ptr, b_ptr, c_ptr, init_ptr, M, N, K, BM: tessera.constexpr, BN: tessera.constexpr,
                   BK: tessera.constexpr):
    pid_m, pid_n = tessera.program_id(0), tessera.program_id(1)
    a, b = tessera.view(a_ptr, (M, K)), tessera.view(b_ptr, (K, N))
    c = tessera.view(c_ptr, (M, N)).block((BM, BN), (pid_m, pid_n))
    c.store(tessera.zeros((BM, BN), tessera.f32))
    acc = tessera.view(init_ptr, (M, N)).block((BM, BN), (pid_m, pid_n)).load()
    for k in tessera.pipeline(0, tessera.cdiv(K, BK), stages=2, warp_specialize=True):
        acc = tessera.dot(a.block((BM, BK), (pid_m, k)).load(), b.block((BK, BN), (k, pid_n)).load(), acc)
    c.store(acc)


@tessera.kernel
def bound_from_memory_ws(a_ptr, b_ptr, c_ptr, blocks_ptr, M, N, K, BM: tessera.constexpr, BN: tessera.constexpr,
                         BK: tessera.constexpr):
    pid_m, pid_n = tessera.program_id(0), tessera.program_id(1)
    a, b = tessera.view(a_ptr, (M, K)), tessera.view(b_ptr, (K, N))
    acc = tessera.zeros((BM, BN), tessera.f32)
    for k in tessera.pipeline(0, tessera.load(blocks_ptr), stages=2, warp_specialize=True):
        acc = tessera.dot(a.block((BM, BK), (pid_m, k)).load(), b.block((BK, BN), (k, pid_n)).load(), acc)
    tessera.view(c_ptr, (M, N)).block((BM, BN), (pid_m, pid_n)).store(acc)


def case(M=61, N=37, K=208, seed=0):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((M, K)).astype(np.float16)
    b = rng.standard_normal((K, N)).astype(np.float16)
    init = rng.standard_normal((M, N)).astype(np.float32)
    return [a, b, np.zeros((M, N), np.float32), init, M, N, K]


def lowered(kernel, args, target, num_warps, BM=64, BN=64, BK=64):
    module = kernel.specialize(*args, BM=BM, BN=BN, BK=BK).module
    return lower(module, target, num_warps).functions[0]


def consumers_branch(fn):
    """The consumers' block of the warp-specialized split (the `if` carrying `producer_joins_at`)."""
    split = next(op for op in fn.body.ops if op.name == "if" and "producer_joins_at" in op.attrs)
    return split.regions[1].blocks[0] if hasattr(split.regions[1], "blocks") else split.regions[1]


@pytest.mark.parametrize("target, num_warps, BM", [("sm_90", 4, 64), ("sm_90a", 8, 128)])
def test_a_load_before_the_loop_runs_in_the_consumers_branch(target, num_warps, BM):
    args = case()
    fn = lowered(init_from_memory_ws, args, target, num_warps, BM=BM)
    assert fn.attrs["num_threads"] == num_warps * 32 + 128
    top = [op.name for op in fn.body.ops]
    assert "load" not in top and "if" in top, "nothing is read before the split"
    body = consumers_branch(fn)
    names = [op.name for op in body.ops]
    assert "load" in names and names.index("load") < names.index("for"), "INIT is read by the consumers, first"
    if target == "sm_90a":
        assert names.index("setmaxnreg") < names.index("load"), "under the consumers' register budget"
    run_threads(fn, args, (tessera.cdiv(61, BM), tessera.cdiv(37, 64)))
    a, b, c, init = args[:4]
    np.testing.assert_allclose(c, init + a.astype(np.float64) @ b.astype(np.float64), rtol=1e-3, atol=1e-3)


def test_strict_mode_accepts_the_load_before_the_loop():
    module = init_from_memory_ws.specialize(*case(), BM=64, BN=64, BK=64).module
    compile_tile_module(module, target="sm_90a", num_warps=4, strict=True)


def test_without_tma_the_load_is_lowered_before_the_loop():
    args = case()
    with pytest.warns(tessera.PipelineWarning, match="no warp specialization"):
        fn = lowered(init_from_memory_ws, args, "sm_80", 4)
    names = [op.name for op in fn.body.ops]
    assert fn.attrs["num_threads"] == 128 and names.index("load") < names.index("for")
    run_threads(fn, args, (1, 1))
    a, b, c, init = args[:4]
    np.testing.assert_allclose(c, init + a.astype(np.float64) @ b.astype(np.float64), rtol=1e-3, atol=1e-3)


def test_a_refused_loop_on_a_tma_target_lowers_the_held_back_load_before_it():
    """sm_90 (TMA) holds INIT's load back for the consumers, then the loop is refused (A cannot come by TMA):
    the load is lowered just before the plain pipeline, and the result is still right."""
    args = case()
    a_padded = np.concatenate([np.zeros(8, np.float16), args[0].ravel()])
    args = [a_padded] + args[1:] + [8]
    with pytest.warns(tessera.PipelineWarning, match="no warp specialization"):
        fn = lowered(offset_a_ws, args, "sm_90", 4)
    names = [op.name for op in fn.body.ops]
    assert fn.attrs["num_threads"] == 128 and "load" in names and names.index("load") < names.index("for")
    run_threads(fn, args, (1, 1))
    a, (b, c, init) = a_padded[8:].reshape(61, 208), args[1:4]
    np.testing.assert_allclose(c, init + a.astype(np.float64) @ b.astype(np.float64), rtol=1e-3, atol=1e-3)


def strict_error(kernel, args):
    module = kernel.specialize(*args, BM=64, BN=64, BK=64).module
    with pytest.raises(tessera.CompileError) as info:
        compile_tile_module(module, target="sm_90a", num_warps=4, strict=True)
    assert info.value.line is not None
    return str(info.value)


def test_a_store_before_the_loop_is_still_refused():
    message = strict_error(store_first_ws, case())
    assert "kernel 'store_first_ws'" in message and "'view_store' comes before a tessera.pipeline" in message


def test_a_loop_bound_read_from_memory_is_refused():
    message = strict_error(bound_from_memory_ws, case()[:3] + [np.array([4], np.int32)] + case()[4:])
    assert "kernel 'bound_from_memory_ws'" in message and "the producer warpgroup needs" in message
    assert "read from memory before the loop" in message
