"""DCE: IR text before and after; real kernels compute the same with no more ops."""

import pytest

from pass_kernels import CASES, run_before_and_after
from tessera.ir.parser import parse_module
from tessera.ir.printer import print_module
from tessera.ir.verifier import verify_module
from tessera.passes.canonicalize import Canonicalize
from tessera.passes.dce import DCE
from tessera.passes.tile_passes import default_tile_passes


def dce(text: str) -> str:
    module = parse_module(text)
    verify_module(module)
    DCE().run(module)
    verify_module(module)
    return print_module(module)


REWRITES = {
    "unused pure ops go, and so do the ops that only fed them": ("""\
func @k(%x: i32, %p: ptr<i32>) {
  %one = constant {value = 1} : i32
  %a = add %x, %one : i32
  %b = mul %a, %a : i32
  %c = sub %b, %one : i32
  %pid = program_id {axis = 0} : i32
  %kept = add %x, %pid : i32
  store %p, %kept
  return
}
""", """\
func @k(%x: i32, %p: ptr<i32>) {
  %pid = program_id {axis = 0} : i32
  %kept = add %x, %pid : i32
  store %p, %kept
  return
}
"""),
    "ops with side effects stay, even with unused results": ("""\
func @k(%p: ptr<f32>, %v: f32) {
  %a = load %p : f32
  %old = atomic_rmw %p, %v {kind = "add"} : f32
  %cas = atomic_cas %p, %v, %v : f32
  %t = constant {value = true} : bool
  assert %t {message = "never"}
  print %v {prefix = "v="}
  store %p, %v
  %i = constant {value = 1} : i32
  %view = make_view %p, %i, %i, %i, %i : view<f32, 2>
  return
}
""", """\
func @k(%p: ptr<f32>, %v: f32) {
  %a = load %p : f32
  %old = atomic_rmw %p, %v {kind = "add"} : f32
  %cas = atomic_cas %p, %v, %v : f32
  %t = constant {value = true} : bool
  assert %t {message = "never"}
  print %v {prefix = "v="}
  store %p, %v
  return
}
"""),
    "dead code inside regions goes; what a region yields stays": ("""\
func @k(%x: i32, %n: i32, %p: ptr<i32>) {
  %zero = constant {value = 0} : i32
  %one = constant {value = 1} : i32
  %r = for %zero, %n, %one, %x : i32 {
  ^(%i: i32, %a: i32):
    %unused = mul %a, %i : i32
    %b = add %a, %i : i32
    yield %b
  }
  store %p, %r
  return
}
""", """\
func @k(%x: i32, %n: i32, %p: ptr<i32>) {
  %zero = constant {value = 0} : i32
  %one = constant {value = 1} : i32
  %r = for %zero, %n, %one, %x : i32 {
  ^(%i: i32, %a: i32):
    %b = add %a, %i : i32
    yield %b
  }
  store %p, %r
  return
}
"""),
    "an if or for that computes only unused values goes": ("""\
func @k(%c: bool, %x: i32, %n: i32) {
  %r = if %c : i32 {
    %a = add %x, %x : i32
    yield %a
  } {
    yield %x
  }
  if %c {
    %b = mul %x, %x : i32
    yield
  } {
    yield
  }
  %zero = constant {value = 0} : i32
  %one = constant {value = 1} : i32
  %s = for %zero, %n, %one, %x : i32 {
  ^(%i: i32, %acc: i32):
    %acc2 = add %acc, %i : i32
    yield %acc2
  }
  return
}
""", """\
func @k(%c: bool, %x: i32, %n: i32) {
  return
}
"""),
    "loops and branches with effects, or not known to finish, stay": ("""\
func @k(%c: bool, %x: i32, %n: i32, %step: i32, %p: ptr<i32>) {
  if %c {
    store %p, %x
    yield
  } {
    yield
  }
  %zero = constant {value = 0} : i32
  %s = for %zero, %n, %step, %x : i32 {
  ^(%i: i32, %acc: i32):
    %acc2 = add %acc, %i : i32
    yield %acc2
  }
  %w = while %x : i32 {
  ^(%a: i32):
    %go = cmp %a, %n {pred = "lt"} : bool
    condition %go, %a
  } {
  ^(%b: i32):
    %unused = mul %b, %b : i32
    %b2 = add %b, %b : i32
    yield %b2
  }
  return
}
""", """\
func @k(%c: bool, %x: i32, %n: i32, %step: i32, %p: ptr<i32>) {
  if %c {
    store %p, %x
    yield
  } {
    yield
  }
  %zero = constant {value = 0} : i32
  %s = for %zero, %n, %step, %x : i32 {
  ^(%i: i32, %acc: i32):
    %acc2 = add %acc, %i : i32
    yield %acc2
  }
  %w = while %x : i32 {
  ^(%a: i32):
    %go = cmp %a, %n {pred = "lt"} : bool
    condition %go, %a
  } {
  ^(%b: i32):
    %b2 = add %b, %b : i32
    yield %b2
  }
  return
}
"""),
    "an unused reduce with a pure combine region goes": ("""\
func @k(%t: tile<8xf32>, %p: ptr<f32>) {
  %a = reduce %t {axis = 0, kind = "custom"} : f32 {
  ^(%x: f32, %y: f32):
    %m = max %x, %y : f32
    yield %m
  }
  %b = reduce %t {axis = 0, kind = "max"} : f32
  store %p, %b
  return
}
""", """\
func @k(%t: tile<8xf32>, %p: ptr<f32>) {
  %b = reduce %t {axis = 0, kind = "max"} : f32
  store %p, %b
  return
}
"""),
}


@pytest.mark.parametrize("name", REWRITES)
def test_rewrite(name):
    before, after = REWRITES[name]
    assert dce(before) == after


@pytest.mark.parametrize("name", REWRITES)
def test_dce_is_idempotent(name):
    _, after = REWRITES[name]
    assert dce(after) == after


def test_dce_cleans_up_after_canonicalize():
    module = parse_module("""\
func @k(%p: ptr<i32>) {
  %two = constant {value = 2} : i32
  %three = constant {value = 3} : i32
  %five = add %two, %three : i32
  store %p, %five
  return
}
""")
    Canonicalize().run(module)
    DCE().run(module)
    assert print_module(module) == """\
func @k(%p: ptr<i32>) {
  %five = constant {value = 5} : i32
  store %p, %five
  return
}
"""


@pytest.mark.parametrize("case", CASES)
def test_kernels_compute_the_same_with_no_more_ops(case):
    before, after = run_before_and_after(CASES[case], [DCE()])
    assert after <= before


@pytest.mark.parametrize("case", CASES)
def test_default_pipeline_computes_the_same_with_fewer_ops(case):
    before, after = run_before_and_after(CASES[case], default_tile_passes())
    assert after <= before
