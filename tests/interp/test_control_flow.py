"""for / if / while / return, and the debugging ops print, assert and breakpoint."""

import sys

import numpy as np
import pytest

from tessera.backends.interp import InterpreterError, run_function
from tessera.ir import dtypes as dt
from tessera.ir.core import Block

from interp_kernels import const, load_value, new_kernel, ptr, scalar, store_value, tile

I32, F32 = scalar(dt.i32), scalar(dt.f32)


def for_loop(b, lb, ub, step, inits, body):
    """Build `for iv in range(lb, ub, step)` carrying `inits`; body(b, iv, *carried) -> new carried."""
    region = Block([lb.type, *[v.type for v in inits]], ["iv"])
    with b.at(region):
        b.create("yield", body(b, *region.args))
    return b.create("for", [lb, ub, step, *inits], result_types=[v.type for v in inits], regions=[region]).results


def range_sum_kernel(iv_dtype=dt.i32):
    """out[0] = sum(range(lb, ub, step)) as f32, out[1] = the number of iterations."""
    t = scalar(iv_dtype)
    b, fn = new_kernel(("out", ptr(dt.f32)), ("lb", t), ("ub", t), ("step", t))
    out, lb, ub, step = fn.args

    def body(b, iv, total, count):
        iv_f = b.create("cast", [iv], result_types=[F32]).result
        return [b.create("add", [total, iv_f]).result, b.create("add", [count, const(b, 1.0, F32)]).result]

    total, count = for_loop(b, lb, ub, step, [const(b, 0.0, F32), const(b, 0.0, F32)], body)
    b.create("store", [out, total])
    b.create("store", [b.create("addptr", [out, const(b, 1, I32)]).result, count])
    b.create("return")
    return fn


@pytest.mark.parametrize("lb, ub, step", [(0, 10, 1), (3, 20, 4), (10, 0, -3), (5, 5, 1), (5, 0, 1), (-4, 4, 3)])
def test_for_runs_like_pythons_range(lb, ub, step):
    out = np.zeros(2, np.float32)
    run_function(range_sum_kernel(), [out, lb, ub, step], grid=1)
    assert out.tolist() == [sum(range(lb, ub, step)), len(range(lb, ub, step))]


def test_for_induction_variable_has_the_bounds_type():
    out = np.zeros(2, np.float32)
    run_function(range_sum_kernel(dt.i64), [out, 2**40, 2**40 + 3, 1], grid=1)
    assert out.tolist() == [np.float32(3 * 2**40 + 3), 3.0]


def test_for_with_a_zero_step_is_an_error():
    with pytest.raises(InterpreterError, match=r"kernel.py:7:5: .*op 'for': for loop step is 0"):
        run_function(range_sum_kernel(), [np.zeros(2, np.float32), 0, 4, 0], grid=1)


def test_for_carries_tiles():
    """acc = acc * 2 + arange, three times."""
    b, fn = new_kernel(("out", ptr(dt.i32)))
    lanes = b.create("arange", attrs={"start": 0, "end": 4}).result
    two = const(b, 2, tile(dt.i32, 4))
    (acc,) = for_loop(b, const(b, 0, I32), const(b, 3, I32), const(b, 1, I32), [const(b, 1, tile(dt.i32, 4))],
                      lambda b, iv, acc: [b.create("add", [b.create("mul", [acc, two]).result, lanes]).result])
    store_value(b, fn.args[0], acc)
    b.create("return")
    out = np.zeros(4, np.int32)
    run_function(fn, [out], grid=1)
    expected = np.ones(4, np.int32)
    for _ in range(3):
        expected = expected * 2 + np.arange(4)
    assert out.tolist() == expected.tolist()


def if_else(b, cond, then_values, else_values):
    then_region, else_region = Block(), Block()
    with b.at(then_region):
        b.create("yield", then_values(b))
    with b.at(else_region):
        b.create("yield", else_values(b))
    types = [v.type for v in then_region.terminator.operands]
    return b.create("if", [cond], result_types=types, regions=[then_region, else_region]).results


def test_if_yields_the_taken_branch():
    b, fn = new_kernel(("out", ptr(dt.f32)), ("x", F32))
    out, x = fn.args
    positive = b.create("cmp", [x, const(b, 0.0, F32)], attrs={"pred": "gt"}).result
    (y,) = if_else(b, positive, lambda b: [b.create("sqrt", [x]).result], lambda b: [b.create("neg", [x]).result])
    b.create("store", [out, y])
    b.create("return")
    for x_value, expected in ((16.0, 4.0), (-3.0, 3.0)):
        result = np.zeros(1, np.float32)
        run_function(fn, [result, x_value], grid=1)
        assert result.tolist() == [expected]


def test_while_loops_until_the_condition_is_false():
    """gcd(a, b) by Euclid: while b != 0: a, b = b, a % b."""
    b, fn = new_kernel(("out", ptr(dt.i32)), ("a", I32), ("b", I32))
    out, a0, b0 = fn.args
    before, after = Block([I32, I32], ["a", "b"]), Block([I32, I32], ["a", "b"])
    with b.at(before):
        a, c = before.args
        keep_going = b.create("cmp", [c, const(b, 0, I32)], attrs={"pred": "ne"}).result
        b.create("condition", [keep_going, a, c], result_types=[])
    with b.at(after):
        a, c = after.args
        b.create("yield", [c, b.create("rem", [a, c]).result])
    gcd, _ = b.create("while", [a0, b0], result_types=[I32, I32], regions=[before, after]).results
    b.create("store", [out, gcd])
    b.create("return")
    result = np.zeros(1, np.int32)
    run_function(fn, [result, 1071, 462], grid=1)
    assert result.tolist() == [21]


def test_return_inside_an_if_ends_the_program():
    """if pid == 1: return; then store 1 at out[pid]."""
    b, fn = new_kernel(("out", ptr(dt.i32)))
    pid = b.create("program_id", attrs={"axis": 0}).result
    is_one = b.create("cmp", [pid, const(b, 1, I32)], attrs={"pred": "eq"}).result
    then_region, else_region = Block(), Block()
    with b.at(then_region):
        b.create("return")
    with b.at(else_region):
        b.create("yield")
    b.create("if", [is_one], result_types=[], regions=[then_region, else_region])
    b.create("store", [b.create("addptr", [fn.args[0], pid]).result, const(b, 1, I32)])
    b.create("return")
    out = np.zeros(3, np.int32)
    run_function(fn, [out], grid=3)
    assert out.tolist() == [1, 0, 1]


# -- debugging ----------------------------------------------------------------------------


def test_print_shows_the_program_id_prefix_and_values(capsys):
    b, fn = new_kernel(("x", F32))
    b.create("print", [b.create("arange", attrs={"start": 0, "end": 3}).result, fn.args[0]], attrs={"prefix": "vals:"})
    b.create("return")
    run_function(fn, [2.5], grid=(2,))
    assert capsys.readouterr().out == "pid (0, 0, 0) vals: [0 1 2] 2.5\npid (1, 0, 0) vals: [0 1 2] 2.5\n"


def assert_kernel():
    b, fn = new_kernel(("x", ptr(dt.i32)))
    x = load_value(b, fn.args[0], (4,))
    ok = b.create("cmp", [x, const(b, 0, tile(dt.i32, 4))], attrs={"pred": "ge"}).result
    b.create("assert", [ok], attrs={"message": "x must be non-negative"})
    b.create("return")
    return fn


def test_assert_passes_when_every_lane_holds():
    run_function(assert_kernel(), [np.array([0, 1, 2, 3], np.int32)], grid=1)


def test_assert_fails_with_the_message_location_and_lane():
    with pytest.raises(InterpreterError, match=r"kernel.py:7:5: .*op 'assert': assertion failed: "
                                               r"x must be non-negative \(lane \(2,\), 2 of 4 lanes false\)"):
        run_function(assert_kernel(), [np.array([0, 1, -2, -3], np.int32)], grid=1)


def test_breakpoint_stops_with_the_operands_as_locals(monkeypatch):
    seen = {}

    def hook(*args, **kwargs):
        seen.update(sys._getframe(1).f_locals)

    monkeypatch.setattr(sys, "breakpointhook", hook)
    b, fn = new_kernel(("x", F32))
    b.create("breakpoint", [fn.args[0], b.create("arange", attrs={"start": 0, "end": 2}).result],
             attrs={"names": ("x", "lanes")})
    b.create("return")
    run_function(fn, [1.5], grid=(2,))
    assert seen["x"] == 1.5 and seen["lanes"].tolist() == [0, 1] and seen["program_id"] == (1, 0, 0)
