"""rematerialize_index: thread-index math used inside `while` loops is recomputed there, from a reread thread id.

Specification: every use inside a `while` (condition or body, at any depth) of a value the prologue computes
from `thread_id` gets a clone of its chain in the user's block, from `thread_id {reread = true}`, shared by
the block's later users; uses outside `while` loops, and inside other loops, keep the prologue's value; the
rewritten kernel computes the same; on NVIDIA the reread is a volatile %tid.x inside the loop.
"""

import numpy as np

import tessera
from tessera.backends.interp import run_function
from tessera.backends.simt import run_threads
from tessera.ir.parser import parse_module
from tessera.ir.printer import print_module
from tessera.ir.verifier import verify_module
from tessera.passes.dce import dce_function
from tessera.passes.rematerialize_index import rematerialize_thread_index
from tessera.passes.thread_passes import lower

BEFORE = """\
func @spin(%out: ptr<i32>, %n: i32) attributes {num_threads = 32, warp_size = 32} {
  %0 = thread_id : i32
  %1 = constant {value = 15} : i32
  %lane = and %0, %1 : i32
  %2 = constant {value = 4} : i32
  %group = shr %0, %2 : i32
  %r = while %n : i32 {
  ^(%k: i32):
    %3 = cmp %k, %lane {pred = "gt"} : bool
    condition %3, %k
  } {
  ^(%k_1: i32):
    %4 = sub %k_1, %group : i32
    %5 = sub %4, %lane : i32
    yield %5
  }
  %6 = add %r, %lane : i32
  store %out, %6
  return
}
"""

AFTER = """\
func @spin(%out: ptr<i32>, %n: i32) attributes {num_threads = 32, warp_size = 32} {
  %0 = thread_id : i32
  %1 = constant {value = 15} : i32
  %lane = and %0, %1 : i32
  %2 = constant {value = 4} : i32
  %r = while %n : i32 {
  ^(%k: i32):
    %3 = thread_id {reread = true} : i32
    %4 = and %3, %1 : i32
    %5 = cmp %k, %4 {pred = "gt"} : bool
    condition %5, %k
  } {
  ^(%k_1: i32):
    %6 = thread_id {reread = true} : i32
    %7 = shr %6, %2 : i32
    %8 = sub %k_1, %7 : i32
    %9 = and %6, %1 : i32
    %10 = sub %8, %9 : i32
    yield %10
  }
  %11 = add %r, %lane : i32
  store %out, %11
  return
}
"""


def test_uses_inside_a_while_get_their_own_chain_and_the_rest_keep_the_prologue():
    module = parse_module(BEFORE)
    assert rematerialize_thread_index(module.functions[0]) == 3
    dce_function(module.functions[0])
    verify_module(module)
    assert print_module(module) == AFTER


def test_other_loops_keep_the_hoisted_values():
    text = BEFORE.replace("%r = while %n : i32 {\n  ^(%k: i32):\n    %3 = cmp %k, %lane {pred = \"gt\"} : bool\n"
                          "    condition %3, %k\n  } {\n  ^(%k_1: i32):", "%zero = constant {value = 0} : i32\n"
                          "  %r = for %zero, %n, %2, %n : i32 {\n  ^(%i: i32, %k_1: i32):")
    module = parse_module(text)
    assert rematerialize_thread_index(module.functions[0]) == 0
    assert print_module(module) == print_module(parse_module(text))


@tessera.kernel
def drain(queue, out, n, BLOCK: tessera.constexpr):
    """A ticket loop: each ticket fills BLOCK elements of out with their offsets."""
    t = tessera.atomic_add(queue, 1)
    while t < n:
        offs = t * BLOCK + tessera.arange(0, BLOCK)
        tessera.store(out + offs, offs * 2)
        t = tessera.atomic_add(queue, 1)


def _drain_args():
    return [np.zeros(1, np.int32), np.zeros(64, np.int32), 4]


def test_a_ticket_loop_computes_the_same_and_reads_tid_inside_the_loop_on_nvidia():
    fn = lower(drain.specialize(*_drain_args(), BLOCK=16).module, "sm_80", num_warps=1).functions[0]
    rereads = [op for op in fn.walk() if op.name == "thread_id" and op.attrs.get("reread")]
    assert rereads and all(op.parent is not fn.body for op in rereads)
    expected, got = _drain_args(), _drain_args()
    run_function(drain.specialize(*expected, BLOCK=16).function, expected, grid=2)
    run_threads(fn, got, grid=2)
    np.testing.assert_array_equal(got[1], np.arange(64) * 2)
    np.testing.assert_array_equal(got[1], expected[1])
    ptx = drain.compile(*_drain_args(), BLOCK=16, target="sm_80", num_warps=1).stages["ptx"]
    loop = ptx[ptx.index("$L__BB"):]
    assert "mov.u32 %r" in loop and "%tid.x;" in loop       # the volatile read, inside the loop
