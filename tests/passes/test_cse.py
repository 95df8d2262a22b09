"""CSE: IR text before and after; real kernels compute the same with fewer ops."""

import pytest

from pass_kernels import CASES, run_before_and_after, traced
from tessera.ir.parser import parse_module
from tessera.ir.printer import print_module
from tessera.ir.verifier import verify_module
from tessera.passes.cse import CSE


def cse(text: str) -> str:
    module = parse_module(text)
    verify_module(module)
    CSE().run(module)
    verify_module(module)
    return print_module(module)


REWRITES = {
    "identical pure ops merge, and merging exposes more": ("""\
func @k(%x: i32) {
  %c16 = constant {value = 16} : i32
  %c16_1 = constant {value = 16} : i32
  %pid = program_id {axis = 0} : i32
  %pid_1 = program_id {axis = 0} : i32
  %a = mul %pid, %c16 : i32
  %b = mul %pid_1, %c16_1 : i32
  %s = add %a, %x : i32
  %t = add %b, %x : i32
  print %s, %t {prefix = ""}
  return
}
""", """\
func @k(%x: i32) {
  %c16 = constant {value = 16} : i32
  %pid = program_id {axis = 0} : i32
  %a = mul %pid, %c16 : i32
  %s = add %a, %x : i32
  print %s, %s {prefix = ""}
  return
}
"""),
    "names, attributes, result types and operand order must all match": ("""\
func @k(%x: i32, %y: i32, %t: tile<4x8xf32>) {
  %a = add %x, %y : i32
  %b = add %y, %x : i32
  %c = sub %x, %y : i32
  %d = cmp %x, %y {pred = "lt"} : bool
  %e = cmp %x, %y {pred = "le"} : bool
  %f = cast %x : f32
  %g = cast %x : f16
  %p = permute %t {order = [1, 0]} : tile<8x4xf32>
  %r = reshape %t : tile<8x4xf32>
  print %a, %b, %c, %d, %e, %f, %g, %p, %r {prefix = ""}
  return
}
""", """\
func @k(%x: i32, %y: i32, %t: tile<4x8xf32>) {
  %a = add %x, %y : i32
  %b = add %y, %x : i32
  %c = sub %x, %y : i32
  %d = cmp %x, %y {pred = "lt"} : bool
  %e = cmp %x, %y {pred = "le"} : bool
  %f = cast %x : f32
  %g = cast %x : f16
  %p = permute %t {order = [1, 0]} : tile<8x4xf32>
  %r = reshape %t : tile<8x4xf32>
  print %a, %b, %c, %d, %e, %f, %g, %p, %r {prefix = ""}
  return
}
"""),
    "constants merge by the value their dtype holds": ("""\
func @k() {
  %one = constant {value = 1} : f32
  %one_1 = constant {value = 1.0} : f32
  %zero = constant {value = 0.0} : f32
  %minus_zero = constant {value = -0.0} : f32
  %nan = constant {value = nan} : f32
  %nan_1 = constant {value = nan} : f32
  %tenth = constant {value = 0.1} : f16
  %tenth_1 = constant {value = 0.09999} : f16
  %tile = constant {value = 1.0} : tile<4xf32>
  %int = constant {value = 1} : i32
  print %one, %one_1, %zero, %minus_zero, %nan, %nan_1, %tenth, %tenth_1, %tile, %int {prefix = ""}
  return
}
""", """\
func @k() {
  %one = constant {value = 1} : f32
  %zero = constant {value = 0.0} : f32
  %minus_zero = constant {value = -0.0} : f32
  %nan = constant {value = nan} : f32
  %tenth = constant {value = 0.1} : f16
  %tile = constant {value = 1.0} : tile<4xf32>
  %int = constant {value = 1} : i32
  print %one, %one, %zero, %minus_zero, %nan, %nan, %tenth, %tenth, %tile, %int {prefix = ""}
  return
}
"""),
    "ops with side effects never merge; loads may fault or see stores": ("""\
func @k(%p: ptr<f32>, %v: f32) {
  %a = load %p : f32
  store %p, %v
  %b = load %p : f32
  %c = load %p : f32
  %o = atomic_rmw %p, %v {kind = "add"} : f32
  %o_1 = atomic_rmw %p, %v {kind = "add"} : f32
  print %a, %b, %c, %o, %o_1 {prefix = ""}
  print %a, %b, %c, %o, %o_1 {prefix = ""}
  return
}
""", """\
func @k(%p: ptr<f32>, %v: f32) {
  %a = load %p : f32
  store %p, %v
  %b = load %p : f32
  %c = load %p : f32
  %o = atomic_rmw %p, %v {kind = "add"} : f32
  %o_1 = atomic_rmw %p, %v {kind = "add"} : f32
  print %a, %b, %c, %o, %o_1 {prefix = ""}
  print %a, %b, %c, %o, %o_1 {prefix = ""}
  return
}
"""),
    "a region reuses values from enclosing scopes, never the other way": ("""\
func @k(%x: i32, %n: i32) {
  %zero = constant {value = 0} : i32
  %one = constant {value = 1} : i32
  %r = for %zero, %n, %one, %x : i32 {
  ^(%i: i32, %a: i32):
    %one_1 = constant {value = 1} : i32
    %b = add %a, %one_1 : i32
    %two = constant {value = 2} : i32
    %two_1 = constant {value = 2} : i32
    %c = mul %b, %two_1 : i32
    %xx = add %x, %x : i32
    %d = add %c, %xx : i32
    %e = add %d, %two : i32
    yield %e
  }
  %two_2 = constant {value = 2} : i32
  %xx_1 = add %x, %x : i32
  %f = add %r, %two_2 : i32
  print %f, %xx_1 {prefix = ""}
  return
}
""", """\
func @k(%x: i32, %n: i32) {
  %zero = constant {value = 0} : i32
  %one = constant {value = 1} : i32
  %r = for %zero, %n, %one, %x : i32 {
  ^(%i: i32, %a: i32):
    %b = add %a, %one : i32
    %two = constant {value = 2} : i32
    %c = mul %b, %two : i32
    %xx = add %x, %x : i32
    %d = add %c, %xx : i32
    %e = add %d, %two : i32
    yield %e
  }
  %two_2 = constant {value = 2} : i32
  %xx_1 = add %x, %x : i32
  %f = add %r, %two_2 : i32
  print %f, %xx_1 {prefix = ""}
  return
}
"""),
    "sibling regions do not share values": ("""\
func @k(%c: bool, %x: i32) {
  %r = if %c : i32 {
    %a = add %x, %x : i32
    yield %a
  } {
    %b = add %x, %x : i32
    yield %b
  }
  print %r {prefix = ""}
  return
}
""", """\
func @k(%c: bool, %x: i32) {
  %r = if %c : i32 {
    %a = add %x, %x : i32
    yield %a
  } {
    %b = add %x, %x : i32
    yield %b
  }
  print %r {prefix = ""}
  return
}
"""),
    "ops with regions are not merged, but their insides are": ("""\
func @k(%t: tile<8xf32>) {
  %a = reduce %t {axis = 0, kind = "custom"} : f32 {
  ^(%p: f32, %q: f32):
    %m = max %p, %q : f32
    %m_1 = max %p, %q : f32
    %s = add %m, %m_1 : f32
    yield %s
  }
  %b = reduce %t {axis = 0, kind = "custom"} : f32 {
  ^(%p_1: f32, %q_1: f32):
    %m_2 = max %p_1, %q_1 : f32
    yield %m_2
  }
  %c = reduce %t {axis = 0, kind = "sum"} : f32
  %d = reduce %t {axis = 0, kind = "sum"} : f32
  print %a, %b, %c, %d {prefix = ""}
  return
}
""", """\
func @k(%t: tile<8xf32>) {
  %a = reduce %t {axis = 0, kind = "custom"} : f32 {
  ^(%p: f32, %q: f32):
    %m = max %p, %q : f32
    %s = add %m, %m : f32
    yield %s
  }
  %b = reduce %t {axis = 0, kind = "custom"} : f32 {
  ^(%p_1: f32, %q_1: f32):
    %m_2 = max %p_1, %q_1 : f32
    yield %m_2
  }
  %c = reduce %t {axis = 0, kind = "sum"} : f32
  print %a, %b, %c, %c {prefix = ""}
  return
}
"""),
}


@pytest.mark.parametrize("name", REWRITES)
def test_rewrite(name):
    before, after = REWRITES[name]
    assert cse(before) == after


@pytest.mark.parametrize("name", REWRITES)
def test_cse_is_idempotent(name):
    _, after = REWRITES[name]
    assert cse(after) == after


@pytest.mark.parametrize("case", CASES)
def test_kernels_compute_the_same_with_no_more_ops(case):
    before, after = run_before_and_after(CASES[case], [CSE()])
    assert after <= before


def test_the_frontend_repeats_constants_that_cse_merges():
    module = traced(CASES["matmul"])
    constants = lambda: sum(op.name == "constant" for op in module.functions[0].walk())  # noqa: E731
    before = constants()
    CSE().run(module)
    assert constants() < before
