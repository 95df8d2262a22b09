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


@tessera.kernel
def two_products(a_ptr, b_ptr, c_ptr, x_ptr, y_ptr, N, BM: tessera.constexpr, BK: tessera.constexpr,
                 BN: tessera.constexpr):
    """x = sum over column blocks k of exp2(A B_k / 8), y = the halving chain y = (y + A C_k) / 2: the two dots
    of a step are independent, and each result is first read after the other dot is issued."""
    a = tessera.view(a_ptr, (BM, BK), (BK, 1)).block((BM, BK), (0, 0)).load()
    b = tessera.view(b_ptr, (BK, N), (N, 1))
    c = tessera.view(c_ptr, (BK, N), (N, 1))
    x = tessera.zeros((BM, BN), tessera.f32)
    y = tessera.zeros((BM, BN), tessera.f32)
    for k in tessera.pipeline(0, N // BN, stages=2):
        s = tessera.dot(a, b.block((BK, BN), (0, k)).load())
        y = tessera.dot(a, c.block((BK, BN), (0, k)).load(), y)
        x = x + tessera.exp2(s * 0.125)
        y = y * 0.5
    tessera.view(x_ptr, (BM, BN), (BN, 1)).block((BM, BN), (0, 0)).store(x)
    tessera.view(y_ptr, (BM, BN), (BN, 1)).block((BM, BN), (0, 0)).store(y)


def test_two_independent_dots_overlap_on_the_simulator():
    """Lowered for sm_90a (one warpgroup, K and V-like blocks by TMA), the loop waits for the first product with
    the second in flight (pending = 1) and for the second before its first read (pending = 0); the SIMT
    simulator, which rejects early reads and operands overwritten in flight, computes what the tile
    interpreter computes."""
    from tessera.backends.interp import run_function
    from tessera.backends.simt import run_threads
    from tessera.passes.thread_passes import lower

    rng = np.random.default_rng(0)
    BM, BK, BN, N = 64, 32, 32, 96
    a, b, c = (rng.standard_normal(shape).astype(np.float16) for shape in ((BM, BK), (BK, N), (BK, N)))
    expected = [a, b, c, np.zeros((BM, BN), np.float32), np.zeros((BM, BN), np.float32), N]
    actual = [x.copy() if isinstance(x, np.ndarray) else x for x in expected]
    module = two_products.specialize(*expected, BM=BM, BK=BK, BN=BN).module
    run_function(module.functions[0], expected, (1,))
    fn = lower(module, "sm_90a", num_warps=4).functions[0]
    loop = next(op for op in fn.walk() if op.name == "for" and any(o.name == "wgmma" for o in op.walk()))
    body = [op.name + (f" {op.attrs['pending']}" if op.name == "wgmma_wait" else "") for op in loop.regions[0].ops
            if op.name.startswith("wgmma_") and op.name != "wgmma_desc"]
    assert body == ["wgmma_fence", "wgmma_commit", "wgmma_fence", "wgmma_commit", "wgmma_wait 1", "wgmma_wait 0"]
    run_threads(fn, actual, (1,))
    for want, got in zip(expected[3:5], actual[3:5]):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    assert not np.allclose(expected[3], 0) and not np.allclose(expected[4], 0)


LOOP = """\
func @loop(%sa: ptr<bf16, shared>, %out: ptr<f32>, %n: i32) attributes {{num_threads = 128}} {{
  %0 = constant {{value = 0.0}} : f32
  %c0 = constant {{value = 0}} : i32
  %c1 = constant {{value = 1}} : i32
  %z = splat %0 : regs<32xf32>
  %d = wgmma_desc %sa {{lbo = 16, sbo = 1024, swizzle = 128}} : i64
  %r = for %c0, %n, %c1, %z : regs<32xf32> {{
  ^(%i: i32, %y: regs<32xf32>):
    wgmma_fence
    %x = wgmma %d, %d, %z {{dtype = "bf16", k = 16, m = 64, n = 64}} : regs<32xf32>
    wgmma_commit
{first_wait}    %h = mul %y, %y : regs<32xf32>
    wgmma_fence
    %y2 = wgmma %d, %d, %h {{dtype = "bf16", k = 16, m = 64, n = 64}} : regs<32xf32>
    wgmma_commit
{second_wait}    %e = exp2 %x : regs<32xf32>
    yield %y2
  }}
  %o = extract %r {{index = 0}} : f32
  store %out, %o
  return
}}
"""


def test_a_carried_result_waited_for_in_the_body_is_not_in_flight():
    """The loop yields the second product, waited for (pending = 0) before the yield: at the top of the next
    iteration the carried value is ready, so the first wait passes its read and the second dot's issue."""
    before = LOOP.format(first_wait="    wgmma_wait {pending = 0}\n", second_wait="    wgmma_wait {pending = 0}\n")
    after = LOOP.format(first_wait="", second_wait="    wgmma_wait {pending = 1}\n").replace(
        "    yield %y2", "    wgmma_wait {pending = 0}\n    yield %y2")
    assert deferred(before) == (canonical(after), 2)


def test_a_carried_result_left_in_flight_is_waited_for_before_its_read():
    """A loop that keeps the second product's group in flight (pending = 1 after it, as a pipelined K loop
    does): the carried value may be in flight at the top of the body, so the first wait stays before its read."""
    before = LOOP.format(first_wait="    wgmma_wait {pending = 0}\n", second_wait="    wgmma_wait {pending = 1}\n")
    assert deferred(before) == (canonical(before), 0)


def test_the_depth_one_wait_reaches_the_ptx_and_the_sass():
    """Compiled for sm_90a, the loop's PTX holds `wgmma.wait_group.sync.aligned 1` and ptxas keeps a
    `WARPGROUP.DEPBAR.LE gsb0, 0x1` in the SASS loop (it would serialize the wgmmas of an ill-formed pipeline,
    one depth-0 wait after each, and say so in its log)."""
    import re

    from tessera.backends.nvptx import find_ptxas
    from tessera.backends.nvptx.sass import disassemble, find_cuobjdump, loop_containing
    if find_ptxas() is None:
        pytest.skip("ptxas not installed")
    compiled = two_products.compile(target="sm_90a", signature="*f16:16,*f16:16,*f16:16,*f32:16,*f32:16,i32:16",
                                    BM=64, BK=32, BN=32, num_warps=4)
    ptx = compiled.stages["ptx"]
    assert [int(n) for n in re.findall(r"wgmma\.wait_group\.sync\.aligned\s+(\d+);", ptx)].count(1) == 1
    assert "serialized" not in compiled.metadata["log"]
    if find_cuobjdump() is None or compiled.binary is None:
        return
    loop = loop_containing(disassemble(compiled.binary), "HGMMA")
    assert [i.text.split()[-1] for i in loop if "WARPGROUP.DEPBAR" in i.text] == ["0x1", "0x0"]


def test_a_wait_in_a_region_stays_before_a_read_of_a_product_issued_outside_it():
    """A group issued before an `if` and waited for inside it: the region's wait stays before the read."""
    text = HEAD + FIRST_DOT + """\
  %t = constant {value = true} : bool
  %s = if %t : regs<32xf32> {
    wgmma_wait {pending = 0}
    %c = add %0, %0 : f32
    %e = exp2 %x : regs<32xf32>
    yield %e
  } {
    wgmma_wait {pending = 0}
    yield %z
  }
""" + TAIL
    out, moved = deferred(text)
    assert moved == 1 and out.index("wgmma_wait {pending = 0}\n    %e = exp2 %x") > 0, out
