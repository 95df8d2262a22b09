"""The verifier rejects malformed IR with a message that names the function,
the op, its location and what is wrong: one test per kind of mistake."""

import pytest

from tessera.ir import dtypes as dt
from tessera.ir.builder import Builder
from tessera.ir.core import Location, Module, Operation
from tessera.ir.errors import VerifyError
from tessera.ir.parser import parse_module
from tessera.ir.types import ScalarType
from tessera.ir.verifier import verify_function, verify_module

F32 = ScalarType(dt.f32)


def verify_error(text: str) -> str:
    """The VerifyError message for IR `text` (which must parse)."""
    with pytest.raises(VerifyError) as err:
        verify_module(parse_module(text))
    return str(err.value)


def kernel(*body: str, args: str = "%x: f32, %y: f32, %i: i32, %b: bool") -> str:
    return f"func @k({args}) {{\n" + "".join(f"  {line}\n" for line in body) + "}\n"


def test_message_names_function_op_and_location():
    b = Builder()
    fn = b.function("k", [F32, F32], ["x", "y"])
    b.loc = Location("kernel.py", 7, 12)
    b.create("add", fn.args, result_names=["s"])
    b.create("return")
    fn.body.ops[0].results[0].type = ScalarType(dt.f16)
    message = str(pytest.raises(VerifyError, verify_function, fn).value)
    assert message == "@k: `%s = add %x, %y : f16` at kernel.py:7:12: add must produce (f32), not (f16)"


@pytest.mark.parametrize("line, message", [
    ("%s = add %x : f32", "add takes 2 operands, got 1"),
    ("%p = program_id : i32", "program_id needs attribute 'axis'"),
    ("%p = program_id {axis = 0, color = 1} : i32", "program_id has no attribute 'color'"),
    ("%p = program_id {axis = 1.0} : i32", "program_id attribute 'axis' must be int, got 1.0"),
    ("%p = program_id {axis = 3} : i32", "axis must be 0, 1 or 2, got 3"),
    ("%s = add %x, %i : f32", "arithmetic operands must have the same type, got f32, i32"),
    ("%s = add %x, %y : f16", "add must produce (f32), not (f16)"),
    ("%c = cmp %x, %y {pred = \"less\"} : bool", "cmp predicate must be one of"),
    ("%c = constant {value = 300} : i8", "constant 300 does not fit in i8"),
    ("%c = constant {value = 1.5} : i32", "integer constant needs an int value, got 1.5"),
    ("%s = select %i, %x, %y : f32", "select condition must be bool"),
])
def test_op_definition_and_type_rule_violations(line, message):
    assert message in verify_error(kernel(line, "return"))


def test_bad_broadcast():
    text = kernel("%w = broadcast %t : tile<64x32xf32>", "return", args="%t: tile<2x32xf32>")
    assert "cannot broadcast shape (2, 32) to (64, 32)" in verify_error(text)


def test_tile_dimensions_must_be_powers_of_two():
    assert "argument %t: tile<48xf32> has dimension 48, which is not a power of two: pad it to 64 and mask" \
        in verify_error(kernel("return", args="%t: tile<48xf32>"))
    assert "result %r: tile<3xi32> has dimension 3" in verify_error(kernel("%r = arange {end = 3, start = 0} : tile<3xi32>", "return"))
    assert "has dimension 0" in verify_error(kernel("return", args="%t: tile<0x4xf32>"))


def test_use_before_definition():
    module = parse_module(kernel("%s = add %x, %y : f32", "%t = mul %s, %s : f32", "return"))
    ops = module.functions[0].body.ops
    ops[0], ops[1] = ops[1], ops[0]
    with pytest.raises(VerifyError, match="`%t = mul %s, %s : f32`: %s is used before it is defined"):
        verify_module(module)


def test_values_defined_in_a_region_do_not_escape_it():
    text = kernel(
        "%r = if %b : f32 {",
        "  %inner = add %x, %y : f32",
        "  yield %inner",
        "} {",
        "  yield %x",
        "}",
        "%out = mul %inner, %r : f32",
        "return")
    assert "%inner is used outside the region that defines it" in verify_error(text)


def test_value_from_another_function():
    module = parse_module(kernel("return") + "\n" + kernel("return").replace("@k", "@g"))
    k, g = module.functions
    g.body.ops.insert(0, Operation("neg", [k.args[0]], [F32]))
    g.body.ops[0].parent = g.body
    with pytest.raises(VerifyError, match="@g: .* is not defined in @g"):
        verify_module(module)


def test_region_without_terminator():
    text = kernel("for %i, %i, %i {", "^(%j: i32):", "  %z = add %j, %j : i32", "}", "return")
    assert "missing terminator: nothing ends the body of `for`; it must end with `yield`" in verify_error(text)


def test_empty_region():
    assert "the then region of `if` is empty; it must end with `yield`" \
        in verify_error(kernel("if %b {", "} {", "  yield", "}", "return"))


def test_function_must_end_with_return():
    assert "nothing ends the body of @k; it must end with `return`" in verify_error(kernel("%s = add %x, %y : f32"))
    assert "the function body is empty" in verify_error(kernel())


def test_yield_in_the_function_body():
    assert "`yield` cannot end the body of @k; it must end with `return`" in verify_error(kernel("yield"))


def test_terminators_only_at_the_end():
    assert "`return` is a terminator but ops follow it" in verify_error(kernel("return", "return"))


def test_return_inside_a_loop():
    text = kernel("for %i, %i, %i {", "^(%j: i32):", "  return", "}", "return")
    assert "`return` cannot end the body of `for`; it must end with `yield`" in verify_error(text)


def test_while_condition_region_ends_with_condition_and_body_with_yield():
    cond_in_body = kernel(
        "%r = while %i : i32 {", "^(%k: i32):", "  condition %b, %k",
        "} {", "^(%k_1: i32):", "  condition %b, %k_1", "}", "return")
    assert "`condition` cannot end the body of `while`; it must end with `yield`" in verify_error(cond_in_body)
    yield_in_cond = kernel(
        "%r = while %i : i32 {", "^(%k: i32):", "  yield %k",
        "} {", "^(%k_1: i32):", "  yield %k_1", "}", "return")
    assert "`yield` cannot end the condition region of `while`; it must end with `condition`" \
        in verify_error(yield_in_cond)


def test_for_body_must_yield_the_carried_types():
    text = kernel("%r = for %i, %i, %i, %x : f32 {", "^(%j: i32, %a: f32):", "  yield %j", "}", "return")
    assert "for body must yield the carried values' types" in verify_error(text)


def test_if_branches_must_yield_the_same_types():
    text = kernel("%r = if %b : f32 {", "  yield %x", "} {", "  yield %i", "}", "return")
    assert "if else region must yield (f32)" in verify_error(text)


def test_custom_reduce_region_signature():
    text = kernel(
        "%r = reduce %t {axis = 0, kind = \"custom\"} : f32 {", "^(%a: f32):", "  yield %a", "}", "return",
        args="%t: tile<8xf32>")
    assert "combine region must take two f32 arguments, got (f32)" in verify_error(text)


def test_unknown_op():
    module = parse_module(kernel("%s = add %x, %y : f32", "return"))
    module.functions[0].body.ops[0].name = "frobnicate"
    with pytest.raises(VerifyError, match="unknown op 'frobnicate'"):
        verify_module(module)


def test_function_names_are_unique():
    module = parse_module(kernel("return"))
    module.functions.append(module.functions[0])
    with pytest.raises(VerifyError, match="function @k is defined twice"):
        verify_module(module)


def test_well_formed_module_passes():
    verify_module(parse_module(kernel("%s = add %x, %y : f32", "return")))
    verify_module(Module())
