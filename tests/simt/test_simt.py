"""The SIMT simulator: hand-written thread IR against numpy references.

Shuffles per PTX shfl.sync, warp and block reductions, divergent control
flow under masks, launch parameters, the step limit, and the thread-IR
check. Memory (vector promises, races, bounds, atomics) is in
test_simt_memory.py.
"""

import numpy as np
import pytest

from tessera.backends.interp import InterpreterError, Memory, run_function

from tessera.backends.simt import run_threads, verify_thread_ir
from tessera.backends.simt.ops import SIMT_SEMANTICS
from tessera.backends.simt.thread_checks import TILE_ONLY_OPS
from tessera.ir import dtypes as dt
from tessera.ir.errors import VerifyError
from tessera.ir.ops import OPS
from tessera.ir.parser import parse_module
from ir_text import kernel


# -- shuffles ------------------------------------------------------------------

SHUFFLE = """\
func @shuffle(%x: ptr<i32>, %lanes: ptr<i32>, %out: ptr<i32>) attributes {num_threads = 64} {
  %tid = thread_id : i32
  %px = addptr %x, %tid : ptr<i32>
  %v = load %px : i32
  %pl = addptr %lanes, %tid : ptr<i32>
  %lane = load %pl : i32
  %s = shuffle %v, %lane {mode = "MODE"WIDTH} : i32
  %po = addptr %out, %tid : ptr<i32>
  store %po, %s
  return
}
"""


def shuffle_reference(x, operand, mode, width, warp=32):
    """CUDA's __shfl_{up,down,xor,}_sync, thread by thread."""
    out = np.empty_like(x)
    for t in range(x.size):
        base, lane = t - t % warp, t % warp
        first = lane - lane % width
        b = int(operand[t])
        if mode == "up":
            src = lane - b if lane - b >= first else lane
        elif mode == "down":
            src = lane + b if lane + b < first + width else lane
        elif mode == "bfly":  # an earlier segment may be read, a later one gives the own value
            src = lane ^ b if (lane ^ b) < first + width else lane
        else:
            src = first + b % width
        out[t] = x[base + src]
    return out


@pytest.mark.parametrize("width", [0, 2, 4, 8, 16, 32])
@pytest.mark.parametrize("mode, operands", [
    ("up", [0, 1, 3, 7, 16]), ("down", [0, 1, 2, 5, 16]), ("bfly", [1, 2, 4, 8, 16, 24]), ("idx", [0, 5, 31]),
])
def test_shuffle_matches_ptx_for_every_mode_and_width(mode, operands, width):
    attr = f", width = {width}" if width else ""
    fn = kernel(SHUFFLE.replace("MODE", mode).replace("WIDTH", attr))
    rng = np.random.default_rng(0)
    x = rng.integers(-1000, 1000, 64).astype(np.int32)
    for b in operands:
        lanes = np.full(64, b, np.int32)
        if mode == "idx":  # each thread asks for its own lane
            lanes = ((np.arange(64) * 7 + b) % 40).astype(np.int32)
        out = np.zeros(64, np.int32)
        run_threads(fn, [x, lanes, out], grid=1)
        np.testing.assert_array_equal(out, shuffle_reference(x, lanes, mode, width or 32), err_msg=f"{mode} {b}")


def test_shuffle_in_a_partial_warp_cannot_read_missing_threads():
    fn = kernel(SHUFFLE.replace("MODE", "down").replace("WIDTH", ", width = 8"))
    x, lanes = np.arange(64, dtype=np.int32), np.full(64, 4, np.int32)
    out = np.zeros(64, np.int32)
    run_threads(fn, [x, lanes, out], grid=1, num_threads=40)  # the 8-lane segment 32..39 is whole
    np.testing.assert_array_equal(out[32:40], [36, 37, 38, 39, 36, 37, 38, 39])
    with pytest.raises(InterpreterError, match="thread 34 reads lane 6 of its warp, but the block has only 38"):
        run_threads(fn, [x, lanes, out], grid=1, num_threads=38)


def test_shuffle_width_larger_than_the_warp_is_an_error():
    fn = kernel(SHUFFLE.replace("MODE", "bfly").replace("WIDTH", ", width = 32"))
    with pytest.raises(InterpreterError, match="shuffle width 32 exceeds the warp size 16"):
        run_threads(fn, [np.zeros(64, np.int32)] * 3, grid=1, warp_size=16)


WARP_SUM = """\
func @warp_sum(%x: ptr<i32>, %out: ptr<i32>) attributes {num_threads = 96, warp_size = 32} {
  %tid = thread_id : i32
  %px = addptr %x, %tid : ptr<i32>
  %v0 = load %px : i32
  %c16 = constant {value = 16} : i32
  %c8 = constant {value = 8} : i32
  %c4 = constant {value = 4} : i32
  %c2 = constant {value = 2} : i32
  %c1 = constant {value = 1} : i32
  %s16 = shuffle %v0, %c16 {mode = "bfly"} : i32
  %v1 = add %v0, %s16 : i32
  %s8 = shuffle %v1, %c8 {mode = "bfly"} : i32
  %v2 = add %v1, %s8 : i32
  %s4 = shuffle %v2, %c4 {mode = "bfly"} : i32
  %v3 = add %v2, %s4 : i32
  %s2 = shuffle %v3, %c2 {mode = "bfly"} : i32
  %v4 = add %v3, %s2 : i32
  %s1 = shuffle %v4, %c1 {mode = "bfly"} : i32
  %v5 = add %v4, %s1 : i32
  %c32 = constant {value = 32} : i32
  %c0 = constant {value = 0} : i32
  %lane = rem %tid, %c32 : i32
  %warp = div %tid, %c32 : i32
  %first = cmp %lane, %c0 {pred = "eq"} : bool
  if %first {
    %po = addptr %out, %warp : ptr<i32>
    store %po, %v5
    yield
  } {
    yield
  }
  return
}
"""


def test_warp_sum_by_butterfly_shuffles():
    x = np.random.default_rng(1).integers(-100, 100, 96).astype(np.int32)
    out = np.full(4, -7, np.int32)
    run_threads(kernel(WARP_SUM), [x, out], grid=1)
    np.testing.assert_array_equal(out, [*x.reshape(3, 32).sum(axis=1), -7])  # only lane 0 of each warp stored


BLOCK_SUM = """\
func @block_sum(%x: ptr<f32>, %out: ptr<f32>) attributes {num_threads = 128, shared_bytes = 1024} {
  %tid = thread_id : i32
  %pid = program_id {axis = 0} : i32
  %c128 = constant {value = 128} : i32
  %row = mul %pid, %c128 : i32
  %i = add %row, %tid : i32
  %px = addptr %x, %i : ptr<f32>
  %v = load %px : f32
  %smem = shared_alloc {bytes = 512, offset = 512} : ptr<f32, shared>
  %mine = addptr %smem, %tid : ptr<f32, shared>
  store %mine, %v
  barrier
  %c0 = constant {value = 0} : i32
  %c1 = constant {value = 1} : i32
  %c7 = constant {value = 7} : i32
  %c64 = constant {value = 64} : i32
  for %c0, %c7, %c1 {
  ^(%k: i32):
    %s = shr %c64, %k : i32
    %active = cmp %tid, %s {pred = "lt"} : bool
    if %active {
      %j = add %tid, %s : i32
      %theirs = addptr %smem, %j : ptr<f32, shared>
      %a = load %mine : f32
      %b = load %theirs : f32
      %ab = add %a, %b : f32
      store %mine, %ab
      yield
    } {
      yield
    }
    BARRIER
    yield
  }
  %first = cmp %tid, %c0 {pred = "eq"} : bool
  if %first {
    %total = load %smem : f32
    %po = addptr %out, %pid : ptr<f32>
    store %po, %total
    yield
  } {
    yield
  }
  return
}
"""


def tree_sum(rows: np.ndarray) -> np.ndarray:
    """The block reduction's order: halve the row, adding the upper half onto the lower, until one is left."""
    rows = rows.copy()
    while rows.shape[1] > 1:
        half = rows.shape[1] // 2
        rows = rows[:, :half] + rows[:, half:]
    return rows[:, 0]


def test_block_sum_through_shared_memory_with_barriers():
    x = np.random.default_rng(2).standard_normal(3 * 128).astype(np.float32)
    out = np.zeros(3, np.float32)
    run_threads(kernel(BLOCK_SUM.replace("BARRIER", "barrier")), [x, out], grid=3)
    np.testing.assert_array_equal(out, tree_sum(x.reshape(3, 128)))


def test_block_sum_without_its_barrier_is_a_race():
    # Round 1 (s = 64): thread 32 adds into element 32; round 2 (s = 32): thread 0 reads it, unordered.
    with pytest.raises(InterpreterError, match=r"program \(0, 0, 0\), op 'load': shared-memory race: thread 0 reads "
                                               r"shared byte 640 \(element 32 of the shared_alloc at byte 512 \(512 "
                                               r"bytes\)\), which thread 32 wrote since the last barrier \(missing "
                                               r"barrier\?\); add a `barrier` between the two accesses"):
        run_threads(kernel(BLOCK_SUM.replace("BARRIER", "")), [np.ones(128, np.float32), np.zeros(1, np.float32)],
                    grid=1)


# -- divergent control flow ------------------------------------------------------

DIVERGENT = """\
func @divergent(%x: ptr<f32>, %out: ptr<f32>, %trips: ptr<i32>) attributes {num_threads = 64} {
  %tid = thread_id : i32
  %px = addptr %x, %tid : ptr<f32>
  %v = load %px : f32
  %c10 = constant {value = 10} : i32
  %small = cmp %tid, %c10 {pred = "lt"} : bool
  %two = constant {value = 2.0} : f32
  %hundred = constant {value = 100.0} : f32
  %y = if %small : f32 {
    %d = mul %v, %two : f32
    yield %d
  } {
    %e = add %v, %hundred : f32
    yield %e
  }
  %c0 = constant {value = 0} : i32
  %c1 = constant {value = 1} : i32
  %c5 = constant {value = 5} : i32
  %n = rem %tid, %c5 : i32
  %acc = for %c0, %n, %c1, %y : f32 {
  ^(%i: i32, %a: f32):
    %fi = cast %i : f32
    %a2 = add %a, %fi : f32
    yield %a2
  }
  %po = addptr %out, %tid : ptr<f32>
  %odd = and %tid, %c1 : i32
  %is_odd = cmp %odd, %c1 {pred = "eq"} : bool
  if %is_odd {
    store %po, %acc
    yield
  } {
    yield
  }
  %start = add %tid, %c1 : i32
  %steps, %last = while %start, %c0 : i32, i32 {
  ^(%k: i32, %count: i32):
    %more = cmp %k, %c1 {pred = "gt"} : bool
    condition %more, %count, %k
  } {
  ^(%count_1: i32, %k_1: i32):
    %bit = and %k_1, %c1 : i32
    %even = cmp %bit, %c0 {pred = "eq"} : bool
    %half = shr %k_1, %c1 : i32
    %c3 = constant {value = 3} : i32
    %triple = mul %k_1, %c3 : i32
    %up = add %triple, %c1 : i32
    %next = select %even, %half, %up : i32
    %count_2 = add %count_1, %c1 : i32
    yield %next, %count_2
  }
  %pt = addptr %trips, %tid : ptr<i32>
  store %pt, %steps
  return
}
"""


def collatz_steps(k: int) -> int:
    steps = 0
    while k > 1:
        k = k // 2 if k % 2 == 0 else 3 * k + 1
        steps += 1
    return steps


def test_divergent_if_for_and_while_run_each_thread_its_own_way():
    x = np.random.default_rng(3).standard_normal(64).astype(np.float32)
    out = np.full(64, -1.0, np.float32)
    trips = np.zeros(64, np.int32)
    run_threads(kernel(DIVERGENT), [x, out, trips], grid=1)
    tid = np.arange(64)
    y = np.where(tid < 10, x * np.float32(2), x + np.float32(100))
    for t in range(64):
        for i in range(t % 5):
            y[t] += np.float32(i)
    np.testing.assert_array_equal(out, np.where(tid % 2 == 1, y, np.float32(-1)))  # even threads never stored
    np.testing.assert_array_equal(trips, [collatz_steps(t + 1) for t in range(64)])


BARRIER_IN_BRANCH = """\
func @k() attributes {num_threads = 64} {
  %tid = thread_id : i32
  %c40 = constant {value = 40} : i32
  %low = cmp %tid, %c40 {pred = "lt"} : bool
  if %low {
    barrier
    yield
  } {
    yield
  }
  return
}
"""


def test_a_barrier_under_divergent_control_flow_is_an_error():
    with pytest.raises(InterpreterError, match="barrier in divergent code: 24 of 64 threads .thread 40 first. do "
                                               "not reach it"):
        run_threads(kernel(BARRIER_IN_BRANCH), [], grid=1)
    run_threads(kernel(BARRIER_IN_BRANCH), [], grid=1, num_threads=32)  # uniform: everyone takes the branch


def test_an_infinite_loop_hits_the_step_limit():
    fn = kernel("""\
func @spin() attributes {num_threads = 32} {
  %t = constant {value = true} : bool
  %c1 = constant {value = 1} : i32
  %r = while %c1 : i32 {
  ^(%k: i32):
    condition %t, %k
  } {
  ^(%k_1: i32):
    %k2 = add %k_1, %c1 : i32
    yield %k2
  }
  return
}
""")
    with pytest.raises(InterpreterError, match=r"spin', program \(0, 0, 0\), op '\w+': the block executed more "
                                               r"than 1000 ops without finishing; is a loop infinite"):
        run_threads(fn, [], grid=1, max_steps=1000)


# -- launch parameters, grid and lane-wise semantics ------------------------------

def test_blocks_see_their_program_ids_and_the_grid():
    fn = kernel("""\
func @ids(%out: ptr<i32>) attributes {num_threads = 4} {
  %tid = thread_id : i32
  %x = program_id {axis = 0} : i32
  %y = program_id {axis = 1} : i32
  %nx = num_programs {axis = 0} : i32
  %c4 = constant {value = 4} : i32
  %row = mul %y, %nx : i32
  %block = add %row, %x : i32
  %base = mul %block, %c4 : i32
  %i = add %base, %tid : i32
  %c100 = constant {value = 100} : i32
  %ten = constant {value = 10} : i32
  %yy = mul %y, %c100 : i32
  %xx = mul %x, %ten : i32
  %v0 = add %yy, %xx : i32
  %v = add %v0, %tid : i32
  %p = addptr %out, %i : ptr<i32>
  store %p, %v
  return
}
""")
    out = np.zeros(24, np.int32)
    run_threads(fn, [out], grid=(3, 2))
    expected = [100 * y + 10 * x + t for y in range(2) for x in range(3) for t in range(4)]
    np.testing.assert_array_equal(out, expected)


def test_missing_num_threads_is_an_error():
    fn = kernel("func @k() {\n  return\n}\n")
    with pytest.raises(InterpreterError, match="no `num_threads` attribute; pass num_threads="):
        run_threads(fn, [], grid=1)
    run_threads(fn, [], grid=1, num_threads=8)


ELEMENTWISE_TILE = """\
func @tile(%x: ptr<f32>, %out: ptr<bf16>) {
  %offs = arange {end = 256, start = 0} : tile<256xi32>
  %xs = splat %x : tile<256xptr<f32>>
  %px = addptr %xs, %offs : tile<256xptr<f32>>
  %v = load %px : tile<256xf32>
  %e = exp %v : tile<256xf32>
  %one = constant {value = 1.0} : tile<256xf32>
  %d = add %v, %one : tile<256xf32>
  %q = div %e, %d : tile<256xf32>
  %b = cast %q : tile<256xbf16>
  %s = sigmoid %b : tile<256xbf16>
  %os = splat %out : tile<256xptr<bf16>>
  %po = addptr %os, %offs : tile<256xptr<bf16>>
  store %po, %s
  return
}
"""

ELEMENTWISE_THREADS = """\
func @threads(%x: ptr<f32>, %out: ptr<bf16>) attributes {num_threads = 64} {
  %tid = thread_id : i32
  %c4 = constant {value = 4} : i32
  %c1 = constant {value = 1} : i32
  %c2 = constant {value = 2} : i32
  %c3 = constant {value = 3} : i32
  %o0 = mul %tid, %c4 : i32
  %o1 = add %o0, %c1 : i32
  %o2 = add %o0, %c2 : i32
  %o3 = add %o0, %c3 : i32
  %offs = pack %o0, %o1, %o2, %o3 : regs<4xi32>
  %xs = splat %x : regs<4xptr<f32>>
  %px = addptr %xs, %offs : regs<4xptr<f32>>
  %v = load %px {vector = 4} : regs<4xf32>
  %e = exp %v : regs<4xf32>
  %one = constant {value = 1.0} : regs<4xf32>
  %d = add %v, %one : regs<4xf32>
  %q = div %e, %d : regs<4xf32>
  %b = cast %q : regs<4xbf16>
  %s = sigmoid %b : regs<4xbf16>
  %os = splat %out : regs<4xptr<bf16>>
  %po = addptr %os, %offs : regs<4xptr<bf16>>
  store %po, %s {vector = 4}
  return
}
"""


def test_registers_compute_bit_for_bit_what_the_tile_interpreter_computes():
    x = np.random.default_rng(4).standard_normal(256).astype(np.float32) * 4
    x[:3] = [-1.0, np.inf, np.nan]
    by_tile, by_threads = np.zeros(256, np.uint16), np.ones(256, np.uint16)
    run_function(kernel(ELEMENTWISE_TILE), [x, _bf16(by_tile)], grid=1)
    run_threads(kernel(ELEMENTWISE_THREADS), [x, _bf16(by_threads)], grid=1)
    np.testing.assert_array_equal(by_threads, by_tile)


def _bf16(array):
    return Memory(array, dt.bf16)


# -- what thread IR may hold --------------------------------------------------------

def test_every_op_is_either_simulated_or_tile_only():
    assert sorted(set(OPS) - set(SIMT_SEMANTICS) - TILE_ONLY_OPS) == []
    assert sorted(set(SIMT_SEMANTICS) & TILE_ONLY_OPS) == []
    assert sorted(set(SIMT_SEMANTICS) - set(OPS)) == []


def test_verify_thread_ir_rejects_tile_ops_and_tile_types():
    verify_thread_ir(kernel(ELEMENTWISE_THREADS))
    verify_thread_ir(parse_module(ELEMENTWISE_THREADS))
    with pytest.raises(VerifyError, match=r"@tile: %offs = arange .* 'arange' is a tile-level op, not thread IR; "
                                          r"lower the kernel with tessera.passes.lower_to_threads first"):
        verify_thread_ir(kernel(ELEMENTWISE_TILE))
    with pytest.raises(VerifyError, match=r"@k: argument %t has type tile<4xf32>, a tile; thread IR holds only"):
        verify_thread_ir(kernel("func @k(%t: tile<4xf32>) {\n  return\n}\n"))
    with pytest.raises(VerifyError, match=r"result %s of %s = splat %x : tile<8xf32> has type tile<8xf32>"):
        verify_thread_ir(kernel("func @k(%x: f32) {\n  %s = splat %x : tile<8xf32>\n  return\n}\n"))


def test_run_threads_refuses_tile_ir():
    with pytest.raises(VerifyError, match="tile-level op"):
        run_threads(kernel(ELEMENTWISE_TILE), [np.zeros(256, np.float32), _bf16(np.zeros(256, np.uint16))],
                    grid=1, num_threads=64)
