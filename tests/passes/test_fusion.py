"""The fusion pass (passes/fusion/): launches in IR text, the pass, the launches after and the reasons it gave.

A module of functions with `grid` and `bind` attributes is a sequence of launches; `bind` names the buffer
or scalar each parameter receives ("#8" is the scalar 8). Fused and refused cases alike are checked by text.
"""

import numpy as np
import pytest

from tessera.backends.interp import run_function
from tessera.ir.parser import parse_module
from tessera.ir.printer import print_module
from tessera.passes.fusion import fuse_launches, launches_from_module, module_from_launches


def fuse(text: str, live_out=(), aliased=()):
    plan = fuse_launches(launches_from_module(parse_module(text)), frozenset(live_out), frozenset(aliased))
    return plan.report(), print_module(module_from_launches(plan.launches))


def elementwise(name, src, dst, compute="%y = exp %v : tile<4xf32>", load_at="%offs", grid=2, n="#8", extra=""):
    """A 1-D kernel over blocks of 4: y = f(src[offs]) into dst[offs], under offs < n."""
    return f"""\
func @{name}(%src: ptr<f32>, %dst: ptr<f32>, %n: i32) attributes {{bind = ["{src}", "{dst}", "{n}"], grid = [{grid}]}} {{
  %pid = program_id {{axis = 0}} : i32
  %four = constant {{value = 4}} : i32
  %start = mul %pid, %four : i32
  %lanes = arange {{end = 4, start = 0}} : tile<4xi32>
  %base = splat %start : tile<4xi32>
  %offs = add %base, %lanes : tile<4xi32>
  %limit = splat %n : tile<4xi32>
  %mask = cmp %offs, %limit {{pred = "lt"}} : tile<4xbool>
  %one = constant {{value = 1}} : tile<4xi32>
  %next = add %offs, %one : tile<4xi32>
  %ss = splat %src : tile<4xptr<f32>>
  %sp = addptr %ss, {load_at} : tile<4xptr<f32>>
  %v = load %sp, %mask : tile<4xf32>
  {compute}
{extra}  %ds = splat %dst : tile<4xptr<f32>>
  %dp = addptr %ds, %offs : tile<4xptr<f32>>
  store %dp, %y, %mask
  return
}}
"""


def test_a_consumer_reading_the_tiles_its_producer_wrote_is_fused_and_the_intermediate_store_dropped():
    report, after = fuse(elementwise("double", "x", "t", "%y = add %v, %v : tile<4xf32>")
                         + elementwise("exp", "t", "out"))
    assert report == "vertical double -> exp: fused (forwarded t; dropped the store of t)"
    assert after == """\
func @double__exp(%src: ptr<f32>, %dst: ptr<f32>, %n: i32, %dst_1: ptr<f32>) attributes {bind = ["x", "t", "#8", "out"], grid = [2]} {
  %pid = program_id {axis = 0} : i32
  %four = constant {value = 4} : i32
  %start = mul %pid, %four : i32
  %lanes = arange {end = 4, start = 0} : tile<4xi32>
  %base = splat %start : tile<4xi32>
  %offs = add %base, %lanes : tile<4xi32>
  %limit = splat %n : tile<4xi32>
  %mask = cmp %offs, %limit {pred = "lt"} : tile<4xbool>
  %ss = splat %src : tile<4xptr<f32>>
  %sp = addptr %ss, %offs : tile<4xptr<f32>>
  %v = load %sp, %mask : tile<4xf32>
  %y = add %v, %v : tile<4xf32>
  %0 = constant {value = 0.0} : tile<4xf32>
  %1 = select %mask, %y, %0 : tile<4xf32>
  %y_1 = exp %1 : tile<4xf32>
  %ds = splat %dst_1 : tile<4xptr<f32>>
  %dp = addptr %ds, %offs : tile<4xptr<f32>>
  store %dp, %y_1, %mask
  return
}
"""


def test_an_intermediate_still_needed_keeps_its_store():
    report, after = fuse(elementwise("double", "x", "t", "%y = add %v, %v : tile<4xf32>")
                         + elementwise("exp", "t", "out"), live_out={"t"})
    assert report == "vertical double -> exp: fused (forwarded t)"
    assert after.count("store ") == 2


NOT_WHOLE = "as a lane map: double is not known to write all of t (the IR cannot show it)"
NOT_PROVEN = ("the consumer reads t at lanes not proven equal to those the producer stored (a different view, "
              "block, offsets or mask)")
RACE = ("the consumer writes x, which the producer reads at other lanes: a program of the fused kernel could "
        "overwrite what another has yet to read")
REFUSED = {
    "grids differ": (
        elementwise("double", "x", "t", "%y = add %v, %v : tile<4xf32>") + elementwise("exp", "t", "out", grid=3),
        f"vertical double -> exp: not fused (grids differ: (2, 1, 1) vs (3, 1, 1); {NOT_WHOLE})"),
    "a neighbour's lanes": (
        elementwise("double", "x", "t", "%y = add %v, %v : tile<4xf32>")
        + elementwise("exp", "t", "out", load_at="%next"),
        f"vertical double -> exp: not fused ({NOT_PROVEN}; as a lane map: its index is not program_id(0) * BLOCK "
        f"+ arange(0, BLOCK))"),
    "a write-after-read race": (
        elementwise("double", "x", "t", "%y = add %v, %v : tile<4xf32>", load_at="%next")
        + elementwise("exp", "t", "x"),
        f"vertical double -> exp: not fused ({RACE}; as a lane map: it writes a buffer the producer touches)"),
    "nothing in common": (
        elementwise("double", "x", "t", "%y = add %v, %v : tile<4xf32>", load_at="%next")
        + elementwise("copy", "u", "x", "%y = exp %v : tile<4xf32>"),
        f"vertical double -> copy: not fused ({RACE})"),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_unprovable_cases_stay_separate_with_their_reason(case):
    text, reason = REFUSED[case]
    report, after = fuse(text)
    assert report.splitlines()[0] == reason
    assert after.count("func @") == 2 and "horizontal" in report.splitlines()[1]


def test_overlapping_buffers_are_not_fused():
    report, _ = fuse(elementwise("double", "x", "t", "%y = add %v, %v : tile<4xf32>")
                     + elementwise("exp", "t", "out"), aliased={"t", "x"})
    assert report.startswith("vertical double -> exp: not fused (buffer t overlaps another buffer;")


def test_independent_launches_merge_horizontally_with_program_ids_partitioned():
    report, after = fuse(elementwise("a", "x", "y") + elementwise("b", "u", "v", grid=3, n="#12"))
    assert report.splitlines() == [
        "vertical a -> b: not fused (grids differ: (2, 1, 1) vs (3, 1, 1))",
        "horizontal a | b: fused (2 launches -> 1, grid 5)"]
    assert 'grid = [5]' in after and after.count(" = program_id {axis = 0} : i32") == 1
    assert """\
  %7 = constant {value = 5} : i32
  %8 = cmp %0, %2 {pred = "ge"} : bool
  %9 = cmp %0, %7 {pred = "lt"} : bool
  %10 = and %8, %9 : bool
  if %10 {
    %11 = sub %0, %2 : i32
    %four_1 = constant {value = 4} : i32
    %start_1 = mul %11, %four_1 : i32""" in after         # programs 2..4 run b's programs 0..2
    x, u = np.arange(8, dtype=np.float32) / 8, np.arange(12, dtype=np.float32) / 12
    y, v = np.zeros_like(x), np.zeros_like(u)
    launch = fuse_launches(launches_from_module(parse_module(elementwise("a", "x", "y")
                                                             + elementwise("b", "u", "v", grid=3, n="#12"))))
    run_function(launch.launches[0].fn, [x, y, 8, u, v, 12], (5,))
    np.testing.assert_allclose(y, np.exp(x), rtol=1e-6)
    np.testing.assert_allclose(v, np.exp(u), rtol=1e-6)


def test_dependent_launches_do_not_merge_horizontally():
    report, after = fuse(elementwise("a", "x", "t", grid=2) + elementwise("b", "t", "v", grid=2, load_at="%next"))
    assert report.splitlines()[-1] == "horizontal a | b: not fused (not independent: both touch t, and one writes it)"
    assert after.count("func @") == 2


def test_a_lane_map_needs_its_producer_declared_to_write_the_whole_buffer():
    producer = elementwise("a", "x", "t", grid=2).replace("%n: i32", "%n: i32")
    report, _ = fuse(producer + elementwise("b", "t", "v", grid=1, n="#8").replace("value = 4", "value = 8")
                     .replace("end = 4", "end = 8").replace("tile<4x", "tile<8x"))
    assert report.splitlines()[0] == (
        "vertical a -> b: not fused (grids differ: (2, 1, 1) vs (1, 1, 1); as a lane map: a is not known to write "
        "all of t (the IR cannot show it))")
