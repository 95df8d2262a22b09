"""rematerialize_index: thread-index math used inside `while` loops (or an `if` holding a loop after a loop) is
recomputed there, from a reread thread id.

Specification: every use inside a `while` (condition or body, at any depth) of a value the prologue computes
from `thread_id` gets a clone of its chain in the user's block, from `thread_id {reread = true}`, shared by
the block's later users; so does every use in a top-level `if` that holds a loop and follows a loop (or an op
holding one), while an `if` of straight-line code keeps the prologue's values (MoE's align_kernel); other uses
outside `while` loops, and uses inside other loops, keep the prologue's value; the rewritten kernel computes the
same; on NVIDIA the reread is a volatile %tid.x inside the loop.
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


IF_AFTER_LOOP = """\
func @merge(%out: ptr<i32>, %n: i32, %c: bool) attributes {num_threads = 32, warp_size = 32} {
  %0 = thread_id : i32
  %1 = constant {value = 15} : i32
  %lane = and %0, %1 : i32
  %2 = constant {value = 4} : i32
  %group = shr %0, %2 : i32
  %row = add %group, %1 : i32
  %zero = constant {value = 0} : i32
  %r = for %zero, %n, %2, %n : i32 {
  ^(%i: i32, %k: i32):
    %3 = sub %k, %lane : i32
    yield %3
  }
  if %c {
    %s = for %zero, %n, %2, %r : i32 {
    ^(%j: i32, %a: i32):
      %4 = add %a, %lane : i32
      %5 = add %4, %row : i32
      yield %5
    }
    store %out, %s
    yield
  } {
    yield
  }
  return
}
"""

IF_AFTER_LOOP_REWRITTEN = """\
func @merge(%out: ptr<i32>, %n: i32, %c: bool) attributes {num_threads = 32, warp_size = 32} {
  %0 = thread_id : i32
  %1 = constant {value = 15} : i32
  %lane = and %0, %1 : i32
  %2 = constant {value = 4} : i32
  %zero = constant {value = 0} : i32
  %r = for %zero, %n, %2, %n : i32 {
  ^(%i: i32, %k: i32):
    %3 = sub %k, %lane : i32
    yield %3
  }
  if %c {
    %s = for %zero, %n, %2, %r : i32 {
    ^(%j: i32, %a: i32):
      %4 = thread_id {reread = true} : i32
      %5 = and %4, %1 : i32
      %6 = add %a, %5 : i32
      %7 = shr %4, %2 : i32
      %8 = add %7, %1 : i32
      %9 = add %6, %8 : i32
      yield %9
    }
    store %out, %s
    yield
  } {
    yield
  }
  return
}
"""


def test_an_if_holding_a_loop_after_a_loop_recomputes_the_index_math_it_uses():
    """%row (and %group under it) is used only in the `if`: hoisted, it would be live through the first loop;
    %lane is used in that loop too, and would stay live past it through the `if`'s loop. The `if`'s loop body
    gets both chains from one reread; the first loop keeps the prologue's %lane."""
    module = parse_module(IF_AFTER_LOOP)
    assert rematerialize_thread_index(module.functions[0]) == 2
    dce_function(module.functions[0])
    verify_module(module)
    assert print_module(module) == IF_AFTER_LOOP_REWRITTEN


def straight_if() -> str:
    """IF_AFTER_LOOP with the `if`'s loop unrolled once: straight-line code (MoE align_kernel's `if chunk == 0`)."""
    start, end = IF_AFTER_LOOP.index("    %s = for"), IF_AFTER_LOOP.index("    store %out, %s")
    return (IF_AFTER_LOOP[:start] + "    %4 = add %r, %lane : i32\n    %s = add %4, %row : i32\n"
            + IF_AFTER_LOOP[end:])


def test_an_if_of_straight_line_code_after_a_loop_keeps_the_hoisted_values():
    """Recomputed there, the chain from a volatile reread adds registers where the `if` uses them: MoE's
    align_kernel spilled 4 bytes on sm_80 (128 experts) so."""
    module = parse_module(straight_if())
    assert rematerialize_thread_index(module.functions[0]) == 0
    assert print_module(module) == print_module(parse_module(straight_if()))


def test_an_if_before_any_loop_keeps_the_hoisted_values():
    """Nothing is live across a loop before the first loop: the `if` moved ahead of it is left alone."""
    loop_start = IF_AFTER_LOOP.index("  %r = for")
    if_start = IF_AFTER_LOOP.index("  if %c")
    if_end = IF_AFTER_LOOP.index("  return")
    moved_if = IF_AFTER_LOOP[if_start:if_end].replace("%zero, %n, %2, %r", "%zero, %n, %2, %n")
    text = IF_AFTER_LOOP[:loop_start] + moved_if + IF_AFTER_LOOP[loop_start:if_start] + IF_AFTER_LOOP[if_end:]
    module = parse_module(text)
    assert rematerialize_thread_index(module.functions[0]) == 0
    assert print_module(module) == print_module(parse_module(text))


def test_an_if_after_an_if_holding_a_loop_is_rewritten_too():
    """The unified-max decode kernel's merge follows the fallback's `if` around a key loop: a loop all the same."""
    first_loop = "  %r = for %zero, %n, %2, %n : i32 {"
    text = IF_AFTER_LOOP.replace(first_loop, "  if %c {\n" + first_loop)
    text = text.replace("    yield %3\n  }\n", "    yield %3\n  }\n  store %out, %r\n  yield\n  } {\n  yield\n  }\n")
    text = text.replace("%zero, %n, %2, %r", "%zero, %n, %2, %n")
    module = parse_module(text)
    assert rematerialize_thread_index(module.functions[0]) == 2
    inner_loop = module.functions[0].body.ops[-2].regions[0].ops[0]
    assert inner_loop.name == "for"
    assert [op.name for op in inner_loop.regions[0].ops[:2]] == ["thread_id", "and"]
    assert inner_loop.regions[0].ops[0].attrs["reread"]


def test_the_rewritten_if_computes_the_same_on_the_simt_simulator():
    module = parse_module(IF_AFTER_LOOP)
    expected = [np.zeros(1, np.int32), 7, True]
    run_threads(module.functions[0], expected, (1,))
    rematerialize_thread_index(module.functions[0])
    dce_function(module.functions[0])
    actual = [np.zeros(1, np.int32), 7, True]
    run_threads(module.functions[0], actual, (1,))
    np.testing.assert_array_equal(actual[0], expected[0])
