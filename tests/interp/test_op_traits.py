"""Op traits (ir/ops.py) say what the ops do: checked against the interpreter on random inputs.

Passes ask traits instead of keeping lists of op names, so a wrong trait is a
wrong rewrite. An op marked `elementwise` computes each lane of its result
from the same lanes of its operands alone (the whole tile equals the op
applied lane by lane to scalars); `commutative` ops give the same result
with their operands swapped, and the other binary ops do not; a `shape_op`
only moves or repeats its operand's values; the `numerics` family of an op
is the `ir/numerics.py` table that holds it; memory traits go with impurity.
"""

import numpy as np
import pytest

from tessera.backends.interp import run_function
from tessera.backends.interp.inline_asm import register_emulation
from tessera.ir import dtypes as dt
from tessera.ir import numerics
from tessera.ir.ops import COMPARE_PREDICATES, OPS, op_names
from tessera.ir.types import PointerType, ScalarType, TileType

from interp_kernels import contents, memory, new_kernel, ptr, run_op, store_value

SHAPE = (2, 4)
RNG = np.random.default_rng(12)


def random_operands(name: str) -> tuple[list[tuple[np.ndarray, dt.DType]], dict]:
    """Operands (values, dtype) the op accepts, and its attributes; values away from NaN-making edges."""
    floats = lambda: RNG.uniform(0.25, 2.0, SHAPE).astype(np.float32)         # noqa: E731 (log, sqrt: > 0)
    ints = lambda lo=-50, hi=50: RNG.integers(lo, hi, SHAPE).astype(np.int32)  # noqa: E731
    if name in ("shl", "shr"):
        return [(ints(), dt.i32), (ints(0, 31), dt.i32)], {}
    if name == "inline_asm":     # lane-wise through its CPU emulation
        return [(floats(), dt.f32)], {"asm": "neg.f32 $0, $1;", "constraints": "=f,f", "pack": 1,
                                      "emulate": register_emulation(np.negative)}
    if name == "umulhi":     # high halves of products: operands over the whole i32 range
        return [(ints(-2**31, 2**31 - 1), dt.i32), (ints(-2**31, 2**31 - 1), dt.i32)], {}
    if name in ("and", "or", "xor", "not"):
        return [(ints(), dt.i32)] * (2 if name != "not" else 1), {}
    if name in ("div", "rem"):
        return [(ints(), dt.i32), (ints(1, 9), dt.i32)], {}
    if name == "select":
        return [(RNG.random(SHAPE) < 0.5, dt.bool_), (floats(), dt.f32), (floats(), dt.f32)], {}
    if name == "cmp":
        return [(floats(), dt.f32), (floats(), dt.f32)], {"pred": "lt"}
    arity = OPS[name].operands[0]
    return [(floats() * (-1 if name in ("neg", "abs") else 1), dt.f32) for _ in range(arity)], {}


def result_type(name: str, shape):
    """For ops whose result type the producer chooses: cast and bitcast go from f32 to i32, inline_asm stays f32."""
    if name in ("cast", "bitcast"):
        return TileType(ScalarType(dt.i32), shape) if shape else ScalarType(dt.i32)
    if name == "inline_asm":
        return TileType(ScalarType(dt.f32), shape) if shape else ScalarType(dt.f32)
    return None


# addptr, int_to_ptr and ptr_to_int are elementwise too, but pointers cannot be stored to be compared.
ELEMENTWISE = [n for n in op_names(elementwise=True)
               if OPS[n].level == "tile" and n not in ("addptr", "int_to_ptr", "ptr_to_int")]


@pytest.mark.parametrize("name", ELEMENTWISE)
def test_an_elementwise_op_computes_lane_by_lane(name):
    operands, attrs = random_operands(name)
    whole = run_op(name, *operands, attrs=attrs, result=result_type(name, SHAPE))
    for lane in np.ndindex(SHAPE):
        alone = run_op(name, *[(np.asarray(v[lane]), d) for v, d in operands], attrs=attrs,
                       result=result_type(name, ()))
        np.testing.assert_array_equal(whole[lane], alone, err_msg=f"{name}, lane {lane}")


@pytest.mark.parametrize("name", op_names(numerics="binary"))
def test_commutative_ops_and_only_they_ignore_operand_order(name):
    (a, da), (b, db) = random_operands(name)[0]
    if da != db:        # shifts: amounts and values differ in range; swap two values of one range
        a, b = RNG.integers(1, 20, SHAPE).astype(np.int32), RNG.integers(1, 20, SHAPE).astype(np.int32)
    swapped_equal = np.array_equal(run_op(name, (a, da), (b, da)), run_op(name, (b, da), (a, da)))
    assert swapped_equal == OPS[name].commutative, name


SHAPE_OPS = {   # op -> (operand shape, attrs, result shape)
    "splat": ((), {}, (2, 4)),
    "broadcast": ((1, 4), {}, (3, 4)),
    "expand_dims": ((2, 4), {"axis": 1}, (2, 1, 4)),
    "reshape": ((2, 4), {}, (4, 2)),
    "permute": ((2, 4), {"order": (1, 0)}, (4, 2)),
}


def test_shape_ops_are_the_traits_shape_ops():
    assert set(op_names(shape_op=True)) == set(SHAPE_OPS)


@pytest.mark.parametrize("name", sorted(SHAPE_OPS))
def test_a_shape_op_only_moves_or_repeats_its_operands_values(name):
    shape, attrs, out_shape = SHAPE_OPS[name]
    values = RNG.permutation(100)[:max(1, int(np.prod(shape)))].astype(np.float32).reshape(shape)
    result = run_op(name, (values, dt.f32), attrs=attrs, result=TileType(ScalarType(dt.f32), out_shape))
    assert result.shape == out_shape
    assert set(result.reshape(-1).tolist()) <= set(values.reshape(-1).tolist())
    if name in ("reshape", "permute"):      # nothing repeated, nothing lost
        assert sorted(result.reshape(-1).tolist()) == sorted(values.reshape(-1).tolist())


def test_numerics_families_are_the_numerics_tables():
    assert set(op_names(numerics="binary")) == set(numerics.BINARY)
    assert set(op_names(numerics="unary")) == set(numerics.UNARY)
    assert set(op_names(numerics="math")) == set(numerics.MATH)
    assert op_names(numerics="compare") == ("cmp",) and set(COMPARE_PREDICATES) == set(numerics.COMPARE)
    assert all(OPS[n].elementwise for n in OPS if OPS[n].numerics is not None)


def test_traits_agree_with_purity_and_regions():
    for name, opdef in OPS.items():
        if opdef.elementwise or opdef.shape_op:
            assert opdef.pure and not opdef.has_regions, name
            assert not (opdef.reads_memory or opdef.writes_memory), name
        if opdef.reads_memory or opdef.writes_memory or opdef.pointer_lanes:
            assert not opdef.pure, name
        if opdef.commutative:
            assert opdef.operands == (2, 2) and opdef.elementwise, name


@pytest.mark.parametrize("name", op_names(pointer_lanes=True))
def test_pointer_lane_ops_write_memory_exactly_when_marked(name):
    """Run the op on lanes 0..3 of a memory and see whether its contents change."""
    opdef = OPS[name]
    b, fn = new_kernel(("mem", ptr(dt.i32)), ("out", ptr(dt.i32)))
    pointers = b.create("addptr", [b.create("splat", [fn.args[0]], result_types=[
        TileType(PointerType(dt.i32), (4,))]).result, b.create("arange", attrs={"start": 0, "end": 4}).result]).result
    held = b.create("arange", attrs={"start": 0, "end": 4}).result          # what the memory holds
    value = b.create("arange", attrs={"start": 10, "end": 14}).result
    operands = {"load": [pointers], "store": [pointers, value], "atomic_rmw": [pointers, value],
                "atomic_cas": [pointers, held, value], "load_acquire": [pointers],
                "store_release": [pointers, value]}[name]
    op = b.create(name, operands, attrs={"kind": "add"} if name == "atomic_rmw" else None)
    if op.results:
        store_value(b, fn.args[1], op.result)
    b.create("return")
    mem, out = memory(np.arange(4), dt.i32), memory(np.zeros(4), dt.i32)
    run_function(fn, [mem, out], grid=(1,))
    changed = not np.array_equal(contents(mem), np.arange(4))
    assert changed == opdef.writes_memory, name
    if op.results:      # what it read is what the memory held
        assert contents(out).tolist() == [0, 1, 2, 3], name
        assert opdef.reads_memory, name


def test_the_ops_that_order_memory_between_programs_are_the_atomics_and_the_ordered_accesses():
    """The TMA passes ask this trait to fence the async proxy (fills) or keep the threads' stores (TMA stores)."""
    assert set(op_names(orders_programs=True)) == {"atomic_rmw", "atomic_cas", "load_acquire", "store_release"}
